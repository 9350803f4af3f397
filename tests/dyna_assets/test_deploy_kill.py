"""kill -9 of a run worker under the project's own instance config (``infra/dagster/dagster.yaml``:
run queue, pools, run monitoring), as a deployment runs it: the real webserver and daemon on
127.0.0.1; the run is launched through GraphQL (the UI's "Materialize" of one partition), dequeued
by the daemon and started by the code server, holding the ``transcode`` pool's only slot when its
worker is killed. The dead run must end FAILED, its slot must come back, and the same launch again
must complete. (What a relaunch redoes inside a batch is tests/dyna_assets/test_kill_resume.py's.)
"""

import os
import shutil
import signal
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, materialize

from dyna_assets.definitions import defs
from dyna_assets.deployment import embedded_resources
from dyna_resources.catalog.registry import TRANSCODED, Registry
from dyna_resources.ingest.landing import LandingZone
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.resources import IngestResource

from .deploy_harness import Services, service_env, wait_for, write_instance_config

N = 3
POOL = "transcode"

LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""


def _launch(services: Services, location: str, repository: str, batch: str) -> str:
    params = {
        "selector": {
            "repositoryLocationName": location,
            "repositoryName": repository,
            "jobName": "__ASSET_JOB",
            "assetSelection": [{"path": ["mcap_episodes"]}],
        },
        # one episode at a time: the kill lands between two finished episodes
        "runConfigData": {"resources": {"transcode": {"config": {"workers": 1}}}},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": batch}]},
        "mode": "default",
    }
    got = services.gql(LAUNCH_RUN, {"params": params})["launchRun"]
    assert got["__typename"] == "LaunchRunSuccess", got
    return got["run"]["runId"]


def _run_worker_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The run worker's pid, from the engine event the code server reports when it starts it."""
    for ev in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        if ev.dagster_event and ev.dagster_event.message.startswith("Started process for run"):
            return int(ev.dagster_event.engine_event_data.metadata["pid"].value)
    return None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the step subprocess, the transcode pool), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _started_step(instance: DagsterInstance, run_id: str, step: str) -> bool:
    return any(ev.step_key == step for ev in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START))


def _slot_holders(instance: DagsterInstance) -> set[str]:
    info = instance.event_log_storage.get_concurrency_info(POOL)
    return {s.run_id for s in info.claimed_slots}


def _deployment(episode_factory, tmp_path, monkeypatch, seed: int) -> tuple[Path, dict, Registry, str]:
    """A home with N episodes landed and inventoried (raw_episodes, in this process) in one partition, and
    the environment of a deployment on the project's instance config (a queue that releases runs every
    second); returns (home, env, registry, partition)."""
    dyna_home, dagster_home = tmp_path / "dyna", tmp_path / "dagster_home"
    # The project's instance config as is (pools, run monitoring), but a queue that releases runs every second.
    cfg = write_instance_config(dagster_home, {"run_queue": {"dequeue_interval_seconds": 1}})
    assert cfg["concurrency"]["pools"]["default_limit"] == 1 and cfg["run_monitoring"]["enabled"]
    env = service_env(dyna_home, dagster_home, DYNA_SENSORS="stopped")
    for k in ("DYNA_HOME", "DAGSTER_HOME", "DYNA_SENSORS"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)

    landing = dyna_home / "landing" / "2026-11-29"
    landing.mkdir(parents=True)
    for i in range(N):
        g = episode_factory(episode_id=f"ep-kill9-{i}", seed=seed + i, duration_s=2.0)
        shutil.copyfile(g.path, landing / f"ep-kill9-{i}.h5")
    registry = Registry.sqlite(dyna_home / "registry.sqlite")
    plan = landing_tick(
        LandingCursor(),
        LandingZone(dyna_home / "landing"),
        registry,
        LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0),
    )
    (batch,) = [b.key for b in plan.sealed]
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("ingest_partitions", [batch])
        res = embedded_resources({"DYNA_HOME": str(dyna_home)})
        res["ingest"] = IngestResource(home=res["home"], units_on="process")  # setup, in this process
        assert materialize(
            [defs.get_assets_def("raw_episodes")], instance=instance, partition_key=batch, resources=res
        ).success
    return dyna_home, env, registry, batch


def _serve(services: Services) -> tuple[str, str]:
    """The webserver and the daemon started and serving the project: (code location, repository)."""
    services.start_webserver()
    services.start_daemon()
    (entry,) = services.wait_until_serving()
    (repository,) = [r["name"] for r in entry["locationOrLoadError"]["repositories"]]
    return entry["name"], repository


