"""Which ingest partitions hold episodes written by another pipeline or schema version than the
current code's: what ``mcap_episodes.versions_current`` reports per partition. Folded from the
registry's per-partition version summary (catalog/partition_versions.py), so the cost follows the
partitions, never the episodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .registry import QUARANTINED, TRANSCODED

# The verdicts a version stamps: a transcoded MCAP, or a quarantine decided by that code.
_VERSIONED = (TRANSCODED, QUARANTINED)


@dataclass(frozen=True)
class PartitionVersions:
    partition: str
    episodes: int  # transcoded or quarantined
    stale: int  # of those, written by another pipeline or schema version
    by_version: Mapping[str, int] = field(default_factory=dict)  # "pipeline <p>, schema <s>" -> episodes

    @property
    def current(self) -> bool:
        return self.stale == 0

    def describe(self, schema: str, pipeline: str) -> str:
        if self.current:
            return f"{self.partition}: all {self.episodes} episodes at pipeline {pipeline}, schema {schema}"
        older = ", ".join(f"{n} at {v}" for v, n in sorted(self.by_version.items()) if v != _label(pipeline, schema))
        return (
            f"{self.partition}: {self.stale} of {self.episodes} episodes at older versions ({older}); "
            f"current is pipeline {pipeline}, schema {schema}: the drift backfill redoes them"
        )


def _label(pipeline: str, schema: str) -> str:
    return f"pipeline {pipeline or '?'}, schema {schema or '?'}"


def partition_versions(rows: Iterable[Mapping], *, schema: str, pipeline: str) -> dict[str, PartitionVersions]:
    """Per partition, from :meth:`Registry.partition_version_counts` rows."""
    by: dict[str, Counter] = {}
    for r in rows:
        if not r["partition_key"] or r["status"] not in _VERSIONED:
            continue
        by.setdefault(r["partition_key"], Counter())[_label(r["pipeline_version"], r["schema_version"])] += r[
            "episodes"
        ]
    current = _label(pipeline, schema)
    return {
        p: PartitionVersions(
            partition=p,
            episodes=sum(c.values()),
            stale=sum(n for v, n in c.items() if v != current),
            by_version=dict(sorted(c.items())),
        )
        for p, c in sorted(by.items())
    }
