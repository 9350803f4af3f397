"""The page cache as an fsspec filesystem (protocol ``dynacache``), so readers use it unchanged.

    fs = CachedFileSystem(PageCache(CacheConfig(root="/nvme/dyna-cache")), dataset="demo-clean")
    with fs.open("gs://fleet/mcap/ep.mcap") as f:       # any logical URL: file://, gs://, s3://
        EpisodeReader(f).read_window(...)

or by URL: ``fsspec.open("dynacache::gs://fleet/mcap/ep.mcap", dynacache={"cache_dir": ...})``.

An open file pins the object's version at open: every read of it is served from pages of that
version, or fails with ``ObjectChangedError`` if the origin has moved on and the page is not
cached. Files are read-only and unbuffered: each ``read`` is one cache read (the MCAP reader
asks for whole chunks, so a buffer in between would only copy).
"""

from __future__ import annotations

import io
import os
from typing import Any

from fsspec import AbstractFileSystem, register_implementation

try:  # fsspec >= 2025: a chained URL hands the inner path to the outer filesystem
    from fsspec.implementations.chained import ChainedFileSystem as _Base
except ImportError:  # pragma: no cover
    _Base = AbstractFileSystem

from .origins import Origins, normalize_url
from .page_cache import CacheConfig, PageCache

PROTOCOL = "dynacache"


class CachedFileSystem(_Base):
    protocol = PROTOCOL
    cachable = False  # each instance is one cache configuration; fsspec must not hand out another's

    def __init__(
        self,
        cache: PageCache | None = None,
        *,
        dataset: str = "",
        cache_dir: str | None = None,
        origins: Origins | None = None,
        **config: Any,
    ):
        super().__init__()
        # URL chaining ("dynacache::gs://...") passes the inner URL's protocol and options; the origin
        # of every URL is resolved by ``Origins`` instead, so they carry nothing this needs.
        self._target = config.pop("target_protocol", None)
        for chained in ("fo", "target_options"):
            config.pop(chained, None)
        if cache is None:
            if cache_dir is None:
                raise ValueError("CachedFileSystem needs a PageCache or a cache_dir")
            cache = PageCache(CacheConfig(root=cache_dir, **config), origins or Origins.from_env())
        self.cache = cache
        self.dataset = dataset

    @classmethod
    def _strip_protocol(cls, path):
        path = os.fspath(path)
        for prefix in (f"{PROTOCOL}::", f"{PROTOCOL}://"):
            path = path.removeprefix(prefix)
        return path  # "" for a bare chained "dynacache::": fsspec then passes the inner path

    def _url(self, path) -> str:
        """The logical URL of ``path``: chained inner paths lose their protocol, so put it back."""
        path = self._strip_protocol(path)
        if "://" not in path and self._target not in (None, "file", "local"):
            path = f"{self._target}://{path}"
        return normalize_url(path)

    def unstrip_protocol(self, name: str) -> str:
        return name

    def info(self, path, **kwargs) -> dict:
        url = self._url(path)
        i = self.cache.info(url)
        return {"name": url, "size": i.size, "type": "file", "version": i.version}

    def ls(self, path, detail=True, **kwargs):
        url = self._url(path)
        store, key, _ = self.cache.origins.locate(url)
        found = [f"{store.root}/{k}" for k in store.ls(key)]
        return [self.info(u) for u in found] if detail else found

    def cat_file(self, path, start=None, end=None, **kwargs) -> bytes:
        url = self._url(path)
        info = self.cache.info(url)
        start = 0 if start is None else (start + info.size if start < 0 else start)
        end = info.size if end is None else (end + info.size if end < 0 else end)
        return bytes(self.cache.read(url, start, end, info=info, dataset=self.dataset))

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise NotImplementedError(f"{PROTOCOL} is read-only (mode {mode!r}): write to the origin")
        url = self._url(path)
        return CachedFile(self, url)


class CachedFile(io.RawIOBase):
    """A seekable read-only file over the cache, at the version seen when it was opened."""

    def __init__(self, fs: CachedFileSystem, url: str):
        super().__init__()
        self.fs, self.path = fs, url
        self.name = url
        self.info = fs.cache.info(url)
        self.size = self.info.size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def read(self, size: int = -1) -> bytearray:
        """Up to ``size`` bytes (all that is left for -1) as a bytearray: no copy into ``bytes``."""
        self._checkClosed()
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        data = self.fs.cache.read(self.path, self._pos, end, info=self.info, dataset=self.fs.dataset)
        self._pos += len(data)
        return data

    def readall(self) -> bytearray:  # type: ignore[override]  # a bytearray as read() gives, not a copy into bytes
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


register_implementation(PROTOCOL, CachedFileSystem, clobber=True)

__all__ = ["PROTOCOL", "CachedFile", "CachedFileSystem"]
