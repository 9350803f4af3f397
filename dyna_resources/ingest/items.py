"""Landed items and their keys: a raw file (the legacy HDF5), or a directory that lands whole (a ROS 2
bag, a LeRobot dataset), and the episodes an item holds.

A directory item is keyed by its marker file, the one its writer finishes with: ``<bag>/metadata.yaml``
(rosbag2 writes it when the bag closes) or ``<dataset>/meta/info.json``. The key sorts where the
directory's files do, so the landing zone's key-ordered, cursor-resumed listing is unchanged, and it reads
the same on a local zone and on an object store. The item's size is all its files' (what byte-balanced
packing weighs), its time their latest.

An item holding one episode registers it under the item's key. One holding several (a bag split by the
topic map's rule, a LeRobot dataset) registers each under a *member path*, ``<key>#<episode_id>``: every
registry table keyed by source path (episodes, gate results, quarantine) then holds one row an episode,
and a worker told a member path opens the item and takes that episode. ``#`` is therefore refused in
landing keys (the object-store zones refuse it already, ``storage.stores.check_key``).

Plain Python, no Dagster import.
"""

from __future__ import annotations

import posixpath

import yaml

BAG_MARKER = "metadata.yaml"
LEROBOT_MARKER = "meta/info.json"
ITEM_MARKERS = (BAG_MARKER, LEROBOT_MARKER)
MEMBER_SEP = "#"


def item_root(key: str) -> str | None:
    """The key of the directory a directory item's ``key`` names (``None``: a file item)."""
    for marker in ITEM_MARKERS:
        if key.endswith("/" + marker):
            return key[: -len(marker) - 1]
    return None


def is_landed_key(key: str, suffixes: tuple[str, ...]) -> bool:
    """Whether a listing reports ``key``: a raw file by its suffix, or a directory item's marker."""
    return key.endswith(suffixes) or item_root(key) is not None


def member_path(key: str, episode_id: str) -> str:
    return f"{key}{MEMBER_SEP}{episode_id}"


def split_member(source_path: str) -> tuple[str, str | None]:
    """(the landed item's key, the episode id within it, ``None`` when the item is the episode)."""
    key, sep, member = source_path.partition(MEMBER_SEP)
    return key, (member if sep else None)


def bag_files_missing(metadata_text: str, present: set[str]) -> list[str]:
    """The storage files a bag's ``metadata.yaml`` lists that are not in ``present`` (paths relative to the
    bag): an object-store upload still under way. An unparsable ``metadata.yaml`` lists none: the item is
    whole as far as landing can tell, and its inventory says what is wrong with it."""
    try:
        doc = yaml.safe_load(metadata_text) or {}
        info = doc.get("rosbag2_bagfile_information") or {}
        listed = [str(p) for p in info.get("relative_file_paths") or []]
    except (yaml.YAMLError, AttributeError, TypeError):
        return []
    return [p for p in listed if posixpath.normpath(p) not in present]


__all__ = [
    "BAG_MARKER",
    "ITEM_MARKERS",
    "LEROBOT_MARKER",
    "MEMBER_SEP",
    "bag_files_missing",
    "is_landed_key",
    "item_root",
    "member_path",
    "split_member",
]
