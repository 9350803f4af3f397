"""End to end, as a user's tools drive it: the real ``dagster-webserver`` and ``dagster-daemon``
serve the project's workspace on 127.0.0.1; a partition backfill is launched through the
webserver's GraphQL API (the mutation the UI's backfill dialog sends), the daemon runs it
through the run queue, and the outcome is read back through GraphQL and from the registry.

Everything lives in temporary folders (DYNA_HOME, DAGSTER_HOME) and on a free port, so the
test can run next to others (``pytest -n 2``). The sensors are left stopped (DYNA_SENSORS):
the test does by hand what the landing sensor would do, so nothing races it.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from dyna_resources import versions
from dyna_resources.catalog.registry import REJECTED, TRANSCODED, Registry, registry_url_from_env
from dyna_resources.ingest.landing import LandingZone
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv's bin: dagster-webserver, dagster-daemon
PARTITIONS_DEF = "ingest_batches"
ASSETS = ("raw_episodes", "mcap_episodes")
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}

# Every landing tick releases what is pending as one batch (huge target, no wait): one tick, one batch.
ONE_BATCH_PER_TICK = LandingSettings(target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)

# localhost only, never through a proxy from the environment
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- helpers ------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 60) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(lines[-n:])


class Services:
    """The webserver and the daemon as subprocesses, each in its own process group (their code
    servers, run workers and transcode pools go with them at teardown)."""

    def __init__(self, tmp: Path, env: dict[str, str]):
        self.tmp, self.env = tmp, env
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.port = _free_port()

    def start(self, name: str, argv: list[str]) -> None:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        with open(log, "wb") as f:
            self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def start_webserver(self) -> None:
        self.start("webserver", [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(self.port),
                                 "-w", "workspace.yaml"])

    def start_daemon(self) -> None:
        self.start("daemon", [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"])

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            assert p.poll() is None, f"{name} exited with {p.returncode}:\n{_tail(self.logs[name])}"

    def diagnostics(self) -> str:
        return "\n".join(f"----- {name} log tail -----\n{_tail(log)}" for name, log in self.logs.items())

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever is left of the group (code servers, run workers, pool workers)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)

    # -- GraphQL --------------------------------------------------------------------------------
    def gql(self, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
        with _HTTP.open(req, timeout=timeout) as r:
            out = json.load(r)
        assert not out.get("errors"), f"GraphQL errors: {out['errors']}"
        return out["data"]

    def wait_until_serving(self, deadline_s: float = 120) -> None:
        """Wait (not a timed assertion) until the webserver answers and the code location loaded."""
        deadline = time.monotonic() + deadline_s
        last = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                data = self.gql(WORKSPACE, timeout=10)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                last = repr(e)
            else:
                ws = data["workspaceOrError"]
                assert ws["__typename"] == "Workspace", ws
                entries = ws["locationEntries"]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    for e in entries:
                        loc = e["locationOrLoadError"]
                        assert loc["__typename"] == "RepositoryLocation", f"code location {e['name']}: {loc}"
                    return
                last = entries
            time.sleep(0.5)
        raise AssertionError(f"webserver not serving the workspace after {deadline_s} s ({last})")


WORKSPACE = """
{ workspaceOrError { __typename
    ... on Workspace { locationEntries { name loadStatus
        locationOrLoadError { __typename ... on PythonError { message stack } } } }
    ... on PythonError { message } } }
