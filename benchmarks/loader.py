"""Training reads, cold, on a corpus larger than any cache: GOP-aware vs random access vs LeRobot vs JPEG.

`python -m benchmarks loader [--quick | --tiny] [--dir DIR]`

Corpus (full): 16 episodes of 30 s from the sample fleet's renderer, 3 cameras 640x480 at 30 Hz, as
the legacy HDF5 (per-frame JPEG q90) and as MCAP with the fleet's 150-frame GOPs (CRF 21; preset
``faster`` instead of the fleet's ``slower`` to keep generation in minutes: the decode side, which
is what this measures, differs little). Segments: 2 s, back to back. Two sample sets over them:
dense (an anchor every 0.1 s: every 3rd frame) and sparse (one anchor per segment, the demo's).
One sample, for every loader: the frames at anchor -0.5 s and +0 s and the future frame at +0.5 s
of every camera, 24 joint-state steps at 30 Hz up to the anchor and 15 action steps at 30 Hz
after it (LeRobot's ``delta_timestamps`` must be multiples of 1/fps, so the grids are at 30 Hz).

Loaders, side by side, each in a fresh process pinned to ONE core (figures are per loader core),
each preceded by dropping every corpus file from the OS page cache (posix_fadvise DONTNEED), and
each reading a pass of samples it has never decoded (a cold first epoch):

(a) ``gop``: ``GopDataset`` (decode units; one epoch of the set, in its order);
(b) ``random``: ``ManifestDataset`` in fully random order (live GOP decoders and recent frames per
    episode), on the archive stream and on a training stream (t128: 128x128, 30-frame GOPs);
(c) ``lerobot``: LeRobot 0.3.2's ``LeRobotDataset`` with ``delta_timestamps`` (its default video
    backend) on the same episodes written by LeRobot's own writer (``benchmarks/_lerobot_peer.py``,
    in the lerobot v2.1 venv; skipped, saying so, when that venv is missing);
(d) ``jpeg``: the legacy HDF5, each frame a JPEG decoded with libjpeg-turbo (simplejpeg).

(b)-(d) read a random subset of the set (``--random-samples``) drawn from the episodes LeRobot's
writer got (the first 3: it PNG-encodes every frame, hours for the whole corpus): they cost the same
per sample however many are read and whichever episode they come from. (a) and (b) also run on the
t128 training stream, and (a) once more with the unit's cameras on 3 threads over both cores. Frames leave
every loader of ours at 64x64 (the demo model's input; swscale
resizes in the conversion); LeRobot returns full-size float frames (its loader has no resize), the
JPEG loader resizes through the same swscale call. Reported per loader: samples/s, frames decoded
per frame delivered, bytes read from disk per sample (/proc/self/io read_bytes) and the worker's
peak memory (ru_maxrss). Then the demo model trains on the dense set with the GOP-aware loader
(``TrainConfig`` defaults: 1 DataLoader worker, batch 8), on the archive stream (``--steps``) and on t128
(one whole first epoch), and its
first-epoch data-wait fraction is reported (both cores: the trainer and its worker). Last, the same
model trains one whole first epoch of t128 read cold from the loopback object server
(``benchmarks/object_server.py``: S3 API, 20 ms to first byte, 100 MB/s a connection) through an empty
node page cache, with the origin prefetch and no prewarm: its data wait, and the bytes the server sent
over the bytes the epoch needs (the exact chunk ranges a prewarm plan of the manifest lists); side by
side with the same epoch read-through (no prefetch) from the server and read from local disk.

``--quick``: 6 episodes of 20 s; ``--tiny``: 2 episodes of 6 s at 64x48 with 1 s GOPs (CI).
``--mix-sweep``: only (a) at ``mix_units`` 1, 3 and 8: randomness (units and episodes per batch, units
in flight) against speed and peak memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from ._cli import add_size_flags, size_of

ROOT = Path(__file__).resolve().parents[1]
FPS = 30
SEGMENT_S = 2.0
TRAINING_STREAM = "t128"
TRAINING_GOP = 30  # the t128 stream's frames per GOP
LEROBOT_EPISODES = {"full": 3, "quick": 2, "tiny": 2}


def sample_spec(dense: bool, stream: str | None = None, image: int = 64, adjacent_hw: list | None = None):
    """The benchmark's sample definitions. ``adjacent_hw`` (H, W): the adjacent-frames definition at that
    output size, the common ACT / diffusion-policy input: the frames at t and t + 1/fps of every camera,
    1 s of joint states, an anchor every 3rd frame."""
    from trainer.dataset import SampleSpec

    if adjacent_hw is not None:
        return SampleSpec(
            image_size=(int(adjacent_hw[0]), int(adjacent_hw[1])),
            frame_offsets_s=(0.0,),
            future_frame_s=1.0 / FPS,
            proprio_steps=FPS,
            proprio_hz=float(FPS),
            action_chunk=15,
            action_hz=float(FPS),
            tolerance_s=0.034,
            anchors="every",
            anchor_every_s=3.0 / FPS,
            stream=stream,
        )
    # same shape as mcap_writer.py's Statistics(...) (a record built keyword by keyword); nothing to share
    return SampleSpec(
        image_size=(image, image),
        frame_offsets_s=(-0.5, 0.0),
        future_frame_s=0.5,
        proprio_steps=24,
        proprio_hz=30.0,
        action_chunk=15,
        action_hz=30.0,
        tolerance_s=0.034,
        anchors="every" if dense else "end",
        anchor_every_s=0.1,
        stream=stream,
    )


# ---- corpus ---------------------------------------------------------------------------------------
def corpus(root: Path, n: int, duration: float, width: int, height: int, gop: int, size: str) -> dict:
    """The episodes as HDF5, MCAP and MCAP with a training stream; reused when the same (stamp)."""
    from dyna_resources.episodes.mcap_reader import EpisodeReader
    from dyna_resources.episodes.sim.fleet import fleet_specs

    stamp = {"n": n, "duration": duration, "width": width, "height": height, "gop": gop, "v": 1}
    root.mkdir(parents=True, exist_ok=True)
    (root / "h5").mkdir(exist_ok=True)
    (root / "mcap").mkdir(exist_ok=True)
    (root / "mcap-t128").mkdir(exist_ok=True)
    done = root / "corpus.json"
    specs = fleet_specs(n, seed=11, width=width, height=height, duration_s=duration)
    if not done.exists() or json.loads(done.read_text()).get("stamp") != stamp:
        t0 = time.perf_counter()
        jobs = [(spec, str(root), gop) for spec in specs]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1), mp_context=ctx) as pool:
            for k, _ in enumerate(pool.map(_make_episode, jobs)):
                print(f"  episode {k + 1}/{n} ready ({time.perf_counter() - t0:.0f} s)", flush=True)
        done.write_text(json.dumps({"stamp": stamp}))
    rows: dict[str, list] = {"episode_id": [], "uri": [], "start_ns": [], "end_ns": []}
    for spec in specs:
        path = root / "mcap" / f"{spec.episode_id}.mcap"
        with EpisodeReader(path) as r:
            t = r.start_ns
            while t + int(SEGMENT_S * 1e9) <= r.end_ns:
                rows["episode_id"].append(spec.episode_id)
                rows["uri"].append(str(path))
                rows["start_ns"].append(t)
                rows["end_ns"].append(t + int(SEGMENT_S * 1e9))
                t += int(SEGMENT_S * 1e9)
    sizes = {kind: sum(f.stat().st_size for f in (root / kind).iterdir()) for kind in ("h5", "mcap", "mcap-t128")}
    return {"manifest": pa.table(rows), "episodes": [s.episode_id for s in specs], "bytes": sizes, "size": size}


def _make_episode(job) -> str:
    """One episode: HDF5 (the fleet's renderer, JPEG q90), MCAP, MCAP + the t128 training stream."""
    from dyna_resources.episodes.codec import VideoSettings
    from dyna_resources.episodes.sim import write_episode
    from dyna_resources.episodes.training_streams import TrainingStreamSpec, add_training_streams
    from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode

    spec, root, gop = job
    root = Path(root)
    h5 = root / "h5" / f"{spec.episode_id}.h5"
    mcap = root / "mcap" / f"{spec.episode_id}.mcap"
    with_stream = root / "mcap-t128" / mcap.name
    if not mcap.exists():
        write_episode(spec, h5)
        transcode_episode(h5, mcap, TranscodeSettings(video=VideoSettings(gop_frames=gop, preset="faster")))
    if not with_stream.exists():
        add_training_streams(
            mcap, with_stream, [TrainingStreamSpec(TRAINING_STREAM, 128, 128, gop_frames=TRAINING_GOP)]
        )
    return spec.episode_id


def drop_page_cache(*folders: Path) -> int:
    """Evict every file under ``folders`` from the OS page cache (cold reads); returns files dropped."""
    n = 0
    for folder in folders:
        if not folder.exists():
            continue
        for p in folder.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd) if os.access(p, os.W_OK) else None
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                n += 1
    return n


