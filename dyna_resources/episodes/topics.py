"""Names shared by the MCAP writer and reader: topics, schemas, metadata records."""

CAMERA_PREFIX = "/camera/"
VIDEO_SCHEMA = "foxglove.CompressedVideo"
# Depth: lossless 16-bit frames (millimetres), one topic a depth stream, beside the cameras' video.
DEPTH_PREFIX = "/depth/"
DEPTH_SCHEMA = "foxglove.RawImage"
DEPTH_ENCODING = "16UC1"  # little-endian uint16, rows 2 * width bytes apart
EPISODE_METADATA = "dyna.episode"  # versions, provenance, encoder settings (written first)
STATS_METADATA = "dyna.stats"  # per-stream counts and quality figures (written last)


def camera_topic(camera: str) -> str:
    return f"{CAMERA_PREFIX}{camera}"


def depth_topic(name: str) -> str:
    return f"{DEPTH_PREFIX}{name}"


def is_depth_topic(topic: str) -> bool:
    return topic.startswith(DEPTH_PREFIX)


def stream_topic(stream: str) -> str:
    return f"/{stream}"


def is_camera_topic(topic: str) -> bool:
    return topic.startswith(CAMERA_PREFIX)


# Training streams: derived copies of a camera at a training resolution and GOP, each in its own chunk
# group (see training_streams.py). Not cameras and not streams to the reader: it lists them apart.
TRAINING_CAMERA_PREFIX = "/training/"
ARCHIVE_STREAM = "archive"  # the name under which a reader selects the archive camera topic


def training_camera_topic(name: str, camera: str) -> str:
    return f"{TRAINING_CAMERA_PREFIX}{name}{CAMERA_PREFIX}{camera}"


def parse_training_camera_topic(topic: str) -> tuple[str, str]:
    """(training stream name, camera) of a training camera topic; ValueError for any other topic."""
    name, sep, camera = topic.removeprefix(TRAINING_CAMERA_PREFIX).partition(CAMERA_PREFIX)
    if not topic.startswith(TRAINING_CAMERA_PREFIX) or not sep or not name or "/" in name or not camera:
        raise ValueError(f"not a training camera topic: {topic!r}")
    return name, camera


def is_training_camera_topic(topic: str) -> bool:
    try:
        parse_training_camera_topic(topic)
    except ValueError:
        return False
    return True
