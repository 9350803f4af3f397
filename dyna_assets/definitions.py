from dagster import Definitions

from dyna_resources.faces import GatesResource, IngestResource, TranscodeResource

from .ingest.assets import mcap_episodes, raw_episodes
from .ingest.sensors import landing_sensor, version_drift_sensor

defs = Definitions(
    assets=[raw_episodes, mcap_episodes],
    sensors=[landing_sensor, version_drift_sensor],
    resources={"ingest": IngestResource(), "gates": GatesResource(), "transcode": TranscodeResource()},
)
