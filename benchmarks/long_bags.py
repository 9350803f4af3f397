"""A long ROS 2 bag cut into episodes by the topic map's split rule: what reading it costs, by its length.

`python -m benchmarks long_bags [--quick | --tiny]`

One recording of K episodes of the fleet's length (30 s, three 640x480 JPEG cameras, 200 Hz joint states;
`--quick` 6 s at 320x240, `--tiny` 1.5 s at 64x48), 5 s of silence between them, cut back into them by
``split: {rule: gap}``. Two ways of reading it, each phase in a fresh process with the bag's pages dropped
from the page cache first (cold):

- **windowed** (this code): the pre gates plan the bag in one pass that keeps no frame (``plan_bag``) and
  read each episode from its own log-time window (``read_member``); each worker's transcode reads its
  episode's window again.
- **whole** (before 1d8f83c): the pre gates read the whole bag with every episode's frames in memory, and
  each worker's transcode reads the whole bag again to take its episode from it.

Per K: the read CPU of each phase (all K transcode reads summed), the memory each phase held (its peak
RSS over the process's own once imported), and the bytes the K transcodes would stage from an object store
(each its window's byte ranges of the bag's MCAP, against K whole bags). The reads' CPU and the staged
bytes are fitted (windowed linear, whole quadratic: each of K transcodes reads K episodes) and both are
extrapolated to a 1 h bag (120 episodes).

Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from ._cli import add_size_flags, size_of

SIZES = {  # episodes per bag, episode length (s), width, height
    "full": ((2, 4, 8, 16), 30.0, 640, 480),
    "quick": ((2, 4, 8), 6.0, 320, 240),
    "tiny": ((1, 2), 1.5, 64, 48),
}
HOUR_EPISODES = 120  # a 1 h bag of 30 s episodes


def _rss_kb() -> int:
    """The process's resident memory now, its peak reset to it (Linux: clear_refs 5), so that
    :func:`_peak_kb` is the peak from here on, not the imports'."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS")


def _peak_kb() -> int:
    return _status_kb("VmHWM")


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def _drop_cache(bag: Path) -> None:
    os.sync()  # a page still being written back is not dropped
    for p in bag.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _whole_read(bag: Path, topics) -> list:
    """The way before windows: every episode of the bag read at once (what ``read_bag`` did)."""
    from dyna_resources.sources import ros2

    with ros2.Bag(bag, topics) as b:
        series, ignored, markers = ros2._read(bag, b._reader, topics)
    base, meta = ros2._episode_id(bag, b.info), ros2._meta(b.info, topics)
    cuts = ros2._cuts(series, topics, markers)
    return [
        ros2._episode(bag, f"{base}-{k:03d}", meta, series, lo, hi, topics, ignored) for k, (lo, hi) in enumerate(cuts)
    ]


def _phase(bag: str, topics_doc: dict, way: str, phase: str, episodes: int) -> dict:
    """One phase (the windowed way: its pre gates'), in this (fresh) process: its CPU and the memory it held
    above the process's imports."""
    from dyna_resources.sources.ros2 import Bag
    from dyna_resources.sources.topic_map import parse

    path, topics = Path(bag), parse(topics_doc, "bench")
    _imported()
    base_kb = _rss_kb()
    c0 = time.process_time()
    frames = 0
    if way == "windowed":  # pre: the plan, then each episode read (and inspected) in turn, one reader
        with Bag(path, topics) as b:
            frames = sum(sum(len(c) for c in b.read(m).cameras.values()) for m in b.plan())
    elif phase == "pre":
        frames = sum(len(c) for ep in _whole_read(path, topics) for c in ep.cameras.values())
    else:
        for k in range(episodes):  # each worker reads the whole bag, keeps its episode
            frames += sum(len(c) for c in _whole_read(path, topics)[k].cameras.values())
    cpu = time.process_time() - c0
    held_mb = (_peak_kb() - base_kb) / 1024
    return {"cpu_s": cpu, "held_mb": held_mb, "frames": frames}


