"""SIGKILL a real `dagster asset materialize` mid-batch, launch it again: the batch completes
without redoing finished episodes, without duplicates and without losses."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from dagster import AssetKey, DagsterInstance, materialize

from dyna_assets.definitions import defs
from dyna_assets.deployment import embedded_resources
from dyna_resources.catalog.registry import TRANSCODED, Registry
from dyna_resources.ingest.gates import POST_GATES, PRE_GATES
from dyna_resources.ingest.landing import LandingZone
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.resources import IngestResource

REPO = Path(__file__).resolve().parents[2]
N = 4


def _materialize_cmd(batch: str) -> list[str]:
    # one episode at a time, in the run's own process: a clean mid-batch kill of everything that records. (On Ray,
    # a SIGKILLed driver's local cluster lives in its own session and its unit runs on to the end: safe, since each
    # record is an idempotent upsert, but no longer "mid-batch"; test_ingest_graph kills a Ray unit's worker.)
    config = {"resources": {"transcode": {"config": {"workers": 1}}, "ingest": {"config": {"units_on": "process"}}}}
    return [
        str(Path(sys.executable).parent / "dagster"),
        "asset",
        "materialize",
        "-m",
        "dyna_assets.definitions",
        "--select",
        "mcap_episodes",
        "--partition",
        batch,
        "--config-json",
        json.dumps(config),
    ]


def _processes_of(home: Path) -> list[tuple[int, str]]:
    """Processes (not this one) whose environment names this test's home: the run and what it started."""
    mark = f"DYNA_HOME={home}".encode()
    out = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        try:
            if mark in environ.read_bytes().split(b"\0"):
                out.append((pid, (environ.parent / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")))
        except OSError:
            continue  # gone, or not ours to read
    return out


def test_sigkill_mid_batch_then_relaunch_completes_without_duplicates(episode_factory, tmp_path, monkeypatch):
    home, dagster_home = tmp_path / "home", tmp_path / "dagster"
    (home / "landing").mkdir(parents=True)
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for i in range(N):
        g = episode_factory(episode_id=f"ep-kill-{i}", seed=300 + i, duration_s=4.0)
        shutil.copyfile(g.path, home / "landing" / f"ep-kill-{i}.h5")
    env = {
        **os.environ,
        "DYNA_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "DYNA_SENSORS": "stopped",
        "PYTHONPATH": str(REPO),
        "DYNA_REGISTRY_URL": "",
    }
    for k in ("DYNA_HOME", "DAGSTER_HOME"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)

    registry = Registry.sqlite(home / "registry.sqlite")
    plan = landing_tick(
        LandingCursor(),
        LandingZone(home / "landing"),
        registry,
        LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0),
    )
    (batch,) = [b.key for b in plan.sealed]
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("ingest_partitions", [batch])
        res = embedded_resources({"DYNA_HOME": str(home)})
        res["ingest"] = IngestResource(home=res["home"], units_on="process")  # setup, in this process
        assert materialize(
            [defs.get_assets_def("raw_episodes")], instance=instance, partition_key=batch, resources=res
        ).success

    def transcoded() -> list[dict]:
        return [e for e in registry.partition_episodes(batch) if e["status"] == TRANSCODED]

    proc = subprocess.Popen(
        _materialize_cmd(batch),
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while not transcoded():
        assert proc.poll() is None, f"run ended before the kill:\n{proc.stdout.read().decode()[-3000:]}"
        assert time.monotonic() < deadline, "no episode finished in time"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    # The run's units ran on a local Ray cluster that the killed process started: its workers (and their
    # episode processes) are not in the killed process group; they exit once their raylet is gone.
    deadline = time.monotonic() + 120
    while left := _processes_of(home):
        assert time.monotonic() < deadline, f"processes of the killed run still alive: {left}"
        time.sleep(0.1)
    done_before = {e["episode_id"]: Path(e["mcap_path"]).stat().st_mtime_ns for e in transcoded()}
    assert 1 <= len(done_before) < N

    again = subprocess.run(_materialize_cmd(batch), cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]

    eps = registry.partition_episodes(batch)
    assert len(eps) == N and all(e["status"] == TRANSCODED for e in eps)
    for eid, mtime in done_before.items():  # finished episodes were not redone
        assert Path(next(e["mcap_path"] for e in eps if e["episode_id"] == eid)).stat().st_mtime_ns == mtime
    counts = registry.counts()
    assert counts["episodes"] == N and counts["landed_files"] == N and counts["quarantine"] == 0
    assert counts["gate_results"] == 2 * N  # one row per file and stage
    assert all(e["gates_checked"] == len(PRE_GATES) + len(POST_GATES) for e in eps)  # every gate counted once
    mcap_dir = home / "mcap"
    assert sorted(p.name for p in mcap_dir.iterdir()) == [f"ep-kill-{i}.mcap" for i in range(N)]  # no temp left
    with DagsterInstance.get() as instance:
        ev = instance.get_latest_materialization_event(AssetKey("mcap_episodes"))
        md = ev.asset_materialization.metadata
        assert md["this_run_processed"].value == N - len(done_before)
        assert md["this_run_skipped_up_to_date"].value == len(done_before)
        assert md["episodes"].value == N
