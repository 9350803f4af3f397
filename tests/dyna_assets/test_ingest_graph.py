"""The ingest graph on real (ephemeral) Dagster instances: sensors, dynamic partitions, checks, drift."""

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from dagster import (
    AddDynamicPartitionsRequest,
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DeleteDynamicPartitionsRequest,
    FloatMetadataValue,
    IntMetadataValue,
    MarkdownMetadataValue,
    TableMetadataValue,
    build_sensor_context,
    materialize,
)

from dyna_assets.dagster_private import check_history, record_backfill
from dyna_assets.definitions import defs
from dyna_assets.deployment import embedded_ray
from dyna_assets.ingest.sensors import landing_sensor, version_drift_sensor
from dyna_assets.ingest.staleness import version_check_sensor
from dyna_resources import cli, versions
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.ingest.ray_units import ray_cluster
from dyna_resources.resources import GatesResource, HomeResource, IngestResource, LadderResource, TranscodeResource

ASSETS = [defs.get_assets_def(k) for k in ("raw_episodes", "mcap_episodes", "step_ladders")]


@pytest.fixture
def home(tmp_path, episode_factory):
    """A home whose landing zone holds 4 good episodes and a truncated one."""
    root = tmp_path / "home"
    landing = root / "landing" / "2026-11-29"
    landing.mkdir(parents=True)
    for i in range(4):
        g = episode_factory(episode_id=f"ep-g{i}", seed=200 + i, duration_s=2.0)
        shutil.copyfile(g.path, landing / f"ep-g{i}.h5")
    shutil.copyfile(
        episode_factory(fault="truncated", episode_id="ep-trunc", seed=209, duration_s=2.0).path,
        landing / "ep-trunc.h5",
    )
    return root


@pytest.fixture(scope="module", autouse=True)
def ray_cluster_for_the_module():
    """One local Ray cluster (2 CPUs) for this module's runs: the ingest assets' units run on it as
    they do under `make ui` (EmbeddedRay keeps a connection the process already has)."""
    with ray_cluster("local", num_cpus=2) as cluster:
        yield cluster


def resources(home, target_bytes=None, partition_bytes=None, units_on="ray", infra_retries=3, **gates):
    landed = sum(p.stat().st_size for p in (home / "landing").rglob("*.h5"))
    if not (home / "gates.yaml").exists():
        (home / "gates.yaml").write_text("# every gate at its default\n")
    if not (home / "step_ladders.yaml").exists():
        (home / "step_ladders.yaml").write_text("# the embedded procedures and thresholds\n")
    home_res = HomeResource(root=str(home))
    return {
        "ingest": IngestResource(
            home=home_res,
            target_batch_bytes=target_bytes or landed * 2,
            max_wait_s=0,
            max_runs_per_tick=8,
            partition_bytes=partition_bytes or landed * 4,
            units_on=units_on,
            infra_retries=infra_retries,
            infra_retry_wait_s=0.5,
            settle_s=0,
        ),  # the fixture copies every file in whole before the first tick
        "gates": GatesResource(home=home_res, file=str(home / "gates.yaml"), gates=gates),
        "transcode": TranscodeResource(workers=2, preset="veryfast", gop_frames=30, unit_memory_gb=0.5),
        "ladders": LadderResource(home=home_res, file=str(home / "step_ladders.yaml"), pictures=2),
        "ray": embedded_ray(),
    }


def for_sensor(sensor, res):
    """The resources a sensor uses (the daemon builds only those; Ray's would start a cluster)."""
    return {k: res[k] for k in sensor.required_resource_keys}


def run_sensor(sensor, instance, res, cursor=None):
    """One evaluation of the sensor's body on a real instance, its resources set up as the daemon does."""
    with build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources=for_sensor(sensor, res)
    ) as ctx:
        return sensor(ctx)


def tick(instance, res, cursor=None):
    result = run_sensor(landing_sensor, instance, res, cursor)
    for req in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def md(result, node, partition):
    for m in result.asset_materializations_for_node(node):
        if m.partition == partition:
            return {k: getattr(v, "value", v) for k, v in m.metadata.items()}
    raise AssertionError(f"no materialization of {node} for {partition}")


def checks(result):
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def test_landing_sensor_requests_one_run_per_new_batch_and_nothing_when_nothing_is_new(home, tmp_path):
    res = resources(home, target_bytes=1, partition_bytes=1)  # every file a unit and a partition of its own
    with DagsterInstance.ephemeral() as instance:
        first = tick(instance, res)
        keys = [r.partition_key for r in first.run_requests]
        assert len(keys) == 5 == len(set(keys)) and keys == sorted(keys)
        assert first.dynamic_partitions_requests[0].partition_keys == keys
        assert all(
            r.asset_selection == [AssetKey("raw_episodes"), AssetKey("mcap_episodes"), AssetKey("step_ladders")]
            for r in first.run_requests
        )
        assert sorted(instance.get_dynamic_partitions("ingest_partitions")) == keys
        again = tick(instance, res, first.cursor)
        assert again.run_requests == [] and again.dynamic_partitions_requests == []
        # a new arrival is one new batch; a fresh cursor never relaunches batches Dagster already has
        g = home / "landing" / "2026-11-30" / "ep-new.h5"
        g.parent.mkdir()
        shutil.copyfile(home / "landing" / "2026-11-29" / "ep-g0.h5", g)
        third = tick(instance, res, again.cursor)
        assert len(third.run_requests) == 1 and third.run_requests[0].partition_key not in keys
        assert tick(instance, res, None).run_requests == []


