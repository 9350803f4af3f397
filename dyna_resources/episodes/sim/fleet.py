"""The sample fleet: simulated episodes written in the legacy HDF5 layout, with injected faults.

An :class:`EpisodeSpec` holds everything needed to regenerate an episode bit-for-bit;
:class:`SimulatedEpisode` turns it into camera frames (rendered on demand, one at a time)
and sample streams; :func:`write_episode` streams it into a file through
:func:`raw_format.write_raw_episode`; :func:`generate_fleet` makes a deterministic,
diverse fleet (robots, models, software versions, sites, operators, tasks, days) and can
inject each fault of :data:`KNOWN_FAULTS` into distinct episodes. :func:`arrival_folder` names
the folder a landing drop goes into so that its keys sort after every earlier drop's.

Command line::

    python -m dyna_resources.episodes.sim.fleet --out DIR --episodes 8 --seed 0 \\
        --width 640 --height 480 --duration-s 8,16 --faults corrupt_jpeg=1 truncated=1
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import multiprocessing
import os
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import raw_format
from ..raw_format import EpisodeMeta, SampleStream
from .robot import TASKS, ScriptedArm, make_timestamps, stable_hash
from .scene import Renderer

FAULTS = ("dropped_frames", "dead_camera", "non_monotonic", "truncated", "corrupt_jpeg", "missing_stream")
# Faults added since: injected the same way, but kept out of FAULTS so that callers asking for
# "one of each of FAULTS" keep their fleet's shape. Append only: assign_faults walks this order.
ADDED_FAULTS = ("frozen_camera",)
KNOWN_FAULTS = FAULTS + ADDED_FAULTS
DEFAULT_CAMERAS = ("scene_left", "scene_right", "wrist")


@dataclass(frozen=True)
class EpisodeSpec:
    """Everything needed to regenerate an episode bit-for-bit."""

    episode_id: str
    seed: int
    task: str
    robot_id: str
    robot_model: str
    robot_sw_version: str
    site: str
    operator: str
    success: bool
    started_at: str  # ISO-8601 UTC, e.g. "2026-11-02T08:15:00Z"
    duration_s: float = 10.0
    width: int = 640
    height: int = 480
    cameras: tuple[str, ...] = DEFAULT_CAMERAS
    camera_hz: float = 30.0
    proprio_hz: float = 200.0
    action_hz: float = 50.0

    def __post_init__(self):
        object.__setattr__(self, "cameras", tuple(self.cameras))
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; known: {', '.join(TASKS)}")
        if not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ValueError("cameras must be non-empty and unique")
        if self.width < 16 or self.height < 16:
            raise ValueError("width and height must be at least 16 pixels")
        if not (self.duration_s > 0):
            raise ValueError("duration_s must be positive")
        if self.seed < 0:
            raise ValueError("seed must be non-negative")


class SimulatedEpisode:
    """One episode, generated lazily: frames are rendered on request, never all at once.

    ``render_frame(camera, i)`` is a pure function of (spec, camera, i): the raw RGB frame
    before JPEG, which is what a decoded video should be compared against. Camera names
    starting with "wrist" ride on the flange; "scene_left" / "scene_right" (and "scene_top")
    have known mountings; any other name is a scene camera placed in front of the robot.
    Not thread-safe (per-camera work buffers are reused); use one instance per thread.
    """

    def __init__(self, spec: EpisodeSpec):
        self.spec = spec
        self.arm = ScriptedArm(
            seed=spec.seed,
            task=spec.task,
            robot_model=spec.robot_model,
            success=spec.success,
            duration_s=spec.duration_s,
        )
        self.start_ns = self.meta().started_at_ns
        self._cam_ts: dict[str, np.ndarray] = {}
        for cam in spec.cameras:
            rng = np.random.default_rng([spec.seed, 602, stable_hash(cam)])
            self._cam_ts[cam] = make_timestamps(
                rng, self.start_ns, spec.camera_hz, spec.duration_s, offset_ms=rng.uniform(4.0, 30.0)
            )
        self._renderer: Renderer | None = None

    @property
    def renderer(self) -> Renderer:
        if self._renderer is None:
            s = self.spec
            self._renderer = Renderer(
                seed=s.seed,
                site=s.site,
                robot_id=s.robot_id,
                arm=self.arm.arm,
                script=self.arm.script,
                width=s.width,
                height=s.height,
                cameras=s.cameras,
            )
        return self._renderer

    def meta(self) -> EpisodeMeta:
        s = self.spec
        return EpisodeMeta(
            episode_id=s.episode_id,
            robot_id=s.robot_id,
            robot_model=s.robot_model,
            robot_sw_version=s.robot_sw_version,
            task=s.task,
            site=s.site,
            operator=s.operator,
            success=bool(s.success),
            started_at=s.started_at,
            sim=True,
        )

    def camera_timestamps(self, camera: str) -> np.ndarray:
        return self._cam_ts[camera].copy()

    def n_frames(self, camera: str) -> int:
        return len(self._cam_ts[camera])

    def frame_time(self, camera: str, i: int) -> float:
        """Seconds since the episode start at which frame ``i`` was exposed."""
        return (int(self._cam_ts[camera][i]) - self.start_ns) / 1e9

    def render_frame(self, camera: str, i: int) -> np.ndarray:
        """The raw RGB frame (H, W, 3) uint8 of ``camera`` at index ``i`` (before JPEG)."""
        if camera not in self._cam_ts:
            raise KeyError(f"no camera {camera!r}; cameras: {', '.join(self.spec.cameras)}")
        n = len(self._cam_ts[camera])
        if not 0 <= i < n:
            raise IndexError(f"frame {i} out of range for {camera} ({n} frames)")
        t = self.frame_time(camera, i)
        st = self.arm.world_state(t)
        rng = np.random.default_rng([self.spec.seed, 601, stable_hash(camera), int(i)])
        return self.renderer.render(camera, t, st, rng)

    def iter_frames(self, camera: str, indices=None) -> Iterator[np.ndarray]:
        for i in range(self.n_frames(camera)) if indices is None else indices:
            yield self.render_frame(camera, int(i))

    def streams(self) -> dict[str, SampleStream]:
        s = self.spec
        return self.arm.streams(self.start_ns, proprio_hz=s.proprio_hz, action_hz=s.action_hz)


@dataclass(frozen=True)
class GeneratedEpisode:
    spec: EpisodeSpec
    path: Path
    fault: str | None
    frame_indices: dict[str, np.ndarray] = field(compare=False)  # render_frame indices written, per camera
    fault_detail: dict = field(default_factory=dict, compare=False)  # e.g. {"camera": ..., "frame": ...}


# --------------------------------------------------------------------------------------
# writing, with faults
# --------------------------------------------------------------------------------------
def _drop_runs(rng: np.random.Generator, n: int, frac: float = 0.05) -> np.ndarray:
    """Indices kept after dropping ~frac of n frames in short runs (1-4 frames), never the ends."""
    keep = np.ones(n, dtype=bool)
    target = max(1, int(round(frac * n)))
    guard = 0
    while (~keep).sum() < target and guard < 1000:
        guard += 1
        run = int(rng.integers(1, 5))
        s = int(rng.integers(1, max(2, n - run - 1)))
        if keep[max(0, s - 1) : s + run + 1].all():  # runs stay separate
            keep[s : min(n - 1, s + run)] = False
    if keep.all() and n >= 3:  # tiny episodes: still drop one
        keep[n // 2] = False
    return np.flatnonzero(keep)


def _corrupt(jpeg: bytes, rng: np.random.Generator) -> bytes:
    """Truncate inside the entropy-coded data and garble what is left of it: the header
    survives (so the frame is recognisably a JPEG) but decoding fails."""
    sos = jpeg.find(b"\xff\xda")
    start = sos + 20 if sos > 0 else 4
    cut = start + max(8, int((len(jpeg) - start) * rng.uniform(0.35, 0.6)))
    body = bytearray(jpeg[:cut])
    for _ in range(8):
        k = int(rng.integers(start, len(body)))
        body[k] = 0xFF if rng.random() < 0.5 else int(rng.integers(256))
    return bytes(body)


def _frames(
    sim: SimulatedEpisode,
    cam: str,
    indices: np.ndarray,
    quality: int,
    *,
    dead_from: int | None = None,
    corrupt_at: int | None = None,
    frozen: tuple[int, int] | None = None,
    rng: np.random.Generator | None = None,
) -> Iterator[bytes]:
    black = held = None
    for pos, i in enumerate(indices):
        if dead_from is not None and pos >= dead_from:
            if black is None:
                black = raw_format.encode_jpeg(np.zeros((sim.spec.height, sim.spec.width, 3), np.uint8), quality)
            yield black
            continue
        if frozen is not None and frozen[0] <= pos < frozen[1] and held is not None:
            yield held  # the driver hands out its last buffer again
            continue
        data = raw_format.encode_jpeg(sim.render_frame(cam, int(i)), quality)
        if corrupt_at is not None and pos == corrupt_at:
            assert rng is not None  # a corrupted frame is garbled at random: callers pass corrupt_at with rng
            data = _corrupt(data, rng)
        held = data
        yield data


def write_episode(
    spec: EpisodeSpec, path: str | Path, *, jpeg_quality: int = 90, fault: str | None = None
) -> GeneratedEpisode:
    """Render ``spec`` into a legacy HDF5 episode at ``path`` (streamed: one frame in memory at
    a time), written to a temporary name in the same directory and renamed when complete.

    ``fault`` injects one of :data:`KNOWN_FAULTS`:
      dropped_frames -- one camera loses ~5 % of its frames in short runs (valid file);
      dead_camera    -- one camera's frames are all-black from a point on (valid file);
      non_monotonic  -- two adjacent joint_states timestamps swapped (TimestampError);
      truncated      -- the finished file cut to ~60 % of its bytes (RawFormatError);
      corrupt_jpeg   -- one frame's JPEG truncated and garbled (CorruptFrameError on decode);
      missing_stream -- no /action dataset (MissingStreamError);
      frozen_camera  -- one camera repeats one frame's JPEG for 20-40 % of its frames, then
                        recovers (valid file; timestamps keep advancing).
    """
    if fault is not None and fault not in KNOWN_FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(KNOWN_FAULTS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sim = SimulatedEpisode(spec)
    rng = np.random.default_rng([spec.seed, 701])
    streams = sim.streams()
    cams = list(spec.cameras)
    indices = {c: np.arange(sim.n_frames(c)) for c in cams}
    detail: dict = {}
    dead_from = corrupt_at = frozen = None
    fault_cam = cams[int(rng.integers(len(cams)))]
    if fault == "dropped_frames":
        indices[fault_cam] = _drop_runs(rng, len(indices[fault_cam]))
        detail = {"camera": fault_cam, "dropped": np.setdiff1d(np.arange(sim.n_frames(fault_cam)), indices[fault_cam])}
    elif fault == "dead_camera":
        n = len(indices[fault_cam])
        dead_from = int(rng.integers(int(0.3 * n), max(int(0.3 * n) + 1, int(0.7 * n))))
        detail = {"camera": fault_cam, "from_frame": dead_from}
    elif fault == "corrupt_jpeg":
        n = len(indices[fault_cam])
        corrupt_at = int(rng.integers(0, n))
        detail = {"camera": fault_cam, "frame": corrupt_at}
    elif fault == "non_monotonic":
        js = streams["joint_states"]
        ts = js.timestamps_ns.copy()
        k = int(rng.integers(len(ts) // 4, max(len(ts) // 4 + 1, 3 * len(ts) // 4)))
        ts[k], ts[k + 1] = ts[k + 1], ts[k]
        streams["joint_states"] = SampleStream(js.name, ts, js.fields, js.labels)
        detail = {"stream": "joint_states", "index": k}
    elif fault == "missing_stream":
        del streams["action"]
        detail = {"stream": "action"}
    elif fault == "frozen_camera":
        n = len(indices[fault_cam])
        run = max(2, round(n * rng.uniform(0.2, 0.4)))
        start = int(rng.integers(1, max(2, n - run)))
        frozen = (start, min(n, start + run))
        detail = {"camera": fault_cam, "from_frame": frozen[0], "to_frame": frozen[1]}  # [from, to)

    cameras = {}
    for c in cams:
        ts = sim.camera_timestamps(c)[indices[c]]
        is_fault_cam = c == fault_cam
        cameras[c] = (
            ts,
            _frames(
                sim,
                c,
                indices[c],
                jpeg_quality,
                dead_from=dead_from if is_fault_cam else None,
                corrupt_at=corrupt_at if is_fault_cam else None,
                frozen=frozen if is_fault_cam else None,
                rng=rng,
            ),
        )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        raw_format.write_raw_episode(tmp, sim.meta(), cameras, streams)
        if fault == "truncated":
            size = tmp.stat().st_size
            keep = int(size * 0.6)
            with open(tmp, "r+b") as f:
                f.truncate(keep)
            detail = {"bytes": keep, "of": size}
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return GeneratedEpisode(spec, path, fault, indices, detail)


# --------------------------------------------------------------------------------------
# the fleet
# --------------------------------------------------------------------------------------
# robot_id, model, software version, site -- ordered so that any 3 consecutive robots span
# both models and both sites
ROBOTS = (
    ("arm-01", "dyna-a1", "4.2.1", "sfo-lab"),
    ("arm-07", "dyna-a2", "5.0.2", "muc-lab"),
    ("arm-02", "dyna-a1", "4.3.0", "muc-lab"),
    ("arm-11", "dyna-a2", "5.1.0", "sfo-lab"),
    ("arm-04", "dyna-a1", "4.2.3", "sfo-lab"),
)
OPERATORS = {"sfo-lab": ("op-1", "op-2", "op-3"), "muc-lab": ("op-4", "op-5", "op-6")}
FLEET_START = dt.datetime(2026, 11, 2, 8, 0, tzinfo=dt.timezone.utc)


def arrival_folder(now: dt.datetime | None = None) -> str:
    """The landing folder for files arriving ``now`` (UTC, to the microsecond, fixed width), e.g.
    ``20261129T141502.123456Z``: keys under it sort after every earlier arrival's, as the landing
    sensor's cursor needs (``dyna_resources/ingest/landing.py``)."""
    now = dt.datetime.now(dt.UTC) if now is None else now.astimezone(dt.UTC)
    return now.strftime("%Y%m%dT%H%M%S.%fZ")