# ---- one loader pass, in its own process ------------------------------------------------------------
def _io_read_bytes() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(job: dict) -> dict:
    """One pass of one loader (runs in the child process)."""
    import torch

    torch.set_num_threads(1)
    manifest = pa.ipc.open_file(job["manifest"]).read_all()
    kind = job["kind"]
    spec = sample_spec(job["dense"], job.get("stream"), job.get("image", 64), job.get("adjacent_hw"))
    before = _io_read_bytes()
    t0, c0 = time.perf_counter(), time.process_time()
    decoded = delivered = samples = 0
    if kind == "gop":
        from trainer.gop_dataset import GopDataset

        ds = GopDataset(
            manifest,
            spec,
            batch_size=job.get("batch_size", 8),
            lanes=1,
            seed=1,
            mix_units=job.get("mix_units", 3.0),
            decode_threads=job.get("threads", 1),
        )
        limit = job.get("limit") or ds.rows
        for batch in ds:
            decoded += int(batch["decoded_frames"])
            delivered += int(batch["delivered_frames"])
            samples += len(batch["row"])
            if samples >= limit:
                break
    elif kind == "random":
        from collections import OrderedDict

        from trainer.dataset import ManifestDataset

        mds = ManifestDataset(manifest, spec, batch_size=8, seed=1, block=1, shuffle_buffer=1)
        order = np.random.default_rng(5).permutation(mds.rows)[: job["limit"]]
        readers: OrderedDict = OrderedDict()
        for i in order.tolist():
            mds.sample(int(i), readers)
            samples += 1
        decoded = mds.decoded_frames(readers)
        delivered = samples * len(next(iter(readers.values()))[0].cameras) * len(spec.all_frame_offsets_ns())
    elif kind == "jpeg":
        decoded, delivered, samples = _jpeg_pass(job, manifest, spec)
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    extra = {}
    if kind == "gop":  # how mixed the stream is: distinct units and episodes per batch, the most units in flight
        lane = ds.lanes_of(0)[0]
        b = ds.batch_size
        n = len(lane.unit) // b * b
        units = lane.unit[:n].reshape(-1, b)
        episodes = ds.plan.code[lane.samples[:n]].reshape(-1, b)
        first = np.full(int(lane.unit.max()) + 1, n)
        last = np.zeros(int(lane.unit.max()) + 1, np.int64)
        np.minimum.at(first, lane.unit, np.arange(len(lane.unit)))
        np.maximum.at(last, lane.unit, np.arange(len(lane.unit)))
        alive = np.zeros(len(lane.unit) + 1, np.int64)
        np.add.at(alive, first, 1)
        np.add.at(alive, last + 1, -1)
        extra = {
            "units_per_batch": float(np.mean([len(set(u)) for u in units.tolist()])),
            "episodes_per_batch": float(np.mean([len(set(e)) for e in episodes.tolist()])),
            "max_units_in_flight": int(np.cumsum(alive).max()),
        }
    return {
        **extra,
        "kind": kind,
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        # process CPU (every thread): stable on a loaded machine, where wall time is not
        "cpu_ms_per_sample": 1000 * cpu_s / max(1, samples),
        "decoded": decoded,
        "delivered": delivered,
        "decodes_per_frame": decoded / delivered if delivered else None,
        "bytes_per_sample": (_io_read_bytes() - before) / max(1, samples),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _jpeg_pass(job: dict, manifest: pa.Table, spec) -> tuple[int, int, int]:
    """Per-frame JPEG from the legacy HDF5: each sample's frames decoded from their own JPEGs."""
    import av
    import h5py
    import simplejpeg

    h5_of = {Path(u).stem: Path(job["h5"]) / f"{Path(u).stem}.h5" for u in manifest.column("uri").to_pylist()}
    names, plan = _plan(manifest, spec, "uri")
    order = np.random.default_rng(5).permutation(plan.n)[: job["limit"]]
    files: dict = {}
    h, w = spec.image_size
    delivered = 0
    for i in order.tolist():
        c = int(plan.code[i])
        f = files.get(c)
        if f is None:
            f = h5py.File(h5_of[Path(names[c]).stem], "r")
            cams = sorted(f["observations/images"])
            ts = {cam: f[f"timestamps/images/{cam}"][:] for cam in cams}
            files[c] = f = (f, cams, ts, f["timestamps/joints"][:], f["timestamps/action"][:])
        hf, cams, ts, tj, ta = f
        t = int(plan.anchor_ns[i])
        lo, hi = int(plan.lo_ns[c]), int(plan.hi_ns[c])
        for cam in cams:
            for target in np.clip(t + spec.all_frame_offsets_ns(), lo, hi).tolist():
                k = int(np.abs(ts[cam] - target).argmin())
                rgb = simplejpeg.decode_jpeg(bytes(hf[f"observations/images/{cam}"][k]), colorspace="RGB")
                av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
                    width=w, height=h, interpolation="AREA", threads=1
                ).to_ndarray()
                delivered += 1
        pj = np.searchsorted(tj, np.clip(t + spec.proprio_offsets_ns(), lo, hi))
        pa_ = np.searchsorted(ta, np.clip(t + spec.action_offsets_ns(), lo, hi))
        hf["observations/qpos"][int(pj.min()) : int(pj.max()) + 1]
        hf["action"][int(pa_.min()) : int(pa_.max()) + 1]
    return delivered, delivered, len(order)


