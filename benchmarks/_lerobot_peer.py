"""LeRobot's own writer and data loader, measured; a private helper run in the lerobot venv, never in .venv.

    <lerobot-venv>/bin/python benchmarks/_lerobot_peer.py create ROOT SOURCE.npz [OUT.json]
    <lerobot-venv>/bin/python benchmarks/_lerobot_peer.py load ROOT PLAN.json OUT.json

Imports only lerobot, torch, numpy and the standard library (not the project's packages), so the
main benchmark runs it as a subprocess with the lerobot venv's python. Offline (HF_HUB_OFFLINE=1).

``create`` writes ROOT (which must not exist) with lerobot's own writer (``LeRobotDataset.create``,
``add_frame``, ``save_episode``), as tests/lerobot_interop/lerobot_side.py does. SOURCE.npz:
``fps``, ``cameras`` (names), ``tasks`` (one per episode), ``lengths``, and per episode k
``state_k`` (T, S) float32, ``action_k`` (T, A) float32, ``<camera>_k`` (T, H, W, 3) uint8.
Prints, as its last stdout line, a JSON object (also written to OUT.json if given): the time in
``add_frame`` (lerobot writes each frame as a PNG) and in ``save_episode`` (video encoding and
Parquet), the total, and the dataset's bytes on disk by top-level folder.

``load`` reads samples from ROOT cold, the way a trainer does. PLAN.json keys:

    delta_timestamps  {key: [seconds, ...]}  e.g. each "observation.images.<cam>": [-0.5, 0.0, 0.5]
    indices           [int, ...]  dataset frame indices of the samples, in the order to read them
    num_workers       int         DataLoader workers (0: in process)
    batch_size        int
    profile_samples   int, optional (20)   per-sample split: ds[i] in process for this many indices
    warmup            int, optional (1)    samples read in process before the timed pass (code warm-up)
    pss_interval_s    float, optional (1.0)  PSS sampling period (smaps_rollup costs CPU; see _MemorySampler)
    drop_caches       bool, optional (false)  also `echo 1 > /proc/sys/vm/drop_caches` (whole page cache)
    torch_threads     int, optional (null: torch's default) torch.set_num_threads in the main process
                      (workers run with 1, DataLoader's rule)
    video_backend     str, optional (null: lerobot's default)
    repo_id           str, optional ("dyna/interop", what ``create`` writes)

It drops ROOT's files (and the Arrow cache ``datasets`` builds from its Parquet) from the page
cache, opens ``LeRobotDataset(repo_id, root=ROOT, delta_timestamps=...)`` (timed: ``open_s``),
reads ``warmup`` samples (code, not data, warm), drops the files again and times one pass of
``DataLoader(Subset(ds, indices), batch_size, num_workers, shuffle=False)`` from ``iter()`` (worker
start-up included) to the last batch. OUT.json: see ``load`` below (``samples``, ``seconds``,
``samples_per_s``, ``open_s``, ``memory``, ``io``, ``cache_drop``, ``profile``, ``versions``, ...).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ID = "dyna/interop"


# ---------------------------------------------------------------------------------------------- create


def create(root: Path, source: Path) -> dict:
    import numpy as np
    from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset

    if root.exists():
        raise SystemExit(f"{root} exists: lerobot's writer creates the dataset root itself")
    if source.is_dir():
        return _create_from_jpeg_episodes(root, sorted(source.glob("*.npz")))
    src = np.load(source)
    fps, cameras = int(src["fps"]), [str(c) for c in src["cameras"]]
    state0 = src["state_0"]
    action0 = src["action_0"]
    h, w = src[f"{cameras[0]}_0"].shape[1:3]
    features = _features(state0.shape[1], action0.shape[1], cameras, h, w)
    t_start = time.perf_counter()
    ds = LeRobotDataset.create(REPO_ID, fps=fps, features=features, root=root, robot_type="so100", use_videos=True)
    add_s = save_s = 0.0
    frames = 0
    for k, (n, task) in enumerate(zip(src["lengths"], src["tasks"])):
        # each episode's arrays read from the .npz once (src[key] decompresses the whole array)
        state, action = src[f"state_{k}"], src[f"action_{k}"]
        video = {c: src[f"{c}_{k}"] for c in cameras}
        t = time.perf_counter()
        for i in range(int(n)):
            frame = {"observation.state": state[i], "action": action[i]}
            frame.update({f"observation.images.{c}": video[c][i] for c in cameras})
            _add_frame(ds, CODEBASE_VERSION, frame, str(task))
        add_s += time.perf_counter() - t
        t = time.perf_counter()
        ds.save_episode()
        save_s += time.perf_counter() - t
        frames += int(n)
        del video
    if hasattr(ds, "finalize"):  # 0.4: closes its Parquet writers
        t = time.perf_counter()
        ds.finalize()
        save_s += time.perf_counter() - t
    total_s = time.perf_counter() - t_start
    sizes = _bytes_by_folder(root)
    return _created(root, len(src["lengths"]), frames, cameras, (h, w), fps, (add_s, save_s, total_s), sizes)


def _create_from_jpeg_episodes(root: Path, files: list[Path]) -> dict:
    """The loader benchmark's source: one .npz per episode holding ``fps``, ``cameras``, ``task``,
    ``state`` (T, J), ``action`` (T, A) and per camera its T JPEGs end to end (``<cam>_jpeg`` uint8,
    ``<cam>_offsets`` T+1 int64), so a corpus of many 640x480 episodes never sits decoded on disk.
    Frames reach lerobot's writer as the RGB the JPEGs decode to (PIL, libjpeg-turbo)."""
    import io

    import numpy as np
    from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset
    from PIL import Image

    if not files:
        raise SystemExit("no episode .npz files in the source folder")
    first = np.load(files[0])
    fps, cameras = int(first["fps"]), [str(c) for c in first["cameras"]]

    def frame(ep, cam: str, i: int) -> np.ndarray:
        off = ep[f"{cam}_offsets"]
        return np.asarray(Image.open(io.BytesIO(ep[f"{cam}_jpeg"][off[i] : off[i + 1]].tobytes())).convert("RGB"))

    h, w = frame(first, cameras[0], 0).shape[:2]
    features = _features(first["state"].shape[1], first["action"].shape[1], cameras, h, w)
    t_start = time.perf_counter()
    # lerobot's writer PNG-encodes every frame in add_frame; its own image-writer threads do that in the
    # background (as its recording scripts run it), else 640x480 costs ~0.15 s per camera-frame inline.
    ds = LeRobotDataset.create(
        REPO_ID, fps=fps, features=features, root=root, robot_type="so100", use_videos=True, image_writer_threads=4
    )
    add_s = save_s = 0.0
    frames = 0
    for f in files:
        ep = dict(np.load(f))
        task, n = str(ep["task"]), len(ep["state"])
        t = time.perf_counter()
        for i in range(n):
            row = {
                "observation.state": ep["state"][i],
                "action": ep["action"][i],
                **{f"observation.images.{c}": frame(ep, c, i) for c in cameras},
            }
            _add_frame(ds, CODEBASE_VERSION, row, task)
        add_s += time.perf_counter() - t
        t = time.perf_counter()
        ds.save_episode()
        save_s += time.perf_counter() - t
        frames += n
    if hasattr(ds, "finalize"):
        ds.finalize()
    sizes = _bytes_by_folder(root)  # the total below counts this walk too, unlike create()'s (as it always has)
    return _created(
        root, len(files), frames, cameras, (h, w), fps, (add_s, save_s, time.perf_counter() - t_start), sizes
    )


