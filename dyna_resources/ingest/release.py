"""Release quarantine records of a class (``dyna quarantine release --reason-class infrastructure``):
the one-off repair for records that earlier versions wrote for faults of the machine, which this
version never writes (:mod:`.faults`). Plain Python over the registry."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..catalog.registry import Registry
from .faults import FaultClass, classify_all, reason_kind


@dataclass(frozen=True)
class Release:
    """What a release did (or, with ``dry_run``, would do).

    :param records: the quarantine records of the class, as the registry held them.
    :param kinds: how many of each reason kind.
    :param pending: episode ids now pending: the next run of their partitions redoes them (the drift
        sensor launches it).
    :param reinventory: partitions holding released files that never got an episode row (held back by
        the pre gates): their ``raw_episodes`` must run again.
    """

    records: list[dict]
    kinds: dict[str, int]
    pending: list[str] = field(default_factory=list)
    reinventory: list[str] = field(default_factory=list)
    dry_run: bool = False


def release_quarantined(registry: Registry, reason_class: FaultClass, *, dry_run: bool = False) -> Release:
    """Release every quarantine record whose reason is of ``reason_class`` (see :data:`.faults.REASONS`)."""
    records = classify_all(registry.quarantined())[reason_class]
    kinds = dict(Counter(reason_kind(r["gate"], r["reason"]).name for r in records))
    if dry_run or not records:
        return Release(records, kinds, dry_run=dry_run)
    pending = registry.release_quarantine([r["source_path"] for r in records])
    held_early = {r["batch_key"] for r in records if r["stage"] == "pre"}
    partitions = sorted({u.partition_key for u in map(registry.batch, sorted(held_early)) if u.partition_key})
    return Release(records, kinds, pending, partitions)
