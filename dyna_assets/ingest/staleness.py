"""``mcap_episodes.versions_current``: per ingest partition, does it hold episodes that another pipeline
or schema version wrote? The version check sensor has it recorded for every partition whose
answer changed, by one small run (a deploy with a new PIPELINE_VERSION fails the check on every
partition it outdates, the drift backfill passes it again), so the partitions view shows what is
stale without anyone running anything; the check can also be executed by hand from a partition's
page. Its engine is
dyna_resources/catalog/staleness.py."""

import hashlib
import json

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    SensorEvaluationContext,
    SkipReason,
    asset_check,
    job,
    op,
    sensor,
)

from dyna_resources import versions
from dyna_resources.catalog.staleness import PartitionVersions, partition_versions
from dyna_resources.resources import IngestResource

from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on
from .partitions import INGEST_PARTITIONS, ingest_partition_keys, ingest_partitions

MCAP = AssetKey("mcap_episodes")
CHECK = "versions_current"
REPORTS_PER_RUN = 1000  # partitions one run reports; the rest follow on the next ticks


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
    registry = ingest.stores().registry
    keys = ingest_partition_keys(context, registry)
    schema, pipeline = _current()
    found = partition_versions(registry.partition_version_counts(keys), schema=schema, pipeline=pipeline)
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


@op(
    config_schema={"partitions": [str]},
    tags={"dyna/stage": "version-check"},
    description="Records mcap_episodes.versions_current for each partition named, and the asset's stale "
    "episode count as an observation.",
)
def report_versions(context: OpExecutionContext, ingest: IngestResource) -> None:
    schema, pipeline = _current()
    registry = ingest.stores().registry
    keys = list(context.op_config["partitions"])
    found = partition_versions(registry.partition_version_counts(keys), schema=schema, pipeline=pipeline)
    for key in keys:
        p = found.get(key, PartitionVersions(partition=key, episodes=0, stale=0))
        # An evaluation per partition logged by this one run: Dagster 1.13 records a runless (sensor-
        # reported) evaluation of a partitioned check only once per partition (its asset_check_executions
        # unique index holds run_id '' and the partition), so a second report of a partition would fail.
        evaluation = AssetCheckEvaluation(asset_key=MCAP, check_name=CHECK, partition=key, **_result_fields(p))
        context.log_event(evaluation)  # type: ignore[arg-type]  # handled at run time; the annotation omits it
    every = partition_versions(registry.partition_version_counts(), schema=schema, pipeline=pipeline)
    stale = [p for p in every.values() if not p.current]
    context.log_event(
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
    context.log.info(f"versions_current: {len(keys)} partition(s) reported, {len(stale)} hold older episodes")


@job(tags={"dyna/stage": "version-check"}, description="What version_check_sensor launches.")
def report_version_checks():
    report_versions()


@sensor(
    job=report_version_checks,
    **sensor_on("version_check_sensor", 60),
    description="When ingest partitions' version status changed (a new PIPELINE/SCHEMA_VERSION deployed, a "
    "backfill done), one small run records mcap_episodes.versions_current for exactly those "
    "partitions (at most 1000 a run) and the asset's stale episode count.",
)
def version_check_sensor(context: SensorEvaluationContext, ingest: IngestResource):
    schema, pipeline = _current()
    state = json.loads(context.cursor) if context.cursor else {}
    reported: dict[str, int] = state.get("reported", {}) if state.get("current") == [schema, pipeline] else {}
    found = partition_versions(ingest.stores().registry.partition_version_counts(), schema=schema, pipeline=pipeline)
    known = set(context.instance.get_dynamic_partitions(INGEST_PARTITIONS))
    changed = [p for key, p in found.items() if key in known and reported.get(key) != p.stale][:REPORTS_PER_RUN]
    if not changed:
        return SkipReason("no partition's version status changed")
    reported |= {p.partition: p.stale for p in changed}
    cursor = json.dumps({"current": [schema, pipeline], "reported": reported})
    keys = [p.partition for p in changed]
    context.update_cursor(cursor)
    return RunRequest(
        run_key=hashlib.sha256(cursor.encode()).hexdigest()[:16],
        run_config={"ops": {"report_versions": {"config": {"partitions": keys}}}},
        tags={
            "dyna/trigger": "version-status",
            "dyna/partitions": str(len(keys)),
            "dyna/stale_partitions": str(sum(not p.current for p in changed)),
            **AUTOMATIC_RUN_TAGS,
        },
    )
