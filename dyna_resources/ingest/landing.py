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
"""

from __future__ import annotations

import os
from pathlib import Path

from ..catalog.registry import LandedFile
from ..storage.stores import StoreUnavailableError  # the landing store cannot be listed or read: the run or tick fails

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
        return self.root.joinpath(*parts)

    def stat(self, key: str) -> LandedFile | None:
        """The file at ``key`` as a listing would return it, or ``None`` if it is gone."""
        try:
            st = self.resolve(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return LandedFile(key, st.st_size, st.st_mtime_ns)

    def complete(self, key: str) -> bool:
        """Whether the uploader marked the file whole (``<key>.complete`` beside it)."""
        return self.resolve(key + COMPLETION_MARKER).is_file()

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
            if key.endswith("/"):
                # every key below sorts in [key, key[:-1] + "0"): skip the subtree if it all lies before the cursor
                if after is not None and key[:-1] + "0" <= after:
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