def _transcode_reads(bag: str, topics_doc: dict) -> dict:
    """The windowed transcode side: each member read from the window the registry hands its worker (the
    plan is the pre gates', not charged here); the memory is one episode's, as one worker holds."""
    from dyna_resources.sources.ros2 import plan_bag, read_member
    from dyna_resources.sources.topic_map import parse

    path, topics = Path(bag), parse(topics_doc, "bench")
    members = plan_bag(path, topics)
    _drop_cache(path)
    _imported()
    base_kb = _rss_kb()
    c0 = time.process_time()
    frames = sum(sum(len(c) for c in read_member(path, topics, m).cameras.values()) for m in members)
    cpu = time.process_time() - c0
    return {
        "cpu_s": cpu,
        "held_mb": (_peak_kb() - base_kb) / 1024,
        "frames": frames,
    }


def _staged_bytes(bag: Path, topics_doc: dict) -> int:
    """What the K transcodes stage from an object store, all together: each the byte ranges of its window
    (``sources.mcap_window``, what ``ObjectLandingZone.stage_window`` fetches) and the bag's metadata.yaml;
    the whole-bag way stages K whole bags."""
    from dyna_resources.sources.mcap_window import window_ranges
    from dyna_resources.sources.ros2 import plan_bag
    from dyna_resources.sources.topic_map import parse

    (storage,) = bag.glob("*.mcap")
    size = storage.stat().st_size

    def read(lo: int, hi: int) -> bytes:
        with open(storage, "rb") as f:
            f.seek(lo)
            return f.read(hi - lo)

    total = 0
    for m in plan_bag(bag, parse(topics_doc, "bench")):
        ranges = window_ranges(read, size, m.log_lo, m.log_hi) or [(0, size)]
        total += sum(hi - lo for lo, hi in ranges) + (bag / "metadata.yaml").stat().st_size
    return total


def _imported() -> None:
    """What a worker has imported before it reads its first bag: not charged to the read."""
    import rosbags.highlevel  # noqa: F401 (imported before the timed read)
    from rosbags.typesys import Stores, get_typestore

    get_typestore(Stores.ROS2_HUMBLE)


def _in_fresh_process(fn, *args) -> dict:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def run(size: str, workdir: str | None = None, seed: int = 29) -> dict:
    from dyna_resources.episodes.raw_format import RawEpisode
    from dyna_resources.episodes.sim import generate_fleet
    from dyna_resources.sources import samples

    counts, dur, w, h = SIZES[size]
    out: dict = {"size": size, "episode_s": dur, "resolution": f"{w}x{h}", "bags": []}
    with tempfile.TemporaryDirectory(prefix="dyna-long-bags-", dir=workdir) as tmp:
        tmp_p = Path(tmp)
        (gen,) = generate_fleet(tmp_p / "fleet", 1, seed=seed, width=w, height=h, duration_s=dur, workers=1)
        with RawEpisode(gen.path) as raw:
            doc = {**samples.topic_map(sorted(raw.cameras)), "split": {"rule": "gap", "gap_s": 2.0}}
        for k in counts:
            bag = tmp_p / f"bag-{k}"
            samples.write_bag([gen.path] * k, bag, gap_s=5.0)
            row: dict = {"episodes": k, "bag_mb": sum(p.stat().st_size for p in bag.iterdir()) / 2**20}
            for way in ("windowed", "whole"):
                for phase in ("pre", "transcode"):
                    _drop_cache(bag)
                    if way == "windowed" and phase == "transcode":
                        r = _in_fresh_process(_transcode_reads, str(bag), doc)
                    else:
                        r = _in_fresh_process(_phase, str(bag), doc, way, phase, k)
                    row[f"{way}_{phase}"] = r
            assert row["windowed_pre"]["frames"] == row["whole_pre"]["frames"]  # the same episodes both ways
            row["staged_mb"] = _staged_bytes(bag, doc) / 2**20
            out["bags"].append(row)
            shutil.rmtree(bag)
    return out


def _fit(ks: list[int], ys: list[float], degree: int, at: int) -> float | None:
    if len(ks) <= degree:
        return None
    return float(np.polyval(np.polyfit(ks, ys, degree), at))