def decode_floor(manifest: pa.Table, spec, gop_frames: int, limit: int | None = None) -> float:
    """The fewest decodes per delivered frame any decoder needs for the samples of ``manifest`` under
    ``spec``: in every GOP a sample reads, each frame from the keyframe to the last wanted one (P-frames
    need their predecessors), over the frames the samples deliver. Cameras share one timing (the
    corpus's), so one camera stands for all; ``limit``: the first samples of a pass only."""
    names, plan = _plan(manifest, spec, "uri")
    n = plan.n if limit is None else min(limit, plan.n)
    offsets = spec.all_frame_offsets_ns()
    t = plan.anchor_ns[:n, None] + offsets[None, :]
    lo, hi = plan.lo_ns[plan.code[:n]][:, None], plan.hi_ns[plan.code[:n]][:, None]
    frame = np.rint((np.clip(t, lo, hi) - lo) * FPS / 1e9).astype(np.int64)
    code = np.broadcast_to(plan.code[:n, None], frame.shape)
    # the last wanted frame of every (episode, GOP) read
    gop = frame // gop_frames
    key = code.ravel() * (1 << 32) + gop.ravel()
    order = np.lexsort((frame.ravel(), key))
    last = np.r_[key[order][1:] != key[order][:-1], True]
    needed = (frame.ravel()[order][last] - gop.ravel()[order][last] * gop_frames + 1).sum()
    # a sample's frames are delivered one by one even when two of them are the same frame
    return float(needed) / frame.size


def _plan(manifest: pa.Table, spec, key: str):
    """(episode names, the samples of ``manifest``) with episodes coded by ``key``: the samples our
    loaders read, for the loaders that are not ours."""
    from trainer.sampling import plan_samples

    keys = manifest.column(key).to_pylist()
    names = sorted(set(keys))
    index = {n: i for i, n in enumerate(names)}
    code = np.array([index[k] for k in keys])
    return names, plan_samples(
        manifest.column("start_ns").to_numpy(),
        manifest.column("end_ns").to_numpy(),
        code,
        len(names),
        anchors=spec.anchors,
        every_ns=spec.anchor_every_ns,
        end_offset_ns=spec.action_horizon_ns,
    )


def run_pass(job: dict, core: int | None = 0, python: str | None = None, script: list[str] | None = None) -> dict:
    """``job`` in a fresh process pinned to ``core``; its last stdout line is the JSON result."""
    cmd = script or [python or sys.executable, "-m", "benchmarks", "loader", "--measure", json.dumps(job)]
    pre = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, preexec_fn=pre, env=env, check=False, timeout=3600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])}... exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- LeRobot --------------------------------------------------------------------------------------