def fleet_specs(
    n_episodes: int,
    *,
    seed: int = 0,
    width: int = 640,
    height: int = 480,
    duration_s: tuple[float, float] | float = (8.0, 16.0),
) -> list[EpisodeSpec]:
    """Deterministic specs for a fleet: round-robin robots and tasks, ~85 % successes,
    start times over ~4 working days, unique filesystem-safe ids."""
    specs = []
    task_off = stable_hash("tasks", seed) % len(TASKS)
    for k in range(n_episodes):
        rng = np.random.default_rng([seed, 801, k])
        robot_id, model, sw, site = ROBOTS[k % len(ROBOTS)]
        task = TASKS[(k + task_off + k // len(ROBOTS)) % len(TASKS)]
        ops = OPERATORS[site]
        operator = ops[int(rng.integers(len(ops)))]
        success = bool(rng.random() < 0.85)
        day = int(rng.integers(0, 4))
        minute = int(rng.integers(0, 10 * 60))
        start = FLEET_START + dt.timedelta(days=day, minutes=minute, seconds=int(rng.integers(60)))
        started_at = start.strftime("%Y-%m-%dT%H:%M:%SZ")
        if isinstance(duration_s, (int, float)):
            dur = float(duration_s)
        else:
            lo, hi = duration_s
            dur = round(float(rng.uniform(lo, hi)), 1)
        ep_seed = int(np.random.SeedSequence([seed, 802, k]).generate_state(1)[0])
        short = hashlib.sha256(f"{seed}:{k}:{robot_id}:{started_at}".encode()).hexdigest()[:8]
        specs.append(
            EpisodeSpec(
                episode_id=f"ep-{k:06d}-{short}",
                seed=ep_seed,
                task=task,
                robot_id=robot_id,
                robot_model=model,
                robot_sw_version=sw,
                site=site,
                operator=operator,
                success=success,
                started_at=started_at,
                duration_s=dur,
                width=width,
                height=height,
            )
        )
    return specs


def assign_faults(n_episodes: int, faults: Mapping[str, int] | None, seed: int = 0) -> dict[int, str]:
    """Episode index -> fault, each fault on distinct episodes."""
    if not faults:
        return {}
    unknown = set(faults) - set(KNOWN_FAULTS)
    if unknown:
        raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {', '.join(KNOWN_FAULTS)}")
    total = sum(int(v) for v in faults.values())
    if any(int(v) < 0 for v in faults.values()):
        raise ValueError("fault counts must be non-negative")
    if total > n_episodes:
        raise ValueError(f"{total} faulty episodes requested but only {n_episodes} episodes")
    order = np.random.default_rng([seed, 803]).permutation(n_episodes)
    out, pos = {}, 0
    for name in KNOWN_FAULTS:  # fixed order: the assignment does not depend on the mapping's order
        for _ in range(int(faults.get(name, 0))):
            out[int(order[pos])] = name
            pos += 1
    return out


def _write_one(args) -> GeneratedEpisode:
    spec, path, quality, fault = args
    return write_episode(spec, path, jpeg_quality=quality, fault=fault)


def generate_fleet(
    out_dir: str | Path,
    n_episodes: int,
    *,
    seed: int = 0,
    width: int = 640,
    height: int = 480,
    duration_s: tuple[float, float] | float = (8.0, 16.0),
    faults: Mapping[str, int] | None = None,
    jpeg_quality: int = 90,
    workers: int = 1,
    mark_complete: bool = False,
) -> list[GeneratedEpisode]:
    """Write ``n_episodes`` episodes as ``<out_dir>/<episode_id>.h5``; returns them in order.

    :param mark_complete: as an uploader into a landing zone: after each file, its completion marker
        (``<file>.complete``), so the landing sensor lands it without waiting for it to settle."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = fleet_specs(n_episodes, seed=seed, width=width, height=height, duration_s=duration_s)
    fault_of = assign_faults(n_episodes, faults, seed)
    jobs = [(s, out / f"{s.episode_id}.h5", jpeg_quality, fault_of.get(k)) for k, s in enumerate(specs)]
    if workers <= 1 or len(jobs) <= 1:
        written = [_write_one(j) for j in jobs]
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork: callers may hold threads / open HDF5 files
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            written = list(pool.map(_write_one, jobs))
    if mark_complete:
        from ...ingest.landing import COMPLETION_MARKER

        for e in written:
            Path(str(e.path) + COMPLETION_MARKER).touch()
    return written


def _parse_faults(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            name, _, count = part.partition("=")
            out[name] = out.get(name, 0) + (int(count) if count else 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dyna_resources.episodes.sim.fleet",
        description="Generate a sample fleet of legacy HDF5 episodes.",
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--duration-s", default="8,16", help="seconds, or LO,HI for a range (default 8,16)")
    ap.add_argument(
        "--faults",
        nargs="*",
        default=[],
        metavar="NAME[=COUNT]",
        help=f"faults to inject, e.g. corrupt_jpeg=1 truncated=2; known: {', '.join(KNOWN_FAULTS)}",
    )
    ap.add_argument("--jpeg-quality", type=int, default=90)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args(argv)
    parts = [float(x) for x in str(a.duration_s).split(",")]
    duration = parts[0] if len(parts) == 1 else (parts[0], parts[1])
    # run through the package's module (not __main__) so worker processes can import the job
    from dyna_resources.episodes.sim import fleet as this

    try:
        faults = _parse_faults(a.faults)
        eps = this.generate_fleet(
            a.out,
            a.episodes,
            seed=a.seed,
            width=a.width,
            height=a.height,
            duration_s=duration,
            faults=faults,
            jpeg_quality=a.jpeg_quality,
            workers=a.workers,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for g in eps:
        s = g.spec
        size = g.path.stat().st_size / 1e6
        print(
            f"{g.path.name}  {s.task:<12} {s.robot_id} {s.robot_model} {s.site:<8} "
            f"{'ok  ' if s.success else 'FAIL'} {s.duration_s:5.1f}s {size:7.2f} MB  {g.fault or ''}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