"""

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
    dagster_home.mkdir()
    # The project's instance config, with a faster run queue for the test.
    instance_cfg = yaml.safe_load((ROOT / "infra/dagster/dagster.yaml").read_text())
    instance_cfg.setdefault("run_queue", {})["dequeue_interval_seconds"] = 1
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(instance_cfg, sort_keys=False))

    for k, v in {"DYNA_HOME": str(dyna_home), "DAGSTER_HOME": str(dagster_home), "DYNA_SENSORS": "stopped"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "DYNA_REGISTRY_URL"}
    env.update(PYTHONPATH=str(ROOT), DYNA_HOME=str(dyna_home), DAGSTER_HOME=str(dagster_home),
               DYNA_SENSORS="stopped", CI="1", DAGSTER_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")

    # -- what the landing sensor does: register landed files, pack batches, add partitions ---------
    good = [episode_factory(episode_id=f"ep-e2e-{i}", seed=700 + i, duration_s=2.0) for i in range(4)]
    truncated = episode_factory(fault="truncated", episode_id="ep-e2e-trunc", seed=790, duration_s=2.0)
    zone = LandingZone(dyna_home / "landing")
    registry = Registry(registry_url_from_env(dyna_home))
    try:
        cursor, batches = LandingCursor(), []
        arrivals = [[("a/ep-e2e-0.h5", good[0]), ("a/ep-e2e-1.h5", good[1]), ("a/ep-e2e-trunc.h5", truncated)],
                    [("b/ep-e2e-2.h5", good[2]), ("b/ep-e2e-3.h5", good[3])]]
        for wave in arrivals:
            for key, g in wave:
                _land(zone, g, key)
            plan = landing_tick(cursor, zone, registry, ONE_BATCH_PER_TICK)
            cursor = plan.cursor
            assert len(plan.created) == 1 and plan.created[0].files == len(wave), plan
            batches.append(plan.created[0].key)
        bad_batch, clean_batch = batches
        good_ids = {bad_batch: {"ep-e2e-0", "ep-e2e-1"}, clean_batch: {"ep-e2e-2", "ep-e2e-3"}}
    finally:
        registry.close()

    from dagster import DagsterInstance

    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(PARTITIONS_DEF, batches)
        assert instance.get_dynamic_partitions(PARTITIONS_DEF) == batches

    services = Services(tmp_path, env)
    t0 = time.monotonic()
    try:
        services.start_webserver()
        services.wait_until_serving()
        t_ready = time.monotonic()

        # -- the backfill dialog: both partitions, both assets ------------------------------------
        launched = services.gql(LAUNCH, {"params": {
            "partitionNames": batches,
            "assetSelection": [{"path": [a]} for a in ASSETS],
            "fromFailure": False,
        }})["launchPartitionBackfill"]
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
        print(f"\nwebserver ready {t_ready - t0:.1f} s, backfill done {t_done - t_ready:.1f} s later")
        print(json.dumps(bf, indent=1))

        # -- the backfill ------------------------------------------------------------------------
        assert bf["status"] == "COMPLETED_SUCCESS", bf
        assert bf["isAssetBackfill"] and bf["error"] is None
        assert sorted(bf["partitionNames"]) == sorted(batches) and bf["numPartitions"] == 2
        counts = {tuple(s["assetKey"]["path"]): s for s in bf["assetBackfillData"]["assetBackfillStatuses"]}
        for a in ASSETS:
            c = counts[(a,)]
            assert (c["numPartitionsTargeted"], c["numPartitionsMaterialized"], c["numPartitionsFailed"],
                    c["numPartitionsInProgress"]) == (2, 2, 0, 0), c
        runs = bf["runs"]
        assert runs and all(r["status"] == "SUCCESS" for r in runs), runs
        # Each partition of each asset is covered by exactly one run of the backfill (ranged runs
        # of multi_run(max_partitions_per_run=16), or one run per partition).
        covered: dict[str, list[str]] = {}
        for r in runs:
            tags = {t["key"]: t["value"] for t in r["tags"]}
            assert tags["dagster/backfill"] == backfill_id
            if "dagster/partition" in tags:
                keys = [tags["dagster/partition"]]
            else:
                lo, hi = tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
                keys = batches[batches.index(lo): batches.index(hi) + 1]
            for k in keys:
                covered.setdefault(k, []).append(r["runId"])
        print("runs by partition:", covered)

        # -- per-partition materializations and their metadata --------------------------------------
        nodes = {}
        for a in ASSETS:
            node = services.gql(ASSET, {"key": {"path": [a]}, "partitions": batches})["assetNodeOrError"]
            assert node["__typename"] == "AssetNode", node
            nodes[a] = node
            print(a, json.dumps(node, indent=1))
            assert sorted(node["partitionKeys"]) == sorted(batches)
            st = node["assetPartitionStatuses"]
            assert st["__typename"] == "DefaultPartitionStatuses"
            assert sorted(st["materializedPartitions"]) == sorted(batches), st
            assert st["failedPartitions"] == st["unmaterializedPartitions"] == st["materializingPartitions"] == [], st
            latest = {m["partition"]: m for m in node["latestMaterializationByPartition"]}
            assert set(latest) == set(batches), latest
            for b in batches:
                md = _meta(latest[b]["metadataEntries"])
                assert latest[b]["runId"] in covered[b]
                if a == "mcap_episodes":
                    assert md["episodes"] == len(good_ids[b]), (a, b, md)
                else:
                    assert md["episodes_by_status"] == {"accepted": len(good_ids[b])}, (a, b, md)
                assert md["quarantined"] == (1 if b == bad_batch else 0), (a, b, md)
                assert md["dyna/pipeline_version"] == versions.PIPELINE_VERSION
                assert md["dyna/schema_version"] == versions.SCHEMA_VERSION
                if a == "mcap_episodes":
                    # transcoded exactly once, by this backfill: nothing was up to date before
                    assert (md["this_run_processed"], md["this_run_skipped_up_to_date"]) == (len(good_ids[b]), 0), md
                else:
                    assert md["this_run_processed"] == len(good_ids[b]) + (b == bad_batch), md
                if b == bad_batch:
                    (reason,) = md["quarantined_reasons"]
                    assert (reason["path"], reason["gate"], reason["stage"]) == ("a/ep-e2e-trunc.h5", "readable", "pre")

        # -- asset checks ------------------------------------------------------------------------
        def executions(asset: str, check: str) -> list[dict]:
            return services.gql(CHECK_EXECUTIONS, {"key": {"path": [asset]}, "name": check})["assetCheckExecutions"]

        readable = executions("raw_episodes", "readable")
        decodable = executions("mcap_episodes", "decodable")
        print("readable", json.dumps(readable, indent=1))
        print("decodable", json.dumps(decodable, indent=1))
        raise AssertionError("exploration")
    except BaseException:
        print(services.diagnostics())
        raise
    finally:
        services.stop()