def lerobot_venv() -> Path | None:
    for candidate in (os.environ.get("DYNA_LEROBOT_V21_VENV"), str(ROOT / "build" / "lerobot-v21-venv")):
        if candidate and (Path(candidate) / ".lerobot-stamp").exists():
            return Path(candidate)
    return None


def lerobot_episodes(c: dict) -> list[str]:
    """The episodes LeRobot's writer gets: the first few (its writer PNG-encodes every frame, ~0.1 s
    each at 640x480: the whole corpus would take hours). Every random-order loader reads its samples
    from these same episodes; a sample costs the same whichever episode it comes from."""
    return c["episodes"][: LEROBOT_EPISODES[c["size"]]]


def lerobot_dataset(venv: Path, root: Path, c: dict) -> Path:
    """The corpus written by LeRobot's own writer (frames from the same JPEGs); reused when present."""
    out = root / "lerobot"
    if (out / "meta" / "info.json").exists():
        return out
    import h5py

    src = root / "lerobot-src"
    src.mkdir(exist_ok=True)
    for eid in lerobot_episodes(c):
        with h5py.File(root / "h5" / f"{eid}.h5", "r") as f:
            cams = sorted(f["observations/images"])
            ts = {cam: f[f"timestamps/images/{cam}"][:] for cam in cams}
            n = min(len(t) for t in ts.values())
            grid = ts[cams[0]][0] + np.arange(n) * int(1e9 / FPS)
            tj, ta = f["timestamps/joints"][:], f["timestamps/action"][:]
            state = f["observations/qpos"][:][np.clip(np.searchsorted(tj, grid), 0, len(tj) - 1)]
            action = f["action"][:][np.clip(np.searchsorted(ta, grid), 0, len(ta) - 1)]
            arrays = {"state": state.astype(np.float32), "action": action.astype(np.float32)}
            for cam in cams:
                idx = np.clip(np.searchsorted(ts[cam], grid), 0, len(ts[cam]) - 1)
                jpegs = [bytes(f[f"observations/images/{cam}"][k]) for k in idx]
                arrays[f"{cam}_jpeg"] = np.frombuffer(b"".join(jpegs), np.uint8)
                arrays[f"{cam}_offsets"] = np.cumsum([0] + [len(j) for j in jpegs]).astype(np.int64)
            np.savez(src / f"{eid}.npz", fps=FPS, cameras=np.array(cams), task="pick place", **arrays)
    print(f"  writing the LeRobot dataset with LeRobot's writer ({venv.name}) ...", flush=True)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(ROOT / "benchmarks" / "_lerobot_peer.py"), "create", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
        timeout=7200,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"LeRobot writer failed:\n{proc.stderr[-3000:]}")
    return out


def lerobot_pass(
    venv: Path,
    dataset: Path,
    c: dict,
    manifest: pa.Table,
    dense: bool,
    limit: int,
    tmp: Path,
    adjacent_hw: list | None = None,
) -> dict:
    """LeRobot's loader over samples equivalent to ours: the same anchors, as LeRobot frame indices."""
    spec = sample_spec(dense, adjacent_hw=adjacent_hw)
    episode_index = {eid: k for k, eid in enumerate(lerobot_episodes(c))}
    first_ns: dict[str, int] = {}
    for eid, start in zip(
        manifest.column("episode_id").to_pylist(), manifest.column("start_ns").to_pylist(), strict=True
    ):
        first_ns.setdefault(eid, start)
    names, plan = _plan(manifest, spec, "episode_id")
    order = np.random.default_rng(5).permutation(plan.n)[:limit]
    # LeRobot addresses a sample by (episode, frame): the anchor's frame at 30 fps from the episode's start.
    indices = [
        (
            names[int(plan.code[i])],
            int(round((int(plan.anchor_ns[i]) - first_ns[names[int(plan.code[i])]]) * FPS / 1e9)),
        )
        for i in order.tolist()
    ]
    delta = {
        **{f"observation.images.{cam}": (spec.all_frame_offsets_ns() / 1e9).round(6).tolist() for cam in _cameras(c)},
        "observation.state": (spec.proprio_offsets_ns() / 1e9).round(6).tolist(),
        "action": (spec.action_offsets_ns() / 1e9).round(6).tolist(),
    }
    plan_file = tmp / "lerobot-plan.json"
    plan_file.write_text(
        json.dumps(
            {
                "delta_timestamps": delta,
                "samples": [[episode_index[e], f] for e, f in indices],
                "num_workers": 0,
                "batch_size": 8,
                "torch_threads": 1,
                "profile_samples": 0,
            }
        )
    )
    out = tmp / "lerobot-out.json"
    run_pass(
        {},
        script=[
            str(venv / "bin" / "python"),
            str(ROOT / "benchmarks" / "_lerobot_peer.py"),
            "load",
            str(dataset),
            str(plan_file),
            str(out),
        ],
    )
    got = json.loads(out.read_text())
    # Its decodes are torchcodec's, not counted; bytes from disk and peak memory as for ours.
    return {
        "kind": "lerobot",
        "samples": got["samples"],
        "seconds": got["seconds"],
        "samples_per_s": got["samples_per_s"],
        "decodes_per_frame": None,
        "bytes_per_sample": got["io"]["read_bytes_per_sample"],
        "peak_rss_mib": got["memory"]["ru_maxrss_self_kb"] / 1024,
        "cpu_ms_per_sample": got["cpu"]["ms_per_sample"],
        "video_backend": got["video_backend"],
        "codebase_version": got["codebase_version"],
        "dataset_bytes": got["dataset_bytes"],
    }


