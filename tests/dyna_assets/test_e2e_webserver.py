"""End to end, as a user's tools drive it: the real ``dagster-webserver`` and ``dagster-daemon``
serve the project's workspace on 127.0.0.1; a partition backfill is launched through the
webserver's GraphQL API (the mutation the UI's backfill dialog sends), the daemon runs it
through the run queue, and the outcome is read back through GraphQL and from the registry.

Everything lives in temporary folders (DYNA_HOME, DAGSTER_HOME) and on a free port, so the
test can run next to others (``pytest -n 2``). The sensors are left stopped (DYNA_SENSORS):
the test does by hand what the landing sensor would do, so nothing races it.
"""

import json
import shutil
import time
from pathlib import Path

from dagster import DagsterInstance

from dyna_resources import versions
from dyna_resources.catalog.registry import REJECTED, TRANSCODED, Registry, registry_url_from_env
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.ingest.gates import POST_GATES, PRE_GATES
from dyna_resources.ingest.landing import LandingZone
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick

from .deploy_harness import Services, service_env, write_instance_config

PARTITIONS_DEF = "ingest_partitions"
ASSETS = ("raw_episodes", "mcap_episodes")
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}

# Every landing tick releases what is pending as one batch (huge target, no wait): one tick, one batch.
ONE_BATCH_PER_TICK = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

BACKFILL = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      id status numPartitions partitionNames isAssetBackfill
      error { message stack }
      assetBackfillData { assetBackfillStatuses { __typename
        ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted numPartitionsInProgress
                                             numPartitionsMaterialized numPartitionsFailed } } }
      runs { runId status tags { key value } }
    }
    ... on Error { message }
    ... on PythonError { message stack }
  }
}
"""

METADATA = """
metadataEntries { label __typename
  ... on IntMetadataEntry { intValue }
  ... on FloatMetadataEntry { floatValue }
  ... on BoolMetadataEntry { boolValue }
  ... on TextMetadataEntry { text }
  ... on JsonMetadataEntry { jsonString } }