def report(out: dict) -> dict:
    print(f"long bags split by gap: {out['episode_s']:g} s episodes at {out['resolution']}, three JPEG cameras")
    head = (
        f"{'episodes':>8} {'bag MB':>8}  {'windowed pre':>13} {'transcodes':>11}  "
        f"{'whole pre':>10} {'transcodes':>11}  {'read CPU ratio':>14}  {'held MB win/whole (pre)':>24}"
        f"  {'staged MB win/whole':>20}"
    )
    print(head)
    ks, win, whole = [], [], []
    for r in out["bags"]:
        wp, wt, hp, ht = (r[f"{a}_{b}"] for a in ("windowed", "whole") for b in ("pre", "transcode"))
        w_cpu, h_cpu = wp["cpu_s"] + wt["cpu_s"], hp["cpu_s"] + ht["cpu_s"]
        r["read_cpu_ratio"] = h_cpu / w_cpu if w_cpu else None
        ks.append(r["episodes"])
        win.append(w_cpu)
        whole.append(h_cpu)
        print(
            f"{r['episodes']:>8} {r['bag_mb']:>8.1f}  {wp['cpu_s']:>11.2f} s {wt['cpu_s']:>9.2f} s  "
            f"{hp['cpu_s']:>8.2f} s {ht['cpu_s']:>9.2f} s  {r['read_cpu_ratio'] or 0:>13.2f}x  "
            f"{wp['held_mb']:>11.0f} / {hp['held_mb']:<10.0f}"
            f"  {r['staged_mb']:>9.0f} / {r['episodes'] * r['bag_mb']:<8.0f}"
        )
    hour = HOUR_EPISODES if out["size"] == "full" else None
    figures: dict = {
        "benchmark": "long_bags",
        "size": out["size"],
        "episode_s": out["episode_s"],
        "bags": out["bags"],
    }
    if hour:
        w_hour, h_hour = _fit(ks, win, 1, hour), _fit(ks, whole, 2, hour)
        held = [r["whole_pre"]["held_mb"] for r in out["bags"]]
        staged = [r["staged_mb"] for r in out["bags"]]
        whole_staged = [r["episodes"] * r["bag_mb"] for r in out["bags"]]
        figures.update(
            {
                "windowed_read_cpu_s_1h_bag": w_hour,
                "whole_read_cpu_s_1h_bag": h_hour,
                "read_cpu_ratio_1h_bag": h_hour / w_hour if w_hour and h_hour else None,
                "whole_pre_held_mb_1h_bag": _fit(ks, held, 1, hour),
                "windowed_pre_held_mb_max": max(r["windowed_pre"]["held_mb"] for r in out["bags"]),
                "windowed_staged_gb_1h_bag": (_fit(ks, staged, 1, hour) or 0) / 1024,
                "whole_staged_gb_1h_bag": (_fit(ks, whole_staged, 2, hour) or 0) / 1024,
            }
        )
        print(
            f"1 h bag ({hour} episodes), fitted: reads {w_hour:.0f} CPU s windowed (linear), {h_hour:.0f} whole "
            f"(quadratic): {figures['read_cpu_ratio_1h_bag']:.1f}x; the whole way's pre gates would hold "
            f"{figures['whole_pre_held_mb_1h_bag']:.0f} MB, the windowed way's at most "
            f"{figures['windowed_pre_held_mb_max']:.0f} MB at any length; from an object store its transcodes would "
            f"stage {figures['windowed_staged_gb_1h_bag']:.0f} GB windowed, {figures['whole_staged_gb_1h_bag']:.0f} GB whole"
        )
    return figures


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks long_bags", description=__doc__.splitlines()[0])
    add_size_flags(ap, quick="6 s episodes at 320x240, bags of 2-8 (a minute)")
    ap.add_argument("--workdir", help="where the bags are written (default: the system's temp folder)")
    args = ap.parse_args(argv)
    print(json.dumps(report(run(size_of(args), args.workdir))))
    return 0
