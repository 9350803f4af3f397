"""What a landed item is, by its content, never by its suffix alone.

- a file that starts with the HDF5 signature (at offset 0, or after a user block of 512 * 2^k bytes):
  ``"hdf5"``, the legacy episode;
- a ROS 2 bag directory: ``metadata.yaml`` beside its storage files (MCAP or SQLite 3). rosbag2 writes
  ``metadata.yaml`` last, so a directory of storage files without it is a bag still being recorded:
  :class:`BagNotReadyError`, never ingested as it stands;
- a LeRobot dataset directory: ``meta/info.json`` (format v2.1 or v3.0, its ``codebase_version``);
- anything else: :class:`UnknownFormatError`, naming the item and what was expected.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from ..episodes.errors import RawFormatError

SourceFormat = Literal["hdf5", "ros2", "lerobot"]
FORMATS: tuple[SourceFormat, ...] = ("hdf5", "ros2", "lerobot")

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
MCAP_MAGIC = b"\x89MCAP0\r\n"
SQLITE_MAGIC = b"SQLite format 3\x00"
BAG_METADATA = "metadata.yaml"
LEROBOT_INFO = "meta/info.json"
_USER_BLOCKS = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)  # where HDF5 looks for its signature
EXPECTED = (
    "a legacy HDF5 episode (the HDF5 signature), a ROS 2 bag directory (metadata.yaml beside .mcap or "
    ".db3 files) or a LeRobot dataset directory (meta/info.json)"
)


class UnknownFormatError(RawFormatError):
    """The item is none of the formats the platform ingests."""

    kind = "unknown_format"


class BagNotReadyError(RawFormatError):
    """A ROS 2 bag directory without its ``metadata.yaml``: still being recorded (or its recorder died)."""

    kind = "bag_not_ready"


def _head(path: Path, n: int, at: int = 0) -> bytes:
    with open(path, "rb") as f:
        f.seek(at)
        return f.read(n)


def is_hdf5(path: str | Path) -> bool:
    path = Path(path)
    size = path.stat().st_size
    return any(at + 8 <= size and _head(path, 8, at) == HDF5_SIGNATURE for at in _USER_BLOCKS)


def bag_storage(path: Path) -> list[Path]:
    """The storage files of a bag directory (MCAP or SQLite 3, by their magic)."""
    out = []
    for p in sorted(path.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            head = _head(p, 16)
            if head.startswith(MCAP_MAGIC) or head == SQLITE_MAGIC:
                out.append(p)
    return out


def detect(path: str | Path) -> SourceFormat:
    """The format of the landed item at ``path`` (a file or a directory).

    :raises UnknownFormatError: none of :data:`FORMATS`.
    :raises BagNotReadyError: a bag directory whose ``metadata.yaml`` is not there yet.
    """
    path = Path(path)
    if path.is_dir():
        if (path / BAG_METADATA).is_file():
            return "ros2"
        info = path / LEROBOT_INFO
        if info.is_file():
            try:
                json.loads(info.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                raise UnknownFormatError(str(info), f"a LeRobot meta/info.json that is not JSON: {e}") from None
            return "lerobot"
        if bag_storage(path):
            raise BagNotReadyError(
                str(path), f"bag storage files but no {BAG_METADATA} yet (rosbag2 writes it last: still recording?)"
            )
        raise UnknownFormatError(str(path), f"a directory that is not a bag or dataset; expected {EXPECTED}")
    if not path.is_file():
        raise UnknownFormatError(str(path), "not a file or directory")
    if is_hdf5(path):
        return "hdf5"
    head = _head(path, 16)
    if head.startswith(MCAP_MAGIC) or head == SQLITE_MAGIC:
        raise UnknownFormatError(
            str(path), f"a bag storage file on its own: a ROS 2 bag lands as its directory, with {BAG_METADATA}"
        )
    raise UnknownFormatError(str(path), f"unrecognised content (first bytes {head[:8]!r}); expected {EXPECTED}")


__all__ = ["BagNotReadyError", "FORMATS", "SourceFormat", "UnknownFormatError", "bag_storage", "detect", "is_hdf5"]
