from dagster import Definitions

from dyna_resources.faces import (CacheResource, GatesResource, HomeResource, IngestResource, ReplicaResource,
                                  TrainerResource, TranscodeResource, WarehouseResource)

from .cache.assets import cache_sets, mcap_replica
from .cache.sensors import manifest_prewarm_sensor
from .curation.assets import manifests
from .curation.sensors import curation_spec_sensor
from .ingest.assets import mcap_episodes, raw_episodes
from .training.assets import checkpoints
from .ingest.sensors import landing_sensor, version_drift_sensor
from .warehouse.assets import warehouse_episodes
from .warehouse.sensors import warehouse_sync_sensor

defs = Definitions(
    assets=[raw_episodes, mcap_episodes, warehouse_episodes, manifests, cache_sets, mcap_replica, checkpoints],
    sensors=[landing_sensor, version_drift_sensor, warehouse_sync_sensor, curation_spec_sensor,
             manifest_prewarm_sensor],
    resources={"home": HomeResource(), "ingest": IngestResource(), "gates": GatesResource(),
               "transcode": TranscodeResource(), "warehouse": WarehouseResource(), "cache": CacheResource(),
               "replica": ReplicaResource(), "trainer": TrainerResource()},
)
