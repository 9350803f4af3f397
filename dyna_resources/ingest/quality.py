"""Quality scores of one episode, computed at ingest: trajectory smoothness, sensor health and
task success, each in [0, 1], and a verdict ``pass`` / ``review`` / ``fail`` with its reasons.

Everything is measured on the raw episode's arrays (vectorized numpy, no frame decoding) plus
the transcode report's per-camera figures (dark frames: the transcode saw every frame).

Each measurement ``v`` has an ``ok`` level and a ``zero`` level: its score is 1 at or below
``ok``, 0 at or above ``zero``, linear between, and it gives a reason when above ``ok``. A
score is the worst of its measurements. A score below ``review_below`` sends the episode to
the review pool, below ``fail_below`` fails it; the verdict is the worst over the scores.

Frozen frames are not measured here: a camera stuck on one flat level is what the pre gate
``dead_camera`` samples for, and dark frames are counted by the transcode; a frozen *textured*
picture would need every frame decoded and compared, which the transcode does not keep.

Settings come from the ``quality:`` section of the gates file (``$DYNA_HOME/gates.yaml``)::

    quality:
      task_scorer: metadata_success       # a name in SCORERS
      spike_z: 6.0
      measures: {frame_drop_fraction: {ok: 0.005, zero: 0.2}}
      verdict: {smoothness: {review_below: 0.9, fail_below: 0.5}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from .gates import drop_fraction

PASS, REVIEW, FAIL = "pass", "review", "fail"
SCORES = ("smoothness", "sensor_health", "task")
SATURATING_STREAMS = ("imu", "wrench")  # sensors with a measuring range whose rails mean clipping

# measurement -> (score it belongs to, ok, zero)
MEASURES: dict[str, tuple[str, float, float]] = {
    "spike_fraction": ("smoothness", 0.002, 0.01),  # control steps with a velocity/accel/jerk/effort spike
    "frame_drop_fraction": ("sensor_health", 0.005, 0.2),  # worst camera: missing frames / frames
    "timestamp_gap_fraction": ("sensor_health", 0.0, 0.2),  # worst stream: time inside gaps / duration
    "saturation_fraction": ("sensor_health", 0.005, 0.1),  # worst IMU/force channel: samples on a rail
    "dark_frame_fraction": ("sensor_health", 0.01, 0.1),  # worst camera: dark frames / frames
}
VERDICT = {"smoothness": {"review_below": 0.9, "fail_below": 0.5},
           "sensor_health": {"review_below": 0.9, "fail_below": 0.5},
           "task": {"review_below": 0.5, "fail_below": 0.0}}  # failed demonstrations go to review, not out


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
    spike_z: float = 6.0  # a deviation this many times the 99th percentile is a spike
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
                raise QualityConfigError(f"{source}: quality.measures.{name}: expected one of {list(MEASURES)} "
                                         "with {ok, zero}")
            score, ok, zero = measures[name]
            ok, zero = float(v.get("ok", ok)), float(v.get("zero", zero))
            if not 0.0 <= ok < zero:
                raise QualityConfigError(f"{source}: quality.measures.{name}: need 0 <= ok < zero")
            measures[name] = (score, ok, zero)
        verdict = {k: dict(v) for k, v in base.verdict.items()}
        for name, v in (data.get("verdict") or {}).items():
            if name not in SCORES or not isinstance(v, Mapping) or set(v) - {"review_below", "fail_below"}:
                raise QualityConfigError(f"{source}: quality.verdict.{name}: expected one of {list(SCORES)} "
                                         "with {review_below, fail_below}")
            verdict[name].update({k: float(x) for k, x in v.items()})
            if verdict[name]["fail_below"] > verdict[name]["review_below"]:
                raise QualityConfigError(f"{source}: quality.verdict.{name}: fail_below > review_below")
        return cls(task_scorer=scorer, spike_z=float(data.get("spike_z", base.spike_z)),
                   gap_periods=float(data.get("gap_periods", base.gap_periods)), measures=measures, verdict=verdict)


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
        return {"smoothness_score": self.smoothness, "sensor_health_score": self.sensor_health,
                "task_score": self.task, "quality_verdict": self.verdict, "quality_reasons": json.dumps(self.reasons)}


# -- measurements ------------------------------------------------------------------------------

def robust_z(x: np.ndarray) -> np.ndarray:
    """|x - median| per column, in units of the column's 99th percentile of that deviation.
    Robust (a few spikes do not move it) and never zero for a noise-free smooth signal, whose
    median deviation can be 0; a clean signal stays below a few units."""
    dev = np.abs(x - np.median(x, axis=0))
    scale = np.percentile(dev, 99, axis=0)
    return dev / np.maximum(scale, 1e-9 * (1.0 + np.abs(x).max(axis=0)))


def spike_rows(joint_states: Mapping[str, np.ndarray], z: float) -> tuple[np.ndarray, dict[str, int]]:
    """Boolean mask of control steps where joint acceleration, jerk or effort rate spikes, and
    the spike count per signal. Derivatives are per step: the rates are regular. A velocity
    spike shows as an acceleration and a jerk spike."""
    pos, vel, eff = (joint_states.get(k) for k in ("position", "velocity", "effort"))
    if vel is None:
        vel = np.diff(np.asarray(pos, dtype=np.float64), axis=0, prepend=pos[:1])
    vel = np.asarray(vel, dtype=np.float64).reshape(len(vel), -1)
    signals = {"acceleration": np.diff(vel, axis=0), "jerk": np.diff(vel, n=2, axis=0)}
    if eff is not None:
        eff = np.asarray(eff, dtype=np.float64)
        signals["effort"] = np.diff(eff.reshape(len(eff), -1), axis=0)
    mask = np.zeros(len(vel), dtype=bool)
    counts: dict[str, int] = {}
    for name, x in signals.items():
        if len(x) < 10:
            continue
        hit = (robust_z(x) > z).any(axis=1)
        counts[name] = int(hit.sum())
        mask[1: 1 + len(hit)] |= hit  # a difference belongs to the later step
    return mask, counts


def gap_fraction(ts_ns: np.ndarray, periods: float) -> float:
    """Share of a regular stream's span that falls inside gaps longer than ``periods`` nominal periods."""
    if len(ts_ns) < 3:
        return 0.0
    d = np.diff(np.asarray(ts_ns, dtype=np.int64))
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

