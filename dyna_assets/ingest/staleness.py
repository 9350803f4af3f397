"""``mcap_episodes.versions_current``: per ingest partition, does it hold episodes that another pipeline
or schema version wrote? The version check sensor reports it for every partition whose answer
changed (a deploy with a new PIPELINE_VERSION fails the check on every partition it outdates, the
drift backfill passes it again), so the partitions view shows what is stale without anyone running
anything; the check can also be executed by hand from a partition's page. Its engine is
dyna_resources/catalog/staleness.py."""

import json

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    MetadataValue,
    SensorEvaluationContext,
    SensorResult,
    asset_check,
    sensor,
)

from dyna_resources import versions
from dyna_resources.catalog.staleness import PartitionVersions, partition_versions
from dyna_resources.resources import IngestResource

from ..deployment import sensor_on
from .partitions import INGEST_PARTITIONS, ingest_partition_keys, ingest_partitions

MCAP = AssetKey("mcap_episodes")
CHECK = "versions_current"
REPORTS_PER_TICK = 1000  # check results one tick records; the rest follow on the next ticks


def _current() -> tuple[str, str]:
    return versions.SCHEMA_VERSION, versions.PIPELINE_VERSION  # read at each call: a deploy changes them


def _result_fields(p: PartitionVersions) -> dict:
    schema, pipeline = _current()
    return {
        "passed": p.current,
        "severity": AssetCheckSeverity.WARN,  # stale data is still valid data: the drift backfill's to redo
        "description": p.describe(schema, pipeline),
        "metadata": {
            "stale_episodes": p.stale,
            "episodes": p.episodes,
            "by_version": MetadataValue.json(dict(p.by_version)),
            "current_pipeline_version": pipeline,
            "current_schema_version": schema,
        },
    }


@asset_check(
    asset=MCAP,
    name=CHECK,
    partitions_def=ingest_partitions,
    blocking=False,
    description="The partition's episodes are all at the current pipeline and schema versions; fails (WARN) "
    "naming how many are older and at which versions. Reported by version_check_sensor whenever it "
    "changes; the drift backfill brings the partition back to current.",
)
def versions_current(context: AssetCheckExecutionContext, ingest: IngestResource) -> AssetCheckResult:
    keys = ingest_partition_keys(context)
    schema, pipeline = _current()
    found = partition_versions(
        ingest.stores().registry.partition_version_counts(keys), schema=schema, pipeline=pipeline
    )
    parts = [found.get(k, PartitionVersions(partition=k, episodes=0, stale=0)) for k in keys]
    if len(parts) == 1:
        return AssetCheckResult(**_result_fields(parts[0]))
    stale = [p for p in parts if not p.current]
    return AssetCheckResult(
        passed=not stale,
        severity=AssetCheckSeverity.WARN,
        description=f"{len(stale)} of {len(parts)} partitions hold episodes at older versions",
        metadata={"stale_episodes": sum(p.stale for p in parts), "stale_partitions": len(stale)},
    )


@sensor(
    **sensor_on([MCAP], 60),
    description="Reports mcap_episodes.versions_current for every ingest partition whose version status "
    "changed (a new PIPELINE/SCHEMA_VERSION deployed, a backfill done), and the stale episode count "
    "of the asset as an observation; launches no run.",
)
def version_check_sensor(context: SensorEvaluationContext, ingest: IngestResource):
    schema, pipeline = _current()
    state = json.loads(context.cursor) if context.cursor else {}
    reported: dict[str, int] = state.get("reported", {}) if state.get("current") == [schema, pipeline] else {}
    found = partition_versions(ingest.stores().registry.partition_version_counts(), schema=schema, pipeline=pipeline)
    known = set(context.instance.get_dynamic_partitions(INGEST_PARTITIONS))
    changed = [p for key, p in found.items() if key in known and reported.get(key) != p.stale][:REPORTS_PER_TICK]
    if not changed:
        return SensorResult(skip_reason="no partition's version status changed", cursor=context.cursor)
    events: list = [
        AssetCheckEvaluation(asset_key=MCAP, check_name=CHECK, partition=p.partition, **_result_fields(p))
        for p in changed
    ]
    reported |= {p.partition: p.stale for p in changed}
    stale = [p for p in found.values() if p.partition in known and not p.current]
    events.append(
        AssetObservation(
            asset_key=MCAP,
            metadata={
                "stale_episodes": sum(p.stale for p in stale),
                "stale_partitions": len(stale),
                "stale_partition_keys": MetadataValue.json([p.partition for p in stale[:100]]),
                "current_pipeline_version": pipeline,
                "current_schema_version": schema,
            },
        )
    )
    context.log.info(
        f"versions_current: {len(changed)} partition(s) changed, {len(stale)} of {len(known)} now hold older episodes"
    )
    return SensorResult(asset_events=events, cursor=json.dumps({"current": [schema, pipeline], "reported": reported}))
