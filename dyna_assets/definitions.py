from dagster import Definitions

from dyna_resources.faces import HomeResource, TranscodeResource

from .assets import mcap_episodes, raw_episodes

defs = Definitions(
    assets=[raw_episodes, mcap_episodes],
    resources={"home": HomeResource(), "transcode": TranscodeResource()},
)
