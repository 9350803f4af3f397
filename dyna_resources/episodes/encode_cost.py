"""What an encoder setting costs per episode-hour: CPU once at ingest, then storage for the retention.

A setting is measured once (``benchmarks/encode.py``) as an :class:`EncodePoint`: bytes and CPU
seconds per frame, and PSNR. Among the points that reach a quality floor, :func:`pareto_front`
keeps those that no other point beats on both bytes and CPU, and :func:`cheapest` prices them with
a :class:`CostModel` (compute once + storage over the retention) and returns the cheapest.

Plain Python, no Dagster; every function is pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GIB = 2**30  # cloud storage bills "GB-months" of 2^30 bytes
FLEET_FRAMES_PER_EPISODE_HOUR = 3 * 30 * 3600  # 3 cameras at 30 Hz


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def _finite_at_least(name: str, value: float, low: float) -> None:
    _require(
        isinstance(value, (int, float)) and math.isfinite(value) and value >= low,
        name,
        value,
        f"a finite number >= {low:g}",
    )


@dataclass(frozen=True)
class CostModel:
    """Prices that turn an encoder setting's bytes and CPU into dollars per episode-hour."""

    core_hour_usd: float = 0.04
    """Price of one core (vCPU) for one hour, as the transcode fleet pays it."""
    storage_gb_month_usd: float = 0.02
    """Price of storing one GB (2^30 bytes) for one month, per copy."""
    retention_months: float = 36.0
    """How long an encoded episode is kept: the storage bill runs this many months."""
    copies: int = 1
    """Stored copies (replicas, a second region): multiplies the storage bill, not the encode."""
    frames_per_episode_hour: int = FLEET_FRAMES_PER_EPISODE_HOUR
    """Video frames in one episode-hour: cameras x rate x 3600 (the fleet: 3 x 30 Hz)."""

    def __post_init__(self):
        for name in ("core_hour_usd", "storage_gb_month_usd", "retention_months"):
            _finite_at_least(name, getattr(self, name), 0.0)
        _require(isinstance(self.copies, int) and self.copies >= 1, "copies", self.copies, "an integer >= 1")
        _require(
            isinstance(self.frames_per_episode_hour, int) and self.frames_per_episode_hour >= 1,
            "frames_per_episode_hour",
            self.frames_per_episode_hour,
            "an integer >= 1",
        )


@dataclass(frozen=True)
class EncodePoint:
    """One encoder setting, measured on a set of frames."""

    preset: str
    """x264 preset, e.g. ``"faster"``."""
    crf: float
    """x264 constant rate factor."""
    options: str
    """x264 options on top of the preset, as ``x264-params`` spells them (``"ref=2:trellis=2"``); ``""``: none."""
    bytes_per_frame: float
    """Mean encoded bytes per frame."""
    psnr_db: float
    """Mean per-frame PSNR (dB) against the reference frames: the quality the floor applies to."""
    cpu_s_per_frame: float
    """Encoder CPU seconds per frame, on one core."""

    def __post_init__(self):
        _require(isinstance(self.preset, str) and bool(self.preset), "preset", self.preset, "a non-empty string")
        _finite_at_least("crf", self.crf, 0.0)
        _require(isinstance(self.options, str), "options", self.options, "a string")
        _require(
            isinstance(self.bytes_per_frame, (int, float))
            and math.isfinite(self.bytes_per_frame)
            and self.bytes_per_frame > 0,
            "bytes_per_frame",
            self.bytes_per_frame,
            "a finite number > 0",
        )
        _require(
            isinstance(self.psnr_db, (int, float)) and not math.isnan(self.psnr_db),
            "psnr_db",
            self.psnr_db,
            "a number (inf for a lossless frame)",
        )
        _finite_at_least("cpu_s_per_frame", self.cpu_s_per_frame, 0.0)

    @property
    def label(self) -> str:
        """``preset/crf[/options]``: how tables name the setting."""
        return f"{self.preset}/{self.crf:g}" + (f"/{self.options}" if self.options else "")


@dataclass(frozen=True)
class EpisodeHourCost:
    """What one episode-hour costs at one setting, in USD."""

    compute_usd: float
    """Encoding it once."""
    storage_usd: float
    """Keeping its bytes for the retention, every copy."""

    @property
    def total_usd(self) -> float:
        return self.compute_usd + self.storage_usd


@dataclass(frozen=True)
class Pick:
    """The cheapest acceptable setting and what it costs."""

    point: EncodePoint
    cost: EpisodeHourCost
    episode_hours_per_core_hour: float


