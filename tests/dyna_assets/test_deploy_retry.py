"""A failed automatic run is retried once, by the real ``dagster-daemon`` on the project's instance
config, then left failed with its reason (visible in the UI: the retry is a run of its own, tagged with
its retry number and its parent).

The run: the curation sensor's build of a spec's manifest while the warehouse does not exist yet (DuckDB
cannot open a database that is not there, read-only). It fails the same way twice; nothing launches a
third run.
"""

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


def test_a_failed_sensor_run_is_retried_once_by_the_daemon_then_left_failed(tmp_path, monkeypatch):
    dyna_home, dagster_home = tmp_path / "dyna", tmp_path / "dagster_home"
    (dyna_home / "curation").mkdir(parents=True)
    (dyna_home / "curation" / f"{SPEC}.yaml").write_text(SAMPLE_SPEC.replace("name: demo-clean", f"name: {SPEC}"))
    write_instance_config(dagster_home)  # the project's instance config, as is: run retries on
    env = service_env(dyna_home, dagster_home, DYNA_SENSORS="stopped")
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    services = Services(tmp_path, env)
    try:
        services.cli("sensor", "start", "curation_spec_sensor", "-w", "workspace.yaml")
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
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()
