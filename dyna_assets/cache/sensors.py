"""Prewarm follows the manifests: a new manifest DataVersion requests its cache set, nothing else does."""

import json

from dagster import AssetKey, AssetRecordsFilter, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on

DATA_VERSION_TAG = "dagster/data_version"  # the tag Dagster stamps on a materialization's DataVersion
BATCH = 1000


@sensor(
    **sensor_on("manifest_prewarm_sensor", 30, [AssetKey("cache_sets")]),
    description="When a manifests partition is materialized with a new DataVersion (its content hash), "
    "prewarm its cache set; a rebuild with the same content requests nothing.",
)
def manifest_prewarm_sensor(context: SensorEvaluationContext):
    state = json.loads(context.cursor) if context.cursor else {"after": None, "versions": {}}
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("manifests"), after_storage_id=state["after"]),
        limit=BATCH,
        ascending=True,
    ).records
    latest: dict[str, str] = {}
    for record in records:  # oldest first: the last one per partition wins
        materialization = record.asset_materialization
        version = (materialization.tags or {}).get(DATA_VERSION_TAG) if materialization else None
        if materialization is not None and materialization.partition and version:
            latest[materialization.partition] = version
        state["after"] = record.storage_id
    requests = []
    for partition, version in sorted(latest.items()):
        if state["versions"].get(partition) != version:
            state["versions"][partition] = version
            requests.append(
                RunRequest(
                    run_key=f"prewarm-{partition}-{version[:16]}",
                    partition_key=partition,
                    tags={"dyna/trigger": "manifest-version", "dyna/manifest_version": version, **AUTOMATIC_RUN_TAGS},
                )
            )
    cursor = json.dumps(state)
    if not requests:
        return SensorResult(skip_reason=SkipReason("no manifest has a new DataVersion"), cursor=cursor)
    return SensorResult(run_requests=requests, cursor=cursor)
