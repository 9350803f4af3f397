"""Open a landed item as its episodes, whatever its format (``detect``): the legacy HDF5 is one
``RawEpisode``; a ROS 2 bag one ``MemoryEpisode`` or several (the topic map's split rule); a LeRobot
dataset one an episode of it.

Plain Python, no Dagster import.
"""

from __future__ import annotations

from pathlib import Path

from ..episodes.raw_format import RawEpisode
from . import topic_map
from .detect import SourceFormat, detect
from .memory import MemoryEpisode
from .ros2 import read_bag
from .topic_map import DEFAULT, TopicMap


def open_format(path: str | Path, fmt: SourceFormat, topics: TopicMap = DEFAULT) -> list[MemoryEpisode]:
    """The episodes of an item of a format other than the legacy HDF5 (which ``RawEpisode`` opens).

    :raises EpisodeError: the item cannot be read (naming it, and the stream at fault).
    """
    if fmt == "ros2":
        return list(read_bag(path, topics))
    if fmt == "lerobot":
        from .lerobot import read_lerobot_dataset

        return list(read_lerobot_dataset(path))
    raise ValueError(f"open_format: {fmt!r} is opened by RawEpisode")


def open_episodes(
    path: str | Path, home: str | Path | None = None
) -> tuple[SourceFormat, list[RawEpisode | MemoryEpisode]]:
    """(the format, the item's episodes). ``home``: where ``ros2_topics.yaml`` is (else the embedded map).

    :raises EpisodeError: the item cannot be read (naming it, and the stream at fault).
    """
    fmt = detect(path)
    if fmt == "hdf5":
        return fmt, [RawEpisode(path)]
    return fmt, list(open_format(path, fmt, topic_map.load(Path(home) if home is not None else None)))


__all__ = ["open_episodes", "open_format"]
