"""Step ladders: how well the heuristic segmenter recovers the sample fleet's scripted procedures,
and what it costs.

`python -m benchmarks ladders [--quick | --tiny]`

Ground truth: the task scripts of dyna_resources/episodes/sim mark where each procedure step
begins and which step fails (a missed grasp, a slip). Every task x {success, failure} x both arm
models over seeds 0..N-1 (N = 16, --quick 4, --tiny 1), durations drawn in 6..16 s. Measured:
  - ladders whose step names match the script exactly (share);
  - boundary error |detected - scripted| over every step start and end (mean, p95, p99, max);
    grip_close/grip_open are dated at the command, which leads the scripted motion by ~40-60 ms;
  - failed step and failure mode found (share of failing episodes), false failures (share of
    successful episodes given a failed step);
  - segmentation time per episode-hour on in-memory streams (the engine's own cost; reading the
    proprio chunks of an MCAP adds its I/O);
  - the same, with the sensors 10x noisier than the simulator's (end-effector position sigma 0.2 mm,
    gripper effort sigma 3 N): the heuristic was tuned on this simulator, so this is the first
    measure of how far it is from the edge.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable

import numpy as np

from dyna_resources.episodes.sim.robot import ScriptedArm
from dyna_resources.ladders.config import LadderConfig
from dyna_resources.ladders.segment import failed_step, segment

from ._cli import add_size_flags, size_of

TASKS = ("pick_place", "fold_towel", "open_drawer", "wipe_table")
MODELS = ("dyna-a1", "dyna-a2")


def noisier(streams: dict, seed: int) -> dict:
    rng = np.random.default_rng([seed, 99])
    ee, js = streams["ee_pose"], streams["joint_states"]
    pose = np.array(ee.fields["pose"])
    pose[:, :3] += rng.normal(0, 2e-4, size=(len(pose), 3))
    effort = np.array(js.fields["effort"])
    effort[:, 6] += rng.normal(0, 3.0, size=len(effort))
    return {
        **streams,
        "ee_pose": dataclasses.replace(ee, fields={"pose": pose}),
        "joint_states": dataclasses.replace(js, fields={**js.fields, "effort": effort}),
    }


def run(seeds, config, noise: bool) -> dict:
    errors, by_task = [], {t: {"episodes": 0, "names_ok": 0} for t in TASKS}
    failing = found = clean = false_fail = 0
    seconds = episode_s = 0.0
    for seed in seeds:
        for task in TASKS:
            for success in (True, False):
                for model in MODELS:
                    dur = float(np.random.default_rng([seed, 7]).uniform(6.0, 16.0))
                    arm = ScriptedArm(seed=seed, task=task, robot_model=model, success=success, duration_s=dur)
                    streams = arm.streams(0)
                    if noise:
                        streams = noisier(streams, seed)
                    t0 = time.perf_counter()
                    steps = segment(streams, 0, int(dur * 1e9), task, config)
                    seconds += time.perf_counter() - t0
                    episode_s += dur
                    truth = arm.scripted_steps()
                    by_task[task]["episodes"] += 1
                    if [s.name for s in steps] != [g["name"] for g in truth]:
                        continue
                    by_task[task]["names_ok"] += 1
                    for s, g in zip(steps, truth):
                        errors += [abs(s.start_ns / 1e9 - g["start_s"]), abs(s.end_ns / 1e9 - g["end_s"])]
                    got = failed_step(steps)
                    want = next((i for i, g in enumerate(truth) if g["failed"]), None)
                    if want is None:
                        clean += 1
                        false_fail += got is not None
                    else:
                        failing += 1
                        found += got is not None and got.index == want and got.failure_mode == arm.script.failure_mode
    e = np.array(errors) * 1000 if errors else np.zeros(1)
    n = sum(v["episodes"] for v in by_task.values())
    return {
        "episodes": n,
        "ladder_match": sum(v["names_ok"] for v in by_task.values()) / n,
        "by_task": {t: v["names_ok"] / v["episodes"] for t, v in by_task.items()},
        "edges": len(errors),
        "boundary_err_ms_mean": round(float(e.mean()), 2),
        "boundary_err_ms_p95": round(float(np.percentile(e, 95)), 2),
        "boundary_err_ms_p99": round(float(np.percentile(e, 99)), 2),
        "boundary_err_ms_max": round(float(e.max()), 2),
        "failure_recall": round(found / max(failing, 1), 4),
        "false_failure_rate": round(false_fail / max(clean, 1), 4),
        "failures": f"{found}/{failing}",
        "false": f"{false_fail}/{clean}",
        "segment_ms_per_episode_hour": round(seconds / episode_s * 3600 * 1000, 1),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks ladders")
    add_size_flags(ap, quick="4 seeds instead of 16")
    args = ap.parse_args(argv)
    size = size_of(args)
    seeds = range({"full": 16, "quick": 4, "tiny": 1}[size])
    config = LadderConfig.from_mapping(None)
    res = {"simulator noise": run(seeds, config, False), "10x noise": run(seeds, config, True)}
    n = res["simulator noise"]["episodes"]
    print(
        f"step ladders vs scripted procedures: {n} episodes per column ({len(seeds)} seeds x {len(TASKS)} tasks "
        f"x 2 outcomes x {len(MODELS)} arms, 6-16 s), config {config.version}\n"
    )

    def share_of(task: str) -> Callable[[dict], object]:
        return lambda r: f"{r['by_task'][task]:.1%}"

    rows: list[tuple[str, Callable[[dict], object]]] = [("ladder = script", lambda r: f"{r['ladder_match']:.1%}")]
    rows += [(f"  {t}", share_of(t)) for t in TASKS]
    rows += [
        ("boundary err mean ms", lambda r: f"{r['boundary_err_ms_mean']:.1f}"),
        ("boundary err p95 ms", lambda r: f"{r['boundary_err_ms_p95']:.1f}"),
        ("boundary err p99 ms", lambda r: f"{r['boundary_err_ms_p99']:.1f}"),
        ("boundary err max ms", lambda r: f"{r['boundary_err_ms_max']:.1f}"),
        ("failed step+mode found", lambda r: r["failures"]),
        ("false failures", lambda r: r["false"]),
        ("segment ms / episode-hour", lambda r: f"{r['segment_ms_per_episode_hour']:.0f}"),
    ]
    print(f"{'':<28}" + "".join(f"{k:>18}" for k in res))
    for label, f in rows:
        print(f"{label:<28}" + "".join(f"{f(r):>18}" for r in res.values()))
    print(
        json.dumps(
            {
                "benchmark": "ladders",
                "config": config.version,
                "size": size,
                **{
                    k.replace(" ", "_"): {x: y for x, y in r.items() if x not in ("failures", "false")}
                    for k, r in res.items()
                },
            }
        )
    )
    return 0
