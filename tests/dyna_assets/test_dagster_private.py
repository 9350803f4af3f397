"""Every Dagster internal the project uses (``dyna_assets/dagster_private.py``), exercised on a real
instance: an upgrade that moves or changes one fails here, by name, before a sensor does."""

import pytest
from dagster import AssetCheckEvaluation, AssetCheckKey, AssetKey, DagsterInstance, job, op

from dyna_assets.dagster_private import (
    FINISHED,
    BulkActionStatus,
    backfill_request,
    backfills_in_flight,
    check_history,
    record_backfill,
    requested_partitions,
    stale_status,
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


def test_a_partitions_check_history_holds_its_own_evaluations_newest_first():
    key = AssetCheckKey(MCAP, "versions_current")

    @op(config_schema={"results": [{"partition": str, "passed": bool}]})
    def report(context):
        for r in context.op_config["results"]:
            context.log_event(AssetCheckEvaluation(asset_key=MCAP, check_name=key.name, **r))

    @job
    def reporting():
        report()

    def run(*results):
        config = {"ops": {"report": {"config": {"results": [{"partition": p, "passed": ok} for p, ok in results]}}}}
        assert reporting.execute_in_process(run_config=config, instance=instance).success

    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ingest_partitions", ["p1", "p2"])
        run(("p1", False), ("p2", False))  # one run reports several partitions
        run(("p1", True))
        assert [e.passed for e in check_history(instance, key, "p1")] == [True, False]
        assert [(e.partition, e.passed) for e in check_history(instance, key, "p2")] == [("p2", False)]
        assert check_history(instance, key, "p3") == []
        # why a run reports them, not the sensor itself: Dagster 1.13 keeps one runless evaluation per partition
        instance.report_runless_asset_event(
            AssetCheckEvaluation(asset_key=MCAP, check_name=key.name, passed=True, partition="p2")
        )
        with pytest.raises(Exception, match="UNIQUE|unique"):
            instance.report_runless_asset_event(
                AssetCheckEvaluation(asset_key=MCAP, check_name=key.name, passed=True, partition="p2")
            )


def test_a_partition_downstream_of_a_new_data_version_is_stale_and_names_its_cause():
    from dagster import DataVersion, DynamicPartitionsDefinition, Output, asset, materialize

    specs = DynamicPartitionsDefinition(name="specs")
    version = {"now": "a"}

    @asset(partitions_def=specs)
    def manifest():
        return Output(None, data_version=DataVersion(version["now"]))

    @asset(partitions_def=specs, deps=[manifest])
    def model():
        return None

    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("specs", ["s1"])
        assert stale_status(instance, [manifest, model], model.key, "s1")[0] == "MISSING"
        materialize([manifest, model], instance=instance, partition_key="s1")
        assert stale_status(instance, [manifest, model], model.key, "s1") == ("FRESH", [])
        materialize([manifest], instance=instance, partition_key="s1")  # the same content: nothing is stale
        assert stale_status(instance, [manifest, model], model.key, "s1") == ("FRESH", [])
        version["now"] = "b"
        materialize([manifest], instance=instance, partition_key="s1")
        status, causes = stale_status(instance, [manifest, model], model.key, "s1")
        assert status == "STALE" and [(k, p) for k, p, _ in causes] == [(manifest.key, "s1")], causes
