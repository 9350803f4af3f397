"""Where an ingest worker reads a raw episode and where it puts the MCAP: local folders (the
embedded default) or object stores (production, with no shared volume).

- Raw files: a local landing zone is read in place; from ``gs://`` / ``s3://`` each file is
  staged to local scratch (ranged reads pinned to the version listed, temp name then rename:
  HDF5 wants a seekable local file) and the copy is removed when the episode is done.
- MCAPs: the transcoder always writes a local file under a temporary name and renames it when
  complete. Locally that file is the MCAP. With an MCAP store it is published with a
  precondition (``"absent"`` for a first write, the version the registry recorded for a
  rewrite), so no partial object is ever visible at the final key and a newer object written by
  someone else is never silently overwritten; then the local copy goes. An object already there
  with exactly the bytes this attempt wrote (a worker killed after publishing, before its outcome
  was recorded: the transcode is deterministic) is adopted, its content hash checked.
- Held-back MCAPs go to ``quarantine/`` under the same store (a local folder embedded).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..episodes.raw_format import file_sha256
from ..storage.publish import PreconditionFailed, move_to_quarantine, publish_file
from ..storage.stores import Store, local_version
from .items import item_root
from .landing import LandingZone
from .object_landing import ObjectLandingZone

QUARANTINE_PREFIX = "quarantine"


@dataclass(frozen=True)
class Published:
    """Where an MCAP now lives: what the registry records."""

    path: str  # a local path, or the store URL (nothing local is left)
    uri: str  # fsspec URL: what manifests and the cache read
    version: str  # the object's version token (local: size and mtime), the precondition of the next rewrite


@dataclass(frozen=True)
class RawSource:
    """A landing zone, by its root (a folder or a ``gs://`` / ``s3://`` URL), and the local scratch
    folder its objects are staged in. It carries no live client: gcsfs and s3fs clients must not
    cross a fork, so each process builds its own (fsspec keeps one per process)."""

    root: str
    scratch: str
    endpoint_url: str | None = None

    @classmethod
    def of(cls, landing: LandingZone | ObjectLandingZone, scratch: str) -> RawSource:
        if isinstance(landing, LandingZone):
            return cls(str(landing.root), scratch)
        return cls(landing.root, scratch, landing.store.endpoint_url)

    def zone(self) -> LandingZone | ObjectLandingZone:
        if "://" not in self.root:
            return LandingZone(self.root)
        return ObjectLandingZone(self.root, endpoint_url=self.endpoint_url)

    @contextmanager
    def local(self, key: str, size: int | None = None, log_window: tuple[int, int] | None = None) -> Iterator[Path]:
        """A local path to the item at ``key`` for the block: the raw file, or a directory item's folder
        (``items.py``); ``FileNotFoundError`` if it is gone. ``size``: the registered bytes, checked when
        staging from an object store. ``log_window``: only one episode of a long bag is read, by its
        log-time window: from an object store its MCAP files are staged as sparse copies of what that
        window needs (``ObjectLandingZone.stage_window``); a local zone is read in place either way."""
        zone = self.zone()
        directory = item_root(key) is not None
        if isinstance(zone, LandingZone):
            path = zone.local_item(key)
            if not (zone.resolve(key).is_file() and (path.is_dir() if directory else path.is_file())):
                raise FileNotFoundError(f"{key}: vanished from the landing zone")
            yield path
            return
        if not directory:
            staged = zone.stage(key, self.scratch, expect_size=size)
            try:
                yield staged
            finally:
                staged.unlink(missing_ok=True)
            return
        folder = zone.stage_item(key, self.scratch, expect_size=size, log_window=log_window)
        try:
            yield folder
        finally:
            shutil.rmtree(self._staged_top(folder), ignore_errors=True)

    @contextmanager
    def staged_once(self, keys: Iterable[str]) -> Iterator[dict[str, Path]]:
        """The directory items at ``keys`` whose episodes several workers read (a long bag cut into
        episodes), staged once for all of them where a worker could not stage only its episode's window
        (a SQLite 3 bag in an object store: K episodes would stage the bag K times), and removed after the
        block: ``{key: local folder}``. A local zone's items, MCAP bags (each worker stages its window)
        and an item that fails to stage here (its workers stage it and report why) are left out."""
        zone = self.zone()
        staged: dict[str, Path] = {}
        try:
            if isinstance(zone, ObjectLandingZone):
                for key in keys:
                    try:
                        if not zone.windowable(key):
                            staged[key] = zone.stage_item(key, self.scratch)
                    except Exception:  # each worker then stages the item itself, and reports the fault
                        continue
            yield staged
        finally:
            for folder in staged.values():
                shutil.rmtree(self._staged_top(folder), ignore_errors=True)

    def _staged_top(self, folder: Path) -> Path:
        """The folder below the scratch directory that :meth:`ObjectLandingZone.stage_item` made for ``folder``."""
        return Path(self.scratch) / folder.relative_to(self.scratch).parts[0]


@dataclass(frozen=True)
class McapSink:
    """Where MCAPs go: ``folder`` (embedded: the MCAPs themselves; with ``store``: where they are
    written before being published) and held-back ones to ``quarantine_folder`` / the store's
    ``quarantine/``."""

    folder: str
    quarantine_folder: str
    store: str | None = None  # gs://bucket/mcap, s3://bucket/mcap
    endpoint_url: str | None = None

    def _store(self) -> Store:
        assert self.store is not None
        return Store.from_url(self.store, endpoint_url=self.endpoint_url)

    def work_path(self, episode_id: str) -> Path:
        """The local file the transcoder writes for an episode, named like every temporary output (its
        writer's pid inside, see batches.remove_orphan_temps): nothing is at the episode's key until
        :meth:`publish`, which is the last thing an attempt does."""
        return Path(self.folder) / f".{episode_id}.mcap.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"

    def final_path(self, episode_id: str) -> Path:
        """Where a local store keeps the episode's MCAP."""
        return Path(self.folder) / f"{episode_id}.mcap"

    def publish(self, episode_id: str, local: Path, expect: str | None) -> Published:
        """Make the finished local MCAP the episode's MCAP. ``expect``: the version this write replaces
        (``None``: there must be none). :raises PreconditionFailed: another object is there now."""
        if self.store is None:
            final = self.final_path(episode_id)
            os.replace(local, final)
            return Published(str(final), final.resolve().as_uri(), local_version(final.stat()))
        store = self._store()
        key = f"{episode_id}.mcap"
        info = publish_file(store, local, key, expect=expect or "absent")
        local.unlink(missing_ok=True)
        return Published(store.url(key), store.url(key), info.version)

    def adopt(self, episode_id: str, local: Path) -> Published | None:
        """The episode's published MCAP, if its bytes are exactly ``local``'s (same size, same SHA-256):
        what a killed attempt published before its outcome was recorded. ``None`` otherwise (another
        object, or none); ``local`` goes when adopted."""
        if self.store is None:
            return None
        store, key = self._store(), f"{episode_id}.mcap"
        try:
            info = store.info(key)
        except FileNotFoundError:
            return None
        if info.size != local.stat().st_size:
            return None
        theirs = hashlib.sha256()
        with store.open(key, "rb") as f:
            for block in iter(lambda: f.read(8 << 20), b""):
                theirs.update(block)
        if theirs.hexdigest() != file_sha256(local) or store.info(key).version != info.version:
            return None
        local.unlink(missing_ok=True)
        return Published(store.url(key), store.url(key), info.version)

    def exists(self, path: str | None) -> bool:
        """Whether an MCAP the registry points at is still there."""
        if not path:
            return False
        if self.store is None or "://" not in path:
            return Path(path).is_file()
        try:
            self._store().info(path.removeprefix(self._store().root).lstrip("/"))
        except FileNotFoundError:
            return False
        return True

    def hold(self, episode_id: str, local: Path | None = None) -> str | None:
        """Hold an episode's MCAP back: the local copy if there is one, else one already published.
        Returns where it went, or ``None`` if there was nothing to hold."""
        if self.store is None:
            dst = local or self.final_path(episode_id)
            if not dst.is_file():
                return None
            held = Path(self.quarantine_folder) / f"{episode_id}.mcap"
            held.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(dst, held)
            return str(held)
        store, key = self._store(), f"{episode_id}.mcap"
        if local is not None and local.is_file():
            publish_file(store, local, f"{QUARANTINE_PREFIX}/{key}")  # a held copy may be replaced
            local.unlink(missing_ok=True)
            return store.url(f"{QUARANTINE_PREFIX}/{key}")
        try:
            return store.url(move_to_quarantine(store, key, QUARANTINE_PREFIX).key)
        except FileNotFoundError:
            return None


__all__ = ["McapSink", "PreconditionFailed", "Published", "RawSource"]
