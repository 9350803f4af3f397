"""Which resources the graph runs with, switched by one variable: ``DYNA_ENV``.

- ``embedded`` (default): everything under ``$DYNA_HOME`` (SQLite registry, local files), what
  ``make demo`` and the tests use; a short landing batch is released after 30 s;
- ``production``: the registry in PostgreSQL, manifests and checkpoints in the object store, the
  page cache on the nodes' NVMe; a short landing batch waits up to an hour for more files. The
  settings come from the environment (secrets included, e.g. the password inside
  ``DYNA_REGISTRY_URL``), read through ``EnvVar`` at launch, and their presence is checked when
  the definitions load, so a missing one fails the deployment (and CI), not a run at 3 a.m.

This is the one module of the graph that reads the environment: every other setting a resource,
sensor or asset needs is resolved here and handed to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster import DefaultSensorStatus, EnvVar
from dagster_ray import Lifecycle

from dyna_resources.episodes.read_profiles import DEFAULT_READ_PROFILE
from dyna_resources.home import DEFAULT_ROOT
from dyna_resources.ingest.tick import LandingSettings
from dyna_resources.resources import (
    CacheResource,
    GatesResource,
    HomeResource,
    IngestResource,
    LadderResource,
    ReplicaResource,
    TrainerResource,
    TranscodeResource,
    WarehouseResource,
)
from dyna_resources.storage.alluxio import ENV_PREFIX as ALLUXIO_ENV_PREFIX

from .ray import EmbeddedRay

PRODUCTION_SETTINGS = {
    "DYNA_HOME": "a shared folder (ReadWriteMany volume): landing zone, MCAP episodes, curation specs",
    "DYNA_REGISTRY_URL": "the registry: postgresql+psycopg2://user:password@host/db",
    "DYNA_WAREHOUSE_PATH": "the DuckDB warehouse file (one writer: the duckdb pool)",
    "DYNA_MANIFEST_STORE": "where manifests go: gs://bucket/manifests",
    "DYNA_CACHE_DIR": "the node page cache on local NVMe",
    "DYNA_CHECKPOINT_STORE": "where checkpoints are uploaded: gs://bucket/checkpoints",
}
# Optional in both modes: DYNA_READ_PROFILE (the read profile, episodes/read_profiles.py; default t64).
# Optional in production: DYNA_LANDING_URL (gs:// or s3:// landing zone), DYNA_MCAP_STORE (where MCAPs are
# published), DYNA_SCRATCH_DIR (node-local scratch for staging and writing), DYNA_RAY_NAMESPACE / _WORKER_CPUS
# / _WORKER_MEMORY / _MAX_WORKERS (the KubeRay
# cluster of the ingest steps), DYNA_REPLICA_STORE + DYNA_S3_ENDPOINT_URL (second origin), DYNA_ORIGIN_ROUTES,
# DYNA_CACHE_CAPACITY_GB / _PAGE_MB / _TTL_S, DYNA_ALLUXIO_* (cluster cache), GOOGLE_APPLICATION_CREDENTIALS.


class MissingSettingsError(RuntimeError):
    def __init__(self, missing: list[str]):
        self.missing = missing
        lines = "\n".join(f"  {name}: {PRODUCTION_SETTINGS[name]}" for name in missing)
        super().__init__(f"DYNA_ENV=production needs {len(missing)} more setting(s) in the environment:\n{lines}")


def embedded_ray(environ: Mapping[str, str] | None = None) -> EmbeddedRay:
    """A local Ray cluster of this machine's cores for each step that fans out work units, or the
    cluster ``RAY_ADDRESS`` names (then Ray takes its size from that cluster)."""
    env = _environ(environ)
    options = {} if env.get("RAY_ADDRESS") else {"num_cpus": os.cpu_count() or 1, "include_dashboard": False}
    return EmbeddedRay(ray_init_options={**options, "log_to_driver": False}, lifecycle=Lifecycle(connect=False))


def production_ray(env: Mapping[str, str]):
    """One KubeRay cluster per ingest step (KubeRay >= 1.3), autoscaling its worker group from zero;
    the image is the run's own (``dagster/image``), which carries ray 2.60 and this project."""
    from dagster_ray.kuberay import KubeRayInteractiveJob, RayClusterSpec

    cpus, memory = env.get("DYNA_RAY_WORKER_CPUS", "16"), env.get("DYNA_RAY_WORKER_MEMORY", "64Gi")
    worker = {
        "groupName": "ingest",
        "replicas": 0,
        "minReplicas": 0,
        "maxReplicas": int(env.get("DYNA_RAY_MAX_WORKERS", "64")),
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "worker",
                        "resources": {
                            "requests": {"cpu": cpus, "memory": memory},
                            "limits": {"cpu": cpus, "memory": memory},
                        },
                    }
                ]
            }
        },
    }
    spec = RayClusterSpec(enable_in_tree_autoscaling=True, ray_version="2.60.0", worker_group_specs=[worker])
    return KubeRayInteractiveJob(
        ray_job={  # type: ignore[arg-type]  # pydantic validates the dict into InteractiveRayJobConfig
            "metadata": {"namespace": env.get("DYNA_RAY_NAMESPACE", "dyna")},
            "spec": {"ray_cluster_spec": spec.model_dump(), "active_deadline_seconds": 24 * 3600},
        },
        timeout=900.0,
        lifecycle=Lifecycle(connect=False),
    )


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _cache_settings(env: Mapping[str, str]) -> dict:
    """The page cache's optional settings (both modes): size, pages, TTL, other origins, Alluxio."""
    settings: dict = {
        "origin_routes": env.get("DYNA_ORIGIN_ROUTES", ""),
        "s3_endpoint_url": env.get("DYNA_S3_ENDPOINT_URL", ""),
        "alluxio": {k: v for k, v in env.items() if k.startswith(ALLUXIO_ENV_PREFIX)},
    }
    for field, name in (
        ("capacity_gb", "DYNA_CACHE_CAPACITY_GB"),
        ("page_mb", "DYNA_CACHE_PAGE_MB"),
        ("ttl_s", "DYNA_CACHE_TTL_S"),
    ):
        if env.get(name):
            settings[field] = float(env[name])
    return settings