def _cameras(c: dict) -> list[str]:
    from dyna_resources.episodes.mcap_reader import EpisodeReader

    with EpisodeReader(c["manifest"].column("uri")[0].as_py()) as r:
        return r.cameras


# ---- training: the demo model's data wait ---------------------------------------------------------
def demo_config(manifest_arrow: str, run_dir: Path, steps: int, stream: str | None, **loader):
    """The demo model's training config on the dense set (``loader``: ``LoaderConfig`` fields)."""
    from trainer.dataset import SampleSpec
    from trainer.train import LoaderConfig, TrainConfig

    return TrainConfig(
        manifest=manifest_arrow,
        run_dir=str(run_dir),
        steps=steps,
        checkpoint_every=10**6,
        log_every=10**6,
        loader=LoaderConfig(kind="gop", **loader),
        sample=SampleSpec(anchors="every", anchor_every_s=0.1, stream=stream),
    )


def train_wait(tmp: Path, manifest: pa.Table, steps: int, stream: str | None = None) -> dict:
    from dyna_resources.catalog.manifest import write_manifest
    from trainer.train import run

    files = write_manifest(manifest, tmp / "manifests", "loader-bench")
    summary = run(demo_config(files.arrow, tmp / "run", steps, stream))
    out = {
        k: getattr(summary, k)
        for k in (
            "data_wait_first_epoch",
            "data_wait_fraction",
            "decodes_per_frame",
            "samples_per_s",
            "first_epoch_steps",
            "steps",
        )
    }
    # The first batch also waits for the DataLoader worker to start (a process, imports, its first unit):
    # once per run, whatever the epoch's length; shown apart so a short run's figure can be read.
    out["first_batch_wait_s"] = summary.step_wait_s[0] if summary.step_wait_s else None
    out["data_wait_after_first_batch"] = _after_first(summary)
    return out


def _after_first(summary) -> float | None:
    waits, compute = summary.step_wait_s[1:], summary.step_compute_s[1:]
    return sum(waits) / (sum(waits) + sum(compute)) if waits else None


# ---- cold from the origin: the object server, no prewarm -------------------------------------------
BUCKET = "bench"


def epoch_steps(manifest: pa.Table, stream: str | None) -> int:
    """Steps of the demo model's first epoch (one rank) on the dense set."""
    from trainer.elastic import ElasticStream

    cfg = demo_config("", Path(), 0, stream)
    return ElasticStream(manifest, cfg.sample, batch_size=cfg.batch_size).batches_per_epoch


def origin_wait(
    tmp: Path,
    manifest: pa.Table,
    stream: str,
    *,
    prefetch_batches: int = 16,
    latency_s: float = 0.02,
    bandwidth_Bps: float = 100e6,
):
    """The demo model's first epoch read cold from the loopback object server (S3 API, ``latency_s`` to first
    byte, ``bandwidth_Bps`` per connection) through an empty node page cache with the origin prefetch
    (``prefetch_batches`` ahead; 0: read-through only) and no prewarm; and the bytes served against the
    bytes the epoch needs (a prewarm plan's exact ranges)."""
    from benchmarks.object_server import ObjectServer
    from dyna_resources.catalog.manifest import write_manifest
    from dyna_resources.storage.cache_fs import CachedFileSystem
    from dyna_resources.storage.origins import Origins
    from dyna_resources.storage.page_cache import CacheConfig, PageCache
    from dyna_resources.storage.prewarm import ReadSet, plan_manifest
    from dyna_resources.storage.stores import Store
    from trainer.train import run

    served = tmp / "origin"
    (served / BUCKET).mkdir(parents=True)
    uris = []
    for u in manifest.column("uri").to_pylist():
        src = Path(u.removeprefix("file://"))
        dst = served / BUCKET / src.parent.name / src.name
        if not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            os.link(src, dst)  # the server refuses symlinks that lead out of its root
        uris.append(f"s3://{BUCKET}/{src.parent.name}/{src.name}")
    remote = manifest.set_column(manifest.column_names.index("uri"), "uri", pa.array(uris))
    files = write_manifest(remote, tmp / "manifests", "loader-bench-origin")
    steps = epoch_steps(remote, stream)  # one whole first epoch
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with ObjectServer(served, latency_s=latency_s, bandwidth_Bps=bandwidth_Bps) as server:
        os.environ["DYNA_S3_ENDPOINT_URL"] = server.endpoint_url
        store = Store.from_url(f"s3://{BUCKET}", endpoint_url=server.endpoint_url)
        for u in dict.fromkeys(uris):  # the server computes each ETag once, on first use: not timed
            store.info(u.removeprefix(f"s3://{BUCKET}/"))
        server.reset_counters()
        cfg = demo_config(files.arrow, tmp / "run-origin", steps, stream, prefetch_batches=prefetch_batches)
        summary = run(dataclasses.replace(cfg, cache_dir=str(tmp / "node-cache")))
        counts = server.counters.snapshot()
        with PageCache(CacheConfig(root=str(tmp / "plan-cache")), Origins.from_env()) as cache:
            plan = plan_manifest(remote, CachedFileSystem(cache), ReadSet(video_stream=stream))
    return {
        "data_wait_first_epoch": summary.data_wait_first_epoch,
        "samples_per_s": summary.samples_per_s,
        "steps": summary.steps,
        "first_epoch_steps": summary.first_epoch_steps,
        "first_batch_wait_s": summary.step_wait_s[0] if summary.step_wait_s else None,
        "data_wait_after_first_batch": _after_first(summary),
        "origin_bytes": counts["bytes_served"],
        "origin_gets": counts["operations"].get("GetObject", 0),
        "needed_bytes": plan.bytes,
        "origin_bytes_over_needed": counts["bytes_served"] / plan.bytes if plan.bytes else None,
        "prefetch_batches": prefetch_batches,
        "latency_s": latency_s,
        "bandwidth_MBps": bandwidth_Bps / 1e6,
    }