def score_episode(raw, cameras: Mapping[str, Mapping] | None, config: QualityConfig | None = None) -> QualityReport:
    """``raw``: an open :class:`RawEpisode`; ``cameras``: the transcode report's per-camera figures
    (``frames``, ``dark_frames``), or None."""
    config = config or QualityConfig()
    js = {k: np.asarray(v) for k, v in raw.streams["joint_states"].fields.items()}
    values: dict[str, float] = {}
    detail: dict[str, str] = {}

    mask, counts = spike_rows(js, config.spike_z)
    values["spike_fraction"] = float(mask.mean()) if len(mask) else 0.0
    detail["spike_fraction"] = f"{int(mask.sum())} of {len(mask)} steps spike ({counts})"

    drops = {c: drop_fraction(cam.timestamps_ns) for c, cam in raw.cameras.items()}
    worst = max(drops, key=drops.get) if drops else None
    values["frame_drop_fraction"] = drops[worst] if worst else 0.0
    detail["frame_drop_fraction"] = f"images/{worst} misses {values['frame_drop_fraction']:.2%} of its frames"

    gaps = {n: gap_fraction(s.timestamps_ns, config.gap_periods) for n, s in raw.streams.items()}
    gaps |= {f"images/{c}": gap_fraction(cam.timestamps_ns, config.gap_periods) for c, cam in raw.cameras.items()}
    worst = max(gaps, key=gaps.get)
    values["timestamp_gap_fraction"] = gaps[worst]
    detail["timestamp_gap_fraction"] = (f"{worst}: {gaps[worst]:.2%} of its span in gaps > "
                                        f"{config.gap_periods:g} periods")

    sat = {n: rail_fraction(np.asarray(next(iter(s.fields.values()))))
           for n, s in raw.streams.items() if n in SATURATING_STREAMS}
    worst = max(sat, key=sat.get) if sat else None
    values["saturation_fraction"] = sat[worst] if worst else 0.0
    detail["saturation_fraction"] = f"{worst}: {values['saturation_fraction']:.2%} of samples on a rail"

    dark = {c: v["dark_frames"] / v["frames"] for c, v in (cameras or {}).items() if v.get("frames")}
    worst = max(dark, key=dark.get) if dark else None
    values["dark_frame_fraction"] = dark[worst] if worst else 0.0
    detail["dark_frame_fraction"] = f"images/{worst}: {values['dark_frame_fraction']:.2%} of frames dark"

    scores = {"smoothness": 1.0, "sensor_health": 1.0}
    reasons = []
    for name, v in values.items():
        score, ok, zero = config.measures[name]
        s = 1.0 - float(np.clip((v - ok) / (zero - ok), 0.0, 1.0))
        scores[score] = min(scores[score], s)
        if v > ok:
            reasons.append({"check": name, "detail": detail[name]})

    task = SCORERS[config.task_scorer]({"success": raw.meta.success, **raw.meta.as_dict()})
    if task is not None:
        scores["task"] = float(task)
        if task < config.verdict["task"]["review_below"]:
            reasons.append({"check": "task", "detail": f"{config.task_scorer} scored {task:g}"})
    verdict = PASS
    for name, s in scores.items():
        th = config.verdict[name]
        v = FAIL if s < th["fail_below"] else REVIEW if s < th["review_below"] else PASS
        verdict = max(verdict, v, key=(PASS, REVIEW, FAIL).index)
    return QualityReport(smoothness=round(scores["smoothness"], 6), sensor_health=round(scores["sensor_health"], 6),
                         task=task, verdict=verdict, reasons=reasons,
                         measures={k: round(v, 6) for k, v in values.items()})