def _read_profile(env: Mapping[str, str]) -> str:
    """The read profile (``DYNA_READ_PROFILE``, both modes): the one setting that says which training
    streams transcode writes, what prewarm warms and what the trainer reads."""
    return env.get("DYNA_READ_PROFILE") or DEFAULT_READ_PROFILE


def _trainer_settings(env: Mapping[str, str]) -> dict:
    return {"omp_num_threads": int(env["OMP_NUM_THREADS"])} if env.get("OMP_NUM_THREADS", "").isdigit() else {}


def embedded_resources(environ: Mapping[str, str] | None = None) -> dict:
    """Everything under ``$DYNA_HOME`` (default ``./.dyna``); ``DYNA_REGISTRY_URL`` and the optional
    settings above are honoured when set."""
    env = _environ(environ)
    home = HomeResource(
        root=env.get("DYNA_HOME") or DEFAULT_ROOT,
        manifest_store=env.get("DYNA_MANIFEST_STORE", ""),
        registry_url=env.get("DYNA_REGISTRY_URL", ""),
        model_store=env.get("DYNA_MODEL_STORE", ""),
        read_profile=_read_profile(env),
    )
    return {
        "home": home,
        "ingest": IngestResource(home=home),
        "gates": GatesResource(home=home),
        "transcode": TranscodeResource(),
        "warehouse": WarehouseResource(home=home, path=env.get("DYNA_WAREHOUSE_PATH", "")),
        "cache": CacheResource(home=home, root=env.get("DYNA_CACHE_DIR", ""), **_cache_settings(env)),
        "replica": ReplicaResource(
            home=home, target=env.get("DYNA_REPLICA_STORE", ""), endpoint_url=env.get("DYNA_S3_ENDPOINT_URL", "")
        ),
        "trainer": TrainerResource(
            anchors="every", checkpoint_store=env.get("DYNA_CHECKPOINT_STORE", ""), **_trainer_settings(env)
        ),
        "ladders": LadderResource(home=home),
        "ray": embedded_ray(env),
    }


