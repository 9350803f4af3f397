"""Quality scores of one episode, computed at ingest: trajectory smoothness, sensor health and
task success, each in [0, 1], and a verdict ``pass`` / ``review`` / ``fail`` with its reasons.

Everything is measured on the raw episode's arrays (vectorized numpy, no frame decoding) plus
the transcode report's per-camera figures (dark and frozen frames: the transcode decodes every
frame anyway, see ``transcode._VideoWindows``).

Each measurement ``v`` has an ``ok`` level and a ``zero`` level: its score is 1 at or below
``ok``, 0 at or above ``zero``, linear between, and it gives a reason when above ``ok``. A
score is the worst of its measurements. A score below ``review_below`` sends the episode to
the review pool, below ``fail_below`` fails it; the verdict is the worst over the scores.

Spikes. A sample of joint velocity, acceleration, jerk or effort spikes when it misses the
trajectory on *both* sides: its distances to the straight-line extrapolations from the samples
``lag`` and ``2 * lag`` steps before it, and from those after it, both exceed (a) ``spike_z``
times the signal's noise (1.4826 x the median absolute deviation of that extrapolation error,
a second difference; never below the signal's resolution, the step of a quantized encoder) and
(b) how far the spike-free signal (a running median) moves in the ``MOTION_SPAN`` steps around
it. (a) is a median: it holds until ~15 % of one joint's samples spike (a spike touches three
second differences), where a high percentile of the signal grows with the spikes and hides them
above ~1 %; (b) keeps fast but smooth motion (a 70 ms gripper close is 14 samples: its jerk is
barely resolved at 200 Hz) and noise-free minimum-jerk trajectories, whose median deviation is
0, from counting. Steps and kinks (grip force switching on, friction reversing) agree with one
side, so they are not spikes. Velocity and effort pulses up to ``SPIKE_PULSE_S`` (20 ms: 4 steps
at 200 Hz, ``lag`` 2) are spikes, wider ones are motion; acceleration and jerk use lag 1 (a velocity
step is one acceleration sample, an acceleration step one jerk sample). A velocity glitch also
shows in its derivatives one step either side: that is the same event and counts once.

The scale is in time, read off the joint states' own rate (:func:`spike_scale`). Below 75 Hz (a
LeRobot dataset's 30 Hz) 20 ms is less than a step: a spike is a single-step pulse, and only
velocity and effort are checked. There a 70 ms gripper close is two or three steps, and the second
and third differences of real motion read as spikes: on 16 sample episodes resampled at 30 Hz,
the 200 Hz rule counted 2.9 % of clean steps (max 7.4 %) and with acceleration and jerk at lag 1
still 1.2 %; velocity alone with single-step pulses 0.03 % (max 0.4 %). A move of three steps
misses the extrapolation at its edges by about its own height, so below 75 Hz a spike must miss by
``UNRESOLVED_MARGIN`` (1.5) times the motion: clean steps then read 0 in all 16, and velocity
glitches on 0.5 / 2 / 5 / 10 % of the steps read 0.16 / 1.1 / 3.0 / 6.1 % (at 200 Hz 0.50 / 2.05 /
5.2 / 10.6 %: a coarser clock sees less).

Calibration (``python -m benchmarks quality``): the sample fleet's joint states, 120 episodes
(fleet seeds 0-2 x 40: the four tasks on both robot models, 8-16 s, 1,600-3,140 steps at 200 Hz),
and rendered episodes at 640x480 (4, one with a frozen camera) and 160x120 (8 + 3).

=======================  ====================================  =====================================
figure                   clean episodes                        faults
=======================  ====================================  =====================================
spike_fraction           0 in all 120 at spike_z 8; the worst  velocity glitches on 0.5 / 2 / 5 / 10
                         is 0.06 % at z 6, 0.125 % at z 4.     / 20 % of the steps of 20 episodes
                         The former p99-scaled z read up to    read 0.50 / 2.05 / 5.2 / 10.6 / 22.2 %
                         0.73 % on clean wipe_table episodes   (mean; max 0.55 / 2.15 / 5.4 / 11.5 /
                         (smoothness < 0.9: sent to review)    23.6 %); the former statistic read
                                                               5 % as 0.54 % and 10 % as 0.06 %
frame change, mean |dY|  >= 1.93 DN at 640x480, >= 1.55 DN     a frozen camera's repeated frames:
(8-bit luma, per frame)  at 160x120, static scenes while the   0.0 DN; 107 of 107 and 37 of 37
                         robot pauses included (sensor noise   counted, none on the live cameras
                         ~2 DN per pixel); 0 frozen counted
=======================  ====================================  =====================================

So ``spike_fraction`` has ok 0.001 (2 spiky steps in 2,000; clean episodes measured 0) and zero
0.01 (1 step in 100: the 2-step glitch of an 800-step episode scores ~0.83, review; 2 % fails);
``TranscodeSettings.frozen_level`` (0.5 DN) sits 3x below the quietest live camera; and
``frozen_frame_fraction`` (worst camera's frozen frames / frames; dark frames are counted as
dark only) has ok 0.01 and zero 0.1, like dark frames. Cost: ~5 ms per 10 s episode
(4 signals x 7 joints at 200 Hz), linear in its length.

Settings come from the ``quality:`` section of the gates file (``$DYNA_HOME/gates.yaml``)::

    quality:
      task_scorer: metadata_success       # a name in SCORERS
      spike_z: 8.0
      measures: {frame_drop_fraction: {ok: 0.005, zero: 0.2}}
      verdict: {smoothness: {review_below: 0.9, fail_below: 0.5}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .measures import drop_fraction

PASS, REVIEW, FAIL = "pass", "review", "fail"
SCORES = ("smoothness", "sensor_health", "task")
SATURATING_STREAMS = ("imu", "wrench")  # sensors with a measuring range whose rails mean clipping
SPIKE_PULSE_S = 0.020  # velocity/effort pulses up to this long are spikes, longer ones motion
SPIKE_LAG = 2  # control steps at 200 Hz: pulses up to 2 * SPIKE_LAG steps wide are spikes
MOTION_SPAN = 17  # control steps around a sample over which the spike-free signal's own motion is measured
DERIVATIVE_PULSE_STEPS = 2  # acceleration and jerk are checked where SPIKE_PULSE_S spans this many steps
UNRESOLVED_MARGIN = 1.5  # below that rate: a move of 3 steps misses the extrapolation at its edges by its height

# measurement -> (score it belongs to, ok, zero)
MEASURES: dict[str, tuple[str, float, float]] = {
    "spike_fraction": ("smoothness", 0.001, 0.01),  # control steps with a velocity/accel/jerk/effort spike
    "frame_drop_fraction": ("sensor_health", 0.005, 0.2),  # worst camera: missing frames / frames
    "timestamp_gap_fraction": ("sensor_health", 0.0, 0.2),  # worst stream: time inside gaps / duration
    "saturation_fraction": ("sensor_health", 0.005, 0.1),  # worst IMU/force channel: samples on a rail
    "dark_frame_fraction": ("sensor_health", 0.01, 0.1),  # worst camera: dark frames / frames
    "frozen_frame_fraction": ("sensor_health", 0.01, 0.1),  # worst camera: frames repeating the last / frames
}
VERDICT = {
    "smoothness": {"review_below": 0.9, "fail_below": 0.5},
    "sensor_health": {"review_below": 0.9, "fail_below": 0.5},
    "task": {"review_below": 0.5, "fail_below": 0.0},
}  # failed demonstrations go to review, not out


class QualityConfigError(ValueError):
    pass


# -- task scorers: name -> f(meta: dict) -> score in [0, 1], or None when unknown -----------------


def metadata_success(meta: Mapping) -> float | None:
    s = meta.get("success")
    return None if s is None else float(bool(s))


SCORERS: dict[str, Callable[[Mapping], float | None]] = {"metadata_success": metadata_success}


def register_scorer(name: str, fn: Callable[[Mapping], float | None]) -> None:
    """Make a task scorer selectable by ``quality.task_scorer`` (register before loading the config)."""
    SCORERS[name] = fn


@dataclass(frozen=True)
class QualityConfig:
    task_scorer: str = "metadata_success"
    spike_z: float = 8.0  # a spike misses the trajectory by this many noise sigmas on both sides
    gap_periods: float = 3.0  # a timestamp step longer than this many nominal periods is a gap
    measures: Mapping[str, tuple[str, float, float]] = field(default_factory=lambda: dict(MEASURES))
    verdict: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: {k: dict(v) for k, v in VERDICT.items()})

    @classmethod
    def from_mapping(cls, data: Mapping | None, *, source: str = "quality config") -> QualityConfig:
        data = dict(data or {})
        unknown = set(data) - {"task_scorer", "spike_z", "gap_periods", "measures", "verdict"}
        if unknown:
            raise QualityConfigError(f"{source}: unknown quality field(s) {sorted(unknown)}")
        base = cls()
        scorer = str(data.get("task_scorer", base.task_scorer))
        if scorer not in SCORERS:
            raise QualityConfigError(f"{source}: unknown task_scorer {scorer!r}; known: {', '.join(SCORERS)}")
        measures = dict(base.measures)
        for name, v in (data.get("measures") or {}).items():
            if name not in MEASURES or not isinstance(v, Mapping) or set(v) - {"ok", "zero"}:
                raise QualityConfigError(
                    f"{source}: quality.measures.{name}: expected one of {list(MEASURES)} with {{ok, zero}}"
                )
            score, ok, zero = measures[name]
            ok, zero = float(v.get("ok", ok)), float(v.get("zero", zero))
            if not 0.0 <= ok < zero:
                raise QualityConfigError(f"{source}: quality.measures.{name}: need 0 <= ok < zero")
            measures[name] = (score, ok, zero)
        verdict = {k: dict(v) for k, v in base.verdict.items()}
        for name, v in (data.get("verdict") or {}).items():
            if name not in SCORES or not isinstance(v, Mapping) or set(v) - {"review_below", "fail_below"}:
                raise QualityConfigError(
                    f"{source}: quality.verdict.{name}: expected one of {list(SCORES)} "
                    "with {review_below, fail_below}"
                )
            verdict[name].update({k: float(x) for k, x in v.items()})
            if verdict[name]["fail_below"] > verdict[name]["review_below"]:
                raise QualityConfigError(f"{source}: quality.verdict.{name}: fail_below > review_below")
        return cls(
            task_scorer=scorer,
            spike_z=float(data.get("spike_z", base.spike_z)),
            gap_periods=float(data.get("gap_periods", base.gap_periods)),
            measures=measures,
            verdict=verdict,
        )


@dataclass
class QualityReport:
    smoothness: float
    sensor_health: float
    task: float | None
    verdict: str
    reasons: list[dict]  # {"check": measurement or score, "detail": ...}
    measures: dict[str, float]

    def as_row(self) -> dict:
        """The registry columns."""
        return {
            "smoothness_score": self.smoothness,
            "sensor_health_score": self.sensor_health,
            "task_score": self.task,
            "quality_verdict": self.verdict,
            "quality_reasons": json.dumps(self.reasons),
        }


# -- measurements ------------------------------------------------------------------------------


def _running_median(x: np.ndarray, w: int) -> np.ndarray:
    """Per column, the median of the ``w`` (odd) samples centred on each row, the ends repeated."""
    h = w // 2
    windows = sliding_window_view(np.pad(x, ((h, h), (0, 0)), mode="edge"), w, axis=0)
    return np.partition(windows, h, axis=-1)[..., h]  # a partial sort: ~6x faster than np.median here


def _running_range(x: np.ndarray, w: int) -> np.ndarray:
    """Per column, max - min of the ``w`` samples centred on each row, the ends repeated: after k
    doublings ``hi[i]`` is the max of ``2**k`` samples from ``i``; two overlapping blocks cover ``w``."""
    h = w // 2
    hi = lo = np.pad(x, ((h, h), (0, 0)), mode="edge")
    span = 1
    while 2 * span <= w:
        hi, lo = np.maximum(hi[:-span], hi[span:]), np.minimum(lo[:-span], lo[span:])
        span *= 2
    n, rest = len(x), w - span
    return np.maximum(hi[:n], hi[rest : rest + n]) - np.minimum(lo[:n], lo[rest : rest + n])


def _resolution(x: np.ndarray) -> np.ndarray:
    """Per column, the smallest step above float rounding: the quantum of a quantized signal
    (an encoder count); tiny, so harmless, for a continuous one."""
    d = np.abs(np.diff(x, axis=0))
    step = np.where(d > 1e-9 * (1.0 + np.abs(x).max(axis=0)), d, np.inf).min(axis=0)
    return np.where(np.isfinite(step), step, 0.0)


@dataclass(frozen=True)
class SpikeScale:
    """The spike rule in steps of one stream's rate (see the module docstring)."""

    pulse: int  # steps: pulses up to this wide are spikes
    lag: int  # steps back and ahead the extrapolations start from
    span: int  # steps over which the spike-free signal's motion is measured
    derivatives: bool  # whether acceleration and jerk are checked
    margin: float  # a spike misses by more than this times the spike-free signal's motion


