"""The backfill after a pipeline change, as a deployment runs it, and the graph following it down:
batches were ingested by the current code, the warehouse synced, a manifest built; a new revision
(a throwaway copy of the code whose ``PIPELINE_VERSION`` is bumped) is deployed and the real
``dagster-daemon`` serves it on the project's instance config. Its ``version_check_sensor`` marks
the stale batches (``versions_current`` fails for each); its ``version_drift_sensor`` must launch
ONE backfill of exactly the stale batches, the backfill daemon must run it to completion, and only
those batches' episodes are transcoded again; then the warehouse sync, the curation sensor and the
prewarm sensor must carry the change down: the manifest is rebuilt with a new DataVersion (its run
says why), its cache set is requested, and the checks pass again.
"""

import re
import shutil
from pathlib import Path

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    materialize,
)

from dyna_assets.cache.sensors import DATA_VERSION_TAG
from dyna_assets.dagster_private import FINISHED, BulkActionStatus, check_history, requested_partitions
from dyna_assets.definitions import defs
from dyna_assets.deployment import embedded_resources
from dyna_assets.ingest.sensors import DRIFT_TAG
from dyna_resources import versions
from dyna_resources.catalog.registry import TRANSCODED, Registry
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.ingest.landing import LandingZone
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.resources import IngestResource

from .deploy_harness import Services, copy_code, service_env, wait_for, write_instance_config

ONE_BATCH_PER_TICK = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)
INGEST = ("raw_episodes", "mcap_episodes", "step_ladders")
NEW_VERSION = f"{versions.PIPELINE_VERSION}.drift-check"
SPEC = "drift-all"
VERSIONS_CURRENT = AssetCheckKey(AssetKey("mcap_episodes"), "versions_current")
FOLLOWERS = ("version_check_sensor", "warehouse_sync_sensor", "curation_spec_sensor", "manifest_prewarm_sensor")


def _bump_pipeline_version(code: Path) -> None:
    path = code / "dyna_resources" / "versions.py"
    text, n = re.subn(
        r'^PIPELINE_VERSION = "[^"]*"', f'PIPELINE_VERSION = "{NEW_VERSION}"', path.read_text(), flags=re.MULTILINE
    )
    assert n == 1, "versions.py defines PIPELINE_VERSION once"
    path.write_text(text)


def _mcaps(registry: Registry, batch: str) -> dict[str, tuple[str, int]]:
    """episode -> (pipeline version stamped in its MCAP, the file's mtime)"""
    out = {}
    for e in registry.partition_episodes(batch):
        assert e["status"] == TRANSCODED, e
        with EpisodeReader(e["mcap_path"]) as r:
            out[e["episode_id"]] = (r.metadata()["pipeline_version"], Path(e["mcap_path"]).stat().st_mtime_ns)
    return out