def production_resources(environ: Mapping[str, str] | None = None) -> dict:
    env = _environ(environ)
    missing = [name for name in PRODUCTION_SETTINGS if not env.get(name)]
    if missing:
        raise MissingSettingsError(missing)
    home = HomeResource(
        root=EnvVar("DYNA_HOME"),
        manifest_store=EnvVar("DYNA_MANIFEST_STORE"),
        registry_url=EnvVar("DYNA_REGISTRY_URL"),
        model_store=env.get("DYNA_MODEL_STORE", ""),
        read_profile=_read_profile(env),
    )
    return {
        "home": home,
        # a fleet uploads all day: full batches, a short one only after an hour (the embedded default: 30 s)
        "ingest": IngestResource.with_landing(
            LandingSettings(),
            home=home,
            # no shared volume for ingest: the fleet's bucket in, MCAPs out
            landing_url=env.get("DYNA_LANDING_URL", ""),
            mcap_store=env.get("DYNA_MCAP_STORE", ""),
            endpoint_url=env.get("DYNA_S3_ENDPOINT_URL", ""),
            scratch_dir=env.get("DYNA_SCRATCH_DIR", ""),
        ),
        "gates": GatesResource(home=home),  # $DYNA_HOME/gates.yaml when present
        "transcode": TranscodeResource(),
        "warehouse": WarehouseResource(home=home, path=EnvVar("DYNA_WAREHOUSE_PATH")),
        "cache": CacheResource(home=home, root=EnvVar("DYNA_CACHE_DIR"), **_cache_settings(env)),
        "replica": ReplicaResource(
            home=home, target=env.get("DYNA_REPLICA_STORE", ""), endpoint_url=env.get("DYNA_S3_ENDPOINT_URL", "")
        ),
        "trainer": TrainerResource(checkpoint_store=EnvVar("DYNA_CHECKPOINT_STORE"), **_trainer_settings(env)),
        "ladders": LadderResource(home=home),  # $DYNA_HOME/step_ladders.yaml when present
        "ray": production_ray(env),  # the ingest assets' work units (DYNA_RAY_* size its worker group)
    }


def sensor_status(name: str, environ: Mapping[str, str] | None = None) -> DefaultSensorStatus:
    """Sensor ``name``'s default status: running, unless ``DYNA_SENSORS`` says otherwise: ``stopped``
    (every sensor: tests that drive Dagster by hand), or a comma-separated list of the sensors that start
    running (the rest stopped)."""
    value = _environ(environ).get("DYNA_SENSORS", "running").strip() or "running"
    if value in ("running", "stopped"):
        return DefaultSensorStatus.RUNNING if value == "running" else DefaultSensorStatus.STOPPED
    running = {n.strip() for n in value.split(",")}
    return DefaultSensorStatus.RUNNING if name in running else DefaultSensorStatus.STOPPED


def sensor_interval(every_s: int, environ: Mapping[str, str] | None = None) -> int:
    """A sensor's minimum interval: ``every_s``, or ``DYNA_SENSOR_INTERVAL_S`` when that is shorter (a
    small deployment, or a test of the deployment, whose sensors should follow each other faster than the
    production intervals allow)."""
    cap = _environ(environ).get("DYNA_SENSOR_INTERVAL_S", "")
    return min(every_s, max(1, int(cap))) if cap.isdigit() else every_s


# Every run a sensor launches carries this: a failed automatic run (a killed `dagster dev`, a node gone,
# a store that did not answer) is launched again once by the daemon (infra/dagster/dagster.yaml enables
# run retries; runs a person launches are not retried unless they say so), then left failed with its
# reason. The retry is a run of its own in the UI: "dagster/retry_number" 1, its parent the failed run.
AUTOMATIC_RUN_RETRIES = 1
AUTOMATIC_RUN_TAGS = {"dagster/max_retries": str(AUTOMATIC_RUN_RETRIES)}


def sensor_on(name: str, every_s: int, asset_selection: Any = None) -> dict[str, Any]:
    """What every sensor here declares to ``@sensor``: its name, what it requests, how often it is
    evaluated (:func:`sensor_interval`), and its default status (:func:`sensor_status`)."""
    declared: dict[str, Any] = {
        "name": name,
        "minimum_interval_seconds": sensor_interval(every_s),
        "default_status": sensor_status(name),
    }
    if asset_selection is not None:
        declared["asset_selection"] = asset_selection
    return declared


def resources(environ: Mapping[str, str] | None = None) -> dict:
    env = _environ(environ)
    mode = env.get("DYNA_ENV", "embedded") or "embedded"
    if mode == "embedded":
        return embedded_resources(env)
    if mode == "production":
        return production_resources(env)
    raise ValueError(f"DYNA_ENV={mode!r}: expected 'embedded' or 'production'")


def executor(environ: Mapping[str, str] | None = None):
    """Production runs each step in its own pod (sized by the asset's dagster-k8s/config tags)."""
    env = _environ(environ)
    if env.get("DYNA_ENV") == "production":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return None
