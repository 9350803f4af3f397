"""Ingest one partition: its byte-balanced work units, each through the batch engine
(:mod:`.batches`), with progress reported as each unit finishes.

A partition holds a few TiB in production (thousands of episodes), so its run is where the
parallel work is: every unit is independent (its own files, episodes and registry rows), a
unit's outcome is durable the moment each of its episodes is recorded, and a unit that fails
as a whole (its worker died, the store was unreachable for it) fails alone: the others go on and
the run reports it. A rerun redoes only what is stale in each unit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..catalog.registry import Batch
from ..episodes.transcode import TranscodeSettings
from .batches import IngestStores, StageReport, inventory_batch, transcode_batch
from .gates import GateConfig


@dataclass(frozen=True)
class Progress:
    """Where a partition's run stands, after a unit finished."""

    partition_key: str
    stage: str
    units_done: int
    units_total: int
    units_failed: int
    episodes: int  # episodes processed so far (quarantined included)
    bytes_done: int  # input bytes of the finished units
    bytes_total: int
    elapsed_s: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_done / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if not self.bytes_done:
            return None
        return self.elapsed_s * (self.bytes_total - self.bytes_done) / self.bytes_done

    def line(self) -> str:
        eta = "?" if self.eta_s is None else f"{self.eta_s:.0f} s"
        return (f"{self.partition_key} {self.stage}: {self.units_done}/{self.units_total} units"
                + (f" ({self.units_failed} failed)" if self.units_failed else "")
                + f", {self.episodes} episodes, {self.bytes_done / 1e9:.2f} of {self.bytes_total / 1e9:.2f} GB,"
                  f" {self.mb_per_s:.1f} MB/s, ETA {eta}")


@dataclass
class PartitionReport:
    """A partition's stage: the combined report, each unit's, and the units that failed whole."""

    partition_key: str
    stage: str
    combined: StageReport
    units: list[StageReport] = field(default_factory=list)
    failed_units: dict[str, str] = field(default_factory=dict)  # unit key -> reason


def run_partition(partition_key: str, stage: str, units: Sequence[Batch],
                  run_unit: Callable[[Batch], StageReport], *,
                  on_progress: Callable[[Progress], None] = lambda p: None,
                  clock: Callable[[], float] = time.monotonic) -> PartitionReport:
    """Run ``run_unit`` for every unit, largest first, and combine the reports. A unit that
    raises is recorded as failed with the reason and the others go on; an unreachable store or
    registry (the partition's critical dependencies) is checked by the caller before."""
    t0 = clock()
    total = sum(u.bytes for u in units)
    reports: list[StageReport] = []
    failed: dict[str, str] = {}
    done_bytes = episodes = 0
    for n, unit in enumerate(sorted(units, key=lambda u: (-u.bytes, u.seq)), start=1):
        try:
            rep = run_unit(unit)
        except Exception as e:  # noqa: BLE001  (one unit failing whole must not cancel the others)
            failed[unit.key] = f"{type(e).__name__}: {e}"
        else:
            reports.append(rep)
            episodes += len(rep.processed) + len(rep.quarantined)
        done_bytes += unit.bytes
        on_progress(Progress(partition_key, stage, n, len(units), len(failed), episodes, done_bytes, total,
                             clock() - t0))
    combined = StageReport.combine(partition_key, stage, reports)
    return PartitionReport(partition_key, stage, combined, reports, failed)


def inventory_partition(partition_key: str, stores: IngestStores, gates: GateConfig, *,
                        log: Callable[[str], None] = lambda m: None,
                        on_progress: Callable[[Progress], None] = lambda p: None) -> PartitionReport:
    """``raw_episodes`` for one partition: every unit's inventory and pre gates."""
    stores.check()
    units = stores.registry.partition_units(partition_key)
    return run_partition(partition_key, "pre", units, lambda u: inventory_batch(u.key, stores, gates, log=log),
                         on_progress=on_progress)


def transcode_partition(partition_key: str, stores: IngestStores, gates: GateConfig, *,
                        settings: TranscodeSettings | None = None, workers: int | None = None,
                        log: Callable[[str], None] = lambda m: None,
                        on_progress: Callable[[Progress], None] = lambda p: None) -> PartitionReport:
    """``mcap_episodes`` for one partition: what is stale in every unit, transcoded and post-gated."""
    stores.check()
    units = stores.registry.partition_units(partition_key)
    return run_partition(partition_key, "post", units,
                         lambda u: transcode_batch(u.key, stores, gates, settings=settings, workers=workers, log=log),
                         on_progress=on_progress)
