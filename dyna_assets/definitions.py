from dagster import Definitions

from dyna_resources.faces import GatesResource, HomeResource, IngestResource, TranscodeResource, WarehouseResource

from .curation.assets import manifests
from .curation.sensors import curation_spec_sensor
from .ingest.assets import mcap_episodes, raw_episodes
from .ingest.sensors import landing_sensor, version_drift_sensor
from .warehouse.assets import warehouse_episodes
from .warehouse.sensors import warehouse_sync_sensor

defs = Definitions(
    assets=[raw_episodes, mcap_episodes, warehouse_episodes, manifests],
    sensors=[landing_sensor, version_drift_sensor, warehouse_sync_sensor, curation_spec_sensor],
    resources={"home": HomeResource(), "ingest": IngestResource(), "gates": GatesResource(),
               "transcode": TranscodeResource(), "warehouse": WarehouseResource()},
)