"""

ASSET = """
query Asset($key: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      partitionKeys
      assetPartitionStatuses { __typename
        ... on DefaultPartitionStatuses { materializedPartitions failedPartitions unmaterializedPartitions
                                          materializingPartitions } }
      latestMaterializationByPartition(partitions: $partitions) { partition runId %(metadata)s }
      assetChecksOrError { __typename
        ... on AssetChecks { checks { name blocking
          partitionStatuses { __typename
            ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions inProgressPartitions
                                                        skippedPartitions executionFailedPartitions } } } } }
    }
  }
}
""" % {"metadata": METADATA}

CHECK_EXECUTIONS = """
query Checks($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 10) {
    runId status partition stepKey
    evaluation { checkName success severity partition description targetMaterialization { runId } %(metadata)s }
  }
}
""" % {"metadata": METADATA}


def _meta(entries: list[dict]) -> dict:
    out = {}
    for e in entries:
        for field in ("intValue", "floatValue", "boolValue", "text"):
            if field in e:
                out[e["label"]] = e[field]
        if "jsonString" in e:
            out[e["label"]] = json.loads(e["jsonString"])
    return out


def _land(zone: LandingZone, generated, key: str) -> None:
    dst = zone.resolve(key)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(generated.path, dst)


# -- the test -----------------------------------------------------------------------------------


def test_backfill_launched_through_the_webserver_runs_on_the_daemon(episode_factory, tmp_path, monkeypatch):
    dyna_home, dagster_home = tmp_path / "dyna", tmp_path / "dagster_home"
    # The project's instance config, with a faster run queue for the test.
    write_instance_config(dagster_home, {"run_queue": {"dequeue_interval_seconds": 1}})

    for k, v in {"DYNA_HOME": str(dyna_home), "DAGSTER_HOME": str(dagster_home), "DYNA_SENSORS": "stopped"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
    env = service_env(dyna_home, dagster_home, DYNA_SENSORS="stopped")

    # -- what the landing sensor does: register landed files, pack batches, add partitions ---------
    good = [episode_factory(episode_id=f"ep-e2e-{i}", seed=700 + i, duration_s=2.0) for i in range(4)]
    truncated = episode_factory(fault="truncated", episode_id="ep-e2e-trunc", seed=790, duration_s=2.0)
    zone = LandingZone(dyna_home / "landing")
    registry = Registry(registry_url_from_env(dyna_home))
    try:
        cursor, batches = LandingCursor(), []
        arrivals = [
            [("a/ep-e2e-0.h5", good[0]), ("a/ep-e2e-1.h5", good[1]), ("a/ep-e2e-trunc.h5", truncated)],
            [("b/ep-e2e-2.h5", good[2]), ("b/ep-e2e-3.h5", good[3])],
        ]
        for wave in arrivals:
            for key, g in wave:
                _land(zone, g, key)
            plan = landing_tick(cursor, zone, registry, ONE_BATCH_PER_TICK)
            cursor = plan.cursor
            assert len(plan.sealed) == 1 and plan.sealed[0].files == len(wave), plan
            batches.append(plan.sealed[0].key)
        bad_batch, clean_batch = batches
        good_ids = {bad_batch: {"ep-e2e-0", "ep-e2e-1"}, clean_batch: {"ep-e2e-2", "ep-e2e-3"}}
    finally:
        registry.close()

    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(PARTITIONS_DEF, batches)
        assert instance.get_dynamic_partitions(PARTITIONS_DEF) == batches
    assert batches == sorted(batches)

    services = Services(tmp_path, env)
    t0 = time.monotonic()
    try:
        services.start_webserver()
        services.wait_until_serving()
        t_ready = time.monotonic()

        # -- the backfill dialog: both partitions, both assets ------------------------------------
        launched = services.gql(
            LAUNCH,
            {
                "params": {
                    "partitionNames": batches,
                    "assetSelection": [{"path": [a]} for a in ASSETS],
                    "fromFailure": False,
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        # The daemon starts after the launch: its first backfill iteration picks the backfill up
        # at once instead of up to 30 s later (the backfill daemon's fixed interval).
        services.start_daemon()

        deadline = time.monotonic() + 300
        while True:
            services.check_alive()
            bf = services.gql(BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
            assert bf["__typename"] == "PartitionBackfill", bf
            if bf["status"] in TERMINAL:
                break
            assert time.monotonic() < deadline, f"backfill still {bf['status']} after 300 s: {bf}"
            time.sleep(1)
        t_done = time.monotonic()
        print(
            f"\nwebserver serving after {t_ready - t0:.1f} s; backfill {bf['status']} {t_done - t_ready:.1f} s "
            "after the launch"
        )

        # -- the backfill ------------------------------------------------------------------------
        assert bf["status"] == "COMPLETED_SUCCESS", bf
        assert bf["isAssetBackfill"] and bf["error"] is None, bf
        assert sorted(bf["partitionNames"]) == batches and bf["numPartitions"] == 2, bf
        counts = {tuple(s["assetKey"]["path"]): s for s in bf["assetBackfillData"]["assetBackfillStatuses"]}
        assert set(counts) == {(a,) for a in ASSETS}, counts
        for a in ASSETS:
            c = counts[(a,)]
            assert (
                c["numPartitionsTargeted"],
                c["numPartitionsMaterialized"],
                c["numPartitionsFailed"],
                c["numPartitionsInProgress"],
            ) == (2, 2, 0, 0), c
        # BackfillPolicy.multi_run(max_partitions_per_run=16): both batches (and both assets, same
        # partitioning and policy) go into ONE ranged run; nothing is run twice.
        (run,) = bf["runs"]
        tags = {t["key"]: t["value"] for t in run["tags"]}
        assert run["status"] == "SUCCESS", run
        assert tags["dagster/backfill"] == backfill_id
        assert (tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]) == (
            bad_batch,
            clean_batch,
        ), tags
        assert "dagster/partition" not in tags, tags
        run_id = run["runId"]

        # -- per-partition materialization status and metadata ------------------------------------
        nodes = {
            a: services.gql(ASSET, {"key": {"path": [a]}, "partitions": batches})["assetNodeOrError"] for a in ASSETS
        }
        for a, node in nodes.items():
            assert node["__typename"] == "AssetNode", node
            assert sorted(node["partitionKeys"]) == batches
            st = node["assetPartitionStatuses"]
            assert st["__typename"] == "DefaultPartitionStatuses", st
            assert sorted(st["materializedPartitions"]) == batches, (a, st)
            assert st["failedPartitions"] == st["unmaterializedPartitions"] == st["materializingPartitions"] == [], (
                a,
                st,
            )
            latest = {m["partition"]: m for m in node["latestMaterializationByPartition"]}
            assert set(latest) == set(batches), (a, latest)
            for b in batches:
                md = _meta(latest[b]["metadataEntries"])
                n_good, n_bad = len(good_ids[b]), int(b == bad_batch)
                assert latest[b]["runId"] == run_id
                assert md["quarantined"] == n_bad, (a, b, md)
                assert (md["dyna/pipeline_version"], md["dyna/schema_version"]) == (
                    versions.PIPELINE_VERSION,
                    versions.SCHEMA_VERSION,
                ), (a, b, md)
                if n_bad:
                    (reason,) = md["quarantined_reasons"]
                    assert (reason["path"], reason["gate"], reason["stage"]) == ("a/ep-e2e-trunc.h5", "readable", "pre")
                    assert "truncated" in reason["reason"], reason
                else:
                    assert md["quarantined_reasons"] == [], (a, b, md)
                if a == "raw_episodes":
                    # inventoried: every file of the batch looked at; the good ones accepted, none transcoded yet
                    assert md["this_run_processed"] == n_good + n_bad, (a, b, md)
                    assert md["episodes_by_status"] == {"accepted": n_good}, (a, b, md)
                    assert (md["files"], md["episodes"]) == (n_good + n_bad, n_good), (a, b, md)
                    assert md["gates"]["readable"] == {"evaluated": n_good + n_bad, "failed": n_bad}, (a, b, md)
                else:
                    # transcoded exactly once, by this run: nothing was up to date before
                    assert md["episodes"] == n_good, (a, b, md)
                    assert md["episodes_by_status"] == {"transcoded": n_good}, (a, b, md)
                    assert (md["this_run_processed"], md["this_run_skipped_up_to_date"]) == (n_good, 0), (a, b, md)
                    assert md["pipeline_versions"] == {versions.PIPELINE_VERSION: n_good}, (a, b, md)
                    assert md["mcap_GB"] > 0 and md["hours"] > 0, (a, b, md)

        # -- asset checks (one per quality gate) --------------------------------------------------
        # The ranged run evaluates each gate once over both batches: one execution per check whose
        # "partitions" metadata names the batches; each batch's own gate counts are in its
        # materialization metadata (asserted above).
        def executions(asset: str, check: str) -> list[dict]:
            return services.gql(CHECK_EXECUTIONS, {"key": {"path": [asset]}, "name": check})["assetCheckExecutions"]

        files = {bad_batch: 3, clean_batch: 2}
        expected = {  # (asset, gate): (status, evaluated, failed)
            ("raw_episodes", "readable"): ("FAILED", sum(files.values()), 1),
            ("raw_episodes", "required_streams"): ("SUCCEEDED", 4, 0),
            ("mcap_episodes", "decodable"): ("SUCCEEDED", 4, 0),
            ("mcap_episodes", "frame_counts"): ("SUCCEEDED", 4, 0),
        }
        for (asset, gate), (status, evaluated, failed) in expected.items():
            execs = executions(asset, gate)
            assert {e["runId"] for e in execs} == {run_id}, execs
            (result,) = execs
            ev = result["evaluation"]
            assert (result["status"], result["partition"], result["stepKey"]) == (status, None, asset), result
            assert (ev["checkName"], ev["success"], ev["severity"], ev["partition"]) == (
                gate,
                status == "SUCCEEDED",
                "ERROR" if status == "SUCCEEDED" else "WARN",
                None,
            ), ev
            # a failure under the batch limit is a WARN: nothing downstream was blocked
            assert ev["targetMaterialization"]["runId"] == run_id, ev
            md = _meta(ev["metadataEntries"])
            assert (md["evaluated"], md["failed"], md["partitions"]) == (evaluated, failed, batches), md
            if failed:
                assert [f["path"] for f in md["failures"]] == ["a/ep-e2e-trunc.h5"], md
                assert ev["description"].startswith(batches[0]), ev  # the check names its partitions
                assert f": {failed} of {evaluated} episodes failed (quarantine); " in ev["description"], ev
        # the gates' checks, and mcap_episodes' partitioned checks: its MCAPs are in the store, at current versions
        for a, gates in (
            ("raw_episodes", PRE_GATES),
            ("mcap_episodes", (*POST_GATES, "mcaps_present", "versions_current")),
        ):
            checks = nodes[a]["assetChecksOrError"]
            assert checks["__typename"] == "AssetChecks", checks
            assert sorted(c["name"] for c in checks["checks"]) == sorted(gates)

        # -- the registry: every good episode transcoded once, at the current versions ------------
        registry = Registry(registry_url_from_env(dyna_home))
        try:
            mcap_dir = dyna_home / "mcap"
            for b in batches:
                eps = {e["episode_id"]: e for e in registry.partition_episodes(b)}
                assert set(eps) == good_ids[b], eps
                for eid, e in eps.items():
                    assert (e["status"], e["pipeline_version"], e["schema_version"]) == (
                        TRANSCODED,
                        versions.PIPELINE_VERSION,
                        versions.SCHEMA_VERSION,
                    ), e
                    assert Path(e["mcap_path"]) == mcap_dir / f"{eid}.mcap" and Path(e["mcap_path"]).is_file(), e
                    assert e["mcap_bytes"] == Path(e["mcap_path"]).stat().st_size, e
                    with EpisodeReader(e["mcap_path"]) as r:
                        stamp = r.metadata()
                    assert (stamp["pipeline_version"], stamp["source_sha256"]) == (
                        versions.PIPELINE_VERSION,
                        e["source_sha256"],
                    ), stamp
                q = registry.quarantined([u.key for u in registry.partition_units(b)])
                assert [(r["source_path"], r["gate"], r["stage"]) for r in q] == (
                    [("a/ep-e2e-trunc.h5", "readable", "pre")] if b == bad_batch else []
                ), q
                assert not [e for e in eps.values() if e["status"] == REJECTED]
            # exactly one output per good episode, no leftovers (temporary files are hidden names)
            assert sorted(p.name for p in mcap_dir.iterdir()) == sorted(
                f"{eid}.mcap" for ids in good_ids.values() for eid in ids
            )
            assert (
                registry.outdated_partitions(
                    schema_version=versions.SCHEMA_VERSION, pipeline_version=versions.PIPELINE_VERSION
                )
                == []
            )
        finally:
            registry.close()
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()
