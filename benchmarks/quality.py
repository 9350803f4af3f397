"""Calibration of the ingest quality scores on the sample fleet: where clean episodes sit, and
what the faults read. The figures in ``dyna_resources/ingest/quality.py``'s docstring come from
this run.

`python -m benchmarks quality [--quick | --tiny]`

(a) Smoothness, clean. The joint states of sample-fleet episodes (every task on both robot
    models, 8-16 s at 200 Hz; 3 fleet seeds x 40 episodes, `--quick` 1 x 12, `--tiny` 1 x 4), generated
    without rendering: spike_fraction per task and model at the configured spike_z, and at
    lower z to show the margin.
(b) Smoothness, faults. Single-step velocity glitches (0.5-2 rad/s, random sign, joint and
    step) injected into 20 clean episodes (`--quick` 6, `--tiny` 2) at 0.5-20 % of their steps: the
    measured spike_fraction against the injected one.
(c) Frames. Sample-fleet episodes rendered at 640x480 (`--quick` 160x120, `--tiny` 64x48), one with the
    frozen_camera fault, transcoded: per camera the smallest mean |luma change| between
    consecutive frames of the live picture (what frozen_level must stay below; static scenes
    while the robot pauses included) and the frozen / dark frames the transcode counted.

Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.sim.fleet import (
    SimulatedEpisode,
    fleet_specs,
    write_episode,
)
from dyna_resources.episodes.transcode import (
    TranscodeSettings,
    _luma_sample,
    transcode_episode,
)
from dyna_resources.ingest.quality import QualityConfig, spike_rows

from ._cli import add_size_flags, size_of

FRACTIONS = (0.005, 0.02, 0.05, 0.1, 0.2)


def joint_states(specs) -> list[tuple[str, dict]]:
    return [(f"{s.task}/{s.robot_model}", SimulatedEpisode(s).streams()["joint_states"].fields) for s in specs]


def clean_smoothness(episodes, zs) -> dict:
    """Per task/model: episodes, step range, and the worst spike_fraction at each z."""
    rows: dict[str, dict] = defaultdict(lambda: {"episodes": 0, "steps": [], **{f"z{z:g}": 0.0 for z in zs}})
    for key, js in episodes:
        r = rows[key]
        r["episodes"] += 1
        r["steps"].append(len(js["velocity"]))
        for z in zs:
            r[f"z{z:g}"] = max(r[f"z{z:g}"], float(spike_rows(js, z)[0].mean()))
    return {k: {**v, "steps": [min(v["steps"]), max(v["steps"])]} for k, v in sorted(rows.items())}


def injected(episodes, z: float) -> dict:
    """Injected fraction -> (min, mean, max) of the measured spike_fraction."""
    out = {}
    for frac in FRACTIONS:
        got = []
        for k, (_, js) in enumerate(episodes):
            rng = np.random.default_rng([k, int(frac * 1000)])
            vel = js["velocity"].copy()
            rows = rng.choice(np.arange(2, len(vel) - 2), round(frac * len(vel)), replace=False)
            vel[rows, rng.integers(0, vel.shape[1], len(rows))] += rng.choice([-1, 1], len(rows)) * rng.uniform(
                0.5, 2.0, len(rows)
            )
            got.append(float(spike_rows({**js, "velocity": vel}, z)[0].mean()))
        out[frac] = (min(got), float(np.mean(got)), max(got))
    return out


def at_dataset_rate(episodes, z: float, rate_hz: float = 30.0) -> tuple[float, dict]:
    """The episodes' joint positions as a LeRobot dataset holds them (interpolated at ``rate_hz``, velocity
    their step differences): the worst clean spike_fraction, and injected single-step velocity glitches
    (as large as the joint's fastest step) -> the mean measured spike_fraction."""
    resampled = []
    for _, js in episodes:
        pos = np.asarray(js["position"], np.float64)
        t = np.arange(len(pos)) / 200.0
        at = np.arange(0.0, t[-1], 1.0 / rate_hz)
        resampled.append(np.stack([np.interp(at, t, pos[:, j]) for j in range(pos.shape[1])], 1))
    clean = max(float(spike_rows({"position": p}, z, rate_hz)[0].mean()) for p in resampled)
    out = {}
    for frac in FRACTIONS[:4]:
        got = []
        for k, pos in enumerate(resampled):
            rng = np.random.default_rng([k, int(frac * 1000)])
            vel = np.diff(pos, axis=0, prepend=pos[:1])
            rows = rng.choice(np.arange(2, len(vel) - 2), max(1, round(frac * len(vel))), replace=False)
            cols = rng.integers(0, vel.shape[1], len(rows))
            vel[rows, cols] += rng.choice([-1, 1], len(rows)) * np.abs(vel).max(axis=0)[cols]
            got.append(float(spike_rows({"position": pos, "velocity": vel}, z, rate_hz)[0].mean()))
        out[frac] = float(np.mean(got))
    return clean, out


def frame_figures(workdir: Path, n: int, width: int, height: int, duration) -> list[dict]:
    """Per camera of ``n`` rendered episodes (the last one with a frozen camera): the smallest
    live frame-to-frame change and the transcode's frozen/dark counts."""
    out = []
    fast = TranscodeSettings(video=VideoSettings(gop_frames=30, preset="ultrafast"))
    for k, spec in enumerate(fleet_specs(n, seed=11, width=width, height=height, duration_s=duration)):
        fault = "frozen_camera" if k == n - 1 else None
        gen = write_episode(spec, workdir / f"{spec.episode_id}.h5", fault=fault)
        cams = transcode_episode(gen.path, workdir / f"{spec.episode_id}.mcap", fast).as_dict()["cameras"]
        frozen = range(gen.fault_detail["from_frame"], gen.fault_detail["to_frame"]) if fault else range(0)
        with RawEpisode(gen.path) as raw:
            for name, cam in sorted(raw.cameras.items()):
                change = _frame_changes(cam)
                live = np.delete(change, [i - 1 for i in frozen]) if name == gen.fault_detail.get("camera") else change
                out.append(
                    {
                        "episode": spec.episode_id,
                        "task": spec.task,
                        "camera": name,
                        "fault": fault or "",
                        "frames": cams[name]["frames"],
                        "live_change_min": round(float(live.min()), 3),
                        "live_change_p50": round(float(np.median(live)), 3),
                        "frozen_injected": len(frozen) if name == gen.fault_detail.get("camera") else 0,
                        "frozen_counted": cams[name]["frozen_frames"],
                        "dark_counted": cams[name]["dark_frames"],
                    }
                )
        gen.path.unlink()
    return out


def _frame_changes(cam) -> np.ndarray:
    """Mean |luma change| from each frame to the next, on the transcode's own luma sample."""
    lumas = [_luma_sample(f) for f in cam.iter_yuv()]
    return np.array([np.abs(b - a).mean() for a, b in pairwise(lumas)])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks quality", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_size_flags(ap, quick="fewer episodes, 160x120 frames")
    args = ap.parse_args(argv)
    size_name = size_of(args)
    z = QualityConfig().spike_z
    t0 = time.perf_counter()
    seeds, per_seed = {"full": ((0, 1, 2), 40), "quick": ((0,), 12), "tiny": ((0,), 4)}[size_name]
    episodes = joint_states([s for seed in seeds for s in fleet_specs(per_seed, seed=seed)])
    zs = (z, z * 0.75, z * 0.5)
    clean = clean_smoothness(episodes, zs)
    print(f"(a) clean spike_fraction, worst episode per task/model ({len(episodes)} episodes)")
    print(f"{'task/model':24s} {'eps':>4s} {'steps':>11s} " + " ".join(f"{'z=' + format(v, 'g'):>8s}" for v in zs))
    for key, r in clean.items():
        print(
            f"{key:24s} {r['episodes']:4d} {r['steps'][0]:5d}-{r['steps'][1]:<5d} "
            + " ".join(f"{r[f'z{v:g}']:8.4%}" for v in zs)
        )

    inj = injected(episodes[: {"full": 20, "quick": 6, "tiny": 2}[size_name]], z)
    print(f"\n(b) injected velocity glitches -> measured spike_fraction (min / mean / max, z={z:g})")
    for frac, (lo, mean, hi) in inj.items():
        print(f"{frac:8.1%}  ->  {lo:7.2%} {mean:7.2%} {hi:7.2%}")

    low_clean, low_inj = at_dataset_rate(episodes[: {"full": 40, "quick": 12, "tiny": 4}[size_name]], z)
    print("\n(b') the same joint positions at 30 Hz (a LeRobot dataset's rate; the rule in time, velocity only)")
    print(f"clean, worst episode: {low_clean:.4%}")
    for frac, mean in low_inj.items():
        print(f"{frac:8.1%}  ->  {mean:7.2%} (mean)")

    size, n, duration = {
        "full": ((640, 480), 4, (8.0, 12.0)),
        "quick": ((160, 120), 3, 4.0),
        "tiny": ((64, 48), 2, 2.0),
    }[size_name]
    with tempfile.TemporaryDirectory(prefix="dyna-quality-bench-") as tmp:
        frames = frame_figures(Path(tmp), n, *size, duration)
    print(f"\n(c) frames at {size[0]}x{size[1]}: live change (mean |dY|, 8-bit) and transcode counts")
    print(
        f"{'episode':22s} {'camera':12s} {'fault':14s} {'frames':>6s} {'min':>6s} {'p50':>6s} "
        f"{'frozen in/counted':>18s} {'dark':>5s}"
    )
    for r in frames:
        print(
            f"{r['episode']:22s} {r['camera']:12s} {r['fault']:14s} {r['frames']:6d} {r['live_change_min']:6.2f} "
            f"{r['live_change_p50']:6.2f} {r['frozen_injected']:>9d}/{r['frozen_counted']:<8d} "
            f"{r['dark_counted']:5d}"
        )

    summary = {
        "size": size_name,
        "spike_z": z,
        "clean_episodes": len(episodes),
        "clean_spike_fraction_max": max(r[f"z{z:g}"] for r in clean.values()),
        "clean_spike_fraction_max_at_half_z": max(r[f"z{z * 0.5:g}"] for r in clean.values()),
        "injected_to_measured": {str(k): v[1] for k, v in inj.items()},
        "clean_spike_fraction_max_30hz": low_clean,
        "injected_to_measured_30hz": {str(k): v for k, v in low_inj.items()},
        "frame_size": list(size),
        "live_change_min": min(r["live_change_min"] for r in frames),
        "frozen_exact": all(r["frozen_injected"] == r["frozen_counted"] for r in frames),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary))
    return 0