# ---- main -----------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks loader", description=__doc__.split("\n")[0])
    add_size_flags(ap, quick="6 episodes of 20 s")
    ap.add_argument("--dir", help="keep the corpus here and reuse it (default: a temp folder)")
    ap.add_argument("--episodes", type=int)
    ap.add_argument("--duration", type=float)
    ap.add_argument("--random-samples", type=int, help="samples each random-order loader reads (default 300)")
    ap.add_argument("--steps", type=int, help="training steps for the data-wait figure (default 80)")
    ap.add_argument(
        "--mix-sweep",
        action="store_true",
        help="only the GOP-aware loader on the dense set at mix_units 1, 3 and 8 (its randomness knob)",
    )
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one pass in this process
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return 0
    if args.mix_sweep:
        return mix_sweep(args)
    size = size_of(args)
    tiny = size == "tiny"
    n = args.episodes or {"full": 16, "quick": 6, "tiny": 2}[size]
    duration = args.duration or {"full": 30.0, "quick": 20.0, "tiny": 6.0}[size]
    width, height, gop = (64, 48, 30) if tiny else (640, 480, 150)
    limit = args.random_samples or {"full": 300, "quick": 150, "tiny": 8}[size]
    steps = args.steps or {"full": 80, "quick": 40, "tiny": 4}[size]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dyna-bench-loader-"))
    print(
        f"corpus: {n} episodes x {duration:g} s, 3 cameras {width}x{height} @ {FPS} Hz, GOP {gop} ({base})", flush=True
    )
    c = corpus(base / "corpus", n, duration, width, height, gop, size)
    manifest = c["manifest"]
    arrow = base / "manifest.arrow"
    with pa.OSFile(str(arrow), "wb") as f, pa.ipc.new_file(f, manifest.schema) as w:
        w.write_table(manifest)
    stream_manifest = manifest.set_column(
        manifest.column_names.index("uri"),
        "uri",
        pa.array([u.replace("/mcap/", "/mcap-t128/") for u in manifest.column("uri").to_pylist()]),
    )
    arrow_t = base / "manifest-t128.arrow"
    with pa.OSFile(str(arrow_t), "wb") as f, pa.ipc.new_file(f, stream_manifest.schema) as w:
        w.write_table(stream_manifest)
    # The random-order loaders read samples of the episodes LeRobot's writer got (see lerobot_episodes).
    in_subset = pa.array([e in set(lerobot_episodes(c)) for e in manifest.column("episode_id").to_pylist()])
    subset = manifest.filter(in_subset)
    arrow_s, arrow_st = base / "manifest-subset.arrow", base / "manifest-subset-t128.arrow"
    for path, table in ((arrow_s, subset), (arrow_st, stream_manifest.filter(in_subset))):
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    folders = [base / "corpus"]
    venv = lerobot_venv()
    results: dict = {
        "size": size,
        "episodes": n,
        "episode_s": duration,
        "resolution": f"{width}x{height}",
        "gop_frames": gop,
        "segments": manifest.num_rows,
        "cores": os.cpu_count(),
        "corpus_bytes": c["bytes"],
        "sets": {},
    }
    lerobot_ds = None
    if venv is not None:
        try:
            lerobot_ds = lerobot_dataset(venv, base / "corpus", c)
        except (RuntimeError, subprocess.SubprocessError) as e:
            results["lerobot_error"] = str(e)[-500:]
    for set_name, dense in (("dense", True), ("sparse", False), ("adjacent", True)):
        rows = {}
        jobs = {
            "gop": {"kind": "gop", "dense": dense},
            "random": {"kind": "random", "dense": dense, "limit": limit},
            "random_t128": {"kind": "random", "dense": dense, "limit": limit, "stream": TRAINING_STREAM},
            "gop_t128": {"kind": "gop", "dense": dense, "stream": TRAINING_STREAM},
            "jpeg": {"kind": "jpeg", "dense": dense, "limit": limit, "h5": str(base / "corpus" / "h5")},
        }
        adjacent_hw = [height, width] if set_name == "adjacent" else None
        if adjacent_hw:  # the archive at full resolution, as LeRobot returns frames; t128 at its own size (as a read
            del jobs["jpeg"]  # profile reads it, no resize); the JPEG loader is not compared here
            for job in jobs.values():
                job["adjacent_hw"] = [128, 128] if job.get("stream") else adjacent_hw
        elif dense:  # the cameras of a unit decoded on threads (libavcodec and swscale release the GIL), 2 cores
            jobs["gop_threads"] = {"kind": "gop", "dense": True, "threads": 3, "cores": 2}
        elif tiny:  # CI: the sparse set's code paths are the dense set's; one pass of each kind is enough
            jobs = {k: jobs[k] for k in ("gop", "random")}
        for name, job in jobs.items():
            random_order = job["kind"] != "gop"
            job["manifest"] = str(
                {(False, False): arrow, (False, True): arrow_t, (True, False): arrow_s, (True, True): arrow_st}[
                    (random_order, bool(job.get("stream")))
                ]
            )
            job["batch_size"] = 2 if tiny else 8
            drop_page_cache(*folders)
            rows[name] = run_pass(job, core=0 if job.get("cores", 1) == 1 else None)
            print(f"  {set_name:6} {name:12} {rows[name]['samples_per_s']:8.1f} samples/s", flush=True)
        if lerobot_ds is not None and (not tiny or adjacent_hw):  # CI: LeRobot's process once, on the adjacent set
            drop_page_cache(*folders)
            assert venv is not None  # a LeRobot dataset was built with it
            try:
                rows["lerobot"] = lerobot_pass(venv, lerobot_ds, c, subset, dense, limit, base, adjacent_hw)
                print(f"  {set_name:6} lerobot      {rows['lerobot']['samples_per_s']:8.1f} samples/s", flush=True)
            except (RuntimeError, subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
                results["lerobot_error"] = str(e)[-500:]
        results["sets"][set_name] = rows
    drop_page_cache(*folders)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        results["training"] = train_wait(Path(tmp), manifest, steps)
    drop_page_cache(*folders)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        # one whole first epoch, as the runs from the object server below read (side by side)
        results["training_t128"] = train_wait(
            Path(tmp), stream_manifest, epoch_steps(stream_manifest, TRAINING_STREAM), TRAINING_STREAM
        )
    for key, ahead in (("training_t128_origin", 16), ("training_t128_origin_readthrough", 0)):
        drop_page_cache(*folders)
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            results[key] = origin_wait(Path(tmp), stream_manifest, TRAINING_STREAM, prefetch_batches=ahead)
    dense = results["sets"]["dense"]
    lr = dense.get("lerobot", {}).get("samples_per_s")
    adjacent = results["sets"]["adjacent"]
    floor = decode_floor(manifest, sample_spec(True, adjacent_hw=[height, width]), gop)
    floor_t = decode_floor(manifest, sample_spec(True, adjacent_hw=[height, width]), TRAINING_GOP)
    lr_cpu = adjacent.get("lerobot", {}).get("cpu_ms_per_sample")

    def cpu_speedup(name: str) -> float | None:
        return lr_cpu / adjacent[name]["cpu_ms_per_sample"] if lr_cpu else None

    results.update(
        adjacent_decode_floor=floor,
        adjacent_decode_floor_t128=floor_t,
        adjacent_cpu_ms_gop_archive=adjacent["gop"]["cpu_ms_per_sample"],
        adjacent_cpu_ms_random_archive=adjacent["random"]["cpu_ms_per_sample"],
        adjacent_cpu_ms_gop_t128=adjacent["gop_t128"]["cpu_ms_per_sample"],
        adjacent_cpu_ms_lerobot=lr_cpu,
        adjacent_cpu_gop_archive_over_lerobot=adjacent["gop"]["cpu_ms_per_sample"] / lr_cpu if lr_cpu else None,
        adjacent_decodes_over_floor=adjacent["gop"]["decodes_per_frame"] / floor,
        adjacent_decodes_over_floor_t128=adjacent["gop_t128"]["decodes_per_frame"] / floor_t,
        training_stream_gop_cpu_speedup_vs_lerobot=cpu_speedup("gop_t128"),
        training_stream_random_cpu_speedup_vs_lerobot=cpu_speedup("random_t128"),
        data_wait_first_epoch_from_origin=results["training_t128_origin"]["data_wait_first_epoch"],
        data_wait_first_epoch_from_origin_readthrough=results["training_t128_origin_readthrough"][
            "data_wait_first_epoch"
        ],
        origin_bytes_over_needed=results["training_t128_origin"]["origin_bytes_over_needed"],
    )
    results.update(
        gop_aware_samples_per_s=dense["gop"]["samples_per_s"],
        random_samples_per_s=dense["random"]["samples_per_s"],
        random_t128_samples_per_s=dense["random_t128"]["samples_per_s"],
        lerobot_samples_per_s=lr,
        jpeg_samples_per_s=dense["jpeg"]["samples_per_s"],
        decodes_per_frame_gop_aware=dense["gop"]["decodes_per_frame"],
        data_wait_first_epoch=results["training"]["data_wait_first_epoch"],
        data_wait_first_epoch_t128=results["training_t128"]["data_wait_first_epoch"],
        gop_t128_samples_per_s=dense["gop_t128"]["samples_per_s"],
        gop_t128_vs_lerobot=dense["gop_t128"]["samples_per_s"] / lr if lr else None,
        gop_vs_lerobot=dense["gop"]["samples_per_s"] / lr if lr else None,
        random_t128_vs_lerobot=dense["random_t128"]["samples_per_s"] / lr if lr else None,
        lerobot_venv=str(venv) if venv else None,
    )
    _table(results)
    print(json.dumps(results, default=str))
    return 0


def mix_sweep(args) -> int:
    """The bounded mix's effect, cold, one core: randomness (units and episodes per batch) against
    decoded frames held (peak memory) and speed, on the same corpus as the main run."""
    size = size_of(args)
    n = args.episodes or {"full": 16, "quick": 6, "tiny": 2}[size]
    duration = args.duration or {"full": 30.0, "quick": 20.0, "tiny": 6.0}[size]
    width, height, gop = (64, 48, 30) if size == "tiny" else (640, 480, 150)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dyna-bench-loader-"))
    c = corpus(base / "corpus", n, duration, width, height, gop, size)
    arrow = base / "manifest.arrow"
    with pa.OSFile(str(arrow), "wb") as f, pa.ipc.new_file(f, c["manifest"].schema) as w:
        w.write_table(c["manifest"])
    rows = {}
    for mix in (1, 3, 8):
        drop_page_cache(base / "corpus")
        rows[mix] = run_pass(
            {
                "kind": "gop",
                "dense": True,
                "mix_units": mix,
                "manifest": str(arrow),
                "batch_size": 2 if size == "tiny" else 8,
            }
        )
    print(f"\nmix_units sweep ({size}): GOP-aware, dense set, one core, cold, batch 8, one lane")
    print(
        f"{'mix_units':>9}{'samples/s':>11}{'dec/frame':>10}{'units/batch':>12}{'episodes/batch':>15}"
        f"{'units in flight':>16}{'peak MiB':>9}"
    )
    for mix, m in rows.items():
        print(
            f"{mix:>9}{m['samples_per_s']:>11.1f}{m['decodes_per_frame']:>10.2f}{m['units_per_batch']:>12.2f}"
            f"{m['episodes_per_batch']:>15.2f}{m['max_units_in_flight']:>16}{m['peak_rss_mib']:>9.0f}"
        )
    print(json.dumps({"size": size, "mix_sweep": rows}))
    return 0


def _table(r: dict) -> None:
    print()
    print(
        f"loader benchmark ({r['size']}): {r['episodes']} episodes x {r['episode_s']:g} s, 3 cameras {r['resolution']}, "
        f"GOP {r['gop_frames']}, {r['segments']} segments of {SEGMENT_S:g} s; one core per loader, cold"
    )
    mib = {k: v / 2**20 for k, v in r["corpus_bytes"].items()}
    print(
        f"corpus bytes: HDF5/JPEG {mib['h5']:.0f} MiB, MCAP {mib['mcap']:.0f} MiB, MCAP + t128 {mib['mcap-t128']:.0f} MiB"
    )
    head = (
        f"{'set':9}{'loader':14}{'stream':9}{'samples':>8}{'samples/s':>11}{'CPU ms':>8}{'dec/frame':>10}"
        f"{'KiB/sample':>11}{'peak MiB':>9}"
    )
    print(head)
    print("-" * len(head))
    for set_name, rows in r["sets"].items():
        for name, m in rows.items():
            stream = {"jpeg": "jpeg", "lerobot": "av1"}.get(name, "t128" if "t128" in name else "archive")
            stream += "*" if name == "gop_threads" else ""
            dpf = m.get("decodes_per_frame")
            cpu = m.get("cpu_ms_per_sample")
            print(
                f"{set_name:9}{name:14}{stream:9}{m['samples']:>8}{m['samples_per_s']:>11.1f}"
                f"{(f'{cpu:.1f}' if cpu else '-'):>8}{(f'{dpf:.2f}' if dpf else '-'):>10}"
                f"{m.get('bytes_per_sample', 0) / 1024:>11.1f}{m.get('peak_rss_mib', 0):>9.0f}"
            )
    print("* gop_threads: the unit's 3 cameras on 3 decode threads over both cores (every other row: one core)")
    print(
        f"adjacent (t and t + 1/{FPS} s of every camera, 1 s of joint states, an anchor every 3rd frame, full "
        f"resolution out): GOP-aware archive {r['adjacent_cpu_ms_gop_archive']:.1f} CPU ms a sample, "
        f"{r['adjacent_decodes_over_floor']:.2f}x the decode floor ({r['adjacent_decode_floor']:.2f} decodes a "
        f"delivered frame); t128 (128x128 out) {r['adjacent_cpu_ms_gop_t128']:.1f} ms, "
        f"{r['adjacent_decodes_over_floor_t128']:.2f}x its floor ({r['adjacent_decode_floor_t128']:.2f})"
        + (
            f"; LeRobot {r['adjacent_cpu_ms_lerobot']:.1f} ms: archive {r['adjacent_cpu_gop_archive_over_lerobot']:.2f}x "
            f"LeRobot's CPU, t128 GOP-aware {r['training_stream_gop_cpu_speedup_vs_lerobot']:.1f}x and random "
            f"{r['training_stream_random_cpu_speedup_vs_lerobot']:.1f}x faster"
            if r.get("adjacent_cpu_ms_lerobot")
            else ""
        )
    )
    for key, how in (("training_t128_origin", "origin prefetch"), ("training_t128_origin_readthrough", "read-through")):
        o = r[key]
        print(
            f"cold from the object server ({o['latency_s'] * 1e3:.0f} ms, {o['bandwidth_MBps']:.0f} MB/s a "
            f"connection), no prewarm, {how}, t128, demo model, one whole first epoch ({o['steps']} steps): "
            f"data wait {o['data_wait_first_epoch']:.1%}, {o['samples_per_s']:.1f} samples/s, first batch waited "
            f"{o['first_batch_wait_s']:.2f} s, later batches {o['data_wait_after_first_batch']:.1%}; "
            f"origin bytes {o['origin_bytes'] / 2**20:.1f} MiB in {o['origin_gets']} "
            f"GETs = {o['origin_bytes_over_needed']:.3f}x the {o['needed_bytes'] / 2**20:.1f} MiB the epoch needs"
        )
    if r.get("lerobot_error"):
        print(f"lerobot: {r['lerobot_error']}")
    elif r.get("lerobot_venv") is None:
        print("lerobot: skipped (no lerobot v2.1 venv: `make lerobot-v21-venv`)")
    for key, stream in (("training", "archive"), ("training_t128", "t128")):
        t = r[key]
        print(
            f"training on {stream:7} (demo model, dense set, GOP-aware, 1 worker, {t['steps']} steps, "
            f"{t['first_epoch_steps']} in epoch 0): first-epoch data wait {t['data_wait_first_epoch']:.1%}, "
            f"{t['samples_per_s']:.1f} samples/s, {t['decodes_per_frame']:.2f} decodes per delivered frame; "
            f"first batch waited {t['first_batch_wait_s']:.2f} s (worker start), later batches "
            f"{t['data_wait_after_first_batch']:.1%}"
        )
    if r.get("gop_vs_lerobot"):
        print(
            f"GOP-aware / LeRobot: {r['gop_vs_lerobot']:.1f}x; random on t128 / LeRobot: "
            f"{r['random_t128_vs_lerobot']:.1f}x"
        )
    print()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
