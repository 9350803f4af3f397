"""Open a landed item as its episodes, whatever its format (``detect``): the legacy HDF5 is one
``RawEpisode``; a ROS 2 bag one ``MemoryEpisode`` or several (the topic map's split rule).

Plain Python, no Dagster import.
"""

from __future__ import annotations

from pathlib import Path

from ..episodes.errors import RawFormatError
from ..episodes.raw_format import RawEpisode
from . import topic_map
from .detect import SourceFormat, detect
from .memory import MemoryEpisode
from .ros2 import read_bag


def open_episodes(
    path: str | Path, home: str | Path | None = None
) -> tuple[SourceFormat, list[RawEpisode | MemoryEpisode]]:
    """(the format, the item's episodes). ``home``: where ``ros2_topics.yaml`` is (else the embedded map).

    :raises EpisodeError: the item cannot be read (naming it, and the stream at fault).
    """
    fmt = detect(path)
    if fmt == "hdf5":
        return fmt, [RawEpisode(path)]
    if fmt == "ros2":
        return fmt, list(read_bag(path, topic_map.load(Path(home) if home is not None else None)))
    raise RawFormatError(
        str(path), "a LeRobot dataset: not an ingest source yet (episodes.lerobot.import_lerobot converts one to HDF5)"
    )


__all__ = ["open_episodes"]