def test_kill_9_of_a_run_worker_fails_the_run_frees_its_slot_and_the_relaunch_completes(
    episode_factory, tmp_path, monkeypatch
):
    dyna_home, env, registry, batch = _deployment(episode_factory, tmp_path, monkeypatch, seed=500)

    services = Services(tmp_path, env)
    try:
        location, repository = _serve(services)

        with DagsterInstance.get() as instance:

            def status(run_id: str) -> DagsterRunStatus:
                return instance.get_run_by_id(run_id).status

            first = _launch(services, location, repository, batch)
            wait_for(
                "the first run's transcode step started",
                lambda: _started_step(instance, first, "mcap_episodes"),
                deadline_s=180,
                every_s=0.2,
                check=services.check_alive,
                state=lambda: status(first),
            )
            assert status(first) == DagsterRunStatus.STARTED
            assert _slot_holders(instance) == {first}  # its transcode step holds the pool's only slot
            pid = _run_worker_pid(instance, first)
            assert pid is not None and pid != os.getpid()
            # the whole worker, as when its machine or container dies: the run worker, then what it started
            tree = _descendants(pid)
            assert tree, "the run worker runs its step in a subprocess"
            for p in [pid, *tree]:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass

            wait_for(
                "the killed run marked FAILED",
                lambda: status(first) == DagsterRunStatus.FAILURE,
                deadline_s=60,
                check=services.check_alive,
                state=lambda: status(first),
            )
            # freed by the monitoring daemon (run_monitoring.free_slots_after_run_end_seconds)
            wait_for(
                "the dead run's transcode slot freed",
                lambda: not _slot_holders(instance),
                deadline_s=120,
                check=services.check_alive,
                state=lambda: _slot_holders(instance),
            )

            second = _launch(services, location, repository, batch)
            wait_for(
                "the relaunch finished",
                lambda: (
                    status(second) in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
                ),
                deadline_s=240,
                check=services.check_alive,
                state=lambda: status(second),
            )
            assert status(second) == DagsterRunStatus.SUCCESS
            assert not _slot_holders(instance)
            failure = [
                e
                for e in instance.all_logs(first, of_type=DagsterEventType.ENGINE_EVENT)
                if "terminated by signal 9" in e.message
            ]
            assert failure, "the killed run names its signal"

        eps = registry.partition_episodes(batch)
        assert len(eps) == N and all(e["status"] == TRANSCODED for e in eps)
        counts = registry.counts()
        assert counts["episodes"] == N and counts["landed_files"] == N and counts["quarantine"] == 0
        assert sorted(p.name for p in (dyna_home / "mcap").iterdir()) == [f"ep-kill9-{i}.mcap" for i in range(N)]
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()
        registry.close()


def _processes_of(home: Path) -> dict[int, str]:
    """Processes (not this one) whose environment names this test's home, by pid: the services, the runs
    and everything they started (Ray's cluster and workers, episode processes)."""
    mark = f"DYNA_HOME={home}".encode()
    out = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        try:
            if pid != os.getpid() and mark in environ.read_bytes().split(b"\0"):
                out[pid] = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def test_kill_9_of_the_run_worker_alone_leaves_nothing_of_the_run_running_and_nothing_written_after_it(
    episode_factory, tmp_path, monkeypatch
):
    """Only the run worker is killed (the OOM killer's choice), its work units on Ray mid-episode. Its step
    dies with it; the units find the run's lease gone and stop before publishing; the episode processes die
    with their unit. Once the run is marked FAILED nothing of it runs (checked by process, across Ray's
    processes too) and no MCAP is written after that moment; the relaunch completes with nothing held back."""
    dyna_home, env, registry, batch = _deployment(episode_factory, tmp_path, monkeypatch, seed=520)
    services = Services(tmp_path, env)
    try:
        location, repository = _serve(services)
        baseline = set(_processes_of(dyna_home))  # the services and their code servers
        with DagsterInstance.get() as instance:

            def status(run_id: str) -> DagsterRunStatus:
                return instance.get_run_by_id(run_id).status

            first = _launch(services, location, repository, batch)

            def episode_in_flight():  # an episode process with its raw file open, below a Ray unit
                for pid in _processes_of(dyna_home):
                    try:
                        if any(
                            f.endswith(".h5")
                            for f in (
                                os.readlink(fd) for fd in (f"/proc/{pid}/fd/{n}" for n in os.listdir(f"/proc/{pid}/fd"))
                            )
                        ):
                            return pid
                    except (FileNotFoundError, ProcessLookupError, PermissionError):
                        continue
                return None

            wait_for(
                "an episode of the first run in flight",
                episode_in_flight,
                deadline_s=240,
                every_s=0.1,
                check=services.check_alive,
                state=lambda: status(first),
            )
            pid = _run_worker_pid(instance, first)
            assert pid is not None and pid != os.getpid()
            # the worker and all it started: its step, the step's Ray cluster and workers, their episode processes
            of_the_run = {pid, *_descendants(pid)}
            assert episode_in_flight() in of_the_run and not of_the_run & baseline, (of_the_run, baseline)
            os.kill(pid, signal.SIGKILL)  # the run worker alone
            wait_for(
                "the killed run marked FAILED",
                lambda: status(first) == DagsterRunStatus.FAILURE,
                deadline_s=60,
                check=services.check_alive,
                state=lambda: status(first),
            )
            failed_at = instance.get_run_record_by_id(first).end_time
            assert failed_at is not None
            # Ray's agents notice their raylet is gone by polling: seconds, longer on a loaded machine
            wait_for(
                "no process of the failed run left",
                lambda: not (set(_processes_of(dyna_home)) & of_the_run),
                deadline_s=120,
                every_s=0.2,
                state=lambda: {p: c for p, c in _processes_of(dyna_home).items() if p in of_the_run},
            )
            written = {p.name: p.stat().st_mtime for p in (dyna_home / "mcap").glob("*.mcap")}
            assert all(t <= failed_at for t in written.values()), (failed_at, written)
            assert registry.quarantined() == []

            second = _launch(services, location, repository, batch)
            wait_for(
                "the relaunch finished",
                lambda: (
                    status(second) in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
                ),
                deadline_s=240,
                check=services.check_alive,
                state=lambda: status(second),
            )
            assert status(second) == DagsterRunStatus.SUCCESS
        eps = registry.partition_episodes(batch)
        assert len(eps) == N and all(e["status"] == TRANSCODED for e in eps) and registry.quarantined() == []
        assert sorted(p.name for p in (dyna_home / "mcap").glob("*.mcap")) == [f"ep-kill9-{i}.mcap" for i in range(N)]
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()
        registry.close()
