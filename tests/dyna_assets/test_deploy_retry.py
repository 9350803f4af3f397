"""A failed automatic run is retried once, by the real ``dagster-daemon`` on the project's instance
config, then left failed with its reason (visible in the UI: the retry is a run of its own, tagged with
its retry number and its parent).

The run: the curation sensor's build of a spec's manifest while the warehouse does not exist yet (DuckDB
cannot open a database that is not there, read-only). It fails the same way twice; nothing launches a
third run. Beside it, the request types no other daemon test covers: the landing sensor's new ingest
partition and its run, and the curation sensor's removal of a deleted spec's partition.
"""

import shutil

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from dyna_assets.demo import SAMPLE_SPEC
from dyna_assets.deployment import AUTOMATIC_RUN_RETRIES

from .deploy_harness import Services, service_env, wait_for, write_instance_config

SPEC = "retry-me"


def _step_failures(instance: DagsterInstance, run_id: str) -> list[str]:
    return [
        e.dagster_event.step_failure_data.error.to_string()  # with its cause: what the asset raised
        for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
        if e.dagster_event and e.dagster_event.step_failure_data and e.dagster_event.step_failure_data.error
    ]


def test_a_failed_sensor_run_is_retried_once_by_the_daemon_then_left_failed(tmp_path, monkeypatch, episode_factory):
    dyna_home, dagster_home = tmp_path / "dyna", tmp_path / "dagster_home"
    (dyna_home / "landing" / "2026-12-06").mkdir(parents=True)
    shutil.copyfile(episode_factory(episode_id="ep-landed").path, dyna_home / "landing" / "2026-12-06" / "ep-landed.h5")
    (dyna_home / "curation").mkdir(parents=True)
    (dyna_home / "curation" / f"{SPEC}.yaml").write_text(SAMPLE_SPEC.replace("name: demo-clean", f"name: {SPEC}"))
    write_instance_config(dagster_home)  # the project's instance config, as is: run retries on
    # these two start running with the daemon, the others stopped; each evaluated at most every 5 s
    env = service_env(
        dyna_home, dagster_home, DYNA_SENSORS="curation_spec_sensor,landing_sensor", DYNA_SENSOR_INTERVAL_S="5"
    )
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    services = Services(tmp_path, env)
    try:
        services.start_daemon()
        with DagsterInstance.get() as instance:

            def runs():  # oldest first (get_runs gives the newest first)
                return list(reversed(instance.get_runs(RunsFilter(tags={"dagster/partition": SPEC}))))

            def settled():
                got = runs()
                last = got[-1] if got else None
                if len(got) == AUTOMATIC_RUN_RETRIES + 1 and last and last.tags.get("dagster/will_retry") == "false":
                    return got
                return None

            first, retry = wait_for(
                "the sensor's run and its one retry, both failed, the retry not to be retried",
                settled,
                deadline_s=300,
                every_s=2,
                check=services.check_alive,
                state=lambda: [(r.run_id[:8], r.status.value, dict(r.tags)) for r in runs()],
            )
            assert first.tags["dagster/sensor_name"] == "curation_spec_sensor"
            assert first.tags["dagster/max_retries"] == str(AUTOMATIC_RUN_RETRIES)
            assert first.status == retry.status == DagsterRunStatus.FAILURE
            assert first.tags["dagster/auto_retry_run_id"] == retry.run_id
            assert retry.tags["dagster/retry_number"] == "1" and retry.parent_run_id == first.run_id
            for run in (first, retry):  # the reason, in each run's log: the warehouse it could not open
                (message,) = _step_failures(instance, run.run_id)
                assert "warehouse.duckdb" in message, message
            assert len(runs()) == 2  # the failed spec's run key is spent: no tick launches it again

            # the spec deleted: its partition goes, by the daemon's handling of the sensor's delete request
            (dyna_home / "curation" / f"{SPEC}.yaml").unlink()
            wait_for(
                "the deleted spec's partition removed",
                lambda: SPEC not in instance.get_dynamic_partitions("curation_specs"),
                deadline_s=120,
                check=services.check_alive,
                state=lambda: instance.get_dynamic_partitions("curation_specs"),
            )
            # the landed file: a new ingest partition and its run, both from the landing sensor's tick
            (landed,) = wait_for(
                "the landing sensor's ingest run",
                lambda: instance.get_runs(RunsFilter(tags={"dyna/trigger": "landing"})),
                deadline_s=240,
                check=services.check_alive,
            )
            assert landed.tags["dagster/sensor_name"] == "landing_sensor"
            assert instance.get_dynamic_partitions("ingest_partitions") == [landed.tags["dagster/partition"]]
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()
