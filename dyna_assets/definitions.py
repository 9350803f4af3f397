from dagster import Definitions

from .cache.assets import cache_sets, mcap_replica
from .cache.sensors import manifest_prewarm_sensor
from .curation.assets import manifests
from .curation.sensors import curation_spec_sensor
from .datasets.assets import datasets
from .deployment import executor, resources
from .ingest.assets import mcap_episodes, raw_episodes
from .ingest.ladders import step_ladders
from .ingest.presence import mcaps_present
from .ingest.sensors import landing_sensor, version_drift_sensor
from .ingest.staleness import report_version_checks, version_check_sensor, versions_current
from .ingest.training_streams import training_streams
from .training.assets import checkpoints
from .training.evaluations import evaluations, released_models
from .warehouse.assets import warehouse_episodes
from .warehouse.review import review_pool
from .warehouse.sensors import warehouse_sync_sensor


def build_definitions(environ=None) -> Definitions:
    """The project's graph with the resources of the deployment ``environ`` (default: this process's
    environment) names: what the webserver and the daemon load."""
    return Definitions(
        assets=[
            raw_episodes,
            mcap_episodes,
            training_streams,
            step_ladders,
            warehouse_episodes,
            manifests,
            datasets,
            cache_sets,
            mcap_replica,
            checkpoints,
            evaluations,
            released_models,
            review_pool,
        ],
        asset_checks=[mcaps_present, versions_current],
        jobs=[report_version_checks],
        sensors=[
            landing_sensor,
            version_drift_sensor,
            version_check_sensor,
            warehouse_sync_sensor,
            curation_spec_sensor,
            manifest_prewarm_sensor,
        ],
        resources=resources(environ),  # embedded defaults, or production by DYNA_ENV (dyna_assets/deployment.py)
        executor=executor(environ),  # production: one Kubernetes pod per step
    )


defs = build_definitions()
