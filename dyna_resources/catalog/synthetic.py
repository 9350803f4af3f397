"""A synthetic corpus in the registry, written through the registry's own API: what an ingest of
``n`` legacy episodes leaves behind, without the files.

Every episode goes the way the pipeline takes it: its file is registered from the landing zone,
packed into work units and ingest partitions, inventoried (the pre gates' results and a whole
episode row) and transcoded (the post gates' results, the MCAP's URI, bytes and versions). Values
follow the fleet simulator's mix (sites, robots, tasks, operators, ~84 s episodes: 1M hours in
~43M episodes, the scale target) with a small share of flagged, rejected and quarantined episodes, so
curation and manifest queries see the cardinalities a real catalog has. Deterministic in
``seed``: the same call writes the same rows.

Used by ``python -m benchmarks catalog`` (10^5-10^7 episodes) and by the curation and manifest
benchmarks; :func:`populate` writes in chunks of one work unit's size, each chunk one
``record_outcomes`` transaction per stage, as the pipeline's units do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ingest.gates import POST_GATES, PRE_GATES
from .registry import ACCEPTED, QUARANTINED, REJECTED, TRANSCODED, LandedFile, Outcome, Registry

# the vocabulary the curation and manifest benchmarks' specs select by (benchmarks/manifest.py)
SITES = ("sfo-1", "sfo-2", "pit-1", "bos-1")
ROBOT_MODELS = ("aloha-2", "franka-fr3", "ur5e", "g1")
TASKS = ("pick_place", "fold_towel", "open_drawer", "stack_cups", "wipe_table", "insert_peg") + tuple(
    f"{verb}_{obj}" for verb in ("pour", "hang", "sort", "plug", "scoop") for obj in ("cup", "cable", "bag", "lid")
)
OPERATORS = tuple(f"op-{i:03d}" for i in range(200))
CAMERAS = ["scene", "wrist_left", "wrist_right"]
MEAN_EPISODE_S = 84.0
LEGACY_BYTES_PER_S = 8.5e6  # 640x480 x 3 cameras of per-frame JPEG, plus proprio
MCAP_RATIO = 0.2
UNIT_BYTES = 8 << 30  # production work units (dyna_assets/deployment.py)
EPOCH = 1_790_000_000.0  # 2026-09-20 UTC: when the synthetic fleet starts recording


@dataclass(frozen=True)
class CorpusShape:
    """The mix of outcomes; shares of all episodes."""

    rejected: float = 0.002  # quarantined by a pre gate: no transcode
    quarantined: float = 0.001  # quarantined by a post gate
    flagged: float = 0.02  # a non-blocking gate failed (frame drops): kept, quality_ok false
    not_transcoded: float = 0.0  # inventoried, transcode still to come (status accepted)
    episodes_per_unit: int = 12  # an 8 GiB unit of ~84 s legacy episodes (~714 MB each)
    units_per_partition: int = 1024  # an 8 TiB partition


def episode_id(i: int) -> str:
    return f"syn-{i:09d}"


def _path(i: int) -> str:
    return f"{SITES[i % len(SITES)]}/{i // 100_000:04d}/{episode_id(i)}.h5"


def _draws(start: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """Per-episode random values of episodes [start, start + n): a function of the index and seed
    only (a chunk draws the same values whatever chunk size wrote it)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    # splitmix64 of (index, seed): independent, reproducible values per episode without a stateful RNG
    x = idx * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed * 0xBF58476D1CE4E5B9 % 2**64)
    cols = {}
    for name in ("u_dur", "u_task", "u_robot", "u_op", "u_fate", "u_score", "u_succ", "u_sim"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        z = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        cols[name] = (z >> np.uint64(11)).astype(np.float64) / float(2**53)
    cols["duration_s"] = np.round(MEAN_EPISODE_S * (0.25 + 1.5 * cols["u_dur"]), 3)  # 21-147 s, mean 84
    return cols


def landed_files(start: int, n: int, seed: int = 0) -> list[LandedFile]:
    d = _draws(start, n, seed)
    return [
        LandedFile(_path(start + k), int(d["duration_s"][k] * LEGACY_BYTES_PER_S), int(EPOCH * 1e9) + start + k)
        for k in range(n)
    ]


def _gates(names, failed: str | None, action: str, version: str) -> list[dict]:
    return [
        {
            "gate": g,
            "passed": g != failed,
            "action": action if g == failed else "quarantine",
            "detail": f"synthetic failure of {g}" if g == failed else "",
            "pipeline_version": version,
        }
        for g in names
    ]


def outcomes(
    start: int,
    n: int,
    batch_key: str,
    *,
    seed: int = 0,
    shape: CorpusShape = CorpusShape(),
    pipeline_version: str = "1.5",
    schema_version: str = "1.0",
    uri_root: str = "gs://dyna-episodes/mcap",
) -> tuple[list[Outcome], list[Outcome]]:
    """The inventory (pre) and transcode (post) outcomes of episodes [start, start + n) of one work
    unit, as ``ingest/batches.py`` builds them."""
    d = _draws(start, n, seed)
    pre, post = [], []
    edges = [float(x) for x in np.cumsum([shape.rejected, shape.quarantined, shape.flagged, shape.not_transcoded])]
    for k in range(n):
        i = start + k
        eid, path, fate = episode_id(i), _path(i), float(d["u_fate"][k])
        dur = float(d["duration_s"][k])
        rejected, quarantined = fate < edges[0], edges[0] <= fate < edges[1]
        flagged, waiting = edges[1] <= fate < edges[2], edges[2] <= fate < edges[3]
        task = TASKS[int(d["u_task"][k] * len(TASKS))]
        robot = int(d["u_robot"][k] * 64)
        episode = {
            "episode_id": eid,
            "source_bytes": int(dur * LEGACY_BYTES_PER_S),
            "source_sha256": f"{i:064x}",
            "duration_s": dur,
            "robot_id": f"robot-{robot:03d}",
            "robot_model": ROBOT_MODELS[robot % len(ROBOT_MODELS)],
            "robot_sw_version": f"4.{robot % 3}.0",
            "task": task,
            "site": SITES[i % len(SITES)],
            "operator": OPERATORS[int(d["u_op"][k] * len(OPERATORS))],
            "success": bool(d["u_succ"][k] < 0.8),
            "sim": bool(d["u_sim"][k] < 0.25),
            "started_at": f"{EPOCH + i * 2.0:.0f}",
            "cameras": CAMERAS,
            "ingested_at": EPOCH + i * 2.0,
            "timestamps_ok": not rejected,
            "camera_dropped": flagged,
            "frame_drop_fraction": 0.03 if flagged else 0.0,
            "camera_dead": False,
            "quality_ok": not (flagged or rejected),
            "status": REJECTED if rejected else ACCEPTED,
            "schema_version": None,
            "pipeline_version": None,
            "mcap_path": None,
            "mcap_uri": None,
            "mcap_bytes": None,
        }
        failed_pre = "timestamps_monotonic" if rejected else ("frame_drops" if flagged else None)
        pre.append(
            Outcome(
                path,
                batch_key,
                "pre",
                _gates(PRE_GATES, failed_pre, "flag" if flagged else "quarantine", pipeline_version),
                episode,
                {
                    "gate": failed_pre,
                    "reason": "synthetic: timestamps go back",
                    "stream": "joint_states",
                    "pipeline_version": pipeline_version,
                }
                if rejected
                else None,
            )
        )
        if rejected or waiting:
            continue
        row: dict[str, Any] = {
            "episode_id": eid,
            "schema_version": schema_version,
            "pipeline_version": pipeline_version,
        }
        if quarantined:
            row.update(
                status=QUARANTINED, mcap_path=None, mcap_uri=None, mcap_bytes=None, mcap_version=None, quality_ok=False
            )
            q = {
                "gate": "decodable",
                "stage": "post",
                "reason": "synthetic: access unit 12 does not decode",
                "stream": "/cameras/scene/h264",
                "pipeline_version": pipeline_version,
            }
        else:
            frames = int(dur * 30) * len(CAMERAS)
            row.update(
                status=TRANSCODED,
                mcap_path=None,
                mcap_uri=f"{uri_root}/{path[:-3]}.mcap",
                mcap_version=str(1_000_000 + i),
                mcap_bytes=int(dur * LEGACY_BYTES_PER_S * MCAP_RATIO),
                quality_ok=not flagged,
                start_ns=int((EPOCH + i * 2.0) * 1e9),
                end_ns=int((EPOCH + i * 2.0 + dur) * 1e9),
                n_steps=int(dur * 200),
                n_frames=frames,
                dropped_cameras='["wrist_left"]' if flagged else "[]",
                dark_frame_fraction=0.0,
                frozen_frame_fraction=0.0,
                smoothness_score=round(0.5 + 0.5 * float(d["u_score"][k]), 6),
                sensor_health_score=1.0,
                task_score=None,
                quality_verdict="review" if d["u_score"][k] < 0.05 else "pass",
                quality_reasons="[]",
            )
            q = None
        post.append(
            Outcome(
                path,
                batch_key,
                "post",
                _gates(POST_GATES, "decodable" if quarantined else None, "quarantine", pipeline_version),
                row,
                q,
            )
        )
    return pre, post


@dataclass(frozen=True)
class LandedUnit:
    """A work unit of the synthetic corpus as the landing sensor made it: episodes [first, first + n)."""

    first: int
    n: int
    key: str


def land(
    registry: Registry,
    start: int,
    n: int,
    *,
    seed: int = 0,
    shape: CorpusShape = CorpusShape(),
    seal_open: bool = True,
    now: float = EPOCH,
) -> tuple[list[LandedUnit], int]:
    """What the landing sensor does for episodes [start, start + n): register their files, pack
    them into units, put the units into partitions (the open one sealed with ``seal_open``).
    Returns the units and how many partitions their assignment touched."""
    files = landed_files(start, n, seed)
    registry.register_files(files, now=now)
    groups = [files[k : k + shape.episodes_per_unit] for k in range(0, len(files), shape.episodes_per_unit)]
    made = registry.create_batches(groups, target_bytes=UNIT_BYTES, now=now)
    touched = registry.assign_partitions(
        target_bytes=UNIT_BYTES * shape.units_per_partition, max_wait_s=1e9, seal_open=seal_open, now=now
    )
    return [
        LandedUnit(start + u * shape.episodes_per_unit, len(group), unit.key)
        for u, (unit, group) in enumerate(zip(made, groups, strict=True))
    ], len(touched)


def unit_outcomes(
    units: Sequence[LandedUnit],
    *,
    seed: int = 0,
    shape: CorpusShape = CorpusShape(),
    pipeline_version: str = "1.5",
    schema_version: str = "1.0",
) -> tuple[list[Outcome], list[Outcome]]:
    """The inventory and the transcode outcomes of these units, each stage's in one list."""
    pre, post = [], []
    for unit in units:
        a, b = outcomes(
            unit.first,
            unit.n,
            unit.key,
            seed=seed,
            shape=shape,
            pipeline_version=pipeline_version,
            schema_version=schema_version,
        )
        pre += a
        post += b
    return pre, post


def populate(
    registry: Registry,
    n: int,
    *,
    seed: int = 0,
    shape: CorpusShape = CorpusShape(),
    start: int = 0,
    units_per_call: int = 256,
    pipeline_version: str | Callable[[int], str] = "1.5",
    schema_version: str = "1.0",
    now: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Write episodes [start, start + n) through the registry's API, ``units_per_call`` work units
    at a time (the transcode's group commit holds up to 256 units' outcomes): land their files
    (:func:`land`), record their inventory outcomes, then their transcode outcomes (one
    transaction each). ``pipeline_version``: the version that wrote them, or a function of each
    call's first episode index giving it (e.g. older partitions). Returns counts."""
    now = EPOCH if now is None else now
    units = partitions = 0
    per_call = shape.episodes_per_unit * units_per_call
    for lo in range(start, start + n, per_call):
        hi = min(lo + per_call, start + n)
        version = pipeline_version(lo) if callable(pipeline_version) else pipeline_version
        made, touched = land(registry, lo, hi - lo, seed=seed, shape=shape, seal_open=hi >= start + n, now=now)
        units += len(made)
        partitions += touched
        pre, post = unit_outcomes(made, seed=seed, shape=shape, pipeline_version=version, schema_version=schema_version)
        registry.record_outcomes(pre, now=now)
        registry.record_outcomes(post, now=now)
        if progress is not None:
            progress(hi - start)
    return {"episodes": n, "units": units, "partitions": partitions}
