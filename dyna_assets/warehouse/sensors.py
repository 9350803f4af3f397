"""Near-real-time sync: whenever the registry has changes the warehouse has not applied, run the sync."""

from dagster import AssetKey, RunRequest, SensorEvaluationContext, SkipReason, sensor

from dyna_resources.catalog.cdc import pending
from dyna_resources.resources import IngestResource

from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on


@sensor(
    **sensor_on([AssetKey("warehouse_episodes")], 10),
    description="Registry changes pending → one warehouse sync run (run key = oldest pending change, so a "
    "burst never launches twice; DuckDB writers are serialized by the duckdb pool).",
)
def warehouse_sync_sensor(context: SensorEvaluationContext, ingest: IngestResource):
    marker = pending(ingest.stores().registry)
    if marker is None:
        return SkipReason("the warehouse is up to date")
    return RunRequest(run_key=f"cdc-{marker}", tags={"dyna/trigger": "cdc", **AUTOMATIC_RUN_TAGS})
