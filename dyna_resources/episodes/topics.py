"""Names shared by the MCAP writer and reader: topics, schemas, metadata records."""

CAMERA_PREFIX = "/camera/"
VIDEO_SCHEMA = "foxglove.CompressedVideo"
EPISODE_METADATA = "dyna.episode"  # versions, provenance, encoder settings (written first)
STATS_METADATA = "dyna.stats"  # per-stream counts and quality figures (written last)


def camera_topic(camera: str) -> str:
    return f"{CAMERA_PREFIX}{camera}"


def stream_topic(stream: str) -> str:
    return f"/{stream}"


def is_camera_topic(topic: str) -> bool:
    return topic.startswith(CAMERA_PREFIX)