def _features(state_dim: int, action_dim: int, cameras: list[str], h: int, w: int) -> dict:
    """The features lerobot's writer is created with: state, action and one video per camera."""
    return {
        "observation.state": {"dtype": "float32", "shape": (state_dim,), "names": [f"j{i}" for i in range(state_dim)]},
        "action": {"dtype": "float32", "shape": (action_dim,), "names": None},
        **{
            f"observation.images.{c}": {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
            for c in cameras
        },
    }


def _add_frame(ds, codebase_version: str, frame: dict, task: str) -> None:
    """One frame into lerobot's writer: v2.x takes the task as an argument, v3.0 as a field of the frame."""
    if codebase_version.startswith("v2."):
        ds.add_frame(frame, task=task)
    else:
        ds.add_frame(frame | {"task": task})


def _bytes_by_folder(root: Path) -> dict[str, int]:
    """The dataset's bytes on disk by top-level folder."""
    sizes: dict[str, int] = {}
    for p in root.rglob("*"):
        if p.is_file():
            top = p.relative_to(root).parts[0]
            sizes[top] = sizes.get(top, 0) + p.stat().st_size
    return sizes


def _created(
    root: Path,
    episodes: int,
    frames: int,
    cameras: list[str],
    hw: tuple[int, int],
    fps: int,
    seconds: tuple[float, float, float],
    sizes: dict[str, int],
) -> dict:
    """``create``'s report; ``seconds``: in add_frame, in save_episode, and in all."""
    from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION

    (h, w), (add_s, save_s, total_s) = hw, seconds
    return {
        "command": "create",
        "root": str(root),
        "episodes": episodes,
        "frames": frames,
        "cameras": cameras,
        "height": int(h),
        "width": int(w),
        "fps": fps,
        "add_frame_s": round(add_s, 3),
        "save_episode_s": round(save_s, 3),
        "encode_total_s": round(total_s, 3),
        "bytes_on_disk": sum(sizes.values()),
        "bytes_by_folder": sizes,
        "codebase_version": CODEBASE_VERSION,
        "versions": _versions(),
    }


# ---------------------------------------------------------------------------------------------- page cache

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _files(dirs) -> list[Path]:
    return [p for d in dirs if d and Path(d).exists() for p in Path(d).rglob("*") if p.is_file() and not p.is_symlink()]


def _resident_bytes(files: list[Path]) -> int:
    """Bytes of these files now in the page cache (mincore on a read-only mapping)."""
    total = 0
    for p in files:
        size = p.stat().st_size
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                continue
            pages = (size + _PAGE - 1) // _PAGE
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) == 0:
                total += sum(b & 1 for b in vec.raw) * _PAGE
            _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def _drop_cache(dirs, global_drop: bool = False) -> dict:
    """Evict these files from the page cache: fsync + POSIX_FADV_DONTNEED on each (always), and with
    `global_drop` also `echo 1 > /proc/sys/vm/drop_caches` when allowed (root, writable /proc/sys).
    That one empties the whole page cache, the venv's libraries included, so the pass then pays for
    paging torch/FFmpeg code back in: off unless asked for. Pages a process has mapped (the Arrow
    cache `datasets` memory-maps) survive DONTNEED. Reports what ran and how many of the files' bytes
    were resident before and after."""
    files = _files(dirs)
    before = _resident_bytes(files)
    fadvised = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped by DONTNEED
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            fadvised += 1
        finally:
            os.close(fd)
    drop_caches = "not asked"
    if global_drop:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
            drop_caches = "ok"
        except OSError as e:
            drop_caches = f"failed: {e.strerror}"
    return {
        "fadvise_dontneed_files": fadvised,
        "drop_caches": drop_caches,
        "resident_bytes_before": before,
        "resident_bytes_after": _resident_bytes(files),
    }