def _latest_manifest(instance: DagsterInstance):
    """(metadata values, DataVersion, run id) of the spec's latest manifest, or None."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("manifests"), asset_partitions=[SPEC]), limit=1, ascending=False
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    m = records[0].asset_materialization
    return {k: getattr(v, "value", v) for k, v in m.metadata.items()}, m.tags[DATA_VERSION_TAG], records[0].run_id


def _checks(instance: DagsterInstance, batches: list[str]) -> dict[str, list]:
    return {b: check_history(instance, VERSIONS_CURRENT, b) for b in batches}


def test_daemon_backfills_exactly_the_stale_batches_after_a_pipeline_version_bump(
    episode_factory, tmp_path, monkeypatch
):
    dyna_home, dagster_home, code = tmp_path / "dyna", tmp_path / "dagster_home", tmp_path / "code"
    write_instance_config(dagster_home)  # the project's instance config, as is
    _bump_pipeline_version(copy_code(code))
    # the followers start running with the daemon (the drift sensor is switched on later, by hand), every
    # sensor evaluated at most every 5 s instead of its production interval
    env = service_env(
        dyna_home, dagster_home, code_root=code, DYNA_SENSORS=",".join(FOLLOWERS), DYNA_SENSOR_INTERVAL_S="5"
    )
    for k in ("DYNA_HOME", "DAGSTER_HOME", "DYNA_SENSORS"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)

    # -- three batches of one episode each; two ingested by the current code ----------------------
    zone = LandingZone(dyna_home / "landing")
    registry = Registry.sqlite(dyna_home / "registry.sqlite")
    cursor, batches = LandingCursor(), []
    for i in range(3):
        dst = zone.resolve(f"2026-11-2{i}/ep-drift-{i}.h5")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(episode_factory(episode_id=f"ep-drift-{i}", seed=610 + i, duration_s=2.0).path, dst)
        plan = landing_tick(cursor, zone, registry, ONE_BATCH_PER_TICK)
        cursor = plan.cursor
        batches += [b.key for b in plan.sealed]
    assert len(batches) == 3
    stale, current = batches[:2], batches[2]
    assets = [defs.get_assets_def(k) for k in INGEST]
    res = embedded_resources({"DYNA_HOME": str(dyna_home)})
    res["ingest"] = IngestResource(home=res["home"], units_on="process")  # setup, in this process
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("ingest_partitions", batches)
        for b in stale:
            assert materialize(assets, instance=instance, partition_key=b, resources=res).success
        # the third batch landed after the change: ingested at the new version, nothing to backfill
        with monkeypatch.context() as m:
            m.setattr(versions, "PIPELINE_VERSION", NEW_VERSION)
            assert materialize(assets, instance=instance, partition_key=current, resources=res).success
        # the warehouse synced, and a manifest of every episode built from it (by the current code)
        assert materialize([defs.get_assets_def("warehouse_episodes")], instance=instance, resources=res).success
        (dyna_home / "curation").mkdir(exist_ok=True)
        (dyna_home / "curation" / f"{SPEC}.yaml").write_text(
            f"name: {SPEC}\nwhere: {{episode_id: {{like: 'ep-drift-%'}}}}\nsegments: {{length_s: 0.5, stride_s: 0.5}}\n"
        )
        instance.add_dynamic_partitions("curation_specs", [SPEC])
        assert materialize(
            [defs.get_assets_def("manifests")], instance=instance, resources=res, partition_key=SPEC
        ).success
        first_manifest = _latest_manifest(instance)
        assert first_manifest[0]["selection"]["episodes"] == 3
    before = {b: _mcaps(registry, b) for b in batches}
    assert {v for b in stale for v, _ in before[b].values()} == {versions.PIPELINE_VERSION}
    assert {v for v, _ in before[current].values()} == {NEW_VERSION}
    assert registry.outdated_partitions(schema_version=versions.SCHEMA_VERSION, pipeline_version=NEW_VERSION) == stale

    # -- the new revision deployed: the daemon, with the drift sensor switched on ------------------
    services = Services(tmp_path, env, cwd=code)
    try:
        services.start_daemon()
        with DagsterInstance.get() as instance:
            # the deploy outdates the two old batches: their versions_current fails, the new one's passes
            latest = wait_for(
                "versions_current recorded for every batch",
                lambda: h if all((h := _checks(instance, batches)).values()) else None,
                deadline_s=180,
                check=services.check_alive,
                state=lambda: _checks(instance, batches),
            )
            assert {b: latest[b][0].passed for b in batches} == {stale[0]: False, stale[1]: False, current: True}
            assert latest[stale[0]][0].metadata["stale_episodes"].value == 1
            services.cli("sensor", "start", "version_drift_sensor", "-w", "workspace.yaml")

            def drift_backfills():
                return [b for b in instance.get_backfills() if b.tags.get(DRIFT_TAG) == "true"]

            def sensor_ticks():
                return [
                    (t.status.value, t.skip_reason, t.error and t.error.message)
                    for s in instance.all_instigator_state()
                    for t in instance.get_ticks(s.instigator_origin_id, s.selector_id, limit=3)
                ]

            (launched,) = wait_for(
                "the drift sensor launching a backfill",
                drift_backfills,
                deadline_s=180,
                check=services.check_alive,
                state=sensor_ticks,
            )
            done = wait_for(
                "the drift backfill finished",
                lambda: [b for b in drift_backfills() if b.status in FINISHED],
                deadline_s=300,
                every_s=2,
                check=services.check_alive,
                state=lambda: [(b.backfill_id, b.status) for b in drift_backfills()],
            )
            (backfill,) = done
            assert backfill.backfill_id == launched.backfill_id
            assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill
            assert backfill.tags["dyna/pipeline_version"] == NEW_VERSION  # the new revision's sensor
            assert requested_partitions(backfill) == {
                (AssetKey(a), b) for a in ("mcap_episodes", "step_ladders") for b in stale
            }
            runs = instance.get_runs(RunsFilter(tags={"dagster/backfill": backfill.backfill_id}))
            assert runs and all(r.status == DagsterRunStatus.SUCCESS for r in runs), runs

            # -- and down the graph: warehouse sync -> the manifest rebuilt -> its cache set requested --
            def followed():
                m = _latest_manifest(instance)
                return m if m and m[0]["selection"]["episodes"] == 3 and m[0]["stale_episodes"] == 0 else None

            manifest, version, run_id = wait_for(
                "the manifest rebuilt at the new versions",
                followed,
                deadline_s=240,
                every_s=2,
                check=services.check_alive,
                state=lambda: [
                    (r.job_name, r.status.value, r.tags.get("dyna/trigger")) for r in instance.get_runs(limit=8)
                ],
            )
            assert version != first_manifest[1]  # a new DataVersion: what is downstream of it is stale
            why = instance.get_run_by_id(run_id).tags
            assert why["dyna/trigger"] == "selection-changed" and why["dagster/sensor_name"] == "curation_spec_sensor"
            assert why["dyna/selection"] == manifest["selection"]["digest"]  # what the warehouse said it selects
            assert manifest["versions"]["pipeline"] == {NEW_VERSION: manifest["rows"]}
            (prewarm,) = wait_for(
                "the cache set of the new manifest requested",
                lambda: instance.get_runs(RunsFilter(tags={"dyna/manifest_version": version})),
                deadline_s=120,
                check=services.check_alive,
            )
            assert prewarm.tags["dagster/partition"] == SPEC and prewarm.tags["dyna/trigger"] == "manifest-version"
            # the version checks pass again once the backfill is done
            wait_for(
                "versions_current passing again for the backfilled batches",
                lambda: all(h and h[0].passed for h in _checks(instance, stale).values()),
                deadline_s=150,
                check=services.check_alive,
                state=lambda: {b: [e.passed for e in h] for b, h in _checks(instance, stale).items()},
            )
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()

    # -- exactly the stale batches were redone, by the new code -----------------------------------
    after = {b: _mcaps(registry, b) for b in batches}
    for b in stale:
        assert set(after[b]) == set(before[b])
        for eid, (version, mtime) in after[b].items():
            assert version == NEW_VERSION and mtime != before[b][eid][1], (b, eid)
    assert after[current] == before[current]  # not touched
    assert registry.outdated_partitions(schema_version=versions.SCHEMA_VERSION, pipeline_version=NEW_VERSION) == []
    registry.close()
