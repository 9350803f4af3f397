"""A landed item's bytes and content hash, whether it is one file (the legacy HDF5) or a directory (a ROS 2
bag: its metadata.yaml and storage files).

Plain Python, no Dagster import.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..episodes.raw_format import file_sha256


def item_files(path: Path) -> list[Path]:
    """The regular, non-hidden files of a directory item, sorted by relative path."""
    return sorted(
        (
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )


def content_bytes(path: str | Path) -> int:
    path = Path(path)
    return sum(p.stat().st_size for p in item_files(path)) if path.is_dir() else path.stat().st_size


def content_sha256(path: str | Path, block: int = 1 << 20) -> str:
    """A file's SHA-256; a directory's: over each file's relative path, size and bytes, in path order."""
    path = Path(path)
    if not path.is_dir():
        return file_sha256(path, block)
    h = hashlib.sha256()
    for p in item_files(path):
        h.update(f"{p.relative_to(path).as_posix()}\0{p.stat().st_size}\0".encode())
        with open(p, "rb") as f:
            while chunk := f.read(block):
                h.update(chunk)
    return h.hexdigest()


__all__ = ["content_bytes", "content_sha256", "item_files"]
