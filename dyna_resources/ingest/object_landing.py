"""The landing zone on object storage (``gs://bucket/prefix``, ``s3://bucket/prefix``).

The same interface as the local ``LandingZone`` (``scan``, ``check``, ``resolve``), on the stores'
own key-ordered listing: a scan starts at the cursor with GCS ``startOffset`` / S3 ``StartAfter``,
so a tick costs what is new, not the size of the zone, and pages until ``limit`` raw files are found.
The filters are the local zone's: only ``RAW_SUFFIXES``, nothing with a hidden path component
(uploaders' temporary names), and no key that ``check_key`` refuses (``..``, absolute, backslash,
NUL, ``?``/``#``): those are skipped with a warning, since an object store accepts any name.

``stage`` copies a raw object to local scratch for the transcoder (which needs a file path): ranged
reads pinned to the object version seen first (GCS ``generation``, S3 ``If-Match`` on the ETag), so
an object rewritten mid-copy fails the copy instead of mixing two versions; a temp name in the
scratch folder is renamed onto the result only once every byte arrived.

A directory landing whole (a ROS 2 bag, a LeRobot dataset: ``items.py``) is one item keyed by its
marker object, sized by every object under its prefix (one more listing of that prefix) and staged whole
by ``stage``. Uploads do not arrive in order, so a bag's item is whole (``complete``) only once every
storage file its ``metadata.yaml`` names is there; until then, and for a dataset without its
``info.json.complete``, it settles like a file on a local zone (the tick waits for its size to stand still).

``landing_zone(url_or_path)`` picks the local zone for paths and ``file://``, this one otherwise.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ..catalog.registry import LandedFile
from ..sources.mcap_window import window_ranges
from ..storage.publish import PreconditionFailed
from ..storage.stores import ObjectInfo, Store, StoreKeyError, StoreUnavailableError, check_key
from .items import BAG_MARKER, bag_files_missing, is_landed_key, item_root
from .landing import COMPLETION_MARKER, RAW_SUFFIXES, LandingZone

log = logging.getLogger(__name__)

STAGE_CHUNK = 8 << 20  # bytes per ranged read while staging
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ObjectLandingZone:
    """Raw episodes under an object-store prefix, listed incrementally in key (byte) order.

    :param store: the landing root: a ``Store`` (e.g. with a ready filesystem) or a ``gs://`` / ``s3://`` URL.
    :param endpoint_url: an S3-compatible origin, when ``store`` is a URL.
    :param suffixes: the raw files' name endings.
    :param page_size: at most this many names per list request (1000 is both services' maximum).
    :param stage_chunk: bytes per ranged read when staging.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        endpoint_url: str | None = None,
        suffixes: tuple[str, ...] = RAW_SUFFIXES,
        page_size: int = 1000,
        stage_chunk: int = STAGE_CHUNK,
    ):
        self.store = store if isinstance(store, Store) else Store.from_url(store, endpoint_url=endpoint_url)
        if self.store.protocol not in ("gs", "s3"):
            raise ValueError(f"an object landing zone is gs:// or s3://, not {self.store.root!r}: use LandingZone")
        if not 1 <= page_size <= 1000:
            raise ValueError("page_size is 1 to 1000")
        self.suffixes = suffixes
        self.page_size = page_size
        self.stage_chunk = stage_chunk
        self.bucket, _, prefix = self.store.root.split("://", 1)[1].partition("/")
        self._base = f"{prefix}/" if prefix else ""  # object names below the root start with this

    @property
    def root(self) -> str:
        return self.store.root

    def __repr__(self) -> str:
        return f"ObjectLandingZone({self.store!r})"

    # ---- addressing -----------------------------------------------------------------------------
    def resolve(self, key: str) -> str:
        """The URL of a key; a key that would escape the root (``..``, absolute, ...) raises ``StoreKeyError``."""
        return self.store.url(key)

    def info(self, key: str) -> ObjectInfo:
        """Size and version token of a landed object (``FileNotFoundError`` if it is gone)."""
        return self.store.info(key)

    # A listed object is whole (uploads become visible at once when they complete): ``complete`` says so at
    # once. A directory item may still be uploading: it settles.
    settles = True

    def complete(self, key: str) -> bool:
        """Whether the item is whole: any single object; a bag whose ``metadata.yaml`` names only objects
        that are there; an item with ``<key>.complete`` beside it."""
        root = item_root(key)
        if root is None:
            return True
        if self._exists(key + COMPLETION_MARKER):
            return True
        if not key.endswith("/" + BAG_MARKER):
            return False
        try:
            with self.store._guard(key), self.store.open(key, "rb") as f:
                text = f.read(1 << 20).decode("utf-8", "replace")
        except FileNotFoundError:
            return False
        present = {name[len(self._base) + len(root) + 1 :] for name, _, _ in self._prefix(root + "/")}
        return not bag_files_missing(text, present)

    def _exists(self, key: str) -> bool:
        try:
            self.store.info(key)
        except FileNotFoundError:
            return False
        return True

    def _prefix(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        """(name, size, mtime_ns) of every object below ``prefix`` (a key prefix), hidden ones left out."""
        token = None
        while True:
            names, token = self._page(None, token, self.page_size, prefix=self._base + prefix)
            for name, size, mtime_ns in names:
                if not any(part.startswith(".") for part in name[len(self._base) + len(prefix) :].split("/")):
                    yield name, size, mtime_ns
            if token is None:
                return

    def _item(self, key: str) -> LandedFile:
        """A directory item as a listing reports it: its objects' bytes and latest update time."""
        size = mtime_ns = 0
        for _, n, t in self._prefix(f"{item_root(key)}/"):
            size, mtime_ns = size + n, max(mtime_ns, t)
        return LandedFile(key, size, mtime_ns)

    def stat(self, key: str) -> LandedFile | None:
        """The object at ``key`` as a listing would return it (size, and its update time: a new
        generation or version changes it), or ``None`` if it is gone. A directory item: all its objects."""
        if item_root(key) is not None:
            return self._item(key) if self._exists(key) else None
        fs, name = self.store.filesystem, self._base + key
        try:
            with self.store._guard(key):
                if self.store.protocol == "gs":
                    meta = fs.call("GET", "b/{}/o/{}", self.bucket, name, json_out=True)
                    return LandedFile(key, int(meta["size"]), _rfc3339_ns(meta.get("updated")))
                head = fs.call_s3("head_object", Bucket=self.bucket, Key=name)
                return LandedFile(key, int(head["ContentLength"]), _datetime_ns(head.get("LastModified")))
        except FileNotFoundError:
            return None

    def open(self, key: str) -> BinaryIO:
        """A read-only file object on a landed object (ranged reads)."""
        return self.store.open(key, "rb")

    # ---- listing --------------------------------------------------------------------------------
    def check(self) -> None:
        """``StoreUnavailableError`` unless the bucket can be listed (one request for one name)."""
        self._page(None, None, 1)

    def scan(self, after: str | None = None, limit: int | None = None) -> list[LandedFile]:
        """Raw files whose key sorts after ``after``, in key order, at most ``limit`` of them.

        :param after: the cursor (the last key seen); ``None`` lists the whole zone.
        :param limit: stop after this many raw files (``None``: no limit).
        """
        out: list[LandedFile] = []
        if limit is not None and limit <= 0:
            return out
        start = self._base + after if after is not None else None
        token = None
        while True:
            want = self.page_size if limit is None else min(self.page_size, limit - len(out))
            names, token = self._page(start, token, want)
            for name, size, mtime_ns in names:
                key = name[len(self._base) :] if name.startswith(self._base) else None
                # startOffset is inclusive (and an emulator may ignore it): the cursor is filtered here too
                if key is None or (after is not None and key <= after) or not self._wanted(key):
                    continue
                out.append(LandedFile(key, size, mtime_ns) if item_root(key) is None else self._item(key))
                if limit is not None and len(out) >= limit:
                    return out
            if token is None:
                return out

    def _wanted(self, key: str) -> bool:
        if not is_landed_key(key, self.suffixes) or any(part.startswith(".") for part in key.split("/")):
            return False
        try:
            check_key(key)
        except StoreKeyError as e:
            log.warning("landing zone %s: skipping object %r: %s", self.store.root, key, e.reason)
            return False
        return True

    def _page(
        self, start: str | None, token: str | None, want: int, *, prefix: str | None = None
    ) -> tuple[list[tuple[str, int, int]], str | None]:
        """One list request: (name, size, mtime_ns) of up to ``want`` objects from ``start`` on, and
        the token of the next page (``None``: the last page). ``prefix``: an object-name prefix (default:
        the zone's)."""
        fs = self.store.filesystem
        prefix = self._base if prefix is None else prefix
        try:
            with self.store._guard(None):
                if self.store.protocol == "gs":
                    # gcsfs' listings pass no startOffset (its sequential lister hard-codes None): the
                    # JSON API is called through gcsfs' authenticated session instead.
                    page = fs.call(
                        "GET",
                        "b/{}/o",
                        self.bucket,
                        json_out=True,
                        prefix=prefix or None,
                        startOffset=start,
                        maxResults=want,
                        pageToken=token,
                    )
                    names = [(i["name"], int(i["size"]), _rfc3339_ns(i.get("updated"))) for i in page.get("items", [])]
                    return names, page.get("nextPageToken")
                kw = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": want}
                if token:
                    kw["ContinuationToken"] = token
                elif start:
                    kw["StartAfter"] = start
                page = fs.call_s3("list_objects_v2", **kw)
                names = [
                    (o["Key"], int(o["Size"]), _datetime_ns(o.get("LastModified"))) for o in page.get("Contents", [])
                ]
                return names, page.get("NextContinuationToken") if page.get("IsTruncated") else None
        except FileNotFoundError:
            raise StoreUnavailableError(self.store.root, "bucket not found") from None

    # ---- staging --------------------------------------------------------------------------------
    def stage(self, key: str, scratch_dir: str | os.PathLike, *, expect_size: int | None = None) -> Path:
        """Copy the object at ``key`` to ``<scratch_dir>/<key>`` and return that path.

        :param key: a landed key.
        :param scratch_dir: local scratch space; the copy replaces any earlier one at the same path.
        :param expect_size: the size registered for the key; another size raises ``PreconditionFailed``.
        :raises FileNotFoundError: no object at ``key``.
        :raises PreconditionFailed: the object is not the expected size, or changed during the copy.
        """
        check_key(key)
        size, pin = self._stat(key)
        if expect_size is not None and size != expect_size:
            raise PreconditionFailed(key, f"{size} bytes, {expect_size} were registered")
        with _staging(scratch_dir, key) as (f, dest):
            f.writelines(self._ranges(key, size, pin))
            if f.tell() != size:
                raise PreconditionFailed(key, f"copied {f.tell()} bytes of {size}")
        return dest

    def stage_item(
        self,
        key: str,
        scratch_dir: str | os.PathLike,
        *,
        expect_size: int | None = None,
        log_window: tuple[int, int] | None = None,
    ) -> Path:
        """Copy a directory item (``key``: its marker) to a folder of its own below ``scratch_dir``, named as
        the item's directory is (a bag's name can be its episode id), and return that folder. Each object
        is staged pinned to its version (:meth:`stage`); ``expect_size``: the item's registered bytes.
        ``log_window``: one episode of a long bag, by its log-time window (``sources.ros2.BagMember``): its
        MCAP storage files are staged as sparse copies holding what a reader of that window needs
        (:meth:`stage_window`), not whole.

        :raises FileNotFoundError: the marker is gone.
        :raises PreconditionFailed: the item is not the expected size, or changed during the copy.
        """
        root = item_root(key)
        assert root is not None, key
        objects = list(self._prefix(root + "/"))
        if not any(name == self._base + key for name, _, _ in objects):
            raise FileNotFoundError(f"{key}: gone from {self.root}")
        total = sum(size for _, size, _ in objects)
        if expect_size is not None and total != expect_size:
            raise PreconditionFailed(key, f"{total} bytes under {root}/, {expect_size} were registered")
        # a folder per call: two workers staging one bag (two of its episodes) never share files
        dest = Path(scratch_dir) / f"item-{uuid.uuid4().hex}"
        for name, _, _ in objects:
            object_key = name[len(self._base) :]
            if log_window is not None and object_key.endswith(".mcap"):
                self.stage_window(object_key, dest, *log_window)
            else:
                self.stage(object_key, dest)
        return dest.joinpath(*root.split("/"))

    def windowable(self, key: str) -> bool:
        """Whether a worker can stage one episode of the directory item at ``key`` (its marker) by its
        log-time window (:meth:`stage_item`): every storage file of the bag is MCAP. A SQLite 3 bag is
        staged whole, whatever is read of it."""
        root = item_root(key)
        assert root is not None, key
        names = [name[len(self._base) :] for name, _, _ in self._prefix(root + "/")]
        return all(n == key or n.endswith(".mcap") for n in names)

    def stage_window(self, key: str, scratch_dir: str | os.PathLike, start_ns: int, stop_ns: int) -> Path:
        """Stage the MCAP object at ``key`` to ``<scratch_dir>/<key>`` as a sparse file of its size that holds,
        at their offsets, the byte ranges a reader of its messages logged in ``[start_ns, stop_ns)`` needs
        (``sources.mcap_window``); zeros (holes) elsewhere. A file with no chunk index is staged whole.

        :raises FileNotFoundError: no object at ``key``.
        :raises PreconditionFailed: the object changed during the copy.
        """
        check_key(key)
        size, pin = self._stat(key)
        ranges = window_ranges(lambda lo, hi: self._range(key, lo, hi, pin), size, start_ns, stop_ns)
        if ranges is None:
            return self.stage(key, scratch_dir)
        with _staging(scratch_dir, key) as (f, dest):
            f.truncate(size)
            for lo, hi in ranges:
                f.seek(lo)
                for at in range(lo, hi, self.stage_chunk):
                    f.write(self._range(key, at, min(at + self.stage_chunk, hi), pin))
        return dest

    def _stat(self, key: str) -> tuple[int, dict]:
        """Size, and the request arguments that pin reads to this version of the object."""
        fs, name = self.store.filesystem, self._base + key
        with self.store._guard(key):
            if self.store.protocol == "gs":
                meta = fs.call("GET", "b/{}/o/{}", self.bucket, name, json_out=True)
                return int(meta["size"]), {"generation": meta["generation"]}
            # If-Match on the ETag, not VersionId: reading old versions needs another permission
            head = fs.call_s3("head_object", Bucket=self.bucket, Key=name)
            return int(head["ContentLength"]), {"IfMatch": head["ETag"]}

    def _ranges(self, key: str, size: int, pin: dict) -> Iterator[bytes]:
        for start in range(0, size, self.stage_chunk):
            yield self._range(key, start, min(start + self.stage_chunk, size), pin)

    def _range(self, key: str, start: int, end: int, pin: dict) -> bytes:
        """Bytes ``[start, end)`` of this version of the object (``pin``)."""
        fs, name = self.store.filesystem, self._base + key
        with self.store._guard(key):
            try:
                if self.store.protocol == "gs":
                    data = fs.cat_file(f"{self.bucket}/{name}", start=start, end=end, **pin)
                else:
                    from fsspec.asyn import sync

                    data = sync(fs.loop, _s3_range, fs, self.bucket, name, start, end, pin)
            except FileNotFoundError:  # the pinned generation is gone
                raise PreconditionFailed(key, "rewritten or deleted while it was staged") from None
            except OSError as e:
                if _s3_code(e) == "PreconditionFailed":  # If-Match: another ETag now
                    raise PreconditionFailed(key, "rewritten while it was staged") from None
                raise
        if len(data) != end - start:
            raise PreconditionFailed(key, f"bytes {start}-{end} came back {len(data)} long")
        return data


@contextmanager
def _staging(scratch_dir: str | os.PathLike, key: str) -> Iterator[tuple[BinaryIO, Path]]:
    """A temporary file beside ``<scratch_dir>/<key>`` to write, then synced and renamed to it; removed if
    the writing fails, so nothing partial is ever at the staged path."""
    dest = Path(scratch_dir).joinpath(*key.split("/"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.staging-{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as f:
            yield f, dest
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _s3_code(e: BaseException) -> str | None:
    """The S3 error code of a failed s3fs call (s3fs raises an ``OSError`` caused by botocore's error)."""
    response = getattr(e.__cause__, "response", None) or {}
    return response.get("Error", {}).get("Code")


async def _s3_range(fs, bucket: str, name: str, start: int, end: int, pin: dict) -> bytes:
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=name, Range=f"bytes={start}-{end - 1}", **pin)
    body = resp["Body"]
    try:
        return await body.read()
    finally:
        body.close()


def landing_zone(
    url_or_path: str | os.PathLike, endpoint_url: str | None = None, *, suffixes: tuple[str, ...] = RAW_SUFFIXES
) -> LandingZone | ObjectLandingZone:
    """The landing zone at ``url_or_path``: ``LandingZone`` for a local path or ``file://`` URL,
    ``ObjectLandingZone`` for ``gs://`` and ``s3://``.

    :param url_or_path: the landing root.
    :param endpoint_url: an S3-compatible origin (object stores only).
    :param suffixes: the raw files' name endings.
    """
    store = Store.from_url(url_or_path, endpoint_url=endpoint_url)
    if store.protocol == "file":
        return LandingZone(store.root.removeprefix("file://") or "/", suffixes)
    return ObjectLandingZone(store, suffixes=suffixes)


def _rfc3339_ns(text: str | None) -> int:
    if not text:
        return 0
    try:
        return _datetime_ns(datetime.fromisoformat(text))
    except ValueError:
        return 0


def _datetime_ns(when: datetime | None) -> int:
    if when is None:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


__all__ = ["ObjectLandingZone", "landing_zone"]
