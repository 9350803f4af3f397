"""Where the bytes of a logical URL come from, and which version of them they are.

Training configs and manifests name objects by their *logical* URL (``gs://fleet/mcap/ep.mcap``,
``file:///data/mcap/ep.mcap``). A cluster may read them from another origin: routes map a logical
prefix to a physical one (``gs://fleet/mcap`` → ``s3://neutral/mcap`` at an S3-compatible
endpoint). The page cache keys pages by the logical URL and the *content version*, so a cluster's
cache and its training config do not depend on which origin it reads:

- an object written by ``replicate`` carries the version of the primary object it copies as user
  metadata (``dyna-version``); reading it through a route yields that version, not the replica's own
  ETag;
- any other object's version is its store's token (GCS generation, S3 VersionId or ETag, local
  size+mtime+ctime+inode), see ``stores.ObjectInfo`` and ``stores.local_version``.

``read`` fetches a byte range *of a given version*: pinned on the request where the store can
(GCS generation, S3 VersionId), else checked afterwards (``ObjectChangedError`` when the object
moved on meanwhile), so bytes of two versions are never mixed under one key.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from .stores import ObjectInfo, Store, StoreUnavailableError, local_version, redact

VERSION_METADATA = "dyna-version"  # user metadata on a replica: the version of the primary it copies


class ObjectChangedError(RuntimeError):
    """The object was rewritten while a range of a known version was read."""

    def __init__(self, url: str, expected: str, found: str):
        self.url = redact(url)
        super().__init__(f"{self.url}: object changed while reading (version {expected} → {found})")


@dataclass(frozen=True)
class Route:
    """Objects under the logical ``prefix`` are read from ``origin`` (same relative key)."""

    prefix: str
    origin: str
    endpoint_url: str | None = None


@dataclass
class Origins:
    """Resolves logical URLs to (store, key) pairs; one ``Store`` per bucket/root, shared by threads.

    ``routes``: logical prefix → physical origin URL, or a ``Route``; the longest matching prefix wins.
    ``endpoint_urls``: origin root (``s3://neutral``) → endpoint URL of an S3-compatible service.
    ``stores``: ready ``Store`` objects by root (tests, emulators); they win over building one."""

    routes: Mapping[str, str | Route] = field(default_factory=dict)
    endpoint_urls: Mapping[str, str] = field(default_factory=dict)
    stores: Mapping[str, Store] = field(default_factory=dict)  # any keys; each serves below its root
    s3_endpoint_url: str | None = None  # every other s3:// origin is at this S3-compatible endpoint

    def __post_init__(self):
        self._routes = sorted(
            (r if isinstance(r, Route) else Route(p.rstrip("/"), str(r).rstrip("/")) for p, r in self.routes.items()),
            key=lambda r: -len(r.prefix),
        )
        self._stores: dict[str, Store] = {v.root: v for v in self.stores.values()}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> Origins:
        """``DYNA_ORIGIN_ROUTES`` and ``DYNA_S3_ENDPOINT_URL``: see :meth:`from_settings`."""
        return cls.from_settings(os.environ.get("DYNA_ORIGIN_ROUTES", ""), os.environ.get("DYNA_S3_ENDPOINT_URL", ""))

    @classmethod
    def from_settings(cls, routes: str, s3_endpoint_url: str = "") -> Origins:
        """:param routes: ``logical=physical[,logical=physical...]`` (``DYNA_ORIGIN_ROUTES``).
        :param s3_endpoint_url: endpoint of every s3:// origin, an S3-compatible store
            (``DYNA_S3_ENDPOINT_URL``); empty: AWS."""
        parsed = {}
        for item in filter(None, (s.strip() for s in routes.split(","))):
            logical, sep, physical = item.partition("=")
            if not sep or not logical or not physical:
                raise ValueError(f"DYNA_ORIGIN_ROUTES: expected logical=physical, got {redact(item)!r}")
            parsed[logical] = physical
        return cls(routes=parsed, s3_endpoint_url=s3_endpoint_url or None)

    # ---- resolution ---------------------------------------------------------------------------
    def physical(self, url: str) -> tuple[str, Route | None]:
        url = normalize_url(url)
        for r in self._routes:
            if url == r.prefix or url.startswith(r.prefix + "/"):
                return r.origin + url[len(r.prefix) :], r
        return url, None

    def locate(self, url: str) -> tuple[Store, str, Route | None]:
        """The store and key that hold the bytes of logical ``url``."""
        physical, route = self.physical(url)
        with self._lock:
            for root, store in self._stores.items():  # a store given for a prefix serves what is below it
                if physical.startswith(root + "/"):
                    return store, physical[len(root) + 1 :], route
            root, key = _split(physical)
            endpoint = (
                (route.endpoint_url if route else None)
                or self.endpoint_urls.get(_root_of(root))
                or (self.s3_endpoint_url if root.startswith("s3://") else None)
            )
            self._stores[root] = Store.from_url(root, endpoint_url=endpoint)
            return self._stores[root], key, route

    # ---- metadata and bytes -------------------------------------------------------------------
    def info(self, url: str) -> ObjectInfo:
        """Size and *content version* of logical ``url`` (the primary's version for a replica)."""
        store, key, route = self.locate(url)
        info = store.info(key)
        if route is not None:
            primary = _replica_version(store, key)
            if primary:
                return ObjectInfo(key=info.key, size=info.size, version=primary)
        return info

    def read(self, url: str, start: int, end: int, version: str) -> bytes:
        """Bytes ``[start, end)`` of logical ``url`` at ``version`` (``ObjectChangedError`` otherwise)."""
        store, key, route = self.locate(url)
        fs, path = store.filesystem, store._path(key)
        pin = _pin(store.protocol, version) if route is None else {}
        with store._guard(key):
            if store.protocol == "file":
                return _read_local(path, start, end, version, url, replica=route is not None)
            data = fs.cat_file(path, start=start, end=end, **pin)
        if not pin:  # nothing pinned the request: make sure the object is still the version we key by
            now = self.info(url).version
            if now != version:
                raise ObjectChangedError(url, version, now)
        return data


def normalize_url(url: str) -> str:
    """A plain local path becomes a ``file://`` URL; other URLs are kept as they are."""
    text = os.fspath(url)
    if "://" not in text:
        return "file://" + os.path.abspath(text)
    return text


def _split(url: str) -> tuple[str, str]:
    """(store root, key): the bucket for object stores, the file system root for local files."""
    scheme, _, rest = url.partition("://")
    if scheme in ("file", "local"):
        return "file://", rest.lstrip("/")
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", key


def _root_of(url: str) -> str:
    scheme, _, rest = url.rstrip("/").partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}" if scheme not in ("file", "local") else url.rstrip("/")


def _pin(protocol: str, version: str) -> dict:
    if protocol == "gs" and version.startswith("g"):
        return {"generation": version[1:]}
    if protocol == "s3" and version.startswith("v"):
        return {"version_id": version[1:]}
    return {}


def _read_local(path: str, start: int, end: int, version: str, url: str, *, replica: bool) -> bytes:
    """A local range read on one descriptor whose identity is checked, so no race with a rewrite."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        found = (_xattr(fd) if replica else None) or local_version(st)
        if found != version:
            raise ObjectChangedError(url, version, found)
        return os.pread(fd, end - start, start)
    finally:
        os.close(fd)


def _replica_version(store: Store, key: str) -> str | None:
    """The primary's version recorded on a replica, if it was written by ``replicate``."""
    fs = store.filesystem
    path = store._path(key)
    if store.protocol == "file":
        return _xattr(path)
    with store._guard(key):
        if store.protocol == "s3":
            meta = fs.metadata(path)  # a HEAD: s3fs' info() leaves user metadata out
        else:
            meta = fs.info(path).get("metadata")
    return (meta or {}).get(VERSION_METADATA)


def _xattr(target: str | int) -> str | None:
    try:
        return os.getxattr(target, "user." + VERSION_METADATA).decode() or None
    except OSError:  # not set, or the file system keeps no user xattrs
        return None


__all__ = [
    "VERSION_METADATA",
    "ObjectChangedError",
    "Origins",
    "Route",
    "StoreUnavailableError",
    "normalize_url",
]