# ---------------------------------------------------------------------------------------------- /proc


def _proc_io(pid: int | str = "self") -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except OSError:
        return {}


def _smaps_kb(pid: int | str = "self") -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return out


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def _status_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (the kernel's own peak RSS) from /proc/<pid>/status: exact and cheap."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1])
    except OSError:
        pass
    return out


class _MemorySampler(threading.Thread):
    """Every `interval` s: PSS, RSS and USS (smaps_rollup) of this process and its child processes
    (the DataLoader's workers, and anything they start); keeps each process's peak. smaps_rollup walks
    the page tables (~15 ms of CPU for a 1.5 GB process), hence the coarse default interval; the
    sampler's own CPU time is kept in `cpu_s`."""

    def __init__(self, interval: float = 1.0):
        super().__init__(daemon=True)
        self.interval, self.stop_event = interval, threading.Event()
        self.peaks: dict[int, dict[str, int]] = {}
        self.peak_total_pss_kb = 0
        self.samples = 0
        self.cpu_s = 0.0

    def sample(self) -> None:
        me = os.getpid()
        pids, todo = [], [me]
        while todo:
            p = todo.pop()
            pids.append(p)
            todo += _children(p)
        total = 0
        for p in pids:
            s = _smaps_kb(p)
            if not s:
                continue
            peak = self.peaks.setdefault(p, {"pss_kb": 0, "rss_kb": 0, "uss_kb": 0})
            peak["pss_kb"] = max(peak["pss_kb"], s.get("Pss", 0))
            peak["rss_kb"] = max(peak["rss_kb"], s.get("Rss", 0))
            peak["uss_kb"] = max(peak["uss_kb"], s.get("Private_Clean", 0) + s.get("Private_Dirty", 0))
            total += s.get("Pss", 0)
        self.peak_total_pss_kb = max(self.peak_total_pss_kb, total)
        self.samples += 1

    def run(self) -> None:
        self.sample()
        while not self.stop_event.wait(self.interval):
            self.sample()
        self.cpu_s = time.thread_time()

    def stop(self) -> None:
        self.stop_event.set()
        self.join()
        self.sample()


# ---------------------------------------------------------------------------------------------- load


def _versions() -> dict[str, str | None]:
    import importlib.metadata as md

    out: dict[str, str | None] = {}
    for p in ("lerobot", "torch", "torchvision", "torchcodec", "av", "datasets", "numpy"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


def _padded(batch: dict, acc: dict) -> None:
    for k, v in batch.items():
        if k.endswith("_is_pad"):
            n, t = acc.get(k, (0, 0))
            acc[k] = (n + int(v.sum()), t + v.numel())


def load(root: Path, plan: dict, hf_cache: Path) -> dict:
    import torch
    from lerobot.datasets import video_utils
    from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset
    from torch.utils.data import DataLoader, Subset

    repo_id = plan.get("repo_id", REPO_ID)
    delta = plan.get("delta_timestamps") or None
    indices = [int(i) for i in plan.get("indices", [])]
    num_workers, batch_size = int(plan.get("num_workers", 0)), int(plan.get("batch_size", 1))
    backend = plan.get("video_backend")  # None: lerobot's default
    cache_dirs = [root, hf_cache]
    if plan.get("torch_threads"):
        torch.set_num_threads(int(plan["torch_threads"]))
    load_before = os.getloadavg()
    global_drop = bool(plan.get("drop_caches", False))

    drop_open = _drop_cache(cache_dirs, global_drop)
    t = time.perf_counter()
    ds = LeRobotDataset(repo_id, root=root, delta_timestamps=delta, video_backend=backend)
    open_s = time.perf_counter() - t
    if "samples" in plan:  # (episode index, frame in episode) pairs, clamped into the episode
        start, end = ds.episode_data_index["from"], ds.episode_data_index["to"]
        indices = [min(int(start[e]) + max(int(f), 0), int(end[e]) - 1) for e, f in plan["samples"]]
    n_warm = min(int(plan.get("warmup", 1)), len(indices))
    # warm-up: lerobot/torchcodec/FFmpeg code paged in and lazily imported (before the workers fork),
    # as in a trainer past its first steps; the data it read is evicted again below
    for i in indices[:n_warm]:
        ds[i]

    # one pass over the samples, cold, as a trainer's DataLoader does it
    loader = DataLoader(
        Subset(ds, indices),
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle=False,
        persistent_workers=num_workers > 0,
    )  # workers outlive the pass so their /proc is read
    drop_pass = _drop_cache(cache_dirs, global_drop)
    sampler = _MemorySampler(float(plan.get("pss_interval_s", 1.0)))
    io0 = _proc_io()
    ru_self0 = resource.getrusage(resource.RUSAGE_SELF)
    ru_kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    t = time.perf_counter()
    it = iter(loader)
    first_batch_s = None
    samples = 0
    pad: dict = {}
    for batch in it:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t
        samples += len(batch["index"])
        _padded(batch, pad)
    seconds = time.perf_counter() - t
    sampler.stop()
    io1 = _proc_io()
    ru_self1 = resource.getrusage(resource.RUSAGE_SELF)
    workers = [w.pid for w in getattr(it, "_workers", [])]
    worker_io = {pid: _proc_io(pid) for pid in workers}
    worker_status = [_status_kb(pid) for pid in workers]
    main_status = _status_kb()
    if hasattr(it, "_shutdown_workers"):  # persistent workers: joined here, so RUSAGE_CHILDREN has them
        it._shutdown_workers()
    del it, loader
    ru_children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, joined by now
    cpu_main = (ru_self1.ru_utime + ru_self1.ru_stime) - (ru_self0.ru_utime + ru_self0.ru_stime)
    cpu_workers = (ru_children.ru_utime + ru_children.ru_stime) - (ru_kids0.ru_utime + ru_kids0.ru_stime)

    def delta_io(key: str) -> int:
        return (io1.get(key, 0) - io0.get(key, 0)) + sum(w.get(key, 0) for w in worker_io.values())

    read_bytes, rchar = delta_io("read_bytes"), delta_io("rchar")
    me = os.getpid()
    mem: dict = {
        "method": "peak PSS/RSS/USS per process from /proc/<pid>/smaps_rollup, sampled every "
        f"{sampler.interval * 1000:.0f} ms during the pass and once at its end ({sampler.samples} "
        "samples), workers still alive; vm_hwm_kb: the kernel's peak RSS (/proc/<pid>/status VmHWM); "
        "ru_maxrss of self and of reaped children as a cross-check",
        "main": sampler.peaks.get(me, {}) | {"vm_hwm_kb": main_status.get("VmHWM")},
        "workers": [sampler.peaks.get(p, {}) | {"vm_hwm_kb": st.get("VmHWM")} for p, st in zip(workers, worker_status)],
        "sampler_cpu_s": round(sampler.cpu_s, 3),
        "peak_total_pss_kb": sampler.peak_total_pss_kb,
        "ru_maxrss_self_kb": ru_self1.ru_maxrss,
        "ru_maxrss_children_kb": ru_children.ru_maxrss,
        "note": "PSS splits pages shared between the main process and its forked workers (torch's libraries "
        "alone are ~1 GB of RSS); a forked child's RSS, VmHWM and ru_maxrss count the pages it shares "
        "with its parent, so they over-state what a worker adds",
    }
    io = {
        "method": "/proc/<pid>/io deltas over the pass: main process + each worker (read at the pass's end)",
        "read_bytes": read_bytes,
        "rchar": rchar,
        "read_bytes_per_sample": round(read_bytes / max(samples, 1)),
        "rchar_per_sample": round(rchar / max(samples, 1)),
        "main_read_bytes": io1.get("read_bytes", 0) - io0.get("read_bytes", 0),
        "main_rchar": io1.get("rchar", 0) - io0.get("rchar", 0),
        "workers_read_bytes": [w.get("read_bytes", 0) for w in worker_io.values()],
        "workers_rchar": [w.get("rchar", 0) for w in worker_io.values()],
        "ru_inblock_self_512b": ru_self1.ru_inblock - ru_self0.ru_inblock,
        "ru_inblock_children_512b": ru_children.ru_inblock,
        "note": "read_bytes: bytes this process caused to be fetched from storage (read() and mmap faults); "
        "rchar: bytes returned by read()/pread() syscalls, page-cache hits included, mmap not included",
    }

    # per-sample split, in process, cold again: ds[i] total vs lerobot's video decoding vs the table rows
    n_prof = min(int(plan.get("profile_samples", 20)), len(indices))
    timers = {"video": 0.0, "hf": 0.0}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[name] += time.perf_counter() - t0

        return wrapper

    if hasattr(ds, "_query_videos"):
        ds._query_videos = timed("video", ds._query_videos)
    if hasattr(ds, "_query_hf_dataset"):
        ds._query_hf_dataset = timed("hf", ds._query_hf_dataset)
    drop_prof = _drop_cache(cache_dirs, global_drop)
    t = time.perf_counter()
    for i in indices[:n_prof]:
        ds[i]
    prof_s = time.perf_counter() - t
    profile = {
        "samples": n_prof,
        "cold": True,
        "ms_per_sample": round(1000 * prof_s / max(n_prof, 1), 2),
        "video_decode_ms": round(1000 * timers["video"] / max(n_prof, 1), 2),
        "table_rows_ms": round(1000 * timers["hf"] / max(n_prof, 1), 2),
        "other_ms": round(1000 * (prof_s - timers["video"] - timers["hf"]) / max(n_prof, 1), 2),
        "note": "ds[i] in process; video_decode_ms: LeRobotDataset._query_videos (open + seek + decode + "
        "to float), table_rows_ms: _query_hf_dataset (delta windows of the non-video keys)",
    }

    return {
        "command": "load",
        "root": str(root),
        "samples": samples,
        "seconds": round(seconds, 4),
        "samples_per_s": round(samples / seconds, 2) if seconds > 0 else None,
        "first_batch_s": round(first_batch_s, 4) if first_batch_s is not None else None,
        "cpu": {
            "main_s": round(cpu_main, 3),
            "workers_s": round(cpu_workers, 3),
            "ms_per_sample": round(1000 * (cpu_main + cpu_workers) / max(samples, 1), 2),
            "note": "user+sys CPU over the pass (getrusage: self, and the joined workers); "
            "less sensitive than seconds to other load on the machine",
        },
        "open_s": round(open_s, 4),
        "warmup_samples": n_warm,
        "dataset_bytes": sum(p.stat().st_size for p in _files([root])),
        "num_workers": num_workers,
        "batch_size": batch_size,
        "memory": mem,
        "io": io,
        "padded_fraction": {k: round(n / t, 4) for k, (n, t) in pad.items()},
        "cache_drop": {
            "before_open": drop_open,
            "before_pass": drop_pass,
            "before_profile": drop_prof,
            "dirs": [str(d) for d in cache_dirs],
        },
        "profile": profile,
        "video_backend": ds.video_backend,
        "video_backend_default": video_utils.get_safe_default_codec(),
        "codebase_version": ds.meta.info.get("codebase_version"),
        "lerobot_codebase_version": CODEBASE_VERSION,
        "dataset": {
            "frames": len(ds),
            "episodes": ds.meta.total_episodes,
            "fps": ds.meta.fps,
            "video_keys": list(ds.meta.video_keys),
        },
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1min": {"start": round(load_before[0], 2), "end": round(os.getloadavg()[0], 2)},
        "versions": _versions(),
    }


def main(argv: list[str]) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    if len(argv) < 3:
        raise SystemExit(__doc__)
    cmd, root = argv[0], Path(argv[1])
    if cmd == "create":
        result = create(root, Path(argv[2]))
        if len(argv) > 3:
            Path(argv[3]).write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
    elif cmd == "load":
        if len(argv) < 4:
            raise SystemExit(__doc__)
        plan = json.loads(Path(argv[2]).read_text())
        # A fresh Arrow cache per run: `datasets` converts the Parquet into it when the dataset opens
        # (part of open_s), and it is evicted with ROOT before the timed pass.
        with tempfile.TemporaryDirectory(prefix="lerobot-peer-hf-") as hf_cache:
            os.environ["HF_DATASETS_CACHE"] = hf_cache
            result = load(root, plan, Path(hf_cache))
        Path(argv[3]).write_text(json.dumps(result, indent=1))
        print(json.dumps({k: result[k] for k in ("samples", "seconds", "samples_per_s", "open_s", "video_backend")}))
    else:
        raise SystemExit(f"unknown command {cmd!r}\n{__doc__}")


if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0], and benchmarks/lerobot.py there would shadow
    # the lerobot package (and import the project): the folder comes off the path before lerobot is imported.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    main(sys.argv[1:])
