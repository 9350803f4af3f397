"""Every Dagster internal the project uses (``dyna_assets/dagster_private.py``), exercised on a real
instance: an upgrade that moves or changes one fails here, by name, before a sensor does."""

from dagster import AssetKey, DagsterInstance

from dyna_assets.dagster_private import (
    FINISHED,
    BulkActionStatus,
    backfill_request,
    backfills_in_flight,
    record_backfill,
    requested_partitions,
)
from dyna_assets.definitions import defs

MCAP, LADDER = AssetKey("mcap_episodes"), AssetKey("step_ladders")


def test_a_backfill_request_of_chosen_pairs_goes_to_the_backfill_daemon_and_is_listed_while_in_flight():
    pairs = {(MCAP, "p1"), (LADDER, "p1"), (LADDER, "p2")}  # p2: its ladder alone, as a re-segmentation
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ingest_partitions", ["p1", "p2", "p3"])
        req = backfill_request(
            sorted(pairs, key=str),
            defs.get_repository_def().asset_graph,
            tags={"dyna/drift": "true", "dyna/trigger": "drift"},
        )
        assert req.requires_backfill_daemon() and req.tags == {"dyna/drift": "true", "dyna/trigger": "drift"}
        assert requested_partitions(req) == pairs
        assert backfills_in_flight(instance, "dyna/drift") == []
        record_backfill(instance, req, "drift-1")
        (backfill,) = backfills_in_flight(instance, "dyna/drift")
        assert backfill.backfill_id == "drift-1" and backfill.status == BulkActionStatus.REQUESTED
        assert requested_partitions(backfill) == pairs
        assert backfills_in_flight(instance, "dyna/other") == []
        done = backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS)
        instance.update_backfill(done)
        assert backfills_in_flight(instance, "dyna/drift") == []
        assert instance.get_backfill("drift-1").status in FINISHED
        assert BulkActionStatus.REQUESTED not in FINISHED and len(FINISHED) == 5
