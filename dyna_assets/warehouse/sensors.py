"""Near-real-time sync: whenever the registry has changes the warehouse has not applied, run the sync
and rebuild the review pool (a review verdict, a quarantine released, a re-transcode all show up as
registry changes first)."""

from dagster import AssetKey, RunRequest, SensorEvaluationContext, SkipReason, sensor

from dyna_resources.catalog.cdc import pending
from dyna_resources.resources import IngestResource

from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on

SYNCED = [AssetKey("warehouse_episodes"), AssetKey("review_pool")]


@sensor(
    **sensor_on("warehouse_sync_sensor", 10, SYNCED),
    description="Registry changes pending → one run of the warehouse sync and the review pool (run key = "
    "oldest pending change, so a burst never launches twice; DuckDB writers are serialized by the "
    "duckdb pool).",
)
def warehouse_sync_sensor(context: SensorEvaluationContext, ingest: IngestResource):
    marker = pending(ingest.stores().registry)
    if marker is None:
        return SkipReason("the warehouse is up to date")
    return RunRequest(
        run_key=f"cdc-{marker}", asset_selection=SYNCED, tags={"dyna/trigger": "cdc", **AUTOMATIC_RUN_TAGS}
    )