def episode_hours_per_core_hour(point: EncodePoint, model: CostModel | None = None) -> float:
    """Episode-hours one core encodes in an hour at ``point`` (encoder CPU only).

    :param point: the measured setting.
    :param model: gives the frames in an episode-hour (default: the fleet's 3 cameras at 30 Hz).
    """
    frames = (model or CostModel()).frames_per_episode_hour
    return math.inf if point.cpu_s_per_frame == 0 else 3600.0 / (point.cpu_s_per_frame * frames)


def cost_per_episode_hour(point: EncodePoint, model: CostModel) -> EpisodeHourCost:
    """Compute (once) and storage (over the retention) of one episode-hour at ``point``.

    :param point: the measured setting.
    :param model: the prices.
    """
    frames = model.frames_per_episode_hour
    compute = point.cpu_s_per_frame * frames / 3600.0 * model.core_hour_usd
    storage = point.bytes_per_frame * frames / GIB * model.storage_gb_month_usd * model.retention_months * model.copies
    return EpisodeHourCost(compute_usd=compute, storage_usd=storage)


def acceptable(
    points: Sequence[EncodePoint],
    min_psnr_db: float,
    *,
    model: CostModel | None = None,
    min_episode_hours_per_core_hour: float = 0.0,
) -> list[EncodePoint]:
    """The points at or above the quality floor (and the throughput floor, if one is set), in order.

    :param points: measured settings; must not be empty.
    :param min_psnr_db: the quality floor on :attr:`EncodePoint.psnr_db`.
    :param model: gives the frames in an episode-hour for the throughput floor.
    :param min_episode_hours_per_core_hour: the throughput floor; 0: none.
    :raises ValueError: for an empty ``points`` or a floor that is not a number.
    """
    if not points:
        raise ValueError("points must not be empty: nothing to choose from")
    _require(
        isinstance(min_psnr_db, (int, float)) and not math.isnan(min_psnr_db), "min_psnr_db", min_psnr_db, "a number"
    )
    _finite_at_least("min_episode_hours_per_core_hour", min_episode_hours_per_core_hour, 0.0)
    return [
        p
        for p in points
        if p.psnr_db >= min_psnr_db and episode_hours_per_core_hour(p, model) >= min_episode_hours_per_core_hour
    ]


def pareto_front(points: Sequence[EncodePoint], min_psnr_db: float) -> list[EncodePoint]:
    """The acceptable points that no other acceptable point beats on both bytes and CPU, fastest first.

    A point is dominated when another has no more bytes and no more CPU per frame, and less of one.
    Of points equal on both, the first is kept.

    :param points: measured settings; must not be empty.
    :param min_psnr_db: the quality floor; points under it are never on the front.
    :raises ValueError: for an empty ``points``.
    """
    ok = acceptable(points, min_psnr_db)
    front: list[EncodePoint] = []
    # Fastest first (then smallest): a point is on the front iff it has fewer bytes than every point before it.
    for p in sorted(ok, key=lambda p: (p.cpu_s_per_frame, p.bytes_per_frame)):
        if not front or p.bytes_per_frame < front[-1].bytes_per_frame:
            front.append(p)
    return front


def cheapest(
    points: Sequence[EncodePoint], model: CostModel, min_psnr_db: float, *, min_episode_hours_per_core_hour: float = 0.0
) -> Pick | None:
    """The acceptable point with the lowest cost per episode-hour; None when no point is acceptable.

    Cost rises with both bytes and CPU, so the pick is always on :func:`pareto_front`. Ties go to the
    smaller, then the faster point.

    :param points: measured settings; must not be empty.
    :param model: the prices.
    :param min_psnr_db: the quality floor; points under it are never picked.
    :param min_episode_hours_per_core_hour: the throughput floor (episode-hours one core encodes per hour);
        points under it are never picked. 0: none.
    :raises ValueError: for an empty ``points``.
    """
    ok = acceptable(points, min_psnr_db, model=model, min_episode_hours_per_core_hour=min_episode_hours_per_core_hour)
    if not ok:
        return None
    best = min(ok, key=lambda p: (cost_per_episode_hour(p, model).total_usd, p.bytes_per_frame, p.cpu_s_per_frame))
    return Pick(
        point=best,
        cost=cost_per_episode_hour(best, model),
        episode_hours_per_core_hour=episode_hours_per_core_hour(best, model),
    )
