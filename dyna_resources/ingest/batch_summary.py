"""What a work unit, or an ingest partition's units, hold after a stage: the figures the UI shows
for a partition and the demo prints (no Dagster here)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..catalog.registry import REJECTED, TRANSCODED, Registry
from ..figures import gigabytes, rounded

QUARANTINE_REASONS_SHOWN = 100  # the first ones, in the registry's order; the count says how many in all


@dataclass(frozen=True)
class BatchSummary:
    units: int
    files: int
    episodes: int  # "pre": passed the pre gates; "post": transcoded
    episodes_by_status: dict[str, int]
    hours: float
    bytes_in: int
    bytes_out: int
    compression_ratio: float  # bytes out / bytes in ("post" only; 0.0 otherwise)
    quarantined: int
    quarantined_reasons: list[dict[str, Any]] = field(default_factory=list)
    flags: dict[str, int] = field(default_factory=dict)
    pipeline_versions: dict[str, int] = field(default_factory=dict)  # transcoded episodes per version
    schema_versions: dict[str, int] = field(default_factory=dict)

    def as_metadata(self) -> dict[str, Any]:
        """Plain values as a person reads them (:mod:`dyna_resources.figures`): sizes in GB (``source_GB``,
        ``mcap_GB``), floats to four significant digits; Dagster shows the dicts and lists as JSON."""
        d = asdict(self)
        for k in ("schema_versions", "bytes_in", "bytes_out"):
            del d[k]
        d.update(hours=rounded(self.hours), compression_ratio=rounded(self.compression_ratio))
        return {**d, "source_GB": gigabytes(self.bytes_in), "mcap_GB": gigabytes(self.bytes_out)}


def batch_summary(batch_key: str | Sequence[str], registry: Registry, stage: str = "post") -> BatchSummary:
    """``stage`` "pre" counts the episodes that passed the pre gates (input bytes only), "post" the
    transcoded ones (bytes in and out)."""
    eps = registry.episodes(batch_key)
    q = registry.quarantined(batch_key)
    status = Counter(e["status"] for e in eps)
    done = [e for e in eps if (e["status"] == TRANSCODED if stage == "post" else e["status"] != REJECTED)]
    transcoded = [e for e in eps if e["status"] == TRANSCODED]
    bytes_in = sum(e["source_bytes"] for e in done)
    bytes_out = sum(e["mcap_bytes"] or 0 for e in done if e["status"] == TRANSCODED)
    return BatchSummary(
        units=1 if isinstance(batch_key, str) else len(batch_key),
        files=len(registry.batch_files(batch_key)),
        episodes=len(done),
        episodes_by_status=dict(sorted(status.items())),
        hours=round(sum(e["duration_s"] for e in done) / 3600, 4),
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        compression_ratio=round(bytes_out / bytes_in, 4) if bytes_in and stage == "post" else 0.0,
        quarantined=len(q),
        quarantined_reasons=[
            {"path": r["source_path"], **{k: r[k] for k in ("episode_id", "stage", "gate", "reason")}}
            for r in q[:QUARANTINE_REASONS_SHOWN]
        ],
        flags={
            "camera_dropped": sum(bool(e["camera_dropped"]) for e in eps),
            "camera_dead": sum(bool(e["camera_dead"]) for e in eps),
        },
        pipeline_versions=dict(Counter(e["pipeline_version"] for e in transcoded)),
        schema_versions=dict(Counter(e["schema_version"] for e in transcoded)),
    )


__all__ = ["BatchSummary", "batch_summary"]