def test_batch_partition_materializes_with_metadata_checks_and_quarantine(home, monkeypatch, capsys):
    res = resources(home)
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        batch = req.partition_key
        result = materialize(ASSETS, instance=instance, partition_key=batch, resources=res)
        assert result.success
        m = md(result, "mcap_episodes", batch)
        assert m["episodes"] == 4 and m["quarantined"] == 1 and m["this_run_processed"] == 4
        assert 0 < m["compression_ratio"] < 1 and 0 < m["mcap_GB"] < m["source_GB"] and m["hours"] > 0
        # typed as a person reads them and the Plots tab graphs them: sizes in GB, floats to 4 digits
        (mat,) = [x for x in result.asset_materializations_for_node("mcap_episodes") if x.partition == batch]
        floats = ("source_GB", "mcap_GB", "hours", "compression_ratio", "this_run_cpu_s", "this_run_codec_cpu_s")
        for key in (*floats, "this_run_staging_swept_GB"):
            assert isinstance(mat.metadata[key], FloatMetadataValue), key
            assert mat.metadata[key].value == float(f"{mat.metadata[key].value:.4g}"), key
        assert isinstance(mat.metadata["episodes"], IntMetadataValue) and not any("bytes" in k for k in mat.metadata)
        assert m["dyna/pipeline_version"] == versions.PIPELINE_VERSION
        assert m["quarantined_reasons"][0]["path"] == "2026-11-29/ep-trunc.h5"
        assert m["quarantined_reasons"][0]["gate"] == "readable"
        # every episode of the partition in one table: findable from the UI, with the command that opens it
        table = mat.metadata["episodes_table"]
        assert isinstance(table, TableMetadataValue)
        types = {c.name: c.type for c in table.schema.columns}
        assert types["duration_s"] == types["mcap_MB"] == "float" and types["episode_id"] == "string"
        assert list(types)[-1] == "open"
        rows = {r.data["episode_id"]: r.data for r in table.records}
        registry = res["ingest"].stores().registry
        assert set(rows) == {e["episode_id"] for e in registry.partition_episodes(batch)}
        done = [r for r in rows.values() if r["status"] == "transcoded"]
        assert all(isinstance(r["mcap_MB"], float) and r["mcap_MB"] > 0 and r["duration_s"] > 0 for r in done)
        assert len(done) == 4 and all(r["open"].startswith("rerun ") and r["open"].endswith(".mcap") for r in done)
        assert all(
            r["versions"] == f"schema {versions.SCHEMA_VERSION} / pipeline {versions.PIPELINE_VERSION}" for r in done
        )
        # the same from the shell: `dyna episode ID` prints its verdicts, versions and the file, then stale after a bump
        monkeypatch.setenv("DYNA_HOME", str(home))
        monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
        one = sorted(rows)[0]
        capsys.readouterr()
        assert cli.main(["episode", one]) == 0
        out = capsys.readouterr().out
        path = registry.episode_by_id(one)["mcap_path"]
        assert out.startswith(f"{one}: transcoded\n") and "STALE" not in out and f"open: rerun {path}" in out
        assert "gate pre/readable: ok" in out and "gate post/decodable: ok" in out
        assert f"versions: schema {versions.SCHEMA_VERSION}, pipeline {versions.PIPELINE_VERSION}" in out
        with monkeypatch.context() as bumped:
            bumped.setattr(versions, "PIPELINE_VERSION", "9.9-test")
            assert cli.main(["episode", one]) == 0
            assert "STALE (this code writes schema" in capsys.readouterr().out
        assert cli.main(["episode", "ep-nope"]) == 1
        assert "no episode 'ep-nope' in the registry" in capsys.readouterr().err
        c = checks(result)
        assert set(c) == {
            ("raw_episodes", g)
            for g in (
                "readable",
                "required_streams",
                "timestamps_monotonic",
                "max_duration",
                "min_frames",
                "finite_values",
                "frame_drops",
                "dead_camera",
                "min_duration",
            )
        } | {("mcap_episodes", g) for g in ("decodable", "frame_counts", "durations", "size_sanity")}
        readable = c[("raw_episodes", "readable")]
        assert not readable.passed and readable.severity.value == "WARN"
        assert readable.metadata["failed"].value == 1 and readable.metadata["evaluated"].value == 5
        assert readable.metadata["partitions"].value == [batch]
        assert readable.description.startswith(f"{batch}: 1 of 5 episodes failed (quarantine); ")
        raw = md(result, "raw_episodes", batch)
        assert (raw["episodes"], raw["quarantined"], raw["files"]) == (4, 1, 5)
        assert raw["gates"]["readable"] == {"evaluated": 5, "failed": 1} and raw["source_GB"] > 0
        assert all(c[("mcap_episodes", g)].passed for g in ("decodable", "frame_counts", "durations"))
        ladders = md(result, "step_ladders", batch)
        assert ladders["segmented_this_run"] == 4 and ladders["not_segmented"] == {}
        assert ladders["ladder_version"] == res["ladders"].config().version
        assert ladders["ladders"].count("data:image/png;base64,") == 2  # pictures=2
        assert ladders["ladders"].startswith("![ep-")  # the picture first, under its episode id
        # beside them each pictured episode's ladder as a drawing short enough for the table to show in place
        (lmat,) = [x for x in result.asset_materializations_for_node("step_ladders") if x.partition == batch]
        strips = {k: v for k, v in lmat.metadata.items() if k.startswith("ladder ")}
        assert len(strips) == 2 and all(isinstance(v, MarkdownMetadataValue) for v in strips.values())
        assert all(v.value.startswith("![") and "(data:image/svg+xml," in v.value for v in strips.values())
        assert all(len(v.value) < 1000 for v in strips.values())  # Dagster's limit for showing markdown in place
        assert all(r["step_ladder"] for r in res["ingest"].stores().registry.partition_episodes(batch))
        # replay of the partition: nothing redone, no duplicate rows
        reg = res["ingest"].stores().registry
        before = reg.counts()
        again = materialize(ASSETS, instance=instance, partition_key=batch, resources=res)
        assert md(again, "mcap_episodes", batch)["this_run_processed"] == 0
        redo = checks(again)[("mcap_episodes", "decodable")]
        assert redo.passed and redo.description.startswith(f"{batch}: nothing to check in this run")
        assert md(again, "mcap_episodes", batch)["this_run_skipped_up_to_date"] == 4
        assert md(again, "step_ladders", batch)["segmented_this_run"] == 0
        assert reg.counts() == before
        # mcap_episodes alone can be re-materialized for a partition
        alone = materialize(
            [ASSETS[1]], instance=instance, partition_key=batch, resources=res, selection=[AssetKey("mcap_episodes")]
        )
        assert alone.success and md(alone, "mcap_episodes", batch)["episodes"] == 4