def spike_scale(rate_hz: float) -> SpikeScale:
    """:data:`SPIKE_PULSE_S` in steps at ``rate_hz``: 4 steps, lag 2, span 17 at 200 Hz; at 30 Hz a
    single step, lag 1, the same span, velocity and effort only, and a margin of 1.5 over the motion."""
    pulse = max(1, round(SPIKE_PULSE_S * rate_hz))
    resolved = pulse >= DERIVATIVE_PULSE_STEPS
    span = max(MOTION_SPAN, 2 * pulse + 1)
    return SpikeScale(pulse, max(1, pulse // 2), span, resolved, 1.0 if resolved else UNRESOLVED_MARGIN)


def spike_cells(
    x: np.ndarray,
    z: float,
    lag: int = SPIKE_LAG,
    span: int = MOTION_SPAN,
    pulse: int | None = None,
    margin: float = 1.0,
) -> np.ndarray:
    """(n, c) bool: samples that miss the trajectory on both sides (see the module docstring) by more
    than ``margin`` times its motion; pulses up to ``pulse`` steps wide (default ``2 * lag``) are spikes."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    n = len(x)
    pulse = 2 * lag if pulse is None else pulse
    if n < 4 * lag + 1:
        return np.zeros(x.shape, dtype=bool)
    p = np.pad(x, ((2 * lag, 2 * lag), (0, 0)), mode="edge")
    left = x - 2 * p[lag : lag + n] + p[:n]  # x minus its extrapolation from the two samples before
    right = x - 2 * p[3 * lag : 3 * lag + n] + p[4 * lag :]
    miss = np.minimum(np.abs(left), np.abs(right))
    noise = np.maximum(1.4826 * np.median(np.abs(left - np.median(left, axis=0)), axis=0), _resolution(x))
    motion = _running_range(_running_median(x, 2 * pulse + 1), span)  # the median drops pulses <= pulse wide
    floor = np.maximum(z * noise, 1e-9 * (1.0 + np.abs(x).max(axis=0)))
    return miss > np.maximum(margin * motion, floor)


def _near(mask: np.ndarray) -> np.ndarray:
    """``mask`` widened by one row either side."""
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    return out


def spike_rows(
    joint_states: Mapping[str, np.ndarray], z: float, rate_hz: float = 200.0
) -> tuple[np.ndarray, dict[str, int]]:
    """Boolean mask of control steps where joint velocity, acceleration, jerk or effort spikes,
    and the spiky steps per signal, at the stream's ``rate_hz`` (:func:`spike_scale`). Derivatives
    are per step (the rates are regular): an acceleration belongs to the later of its two steps, a
    jerk to the middle of its three."""
    scale = spike_scale(rate_hz)
    pos, vel, eff = (joint_states.get(k) for k in ("position", "velocity", "effort"))
    if vel is None:
        assert pos is not None  # velocity is derived from position: a joint_states stream has one or the other
        vel = np.diff(np.asarray(pos, dtype=np.float64), axis=0, prepend=pos[:1])
    vel = np.asarray(vel, dtype=np.float64).reshape(len(vel), -1)
    n = len(vel)
    # cast: numpy's stubs type any(axis=1) as possibly a scalar; of an (n, c) array it is (n,)
    hits: dict[str, np.ndarray] = {
        "velocity": cast(np.ndarray, spike_cells(vel, z, scale.lag, scale.span, scale.pulse, scale.margin).any(axis=1)),
        "acceleration": np.zeros(n, dtype=bool),
        "jerk": np.zeros(n, dtype=bool),
    }
    if n > 2 and scale.derivatives:
        # a velocity step is one acceleration sample, an acceleration step one jerk sample: lag 1
        hits["acceleration"][1:] = spike_cells(np.diff(vel, axis=0), z, lag=1).any(axis=1)
        hits["jerk"][1:-1] = spike_cells(np.diff(vel, n=2, axis=0), z, lag=1).any(axis=1)
    hits["acceleration"] &= ~_near(hits["velocity"])  # a velocity glitch's own derivatives
    hits["jerk"] &= ~_near(hits["velocity"] | hits["acceleration"])
    if eff is not None:
        effort = np.asarray(eff).reshape(len(eff), -1)
        hits["effort"] = cast(
            np.ndarray, spike_cells(effort, z, scale.lag, scale.span, scale.pulse, scale.margin).any(axis=1)
        )
    mask = np.logical_or.reduce(list(hits.values()))
    return mask, {k: int(v.sum()) for k, v in hits.items()}


def _rate_hz(ts_ns: np.ndarray, default: float = 200.0) -> float:
    """A regular stream's rate from its median period (``default`` for fewer than two samples)."""
    if len(ts_ns) < 2:
        return default
    period = float(np.median(np.diff(np.asarray(ts_ns, dtype=np.int64))))
    return 1e9 / period if period > 0 else default


def gap_fraction(ts_ns: np.ndarray, periods: float) -> float:
    """Share of a regular stream's span that falls inside gaps longer than ``periods`` nominal periods."""
    if len(ts_ns) < 3:
        return 0.0
    d: np.ndarray = np.diff(np.asarray(ts_ns, dtype=np.int64))  # numpy's stubs type an int64 diff as timedelta64
    period = float(np.median(d))
    span = float(ts_ns[-1] - ts_ns[0])
    if period <= 0 or span <= 0:
        return 0.0
    return float(d[d > periods * period].sum()) / span


def rail_fraction(x: np.ndarray) -> float:
    """Worst channel's share of samples sitting on its min or max (beyond the two any signal
    has): a clipped sensor piles samples on its rails."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if len(x) < 3:
        return 0.0
    at = (x == x.min(axis=0)) | (x == x.max(axis=0))
    return float(np.clip((at.sum(axis=0) - 2) / len(x), 0.0, 1.0).max())


# -- scoring -----------------------------------------------------------------------------------


def _worst(per: Mapping[str, float]) -> tuple[str | None, float]:
    """The name with the highest value, and that value (None, 0.0 when there is none)."""
    if not per:
        return None, 0.0
    name = max(per, key=per.__getitem__)
    return name, per[name]


def _camera_fraction(cameras: Mapping[str, Mapping] | None, key: str) -> dict[str, float]:
    """Per camera, the transcode's count ``key`` over its frames (0 when the report predates it)."""
    return {c: v.get(key, 0) / v["frames"] for c, v in (cameras or {}).items() if v.get("frames")}


def measure(raw, cameras: Mapping[str, Mapping] | None, config: QualityConfig) -> dict[str, tuple[float, str]]:
    """Every measurement of :data:`MEASURES`: its value and the detail a reason would give."""
    stream = raw.streams["joint_states"]
    js = {k: np.asarray(v) for k, v in stream.fields.items()}
    mask, counts = spike_rows(js, config.spike_z, _rate_hz(stream.timestamps_ns))
    out = {
        "spike_fraction": (
            float(mask.mean()) if len(mask) else 0.0,
            f"{int(mask.sum())} of {len(mask)} steps spike ({counts})",
        )
    }

    cam, v = _worst({c: drop_fraction(s.timestamps_ns) for c, s in raw.cameras.items()})
    out["frame_drop_fraction"] = (v, f"images/{cam} misses {v:.2%} of its frames")

    gaps = {n: gap_fraction(s.timestamps_ns, config.gap_periods) for n, s in raw.streams.items()}
    gaps |= {f"images/{c}": gap_fraction(s.timestamps_ns, config.gap_periods) for c, s in raw.cameras.items()}
    name, v = _worst(gaps)
    out["timestamp_gap_fraction"] = (v, f"{name}: {v:.2%} of its span in gaps > {config.gap_periods:g} periods")

    name, v = _worst(
        {
            n: rail_fraction(np.asarray(next(iter(s.fields.values()))))
            for n, s in raw.streams.items()
            if n in SATURATING_STREAMS
        }
    )
    out["saturation_fraction"] = (v, f"{name}: {v:.2%} of samples on a rail")

    cam, v = _worst(_camera_fraction(cameras, "dark_frames"))
    out["dark_frame_fraction"] = (v, f"images/{cam}: {v:.2%} of frames dark")
    cam, v = _worst(_camera_fraction(cameras, "frozen_frames"))
    out["frozen_frame_fraction"] = (v, f"images/{cam}: {v:.2%} of frames repeat the one before (frozen)")
    return out


def score_episode(raw, cameras: Mapping[str, Mapping] | None, config: QualityConfig | None = None) -> QualityReport:
    """``raw``: an open :class:`RawEpisode`; ``cameras``: the transcode report's per-camera figures
    (``frames``, ``dark_frames``, ``frozen_frames``), or None."""
    config = config or QualityConfig()
    values: dict[str, float] = {}
    scores = {"smoothness": 1.0, "sensor_health": 1.0}
    reasons = []
    for name, (v, detail) in measure(raw, cameras, config).items():
        score, ok, zero = config.measures[name]
        scores[score] = min(scores[score], 1.0 - float(np.clip((v - ok) / (zero - ok), 0.0, 1.0)))
        values[name] = v
        if v > ok:
            reasons.append({"check": name, "detail": detail})

    task = SCORERS[config.task_scorer]({"success": raw.meta.success, **raw.meta.as_dict()})
    if task is not None:
        scores["task"] = float(task)
        if task < config.verdict["task"]["review_below"]:
            reasons.append({"check": "task", "detail": f"{config.task_scorer} scored {task:g}"})
    return QualityReport(
        smoothness=round(scores["smoothness"], 6),
        sensor_health=round(scores["sensor_health"], 6),
        task=task,
        verdict=_verdict(scores, config),
        reasons=reasons,
        measures={k: round(v, 6) for k, v in values.items()},
    )


def _verdict(scores: Mapping[str, float], config: QualityConfig) -> str:
    verdict = PASS
    for name, s in scores.items():
        th = config.verdict[name]
        v = FAIL if s < th["fail_below"] else REVIEW if s < th["review_below"] else PASS
        verdict = max(verdict, v, key=(PASS, REVIEW, FAIL).index)
    return verdict
