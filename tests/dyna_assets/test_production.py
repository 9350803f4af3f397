"""The production deployment: resources switched by DYNA_ENV, built against the local PostgreSQL and
the GCS emulator; a missing setting fails at load; the production instance config loads."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_resources
from sqlalchemy.engine import make_url

from dyna_assets import deployment
from dyna_resources.storage.stores import Store

ROOT = Path(__file__).resolve().parents[2]


def production_env(tmp_path, postgres_url, bucket) -> dict:
    return {
        "DYNA_ENV": "production",
        "DYNA_HOME": str(tmp_path / "shared"),
        "DYNA_REGISTRY_URL": postgres_url,
        "DYNA_WAREHOUSE_PATH": str(tmp_path / "warehouse.duckdb"),
        "DYNA_MANIFEST_STORE": f"gs://{bucket}/manifests",
        "DYNA_CACHE_DIR": str(tmp_path / "nvme-cache"),
        "DYNA_CHECKPOINT_STORE": f"gs://{bucket}/checkpoints",
    }


def test_missing_settings_fail_at_load_naming_each():
    with pytest.raises(deployment.MissingSettingsError) as e:
        deployment.resources({"DYNA_ENV": "production", "DYNA_HOME": "/shared"})
    text = str(e.value)
    for name in ("DYNA_REGISTRY_URL", "DYNA_MANIFEST_STORE", "DYNA_CACHE_DIR", "DYNA_CHECKPOINT_STORE"):
        assert name in text
    assert "DYNA_HOME:" not in text
    with pytest.raises(ValueError, match="'staging'"):
        deployment.resources({"DYNA_ENV": "staging"})
    proc = subprocess.run(
        [sys.executable, "-c", "import dyna_assets.definitions"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DYNA_ENV": "production"},
    )
    assert proc.returncode != 0 and "DYNA_REGISTRY_URL" in proc.stderr


def test_production_resources_reach_postgres_and_the_object_store(tmp_path, postgres_url, gcs, monkeypatch):
    env = production_env(tmp_path, postgres_url, gcs.bucket)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = deployment.resources()
    with build_resources({k: res[k] for k in ("home", "ingest", "cache", "trainer")}) as r:
        registry = r.ingest.stores().registry
        assert str(registry.url).startswith("postgresql") and registry.episodes() == []
        assert r.home.manifests_url() == f"gs://{gcs.bucket}/manifests"
        assert r.cache.root_dir() == str(tmp_path / "nvme-cache")
        assert r.trainer.checkpoint_store == f"gs://{gcs.bucket}/checkpoints"
    store = Store.from_url(f"gs://{gcs.bucket}/manifests", fs=gcs.fs)  # the emulator is shared by the session
    store.put_bytes(f"probe-{tmp_path.name}.txt", b"ok")
    assert store.cat(f"probe-{tmp_path.name}.txt") == b"ok"
    proc = subprocess.run(
        [sys.executable, "-c", "from dyna_assets.definitions import defs; print(sorted(defs.resources))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trainer" in proc.stdout


def test_production_instance_config_loads_on_postgres(tmp_path, postgres_url, monkeypatch):
    url = make_url(postgres_url)
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copyfile(ROOT / "infra" / "dagster" / "dagster.production.yaml", home / "dagster.yaml")
    kubeconfig = tmp_path / "kubeconfig"  # parsed when the launcher starts; no cluster is contacted
    kubeconfig.write_text("""apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: test, user: {token: test}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
""")
    for k, v in {
        "DAGSTER_PG_HOST": url.host,
        "DAGSTER_PG_PORT": str(url.port),
        "DAGSTER_PG_USER": url.username,
        "DAGSTER_PG_PASSWORD": url.password or "",
        "DAGSTER_PG_DB": url.database,
        "DYNA_K8S_NAMESPACE": "dyna",
        "KUBECONFIG": str(kubeconfig),
    }.items():
        monkeypatch.setenv(k, v)
    with DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert type(instance.run_launcher).__name__ == "K8sRunLauncher"
        assert "Postgres" in type(instance.run_storage).__name__
        assert instance.get_runs() == []


def test_helm_values_match_the_instance_config():
    import yaml

    values = yaml.safe_load((ROOT / "infra" / "dagster" / "helm" / "values.yaml").read_text())
    instance = yaml.safe_load((ROOT / "infra" / "dagster" / "dagster.production.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["postgresqlScheme"] == instance["storage"]["postgres"]["postgres_db"]["scheme"]
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    runs = instance["concurrency"]["runs"]
    assert queued["maxConcurrentRuns"] == runs["max_concurrent_runs"]
    assert queued["dequeueIntervalSeconds"] == instance["run_queue"]["dequeue_interval_seconds"]
    assert {(t["key"], t.get("value"), t["limit"]) for t in queued["tagConcurrencyLimits"]} == {
        (t["key"], t.get("value"), t["limit"]) for t in runs["tag_concurrency_limits"]
    }


def test_every_asset_asks_kubernetes_for_what_it_needs():
    from dyna_assets.definitions import defs

    for key in defs.resolve_asset_graph().get_all_asset_keys():
        tags = defs.get_assets_def(key).op.tags
        requests = __import__("json").loads(tags["dagster-k8s/config"])["container_config"]["resources"]["requests"]
        assert requests["cpu"] and requests["memory"], key
    train = __import__("json").loads(defs.get_assets_def("checkpoints").op.tags["dagster-k8s/config"])
    assert train["container_config"]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_the_deployment_settings_reach_the_definitions_the_daemon_loads(tmp_path):
    """DYNA_SENSORS (which sensors start running), DYNA_SENSOR_INTERVAL_S (a cap on their intervals) and
    DYNA_READ_PROFILE, read where the webserver and daemon read them: importing the definitions."""
    probe = (
        "import json; from dyna_assets.definitions import defs\n"
        "s = {x.name: [x.default_status.value, x.minimum_interval_seconds] for x in defs.sensors}\n"
        "print(json.dumps({'sensors': s, 'profile': defs.resources['home'].read_profile}))"
    )

    def load(**settings) -> dict:
        ours = ("DYNA_SENSORS", "DYNA_SENSOR_INTERVAL_S", "DYNA_READ_PROFILE")
        env = {k: v for k, v in os.environ.items() if k not in ours}
        env.update(DYNA_HOME=str(tmp_path / "home"), **settings)
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    default = load()
    assert default["profile"] == "t64"
    assert {n: v[0] for n, v in default["sensors"].items()} == dict.fromkeys(default["sensors"], "RUNNING")
    assert default["sensors"]["landing_sensor"][1] == 30 and default["sensors"]["version_check_sensor"][1] == 60
    chosen = load(
        DYNA_SENSORS="landing_sensor, warehouse_sync_sensor", DYNA_SENSOR_INTERVAL_S="5", DYNA_READ_PROFILE="t128"
    )
    assert chosen["profile"] == "t128"
    running = sorted(n for n, v in chosen["sensors"].items() if v[0] == "RUNNING")
    assert running == ["landing_sensor", "warehouse_sync_sensor"]
    # capped at 5 s, never raised: the warehouse sensor's own interval is 10 s
    assert {v[1] for v in chosen["sensors"].values()} == {5}
    assert load(DYNA_SENSORS="stopped")["sensors"]["landing_sensor"][0] == "STOPPED"