def test_one_run_ingests_every_work_unit_of_its_partition_and_logs_progress(home):
    landed = sum(p.stat().st_size for p in (home / "landing").rglob("*.h5"))
    res = resources(home, target_bytes=landed // 3)
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        reg = res["ingest"].stores().registry
        units = reg.partition_units(req.partition_key)
        assert len(units) >= 2 and sum(u.files for u in units) == 5
        result = materialize(ASSETS, instance=instance, partition_key=req.partition_key, resources=res)
        assert result.success
        m = md(result, "mcap_episodes", req.partition_key)
        assert (m["units"], m["files"], m["episodes"], m["quarantined"]) == (len(units), 5, 4, 1)
        assert m["this_run_failed_units"] == {}
        assert {e["batch_key"] for e in reg.partition_episodes(req.partition_key)} <= {u.key for u in units}
        lines = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
        progress = [line for line in lines if line.startswith(f"{req.partition_key} post: ") and " units, " in line]
        assert len(progress) >= len(units) + 1  # before the first unit, then after each
        assert progress[0].startswith(f"{req.partition_key} post: 0/{len(units)} units")
        assert progress[-1].startswith(f"{req.partition_key} post: {len(units)}/{len(units)} units")
        assert "MB/s" in progress[-1] and "episode-h" in progress[-1]


def _running_units() -> list[tuple[int, str]]:
    """Ray workers running a work unit: Ray titles a worker process after the task it runs."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::unit:"):
            out.append((int(cmdline.parent.name), title))
    return out


def test_a_work_unit_whose_ray_worker_is_killed_is_retried_and_the_partition_completes_once(home):
    landed = sum(p.stat().st_size for p in (home / "landing").rglob("*.h5"))
    res = resources(home, target_bytes=landed // 3)
    killed: list[tuple[int, str]] = []
    stop = threading.Event()

    def kill_the_first_unit() -> None:  # SIGKILL, as the OOM killer would: no cleanup in the worker
        while not stop.is_set() and not killed:
            for pid, title in _running_units():
                os.kill(pid, signal.SIGKILL)
                killed.append((pid, title))
                break
            time.sleep(0.005)

    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        part = req.partition_key
        reg = res["ingest"].stores().registry
        units = reg.partition_units(part)
        assert len(units) >= 2
        assert materialize(ASSETS[:1], instance=instance, partition_key=part, resources=res).success
        killer = threading.Thread(target=kill_the_first_unit)
        killer.start()
        try:
            result = materialize(ASSETS[1:], instance=instance, partition_key=part, resources=res)
        finally:
            stop.set()
            killer.join()
        assert killed and killed[0][1].startswith("ray::unit:"), killed  # a unit's worker died mid-transcode
        assert result.success
        m = md(result, "mcap_episodes", part)
        assert (m["episodes"], m["quarantined"], m["this_run_failed_units"]) == (4, 1, {})
        eps = reg.partition_episodes(part)
        assert sorted(e["status"] for e in eps) == ["transcoded"] * 4
        for e in eps:  # each MCAP whole, stamped by this run's pipeline
            with EpisodeReader(e["mcap_path"]) as r:
                assert r.metadata()["pipeline_version"] == versions.PIPELINE_VERSION
        counts = reg.counts()
        again = materialize(ASSETS[1:], instance=instance, partition_key=part, resources=res)
        assert md(again, "mcap_episodes", part)["this_run_processed"] == 0  # nothing left half-done
        assert reg.counts() == counts  # and nothing recorded twice


def test_a_full_mcap_volume_fails_the_run_naming_the_episodes_after_its_retries_and_quarantines_nothing(home):
    """The MCAP volume full (a real 16 KiB tmpfs; root can mount one here): Ray reruns the unit, the step is
    retried after a back-off, then the run fails naming the episodes and the cause. Nothing is quarantined
    for it; the episodes are pending, and a run after space is freed lands them."""
    mcap = home / "mcap"
    mcap.mkdir(parents=True)
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mcap)], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root to mount a tmpfs (tests/ingest/test_faults.py covers the engine with ENOSPC injected)")
    try:
        res = resources(home, infra_retries=1)
        with DagsterInstance.ephemeral() as instance:
            (req,) = tick(instance, res).run_requests
            part = req.partition_key
            failed = materialize(ASSETS, instance=instance, partition_key=part, resources=res, raise_on_error=False)
            assert not failed.success
            events = instance.all_logs(failed.run_id)
            retried = [e for e in events if e.dagster_event and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY"]
            assert len(retried) == 1  # infra_retries=1: one more attempt of the step after the back-off
            (failure,) = [e for e in events if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE"]
            text = str(failure.dagster_event.event_specific_data.error)
            assert "for infrastructure faults" in text and "No space left on device" in text
            assert all(f"ep-g{i}" in text for i in range(4))
            reg = res["ingest"].stores().registry
            # only the truncated file is quarantined: a verdict on its content
            assert [q["source_path"] for q in reg.quarantined()] == ["2026-11-29/ep-trunc.h5"]
            assert sorted(e["status"] for e in reg.partition_episodes(part)) == ["pending"] * 4
            subprocess.run(["mount", "-o", "remount,size=64m", str(mcap)], check=True)
            healed = materialize(ASSETS, instance=instance, partition_key=part, resources=res)
            assert healed.success
            assert sorted(e["status"] for e in reg.partition_episodes(part)) == ["transcoded"] * 4
            assert md(healed, "mcap_episodes", part)["this_run_processed"] == 4
    finally:
        subprocess.run(["umount", "-l", str(mcap)], check=False)


def test_gates_switched_at_run_time_change_which_checks_run_and_what_blocks(home):
    res = resources(home)
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        batch = req.partition_key
        run_config = {
            "resources": {
                "gates": {
                    "config": {
                        "gates": {
                            "dead_camera": False,
                            "frame_drops": False,
                            "size_sanity": False,
                            "readable": {"max_failed_fraction": 0.1},
                        }
                    }
                }
            }
        }
        blocked = materialize(
            ASSETS, instance=instance, partition_key=batch, resources=res, run_config=run_config, raise_on_error=False
        )
        assert not blocked.success
        c = checks(blocked)
        assert ("raw_episodes", "dead_camera") not in c and ("raw_episodes", "frame_drops") not in c
        assert c[("raw_episodes", "readable")].severity.value == "ERROR"  # 1 of 5 > 10 %: blocks downstream
        assert blocked.asset_materializations_for_node("mcap_episodes") == []
        assert res["ingest"].stores().registry.partition_episodes(batch)[0]["status"] == "accepted"
        # same code, other run config: the gate no longer blocks, the batch goes through
        ok = materialize(
            ASSETS,
            instance=instance,
            partition_key=batch,
            resources=res,
            run_config={"resources": {"gates": {"config": {"gates": {"readable": {"blocking": False}}}}}},
        )
        assert ok.success and md(ok, "mcap_episodes", batch)["episodes"] == 4
        assert checks(ok)[("raw_episodes", "readable")].severity.value == "WARN"


def test_ranged_run_records_metadata_per_partition(home):
    res = resources(home, target_bytes=1, partition_bytes=1)
    with DagsterInstance.ephemeral() as instance:
        keys = [r.partition_key for r in tick(instance, res).run_requests]
        result = materialize(
            ASSETS,
            instance=instance,
            resources=res,
            raise_on_error=False,
            tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        )
        assert result.success
        per = {k: md(result, "mcap_episodes", k) for k in keys}
        assert sorted(v["episodes"] for v in per.values()) == [0, 1, 1, 1, 1]
        assert sorted(v["quarantined"] for v in per.values()) == [0, 0, 0, 0, 1]


VERSIONS_CURRENT = AssetCheckKey(AssetKey("mcap_episodes"), "versions_current")


def test_drift_sensor_backfills_exactly_the_stale_partitions_once(home, monkeypatch):
    # units in this process: the version is bumped by monkeypatching it here, which a Ray worker would not see
    # (tests/dyna_assets/test_deploy_drift.py bumps it in the code and runs the backfill on Ray under the daemon)
    res = resources(home, target_bytes=1, partition_bytes=1, units_on="process")
    with DagsterInstance.ephemeral() as instance:
        keys = [r.partition_key for r in tick(instance, res).run_requests]
        old = keys[:3]
        for k in old:  # the truncated file's batch fails its readable gate as a whole (1 of 1): that is fine here
            materialize(ASSETS, instance=instance, partition_key=k, resources=res, raise_on_error=False)

        def drift(cursor=None):
            """The sensor's result and the cursor it left on its context."""
            with build_sensor_context(
                instance=instance, cursor=cursor, definitions=defs, resources=for_sensor(version_drift_sensor, res)
            ) as ctx:
                return version_drift_sensor(ctx), ctx.cursor

        def version_check(cursor):
            """What the version check sensor asks (through Dagster's own evaluation), and the run it asks for
            executed: {partition: latest versions_current passed} of the partitions it reported, the cursor."""
            with build_sensor_context(
                instance=instance, cursor=cursor, definitions=defs, resources=for_sensor(version_check_sensor, res)
            ) as ctx:
                data = version_check_sensor.evaluate_tick(ctx)
            if not data.run_requests:
                return {}, data.cursor
            (request,) = data.run_requests
            keys = request.run_config["ops"]["report_versions"]["config"]["partitions"]
            job = defs.get_job_def("report_version_checks")
            assert job.execute_in_process(run_config=request.run_config, instance=instance, resources=res).success
            return {k: check_history(instance, VERSIONS_CURRENT, k)[0].passed for k in keys}, data.cursor

        assert "current versions" in drift()[0].skip_message
        reg = res["ingest"].stores().registry
        old_with_episodes = [k for k in old if reg.partition_episodes(k)]
        reported, checked = version_check(None)
        assert reported == dict.fromkeys(old_with_episodes, True)
        monkeypatch.setattr(versions, "PIPELINE_VERSION", "9.9-test")
        for k in keys[3:]:  # batches ingested after the change are not stale
            materialize(ASSETS, instance=instance, partition_key=k, resources=res, raise_on_error=False)
        new_with_episodes = [k for k in keys[3:] if reg.partition_episodes(k)]
        # the deploy outdates the old partitions: their check fails, the new ones' passes, each named
        reported, checked = version_check(checked)
        assert reported == dict.fromkeys(old_with_episodes, False) | dict.fromkeys(new_with_episodes, True)
        failed = check_history(instance, VERSIONS_CURRENT, old_with_episodes[0])[0]
        assert failed.metadata["stale_episodes"].value == 1 and failed.severity.value == "WARN"
        assert failed.description.startswith(f"{old_with_episodes[0]}: 1 of 1 episodes at older versions")
        assert [e.passed for e in check_history(instance, VERSIONS_CURRENT, old_with_episodes[0])] == [False, True]
        assert version_check(checked)[0] == {}  # nothing changed, nothing reported
        req, cursor = drift()
        stale_with_episodes = [k for k in old if res["ingest"].stores().registry.partition_episodes(k)]
        got = sorted({ap.partition_key for ap in req.asset_graph_subset.iterate_asset_partitions()})
        assert got == sorted(stale_with_episodes) and len(got) >= 2
        assert {ap.asset_key for ap in req.asset_graph_subset.iterate_asset_partitions()} == {
            AssetKey("mcap_episodes"),
            AssetKey("step_ladders"),
        }  # a new MCAP gets a new ladder
        assert req.tags["dyna/drift"] == "true"
        # same state again: never a second backfill for the same partitions and versions
        assert "already backfilled" in drift(cursor)[0].skip_message
        # while a drift backfill is in flight nothing new is launched either
        record_backfill(instance, req, "drift1")
        assert "in flight" in drift()[0].skip_message
        # redoing the stale partitions makes the corpus current: only their episodes are re-transcoded
        for k in stale_with_episodes:
            r = materialize([ASSETS[1]], instance=instance, partition_key=k, resources=res)
            assert md(r, "mcap_episodes", k)["this_run_processed"] == 1
        assert reg.outdated_batches(schema_version=versions.SCHEMA_VERSION, pipeline_version="9.9-test") == []
        assert version_check(checked)[0] == dict.fromkeys(old_with_episodes, True)  # current again


def test_drift_sensor_resegments_only_the_ladders_when_the_ladder_config_changes(home):
    res = resources(home, target_bytes=1, partition_bytes=1)
    with DagsterInstance.ephemeral() as instance:
        keys = [r.partition_key for r in tick(instance, res).run_requests]
        for k in keys:
            materialize(ASSETS, instance=instance, partition_key=k, resources=res, raise_on_error=False)

        def drift():
            return run_sensor(version_drift_sensor, instance, res)

        assert "current versions" in drift().skip_message
        (home / "step_ladders.yaml").write_text("thresholds: {min_pause_s: 0.15}\n")
        req = drift()
        with_episodes = [k for k in keys if res["ingest"].stores().registry.partition_episodes(k)]
        parts = list(req.asset_graph_subset.iterate_asset_partitions())
        assert {ap.asset_key for ap in parts} == {AssetKey("step_ladders")}  # no video is re-encoded
        assert sorted(ap.partition_key for ap in parts) == sorted(with_episodes)
        assert req.tags["dyna/ladder_version"] == res["ladders"].config().version
        ladder = defs.get_assets_def("step_ladders")
        for k in with_episodes:
            r = materialize([ladder], instance=instance, partition_key=k, resources=res)
            assert md(r, "step_ladders", k)["segmented_this_run"] == 1
        assert "current versions" in drift().skip_message


def test_drift_sensor_as_dagster_evaluates_it_requests_exactly_the_stale_partitions_of_both_kinds(home, monkeypatch):
    """Pipeline and ladder versions both drift: the partitions an old pipeline wrote get mcap_episodes
    and step_ladders, those whose ladders alone are old get step_ladders, the current ones nothing.
    Through Dagster's own evaluation of the sensor (``evaluate_tick``, what the daemon calls)."""
    res = resources(home, target_bytes=1, partition_bytes=1, units_on="process")
    with DagsterInstance.ephemeral() as instance:
        keys = [r.partition_key for r in tick(instance, res).run_requests]
        reg = res["ingest"].stores().registry
        for k in keys[:2]:
            materialize(ASSETS, instance=instance, partition_key=k, resources=res, raise_on_error=False)
        monkeypatch.setattr(versions, "PIPELINE_VERSION", "9.9-test")
        for k in keys[2:]:
            materialize(ASSETS, instance=instance, partition_key=k, resources=res, raise_on_error=False)
        with_episodes = [k for k in keys if reg.partition_episodes(k)]
        old_pipeline = [k for k in keys[:2] if k in with_episodes]
        new_pipeline = [k for k in keys[2:] if k in with_episodes]
        assert len(old_pipeline) == 2 and len(new_pipeline) == 2  # the truncated file's partition has none
        # the ladder config changes; one partition of the new pipeline is re-segmented at once
        (home / "step_ladders.yaml").write_text("thresholds: {min_pause_s: 0.15}\n")
        ladder = defs.get_assets_def("step_ladders")
        materialize([ladder], instance=instance, partition_key=new_pipeline[0], resources=res)
        old_ladder = new_pipeline[1:]

        def evaluate(cursor=None):
            with build_sensor_context(
                instance=instance, cursor=cursor, definitions=defs, resources=for_sensor(version_drift_sensor, res)
            ) as ctx:
                return version_drift_sensor.evaluate_tick(ctx)

        data = evaluate()
        (req,) = data.run_requests
        wanted = {(ap.asset_key.path[-1], ap.partition_key) for ap in req.asset_graph_subset.iterate_asset_partitions()}
        assert wanted == (
            {("mcap_episodes", k) for k in old_pipeline}
            | {("step_ladders", k) for k in old_pipeline}
            | {("step_ladders", k) for k in old_ladder}
        )
        assert req.tags["dyna/pipeline_version"] == "9.9-test"
        assert "already backfilled" in evaluate(data.cursor).skip_message  # never twice for the same state


def test_unreachable_registry_fails_the_run_and_names_it_without_the_password(home):
    res = resources(home)
    res["ingest"] = IngestResource(
        home=HomeResource(root=str(home), registry_url="postgresql+psycopg2://dyna:s3cret@127.0.0.1:1/reg")
    )
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ingest_partitions", ["20261129T10-000001"])
        result = materialize(
            ASSETS, instance=instance, partition_key="20261129T10-000001", resources=res, raise_on_error=False
        )
        assert not result.success
        (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        text = str(failure.step_failure_data.error)
        assert "RegistryUnavailableError" in text and "127.0.0.1:1" in text and "s3cret" not in text


def test_warehouse_follows_the_registry_and_its_sensor_fires_only_when_changes_are_pending(home, monkeypatch):
    from dyna_assets.warehouse.sensors import warehouse_sync_sensor
    from dyna_resources.resources import WarehouseResource

    res = {
        **resources(home),
        "warehouse": WarehouseResource(home=HomeResource(root=str(home))),
        "home": HomeResource(root=str(home)),
    }
    wh_asset = defs.get_assets_def("warehouse_episodes")
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        assert materialize(ASSETS, instance=instance, partition_key=req.partition_key, resources=res).success
        fired = run_sensor(warehouse_sync_sensor, instance, res)
        assert fired.run_key.startswith("cdc-") and fired.tags["dyna/trigger"] == "cdc"
        assert fired.asset_selection == [AssetKey("warehouse_episodes"), AssetKey("review_pool")]
        result = materialize([wh_asset], instance=instance, resources=res)
        m = md(result, "warehouse_episodes", None)
        assert m["rows"] == 4 and m["rows_by_status"] == {"transcoded": 4}
        assert "up to date" in run_sensor(warehouse_sync_sensor, instance, res).skip_message
        with res["warehouse"].open(read_only=True) as wh:
            assert [e["episode_id"] for e in wh.episodes()] == [f"ep-g{i}" for i in range(4)]
            assert wh.episodes() == sorted(res["ingest"].stores().registry.episodes(), key=lambda e: e["episode_id"])

        # a curation spec file becomes a manifests partition; its build is one query over the warehouse
        from dyna_assets.curation.sensors import curation_spec_sensor
        from trainer.manifest_loader import open_manifest, rank_slice

        (home / "curation").mkdir(exist_ok=True)
        (home / "curation" / "first-two.yaml").write_text(
            "name: first-two\nwhere: {episode_id: {in: [ep-g0, ep-g1]}}\nsegments: {length_s: 0.5, stride_s: 0.5}\n"
        )
        (home / "curation" / "bad name!.yaml").write_text("name: x\n")
        instance.add_dynamic_partitions("curation_specs", ["deleted-spec"])  # its file is gone
        sr = run_sensor(curation_spec_sensor, instance, res)
        assert [r.partition_key for r in sr.run_requests] == ["first-two"]
        (add, delete) = sr.dynamic_partitions_requests
        assert isinstance(add, AddDynamicPartitionsRequest) and list(add.partition_keys) == ["first-two"]
        assert isinstance(delete, DeleteDynamicPartitionsRequest) and list(delete.partition_keys) == ["deleted-spec"]
        instance.delete_dynamic_partition("curation_specs", "deleted-spec")  # what the daemon does with it
        instance.add_dynamic_partitions("curation_specs", ["first-two"])
        built = materialize(
            [defs.get_assets_def("manifests")], instance=instance, resources=res, partition_key="first-two"
        )
        m = md(built, "manifests", "first-two")
        t = open_manifest(m["arrow"])
        # 2 s episodes (just under, by the first sample's offset), 0.5 s segments every 0.5 s -> 3 or 4 each
        assert m["rows"] == t.num_rows and set(t["episode_id"].to_pylist()) == {"ep-g0", "ep-g1"}
        assert m["episodes"] == 2 and 6 <= m["rows"] <= 8 and "SELECT" in m["sql"]
        (typed,) = built.asset_materializations_for_node("manifests")
        assert all(
            isinstance(typed.metadata[k], FloatMetadataValue) for k in ("arrow_GB", "parquet_GB", "segment_hours")
        )
        assert sum(rank_slice(t, r, 3).num_rows for r in range(3)) == t.num_rows

        # the manifest's working set is prewarmed into the node cache; its files are copied to the second origin
        from dyna_assets.cache.sensors import manifest_prewarm_sensor
        from dyna_resources.resources import CacheResource, ReplicaResource

        res["cache"] = CacheResource(home=HomeResource(root=str(home)), page_mb=0.25)
        res["replica"] = ReplicaResource(home=HomeResource(root=str(home)))
        fired = run_sensor(manifest_prewarm_sensor, instance, res)
        assert [r.partition_key for r in fired.run_requests] == ["first-two"]
        assert not manifest_prewarm_sensor(build_sensor_context(instance=instance, cursor=fired.cursor)).run_requests
        cache_sets = defs.get_assets_def("cache_sets")
        warmed = materialize([cache_sets], instance=instance, resources=res, partition_key="first-two")
        c = md(warmed, "cache_sets", "first-two")
        assert c["files"] == 2 and c["segments"] == t.num_rows and c["errors"] == {}
        assert c["fetched_pages"] == c["pages"] > 0 and c["already_warm_pages"] == 0
        # every byte of the working set warmed; from the origin, the 16 KiB blocks that hold it (two ranges
        # may share one)
        assert (
            0 < c["working_set_GB"] == c["warmed_GB"]
            and 0 < c["fetched_GB"] <= c["working_set_GB"] + c["pages"] * 2 * 16384 / 1e9
        )
        typed = warmed.asset_materializations_for_node("cache_sets")[0].metadata
        assert all(isinstance(typed[k], FloatMetadataValue) for k in ("working_set_GB", "fetched_MBps", "seconds"))
        assert all(e.passed for e in warmed.get_asset_check_evaluations())
        said = [e.user_message for e in instance.all_logs(warmed.run_id) if "prewarm first-two:" in e.user_message]
        assert said[0].startswith(f"prewarm first-two: 0/{c['pages']} pages")  # progress in the run log
        assert said[-1].startswith(f"prewarm first-two: {c['pages']}/{c['pages']} pages") and "MB/s" in said[-1]
        again = md(
            materialize([cache_sets], instance=instance, resources=res, partition_key="first-two"),
            "cache_sets",
            "first-two",
        )
        assert (again["fetched_pages"], again["already_warm_pages"]) == (0, c["pages"])
        replica = materialize(
            [defs.get_assets_def("mcap_replica")], instance=instance, resources=res, partition_key="first-two"
        )
        r = md(replica, "mcap_replica", "first-two")
        assert r["files"] == 2 and r["failed"] == {} and r["copied"] + r["skipped_current"] == 2

        # the manifest follows the data: built from this spec, and the warehouse selects what it holds
        assert m["selection"]["episodes"] == 2 and m["stale_episodes"] == 0
        assert run_sensor(curation_spec_sensor, instance, res).run_requests == []
        synced = md(materialize([wh_asset], instance=instance, resources=res), "warehouse_episodes", None)
        assert synced["selections"]["first-two"] == m["selection"]  # same spec, same rows: nothing to rebuild
        assert run_sensor(curation_spec_sensor, instance, res).run_requests == []
        # a new pipeline version re-transcodes the batch: the warehouse sync sees the spec select other versions
        with monkeypatch.context() as bumped:
            bumped.setattr(versions, "PIPELINE_VERSION", "9.9-follow")  # seen by units in forked processes, not Ray's
            in_process = {**res, "ingest": resources(home, units_on="process")["ingest"]}
            assert materialize(ASSETS, instance=instance, partition_key=req.partition_key, resources=in_process).success
            synced = md(materialize([wh_asset], instance=instance, resources=res), "warehouse_episodes", None)
        now = synced["selections"]["first-two"]
        assert (
            now["episodes"] == 2 and now["digest"] != m["selection"]["digest"] and now["spec"] == m["selection"]["spec"]
        )
        assert now["stale_episodes"] == 0 and synced["stale_episodes"] == 0  # stale counted against the version then
        (follow,) = run_sensor(curation_spec_sensor, instance, res).run_requests
        assert follow.partition_key == "first-two" and follow.tags["dyna/trigger"] == "selection-changed"
        assert follow.run_key == f"first-two-{now['spec']}-{now['digest']}"
        assert follow.tags["dyna/built_from_selection"] == m["selection"]["digest"]
        with monkeypatch.context() as bumped:
            bumped.setattr(versions, "PIPELINE_VERSION", "9.9-follow")
            rebuilt = md(
                materialize(
                    [defs.get_assets_def("manifests")], instance=instance, resources=res, partition_key="first-two"
                ),
                "manifests",
                "first-two",
            )
        assert rebuilt["selection"] == now and rebuilt["sha256"] != m["sha256"]
        assert run_sensor(curation_spec_sensor, instance, res).run_requests == []  # caught up
        # its new DataVersion re-warms its cache set, and only that
        (rewarm,) = run_sensor(manifest_prewarm_sensor, instance, res, cursor=fired.cursor).run_requests
        assert rewarm.partition_key == "first-two" and rewarm.tags["dyna/manifest_version"] == rebuilt["sha256"]
        # against the current code (not the bumped one) every selected episode is stale again
        assert (
            md(materialize([wh_asset], instance=instance, resources=res), "warehouse_episodes", None)["stale_episodes"]
            == 4
        )


def test_an_mcap_deleted_behind_the_registry_fails_the_partitions_check_and_no_manifest_selects_it(home):
    from dagster import AssetSelection

    from dyna_assets.ingest.presence import mcaps_present
    from dyna_resources.resources import HomeResource, WarehouseResource
    from trainer.manifest_loader import open_manifest

    res = {
        **resources(home, units_on="process"),
        "warehouse": WarehouseResource(home=HomeResource(root=str(home))),
        "home": HomeResource(root=str(home)),
    }
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        part = req.partition_key
        assert materialize(ASSETS, instance=instance, partition_key=part, resources=res).success
        reg = res["ingest"].stores().registry
        gone = reg.episode_by_id("ep-g1")
        Path(gone["mcap_path"]).unlink()  # deleted behind the registry's back

        def run_check():
            # the partition by its tag: materialize(partition_key=) asks one partitions definition of the check too
            result = materialize(
                [ASSETS[1], mcaps_present],
                instance=instance,
                resources=res,
                tags={"dagster/partition": part},
                selection=AssetSelection.checks(mcaps_present),
                raise_on_error=False,
            )
            return checks(result)[("mcap_episodes", "mcaps_present")]

        check = run_check()
        assert not check.passed and check.severity.value == "ERROR"
        assert check.metadata["missing"].value == 1 and check.metadata["checked"].value == 4
        (named,) = check.metadata["missing_episodes"].value
        assert (named["episode_id"], named["mcap_uri"], named["why"]) == (
            "ep-g1",
            gone["mcap_uri"],
            "gone from the store",
        )
        assert "ep-g1" in check.description and gone["mcap_uri"] in check.description
        assert reg.episode_by_id("ep-g1")["status"] == "missing"
        assert reg.outdated_partitions(
            schema_version=versions.SCHEMA_VERSION, pipeline_version=versions.PIPELINE_VERSION
        ) == [part]  # the drift sensor's

        # the warehouse follows; a spec that asks for it leaves it out of the manifest, naming it
        assert materialize([defs.get_assets_def("warehouse_episodes")], instance=instance, resources=res).success
        (home / "curation").mkdir(exist_ok=True)
        (home / "curation" / "g012.yaml").write_text(
            "name: g012\nwhere: {episode_id: {in: [ep-g0, ep-g1, ep-g2]}}\nsegments: {length_s: 0.5, stride_s: 0.5}\n"
        )
        instance.add_dynamic_partitions("curation_specs", ["g012"])
        built = materialize([defs.get_assets_def("manifests")], instance=instance, resources=res, partition_key="g012")
        m = md(built, "manifests", "g012")
        assert set(open_manifest(m["arrow"])["episode_id"].to_pylist()) == {"ep-g0", "ep-g2"}
        assert m["missing_excluded"] == 1 and m["missing_episodes"] == [
            {"episode_id": "ep-g1", "mcap_uri": gone["mcap_uri"]}
        ]
        # the next run of the partition transcodes it again; the check passes
        again = materialize(ASSETS[1:], instance=instance, partition_key=part, resources=res)
        assert md(again, "mcap_episodes", part)["this_run_processed"] == 1
        assert reg.episode_by_id("ep-g1")["status"] == "transcoded" and Path(gone["mcap_path"]).is_file()
        assert run_check().passed
