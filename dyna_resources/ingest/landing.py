"""The landing zone: where raw episodes arrive, listed incrementally in key order.

Keys are paths relative to the landing root with ``/`` separators, and a listing returns
them in byte order, like an object store's (GCS ``startOffset``, S3 ``StartAfter``). A
scan starts after a cursor key and never descends into a directory whose whole subtree
sorts before it, so a tick costs what is new, not the size of the zone. Uploaders name
files so that new ones sort last (time-prefixed folders or names) and write them under a
hidden temporary name, then rename: hidden files and other suffixes are never listed.

An uploader that writes under the final name (rsync --inplace, an NFS copy, a recorder writing
in place) is safe too: on a local or NFS zone the landing tick lands a file only once its size
and mtime stood still across two listings ``settle_s`` apart (``tick.py``), or at once when the
uploader has written its completion marker, an empty ``<key>.complete`` beside it.
A file that lands out of order (behind the cursor) is found by the periodic full
reconciliation scan (``after=None``); the registry ignores files it already knows.

A directory that lands whole (a ROS 2 bag, a LeRobot dataset: ``items.py``) is listed as one item keyed by
its marker file, sized by all its files, and never descended into. A bag directory without its
``metadata.yaml`` is not listed at all: rosbag2 writes it last, so that is a bag still being recorded.
A bag's marker says it is whole (``complete``) once every storage file it names is there; a dataset's
settles like a file (its size and latest mtime stand still), or lands at once with ``info.json.complete``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..catalog.registry import LandedFile
from ..storage.stores import StoreUnavailableError  # the landing store cannot be listed or read: the run or tick fails
from .items import BAG_MARKER, ITEM_MARKERS, MEMBER_SEP, bag_files_missing, item_root

RAW_SUFFIXES = (".h5", ".hdf5")
COMPLETION_MARKER = ".complete"  # "<key>.complete": the uploader says the file is whole


class LandingZone:
    # Files here may be listed while still being written under their final names: the landing tick
    # waits for them to settle (an object store's listing shows only whole objects).
    settles = True

    def __init__(self, root: str | Path, suffixes: tuple[str, ...] = RAW_SUFFIXES):
        self.root = Path(root)
        self.suffixes = suffixes

    def resolve(self, key: str) -> Path:
        """Absolute path of a key; a key that would escape the root (``..``, absolute) is refused."""
        parts = key.split("/")
        if any(part in ("", ".", "..") for part in parts) or "\\" in key or "\0" in key:
            raise ValueError(f"landing key {key!r} escapes the landing root")
        if MEMBER_SEP in key:
            raise ValueError(f"landing key {key!r} holds {MEMBER_SEP!r}, which separates an item from its episodes")
        return self.root.joinpath(*parts)

    def local_item(self, key: str) -> Path:
        """The file, or the directory of a directory item, that ``key`` names."""
        root = item_root(key)
        return self.resolve(key) if root is None else self.resolve(root)

    def stat(self, key: str) -> LandedFile | None:
        """The item at ``key`` as a listing would return it, or ``None`` if it is gone."""
        try:
            st = self.resolve(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if item_root(key) is None:
            return LandedFile(key, st.st_size, st.st_mtime_ns)
        size, mtime_ns = _tree_size(self.local_item(key))
        return LandedFile(key, size, mtime_ns)

    def complete(self, key: str) -> bool:
        """Whether the item is known whole: the uploader's ``<key>.complete`` beside it, or a bag whose
        ``metadata.yaml`` names only storage files that are there."""
        if self.resolve(key + COMPLETION_MARKER).is_file():
            return True
        if not key.endswith("/" + BAG_MARKER):
            return False
        folder = self.local_item(key)
        try:
            text = (folder / BAG_MARKER).read_text()
        except (OSError, UnicodeDecodeError):
            return False
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        return not bag_files_missing(text, present)

    def check(self) -> None:
        if not self.root.is_dir() or not os.access(self.root, os.R_OK | os.X_OK):
            raise StoreUnavailableError(str(self.root), "landing zone missing or unreadable")

    def scan(self, after: str | None = None, limit: int | None = None) -> list[LandedFile]:
        """Raw files whose key sorts after ``after``, in key order, at most ``limit`` of them."""
        self.check()
        out: list[LandedFile] = []
        self._walk(self.root, "", after, limit, out)
        return out

    def _walk(self, folder: Path, prefix: str, after: str | None, limit: int | None, out: list[LandedFile]) -> bool:
        try:
            with os.scandir(folder) as it:
                entries = [entry for entry in it if not entry.name.startswith(".")]
        except FileNotFoundError:
            return True  # vanished between listing its parent and opening it
        except PermissionError as e:
            raise StoreUnavailableError(str(folder), f"cannot list: {e.strerror}") from None
        # A folder's keys are "<name>/...": sort it as "<name>/" so the order is the keys' byte order.
        keyed = sorted(
            ((prefix + entry.name + "/" if entry.is_dir(follow_symlinks=False) else prefix + entry.name), entry)
            for entry in entries
        )
        for key, entry in keyed:
            if MEMBER_SEP in key:
                continue  # not a key this zone can name (items.py)
            if key.endswith("/"):
                # every key below sorts in [key, key[:-1] + "0"): skip the subtree if it all lies before the cursor
                if after is not None and key[:-1] + "0" <= after:
                    continue
                marker = next((m for m in ITEM_MARKERS if os.path.isfile(os.path.join(entry.path, m))), None)
                if marker is not None:  # a directory landing whole: one item, never descended into
                    if after is None or key + marker > after:
                        size, mtime_ns = _tree_size(Path(entry.path))
                        out.append(LandedFile(key + marker, size, mtime_ns))
                        if limit is not None and len(out) >= limit:
                            return False
                    continue
                if not self._walk(Path(entry.path), key, after, limit, out):
                    return False
            elif (
                entry.is_file(follow_symlinks=False) and key.endswith(self.suffixes) and (after is None or key > after)
            ):
                st = entry.stat(follow_symlinks=False)
                out.append(LandedFile(key, st.st_size, st.st_mtime_ns))
                if limit is not None and len(out) >= limit:
                    return False
        return True


def _tree_size(folder: Path) -> tuple[int, int]:
    """(bytes, latest mtime_ns) of a directory item's regular non-hidden files."""
    size = mtime_ns = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            size, mtime_ns = size + st.st_size, max(mtime_ns, st.st_mtime_ns)
    return size, mtime_ns
