"""A node-local page cache in front of object stores: an accelerator, never a dependency.

Objects are cut into fixed pages (default 4 MiB). A page is keyed by (logical URL, content
version, page index), so a rewritten object never serves old pages: its new version has new keys.
Layout under ``root``::

    index.sqlite          which pages exist, their dataset, bytes held and access times (WAL, shared);
                          its ``user_version`` is the on-disk format (``_FORMAT``)
    locks                 a lock file: byte-range locks, one slot per page key (fetch-once)
    pages/ab/<object>/N   page N of one object version: header, block bitmap, per-block checksums, data

**Ranged fills.** A page holds only the blocks (``block_size``, 16 KiB) that were asked for: a miss
fetches the missing blocks of the bytes wanted, not the whole page, and adds them to the page file
(data, then checksums, then the bitmap bits, so a reader never sees a block marked present before its
bytes and checksum are there; the absent blocks are holes in a sparse file). A training read set is a
few small chunks (a training stream, proprio) between large archive-camera chunks: whole-page fills
fetched ~12x the bytes such an epoch needs.

A folder of another format (an older release's) is rebuilt when it is first opened: the index
tables are recreated and the old pages removed, under the index's write lock, so concurrent
readers agree and none reads a page in a layout it does not know.

Why not fsspec's own caching filesystems (``blockcache``, ``filecache``): they have no size-based
eviction and their metadata is a per-process JSON file, unsafe with many DataLoader workers and
ranks on one node. Why SQLite for the index: it is the well-kept multi-process transactional store
Python ships with; eviction needs a consistent "least recently used, by dataset" view across
processes, which file mtimes alone cannot give without scanning the tree.

- **Integrity**: a page file is written to a temp name and renamed; its header names what it holds
  (the object's URL + version digest and the page index) and carries an xxh3 checksum per 64 KiB
  block. Every hit checks the blocks it reads (xxh3 runs at memory speed, so a warm read stays at
  the disk's own speed) against the checksums of a header bound to the page's own key: a page
  file copied, renamed or swapped under another key's name fails that and, like a bad block, is
  dropped, counted in ``corrupt_pages`` and refetched from the origin.
- **Concurrency**: a miss takes the page's lock (a thread lock in the process, an open-file-
  description byte-range lock on its slot of ``locks`` across processes), re-checks, and only then
  fetches: concurrent misses for one page cost one origin read. Missing pages of one read are
  fetched in parallel.
- **Eviction**: before a page is added, least-recently-used pages are dropped until it fits under
  ``capacity_bytes`` and under its dataset's quota, so usage never exceeds either. Hits record
  access times in memory and write them to the index in batches (approximate LRU, like most caches).
- **TTL**: ``ttl_s`` bounds how long a page is served after it was fetched; ``metadata_ttl_s``
  bounds how long an object's (size, version) is trusted without asking the origin (0: every
  ``info``/open asks, so a rewrite is seen at once). If the origin cannot be reached, the last known
  version is used and a warning counted (stale-if-error).
- **Fallback**: if the cache directory is missing, full, unwritable or corrupt, reads go straight to
  the origin and ``stats.warnings`` counts it; the next operations try to rebuild the cache. Only
  origin failures (unreachable, missing object, changed mid-read) reach the caller.

Plain Python, no Dagster import: DataLoader workers import it. Forked processes reopen the index
and the lock file on first use.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sqlite3
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import xxhash

from .origins import ObjectChangedError, Origins, normalize_url
from .stores import ObjectInfo, StoreUnavailableError, redact

log = logging.getLogger("dyna.cache")

MiB = 1 << 20
_MAGIC = b"DYPG"
_FORMAT = 3  # the on-disk format: page header below and index schema; another one is rebuilt
# magic, format, block count, block size, data length, fetched at, object digest (URL, version,
# page size: the key's middle part), page index: the header binds the file to its key
_HEADER = struct.Struct("<4sBxHIQd16sQ")
_LOCK_SLOTS = 1 << 20  # byte-range lock slots; two page keys sharing one only serialize their fetches
_TOUCH_BATCH = 512
_TOUCH_EVERY_S = 2.0
_RETRY_BROKEN_S = 5.0
_WARN_EVERY_S = 30.0
_HEADER_MEMO = 8192  # parsed page headers kept per process (~0.6 KiB each for 4 MiB pages)


@dataclass(frozen=True)
class CacheConfig:
    root: str
    page_size: int = 4 * MiB
    capacity_bytes: int = 16 << 30
    quotas: Mapping[str, int] = field(default_factory=dict)  # dataset -> bytes
    ttl_s: float | None = None  # serve a page at most this long after it was fetched
    metadata_ttl_s: float = 0.0  # trust an object's (size, version) this long without asking the origin
    block_size: int = 16 << 10  # checksum and fill granularity inside a page
    fetch_threads: int = 8  # parallel origin reads of the missing pages of one read

    def __post_init__(self):
        if self.page_size <= 0 or self.block_size <= 0 or self.page_size % self.block_size:
            raise ValueError("page_size must be a positive multiple of block_size")
        if self.page_size // self.block_size > 0xFFFF:
            raise ValueError("too many checksum blocks per page: raise block_size")
        if self.capacity_bytes < 0 or any(q < 0 for q in self.quotas.values()):
            raise ValueError("capacity and quotas are byte counts >= 0")

    @classmethod
    def from_env(cls, default_root: str | os.PathLike, **overrides) -> CacheConfig:
        """``DYNA_CACHE_DIR``, ``DYNA_CACHE_CAPACITY_GB``, ``DYNA_CACHE_PAGE_MB``, ``DYNA_CACHE_TTL_S``."""
        env = os.environ
        kw: dict = {"root": env.get("DYNA_CACHE_DIR") or os.fspath(default_root)}
        if env.get("DYNA_CACHE_CAPACITY_GB"):
            kw["capacity_bytes"] = int(float(env["DYNA_CACHE_CAPACITY_GB"]) * (1 << 30))
        if env.get("DYNA_CACHE_PAGE_MB"):
            kw["page_size"] = int(float(env["DYNA_CACHE_PAGE_MB"]) * MiB)
        if env.get("DYNA_CACHE_TTL_S"):
            kw["ttl_s"] = float(env["DYNA_CACHE_TTL_S"])
        kw.update(overrides)
        return cls(**kw)


# A counters dataclass after a from_* classmethod, the shape of trainer/train.py's TrainConfig/StepTimes:
# unrelated records (and dyna_resources must not import trainer).
@dataclass
class CacheStats:
    """Counters of this process (every field only grows)."""

    hit_pages: int = 0
    hit_bytes: int = 0
    miss_pages: int = 0
    origin_requests: int = 0
    origin_bytes: int = 0
    shared_fills: int = 0  # misses another thread or process filled while this one waited
    corrupt_pages: int = 0
    expired_pages: int = 0
    evicted_pages: int = 0
    warnings: int = 0  # reads that fell back to the origin because the cache could not serve them
    last_warning: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class PageCache:
    """``clock``: wall-clock seconds, the time of every TTL (``ttl_s``, ``metadata_ttl_s``) and of the
    fetched/accessed times the cache records. Those times are shared with the node's other processes
    through the page headers and the index, so in production it is ``time.time``; a test passes a
    clock it advances. Not part of ``CacheConfig``: it is how this process tells time, not a setting."""

    def __init__(self, config: CacheConfig, origins: Origins | None = None, *, clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self.origins = origins or Origins()
        self.root = Path(config.root)
        self._pages = os.path.join(os.fspath(self.root), "pages")  # str: pathlib costs a third of a small hit
        self._headers: dict[str, tuple] = {}  # key -> parsed header; the same key always holds the same bytes
        self.stats = CacheStats()
        self._stats_lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        self._db_ino: tuple[int, int] | None = None
        self._page_locks: dict[str, list] = {}  # key -> [threading.Lock, users]
        self._pool: ThreadPoolExecutor | None = None
        self._touched: dict[str, float] = {}
        self._touched_at = time.monotonic()
        self._broken_until = 0.0
        self._warned: dict[str, float] = {}
        self._objects: dict[str, tuple[ObjectInfo, float]] = {}
        _LIVE.add(self)
        self._ready()

    # ---- public API ---------------------------------------------------------------------------
    def info(self, url: str) -> ObjectInfo:
        """Size and content version of ``url`` (asks the origin unless known within metadata_ttl_s)."""
        url = normalize_url(url)
        known = self._objects.get(url)
        if known is None and self.config.metadata_ttl_s > 0:
            known = self._known_object(url)
        if known and self._clock() - known[1] < self.config.metadata_ttl_s:
            return known[0]
        try:
            info = self.origins.info(url)
        except StoreUnavailableError as e:
            known = known or self._known_object(url)
            if known is None:
                raise
            self._warn("origin-down", f"{e}; serving the last known version of {redact(url)}")
            return known[0]
        now = self._clock()
        self._objects[url] = (info, now)
        if known is None or known[0] != info:  # remembered for metadata_ttl_s and for stale-if-error
            self._with_index(
                lambda db: db.execute(
                    "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", (url, info.version, info.size, now)
                )
            )
        return info

    def read(self, url: str, start: int, end: int, *, info: ObjectInfo | None = None, dataset: str = "") -> bytearray:
        """Bytes ``[start, end)`` of ``url`` (clamped to its size) at ``info``'s version."""
        url = normalize_url(url)
        info = info or self.info(url)
        start, end = max(0, start), min(end, info.size)
        if start >= end:
            return bytearray()
        out = bytearray(end - start)
        view = memoryview(out)
        ps = self.config.page_size
        missing = []
        for p in range(start // ps, (end - 1) // ps + 1):
            lo, hi = max(start, p * ps), min(end, (p + 1) * ps)
            if not self._hit(url, info, p, lo - p * ps, hi - p * ps, view[lo - start : hi - start]):
                missing.append((p, lo, hi))
        if missing:

            def fill(item):
                p, lo, hi = item
                got, _ = self._fill(url, info, p, dataset, lo - p * ps, hi - p * ps)
                view[lo - start : hi - start] = got

            self._run_all(fill, missing)
        self._maybe_flush_touches()
        return out

    def warm(
        self, url: str, start: int, end: int, *, info: ObjectInfo | None = None, dataset: str = ""
    ) -> tuple[int, int, int, int]:
        """Make the blocks of ``[start, end)`` present without reading them back.
        Returns (pages fetched, bytes fetched from the origin, pages already warm, bytes already warm)."""
        url = normalize_url(url)
        info = info or self.info(url)
        ps = self.config.page_size
        start, end = max(0, start), min(end, info.size)
        fetched = fetched_bytes = warm = warm_bytes = 0
        for p in range(start // ps, (end - 1) // ps + 1) if start < end else ():
            a, b = max(start, p * ps) - p * ps, min(end, (p + 1) * ps) - p * ps
            if self._present(url, info, p, a, b):
                warm, warm_bytes = warm + 1, warm_bytes + b - a
                self._touch(self._key(url, info, p))
                continue
            _, from_origin = self._fill(url, info, p, dataset, a, b)
            if from_origin:  # else another thread or process filled it meanwhile
                fetched, fetched_bytes = fetched + 1, fetched_bytes + from_origin
            else:
                warm, warm_bytes = warm + 1, warm_bytes + b - a
        return fetched, fetched_bytes, warm, warm_bytes

    def usage(self) -> dict[str, int]:
        """Bytes cached per dataset (``""``: pages read without a dataset)."""
        rows = self._with_index(lambda db: db.execute("SELECT dataset, bytes FROM usage WHERE bytes > 0").fetchall())
        return dict(rows or [])

    def page_count(self) -> int:
        return self._with_index(lambda db: db.execute("SELECT count(*) FROM pages").fetchone()[0]) or 0

    def expire(self) -> int:
        """Drop every page fetched more than ``ttl_s`` ago; returns how many."""
        if self.config.ttl_s is None:
            return 0
        cutoff = self._clock() - self.config.ttl_s

        def drop(db):
            with _immediate(db):
                keys = [k for (k,) in db.execute("SELECT key FROM pages WHERE fetched_at < ?", (cutoff,))]
                db.executemany("DELETE FROM pages WHERE key = ?", [(k,) for k in keys])
            return keys

        keys = self._with_index(drop) or []
        for k in keys:
            _unlink(self._page_path(k))
        self._count(expired_pages=len(keys))
        return len(keys)

    def flush(self) -> None:
        """Write pending access times to the index."""
        self._flush_touches()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._flush_touches()
        with self._state_lock:
            pool = self._pool if self._pid == os.getpid() else None
            self._pool = None
        if pool is not None:  # outside the lock: its threads' fills take it
            pool.shutdown(wait=True)
        with self._state_lock:
            self._close_handles()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- keys and files -----------------------------------------------------------------------
    def _key(self, url: str, info: ObjectInfo, page: int) -> str:
        digest = xxhash.xxh3_128_hexdigest(f"{url}\0{info.version}\0{self.config.page_size}".encode())
        return f"{digest[:2]}/{digest}/{page}"

    def _page_path(self, key: str) -> str:
        return f"{self._pages}/{key}"

    @staticmethod
    def _binding(key: str) -> tuple[bytes, int]:
        """(object digest, page index) of a key: what the page file's header must name."""
        _, digest, page = key.split("/")
        return bytes.fromhex(digest), int(page)

    # ---- hits ---------------------------------------------------------------------------------
    def _hit(self, url, info, page, a, b, dest: memoryview, *, count: bool = True) -> bool:
        """Copy bytes [a, b) of a verified cached page into ``dest``; False on a miss (no page, or a
        block of the range not in it)."""
        if not self._usable():
            return False
        key = self._key(url, info, page)
        want = min(info.size, (page + 1) * self.config.page_size) - page * self.config.page_size
        try:
            fd = os.open(self._page_path(key), os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError as e:
            self._warn("read", f"cache page unreadable ({e.strerror}): reading from the origin")
            return False
        try:
            sums, data_at, bits = self._header(fd, want, key)
            if sums is None:
                return self._drop_bad(key, "corrupt header, or a page file of another key")
            if sums is False:
                return self._drop_expired(key)
            bs = self.config.block_size
            k_first, k_last = a // bs, (b - 1) // bs
            if bits is not None and not _all_set(bits, k_first, k_last + 1):
                return False  # a partial page without these blocks: a miss, the page stays
            # Whole blocks inside [a, b) are read straight into dest; the edge blocks via a buffer.
            inner_lo = -(-a // bs)
            inner_hi = b // bs if b < want else k_last + 1
            if inner_lo < inner_hi:
                off = inner_lo * bs
                n = min(inner_hi * bs, want) - off
                part = dest[off - a : off - a + n]
                if os.preadv(fd, [part], data_at + off) != n:
                    return self._drop_bad(key, "short page file")
                for k in range(inner_lo, inner_hi):
                    blk = part[k * bs - off : min((k + 1) * bs, want) - off]
                    if xxhash.xxh3_64_intdigest(blk) != sums[k]:
                        return self._drop_bad(key, f"checksum mismatch in block {k}")
            for k in {k_first, k_last}:
                if inner_lo <= k < inner_hi:
                    continue
                lo, hi = k * bs, min((k + 1) * bs, want)
                edge = os.pread(fd, hi - lo, data_at + lo)
                if len(edge) != hi - lo or xxhash.xxh3_64_intdigest(edge) != sums[k]:
                    return self._drop_bad(key, f"checksum mismatch in block {k}")
                cut_lo, cut_hi = max(a, lo), min(b, hi)
                dest[cut_lo - a : cut_hi - a] = edge[cut_lo - lo : cut_hi - lo]
        except OSError as e:
            self._warn("read", f"cache page unreadable ({e.strerror or e}): reading from the origin")
            return False
        finally:
            os.close(fd)
        if count:
            self._count(hit_pages=1, hit_bytes=b - a)
        self._touch(key)
        return True

    def _header(self, fd: int, want: int, key: str, *, remember: bool = True):
        """(checksums, data offset, block bitmap): the bitmap is None when every block is present;
        (None, 0, None) if the header is bad or bound to another key, (False, 0, None) if expired.

        Parsed headers of complete pages are remembered per key: a complete page file under one key
        always holds the same bytes (a refetch writes identical data), and the data itself is verified
        on every read against these checksums, which came from a header bound to ``key``: bytes of any
        other page put in its place fail them. A partial page's header changes as blocks are added."""
        known = self._headers.get(key) if remember else None
        if known is not None:
            sums, data_at, fetched_at = known
            if self.config.ttl_s is not None and self._clock() - fetched_at > self.config.ttl_s:
                return False, 0, None
            return sums, data_at, None
        head = os.pread(fd, _HEADER.size, 0)
        if len(head) != _HEADER.size:
            return None, 0, None
        magic, fmt, nblocks, bs, length, fetched_at, digest, index = _HEADER.unpack(head)
        if (
            magic != _MAGIC
            or fmt != _FORMAT
            or bs != self.config.block_size
            or length != want
            or nblocks != -(-length // bs)
            or (digest, index) != self._binding(key)
        ):
            return None, 0, None
        if self.config.ttl_s is not None and self._clock() - fetched_at > self.config.ttl_s:
            return False, 0, None
        nbits = _bitmap_bytes(nblocks)
        # the bitmap before the checksums, in one read: a block's bit is set only after its checksum is
        # written, so a bit seen set here has its checksum in the same (later-copied) bytes
        raw = os.pread(fd, nbits + 8 * nblocks, _HEADER.size)
        if len(raw) != nbits + 8 * nblocks:
            return None, 0, None
        bits = bytes(raw[:nbits])
        sums, data_at = memoryview(raw)[nbits:].cast("Q"), _HEADER.size + nbits + 8 * nblocks
        complete = _all_set(bits, 0, nblocks)
        if remember and complete:
            if len(self._headers) >= _HEADER_MEMO:
                self._headers.clear()
            self._headers[key] = (sums, data_at, fetched_at)
        return sums, data_at, None if complete else bits

    def _present(self, url, info, page, a: int, b: int) -> bool:
        """A page file with a valid header, its full length and the blocks of [a, b) exists (checksums
        verified on read)."""
        if not self._usable():
            return False
        key = self._key(url, info, page)
        want = min(info.size, (page + 1) * self.config.page_size) - page * self.config.page_size
        try:
            fd = os.open(self._page_path(key), os.O_RDONLY)
        except OSError:
            return False
        try:
            sums, data_at, bits = self._header(fd, want, key, remember=False)
            if not sums or os.fstat(fd).st_size != data_at + want:
                return False
            bs = self.config.block_size
            return bits is None or _all_set(bits, a // bs, (b - 1) // bs + 1)
        except OSError:
            return False
        finally:
            os.close(fd)

    def _drop_bad(self, key: str, reason: str) -> bool:
        self._count(corrupt_pages=1)
        log.warning("cache page %s dropped: %s; refetching", key, reason)
        self._forget(key)
        return False

    def _drop_expired(self, key: str) -> bool:
        self._count(expired_pages=1)
        self._forget(key)
        return False

    def _forget(self, key: str) -> None:
        self._headers.pop(key, None)
        _unlink(self._page_path(key))
        self._with_index(lambda db: db.execute("DELETE FROM pages WHERE key = ?", (key,)))

    # ---- misses -------------------------------------------------------------------------------
    def _fill(self, url: str, info: ObjectInfo, page: int, dataset: str, a: int, b: int) -> tuple[bytearray, int]:
        """(bytes [a, b) of the page, bytes fetched from the origin for them): from the cache if another
        reader filled them meanwhile, else the missing blocks from the origin, then stored (best effort)."""
        ps, bs = self.config.page_size, self.config.block_size
        base, want = page * ps, min(info.size, (page + 1) * ps) - page * ps
        key = self._key(url, info, page)
        out = bytearray(b - a)
        self._count(miss_pages=1)
        with self._page_lock(key) as locked:
            if not locked:
                self._warn("fallback", f"cache at {self.root} unusable: reading {redact(url)} from the origin")
                out[:] = self._origin_read(url, info, base + a, base + b)
                return out, b - a
            if self._hit(url, info, page, a, b, memoryview(out), count=False):
                self._count(shared_fills=1)
                return out, 0
            held = self._blocks_held(key, want)  # the page's present blocks (None: no usable page file)
            k0, k1 = a // bs, (b - 1) // bs + 1
            runs, k = [], k0
            while k < k1:  # runs of the blocks of [a, b) the page lacks: one origin request each
                if held is not None and _all_set(held, k, k + 1):
                    k += 1
                    continue
                j = k
                while j < k1 and not (held is not None and _all_set(held, j, j + 1)):
                    j += 1
                runs.append((k, j))
                k = j
            fetched = 0
            view = memoryview(out)
            got: list[tuple[int, bytes]] = []
            for r0, r1 in runs:
                lo, hi = r0 * bs, min(r1 * bs, want)
                data = self._origin_read(url, info, base + lo, base + hi)
                fetched += len(data)
                got.append((r0, data))
                cut_lo, cut_hi = max(a, lo), min(b, hi)
                view[cut_lo - a : cut_hi - a] = memoryview(data)[cut_lo - lo : cut_hi - lo]
            self._store(key, want, got, held, dataset)
            for k in range(k0, k1):  # blocks the page already held: read from it (or the origin if it went)
                if held is None or not _all_set(held, k, k + 1):
                    continue
                lo, hi = max(a, k * bs), min(b, (k + 1) * bs)
                if not self._hit(url, info, page, lo, hi, view[lo - a : hi - a], count=False):
                    view[lo - a : hi - a] = self._origin_read(url, info, base + lo, base + hi)
                    fetched += hi - lo
            return out, fetched

    def _origin_read(self, url: str, info: ObjectInfo, lo: int, hi: int) -> bytes:
        data = self.origins.read(url, lo, hi, info.version)
        self._count(origin_requests=1, origin_bytes=len(data))
        if len(data) != hi - lo:
            raise ObjectChangedError(url, info.version, f"a short read ({len(data)} of {hi - lo} bytes)")
        return data

    def _blocks_held(self, key: str, want: int) -> bytes | None:
        """The bitmap of a usable page file of ``key`` (all set when complete); None when there is none
        (or it is bad or expired: it is removed, and the fill writes a new one)."""
        try:
            fd = os.open(self._page_path(key), os.O_RDONLY)
        except OSError:
            return None
        try:
            sums, data_at, bits = self._header(fd, want, key, remember=False)
            ok = bool(sums) and os.fstat(fd).st_size == data_at + want
        except OSError:
            ok = False
        finally:
            os.close(fd)
        if not ok:
            self._forget(key)
            return None
        nblocks = -(-want // self.config.block_size)
        return bits if bits is not None else b"\xff" * _bitmap_bytes(nblocks)

    def _store(self, key: str, want: int, blocks: list[tuple[int, bytes]], held: bytes | None, dataset: str) -> None:
        """Add the fetched runs (first block, bytes) to the page file (a new sparse one when ``held`` is
        None), then to the index with the bytes the page now holds."""
        if not blocks:
            return
        bs = self.config.block_size
        nblocks = -(-want // bs)
        bits = bytearray(held) if held is not None else bytearray(_bitmap_bytes(nblocks))
        sums: dict[int, int] = {}
        for r0, data in blocks:
            view = memoryview(data)
            for i in range(0, len(data), bs):
                k = r0 + i // bs
                sums[k] = xxhash.xxh3_64_intdigest(view[i : i + bs])
                bits[k >> 3] |= 1 << (k & 7)
        size = sum(min((k + 1) * bs, want) - k * bs for k in range(nblocks) if bits[k >> 3] >> (k & 7) & 1)
        limit = min(self.config.capacity_bytes, self.config.quotas.get(dataset, self.config.capacity_bytes))
        if size > limit:
            self._warn(
                "full",
                f"page of {size} bytes does not fit the cache ({limit} bytes for dataset "
                f"{dataset!r}): read from the origin",
            )
            return
        victims = self._with_index(lambda db: self._reserve(db, key, size, dataset))
        if victims is None:
            return
        for v in victims:
            _unlink(self._page_path(v))
        self._count(evicted_pages=len(victims))
        path = Path(self._page_path(key))
        data_at = _HEADER.size + len(bits) + 8 * nblocks
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            if held is None or key in victims:  # a new page file, written whole and renamed into place
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.ftruncate(fd, data_at + want)  # absent blocks stay holes
                    head = _HEADER.pack(_MAGIC, _FORMAT, nblocks, bs, want, self._clock(), *self._binding(key))
                    all_sums = [sums.get(k, 0) for k in range(nblocks)]
                    os.pwrite(fd, head + bytes(bits) + struct.pack(f"<{nblocks}Q", *all_sums), 0)
                    for r0, data in blocks:
                        os.pwrite(fd, data, data_at + r0 * bs)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            else:  # blocks added to a partial page in place: data, then checksums, then the bitmap
                fd = os.open(path, os.O_WRONLY)
                try:
                    for r0, data in blocks:
                        os.pwrite(fd, data, data_at + r0 * bs)
                    sums_at = _HEADER.size + len(bits)
                    for k, v in sums.items():
                        os.pwrite(fd, struct.pack("<Q", v), sums_at + 8 * k)
                    os.pwrite(fd, bytes(bits), _HEADER.size)
                finally:
                    os.close(fd)
            self._headers.pop(key, None)
        except OSError as e:
            _unlink(tmp)
            self._with_index(lambda db: db.execute("DELETE FROM pages WHERE key = ?", (key,)))
            reason = "cache disk full" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else e.strerror
            self._warn("write", f"cannot store a page ({reason or e}): read from the origin")
            if not self.root.is_dir() or not (self.root / "index.sqlite").exists():
                self._mark_broken()

    def _reserve(self, db: sqlite3.Connection, key: str, size: int, dataset: str) -> list[str]:
        """Add the page to the index, evicting LRU pages first so that usage stays within the
        capacity and the dataset's quota. Returns the evicted keys (their files are removed next)."""
        self._flush_touches(db)
        now = self._clock()
        victims: list[str] = []
        with _immediate(db):
            db.execute("DELETE FROM pages WHERE key = ?", (key,))
            quota = self.config.quotas.get(dataset)
            if quota is not None:
                used = db.execute("SELECT coalesce(sum(bytes), 0) FROM usage WHERE dataset = ?", (dataset,)).fetchone()[
                    0
                ]
                victims += self._evict(db, used + size - quota, dataset)
            used = db.execute("SELECT coalesce(sum(bytes), 0) FROM usage").fetchone()[0]
            victims += self._evict(db, used + size - self.config.capacity_bytes, None)
            db.execute("INSERT INTO pages VALUES (?, ?, ?, ?, ?)", (key, dataset, size, now, now))
        return victims

    @staticmethod
    def _evict(db: sqlite3.Connection, need: int, dataset: str | None) -> list[str]:
        if need <= 0:
            return []
        where, args = ("WHERE dataset = ?", (dataset,)) if dataset is not None else ("", ())
        victims, freed = [], 0
        for key, size in db.execute(f"SELECT key, size FROM pages {where} ORDER BY accessed_at", args):
            victims.append(key)
            freed += size
            if freed >= need:
                break
        db.executemany("DELETE FROM pages WHERE key = ?", [(k,) for k in victims])
        return victims

    @contextlib.contextmanager
    def _page_lock(self, key: str) -> Iterator[bool]:
        """Holds the page's lock in this process and across processes; yields False (no lock, no
        caching) when the cache is unusable."""
        with self._state_lock:
            entry = self._page_locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                fd = -1
                if self._usable():
                    try:
                        fd = _lock_slot(self.root / "locks", xxhash.xxh3_64_intdigest(key.encode()) % _LOCK_SLOTS)
                    except OSError as e:
                        self._warn("lock", f"cannot lock the cache ({e.strerror or e}): read from the origin")
                        self._mark_broken()  # the next operation rebuilds the folder if it can
                if fd < 0:
                    yield False
                    return
                try:
                    yield True
                finally:
                    os.close(fd)  # releases the lock
        finally:
            with self._state_lock:
                entry[1] -= 1
                if entry[1] == 0:
                    self._page_locks.pop(key, None)

    def _run_all(self, fn, items) -> None:
        if len(items) == 1 or self.config.fetch_threads <= 1:
            for it in items:
                fn(it)
            return
        with self._state_lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.config.fetch_threads, thread_name_prefix="dyna-cache")
            pool = self._pool
        for f in [pool.submit(fn, it) for it in items]:
            f.result()

    # ---- access times -------------------------------------------------------------------------
    def _touch(self, key: str) -> None:
        with self._state_lock:
            self._touched[key] = self._clock()

    def _maybe_flush_touches(self) -> None:
        if len(self._touched) >= _TOUCH_BATCH or time.monotonic() - self._touched_at > _TOUCH_EVERY_S:
            self._flush_touches()

    def _flush_touches(self, db: sqlite3.Connection | None = None) -> None:
        self._touched_at = time.monotonic()
        with self._state_lock:
            if not self._touched:
                return
            batch, self._touched = self._touched, {}
        rows = [(t, k) for k, t in batch.items()]
        update = "UPDATE pages SET accessed_at = max(accessed_at, ?) WHERE key = ?"
        if db is not None:
            db.executemany(update, rows)
        else:
            self._with_index(lambda d: d.executemany(update, rows))

    # ---- the index and its health -------------------------------------------------------------
    def _usable(self) -> bool:
        if self._pid == os.getpid() and self._db is not None:
            return True
        return self._ready()

    def _ready(self) -> bool:
        """Open (or reopen after a fork, or rebuild after the folder vanished) the index."""
        with self._state_lock:
            if self._pid == os.getpid() and self._db is not None:
                return True
            if time.monotonic() < self._broken_until:
                return False
            self._close_handles()
            try:
                try:
                    self._db, self._db_ino = _open_index(self.root)
                except sqlite3.DatabaseError as e:
                    if not _is_corruption(e):
                        raise
                    self._warn("corrupt", f"cache index corrupt ({e}): resetting the cache")
                    self._reset()
                    self._db, self._db_ino = _open_index(self.root)
                self._pid = os.getpid()
                return True
            except (OSError, sqlite3.Error) as e:
                self._broken_until = time.monotonic() + _RETRY_BROKEN_S
                self._warn("open", f"cache at {self.root} unusable ({e}): reading from the origin")
                return False

    def _with_index(self, fn):
        """Runs ``fn(db)`` under the index lock; on failure marks the cache broken, returns None."""
        if not self._usable():
            return None
        with self._state_lock:
            db = self._db
            try:
                if db is None:
                    return None
                if self._index_moved():
                    raise OSError(errno.ENOENT, "cache index vanished")
                return fn(db)
            except sqlite3.DatabaseError as e:
                if _is_corruption(e):
                    self._warn("corrupt", f"cache index corrupt ({e}): resetting the cache")
                    self._reset()
                else:
                    self._warn("index", f"cache index error ({e}): reading from the origin")
                    self._mark_broken()
            except OSError as e:
                self._warn("index", f"cache index unavailable ({e.strerror or e}): reading from the origin")
                self._mark_broken()
            return None

    def _index_moved(self) -> bool:
        try:
            st = os.stat(self.root / "index.sqlite")
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._db_ino

    def _mark_broken(self) -> None:
        with self._state_lock:
            self._close_handles()
            self._pid = -1  # the next operation tries to rebuild

    def _reset(self) -> None:
        with self._state_lock:
            self._close_handles()
            with contextlib.suppress(OSError):
                shutil.rmtree(self.root / "pages")
            for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
                _unlink(self.root / name)
            self._pid = -1

    def _after_fork(self) -> None:
        """In a forked child (DataLoader workers): fresh locks, no inherited pool, and the parent's
        SQLite connection left alone (closing it here would disturb the parent's locks)."""
        self._stats_lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._page_locks = {}
        self._pool = None
        self._touched = {}
        if self._db is not None:
            _INHERITED.append(self._db)
        self._db = None
        self._pid = -1

    def _close_handles(self) -> None:
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db.close()
        self._db = None

    def _known_object(self, url: str):
        row = self._with_index(
            lambda db: db.execute("SELECT version, size, checked_at FROM objects WHERE url = ?", (url,)).fetchone()
        )
        if not row:
            return None
        return ObjectInfo(key=url, size=row[1], version=row[0]), row[2]

    # ---- counters and warnings ----------------------------------------------------------------
    def _count(self, **delta: int) -> None:
        with self._stats_lock:
            for k, v in delta.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

    def _warn(self, kind: str, message: str) -> None:
        message = redact(message)
        with self._stats_lock:
            self.stats.warnings += 1
            self.stats.last_warning = message
            now = time.monotonic()
            loud = now - self._warned.get(kind, -1e9) > _WARN_EVERY_S
            if loud:
                self._warned[kind] = now
        if loud:
            log.warning(message)


_LIVE: weakref.WeakSet[PageCache] = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []  # a parent's connections, kept open (never used) in a forked child


def _reinit_after_fork() -> None:
    for cache in list(_LIVE):
        cache._after_fork()


os.register_at_fork(after_in_child=_reinit_after_fork)


_SCHEMA = (
    """CREATE TABLE pages (
        key TEXT PRIMARY KEY, dataset TEXT NOT NULL, size INTEGER NOT NULL,
        fetched_at REAL NOT NULL, accessed_at REAL NOT NULL) WITHOUT ROWID""",
    "CREATE INDEX pages_lru ON pages (accessed_at)",
    "CREATE INDEX pages_dataset_lru ON pages (dataset, accessed_at)",
    "CREATE INDEX pages_fetched ON pages (fetched_at)",
    "CREATE TABLE usage (dataset TEXT PRIMARY KEY, bytes INTEGER NOT NULL)",
    """CREATE TRIGGER pages_added AFTER INSERT ON pages BEGIN
        INSERT INTO usage VALUES (new.dataset, new.size)
        ON CONFLICT (dataset) DO UPDATE SET bytes = bytes + new.size;
    END""",
    """CREATE TRIGGER pages_removed AFTER DELETE ON pages BEGIN
        UPDATE usage SET bytes = bytes - old.size WHERE dataset = old.dataset;
    END""",
    """CREATE TABLE objects (
        url TEXT PRIMARY KEY, version TEXT NOT NULL, size INTEGER NOT NULL, checked_at REAL NOT NULL)""",
)


def _open_index(root: Path) -> tuple[sqlite3.Connection, tuple[int, int]]:
    """The index of ``root``, created, or rebuilt when it is of another format than ``_FORMAT``."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "index.sqlite"
    db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    old_pages = None
    try:
        _set_wal(db)
        db.execute("PRAGMA synchronous=NORMAL")
        if db.execute("PRAGMA user_version").fetchone()[0] != _FORMAT:
            with _immediate(db):  # one process rebuilds; the others wait here, then find it done
                if db.execute("PRAGMA user_version").fetchone()[0] != _FORMAT:
                    old_pages = _rebuild_index(db, root)
        (root / "pages").mkdir(exist_ok=True)
        st = os.stat(path)
    except BaseException:
        db.close()
        raise
    if old_pages is not None:
        shutil.rmtree(old_pages, ignore_errors=True)
    return db, (st.st_dev, st.st_ino)


def _set_wal(db: sqlite3.Connection, wait_s: float = 60.0) -> None:
    """Switch ``db`` to WAL, retrying while another process holds the file: SQLite answers a journal-mode
    change that meets another connection's lock with SQLITE_BUSY at once, without calling the busy
    handler (two processes opening a new or rollback-journal index at the same moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _rebuild_index(db: sqlite3.Connection, root: Path) -> Path | None:
    """In a write transaction: drop whatever schema is there, create this format's, and move the
    pages folder aside (returned, to be removed after the commit)."""
    found = db.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    for kind, name in found:
        if kind in ("table", "trigger"):  # a table's indexes go with it
            db.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {_FORMAT}")
    pages = root / "pages"
    if not pages.exists():
        return None
    aside = root / f".pages-format-rebuild-{os.getpid()}-{time.time_ns()}"
    os.rename(pages, aside)
    if found:
        log.warning("cache at %s had another on-disk format: rebuilt (format %d)", root, _FORMAT)
    return aside


# struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid), native alignment: 32 bytes
_FLOCK = struct.Struct("@hhqqi4x")


def _bitmap_bytes(nblocks: int) -> int:
    """Bytes of a page's block bitmap (bit k of byte k // 8: block k present), padded to 8 so the
    checksums after it stay aligned."""
    return -(-nblocks // 64) * 8


def _all_set(bits: bytes, k0: int, k1: int) -> bool:
    """Whether blocks [k0, k1) are all marked present."""
    return all(bits[k >> 3] >> (k & 7) & 1 for k in range(k0, k1))


def _lock_slot(path: Path, slot: int) -> int:
    """A descriptor holding an exclusive lock on byte ``slot`` of the lock file; closing it unlocks.

    Open-file-description locks (F_OFD_SETLKW), not lockf: POSIX record locks belong to the
    process, so the fetch threads of one process would share them, and the kernel reports a
    deadlock when two processes' threads wait on each other's slots."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot, 1, 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_corruption(e: sqlite3.Error) -> bool:
    return "malformed" in str(e) or "not a database" in str(e)


@contextlib.contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")  # takes the write lock up front: no upgrade deadlocks between processes
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _unlink(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(path)


__all__ = ["CacheConfig", "CacheStats", "PageCache"]
