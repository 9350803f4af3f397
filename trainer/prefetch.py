"""Origin prefetch: the byte ranges of the decode units a worker reads next, fetched into the node page
cache before the decode asks for them, so a cold epoch reads straight from ``gs://``, ``s3://`` or
``file://`` without a prewarm step (prewarm stays an option: what it warmed is found present here).

The order of every sample is a pure function of (seed, epoch): a worker knows which units it decodes
next (``trainer.elastic``). For each one, from the MCAP's chunk index (``storage.prewarm.episode_ranges``
over the unit's sample windows, the read profile's topic groups and stream), the chunks it will read
are cut into per-page pieces and warmed by a pool of threads: several origin requests in flight, one
piece of at most a page each, so at most ``parallel`` pages of bytes in flight. The page cache fetches
only the blocks a piece lacks (ranged fills) and each block once on the node (page locks across
processes): a second rank or worker on the node finds them warm.

A piece that fails (the store does not answer, a timeout) is tried again after a back-off, ``attempts``
times in all; then its unit is marked failed with the reason, naming the object, and the loader fails
that unit's samples only (``GopDataset.bad_samples``). An object rewritten since the plan (another
version) is not retried; one gone from the origin is left to the decode, whose read raises
``MissingDataError`` naming it (the trainer stops on that, as without the prefetch).

Why not fsspec's readahead caches: they read ahead sequentially within one open file; the next unit's
chunks are elsewhere in the file, or in another file, and known only from the sample order.

No Dagster import: DataLoader workers import it. One prefetcher per worker process (threads do not
survive a fork: it is made on first use in the process that iterates).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.storage.origins import ObjectChangedError
from dyna_resources.storage.page_cache import PageCache
from dyna_resources.storage.prewarm import ReadSet, episode_ranges, page_pieces
from dyna_resources.storage.stores import StoreUnavailableError, redact

log = logging.getLogger("dyna.prefetch")

_READERS = 32  # episode summaries kept open per prefetcher


@dataclass
class UnitFetch:
    """One unit's prefetch: its pieces left, bytes asked for and fetched, and the first failure."""

    url: str
    pieces_left: int = -1  # -1: not planned yet
    bytes_wanted: int = 0
    bytes_fetched: int = 0
    error: str | None = None
    gone: bool = False  # the object is not at the origin: the decode's own read says so (MissingDataError)
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class PrefetchStats:
    units: int = 0
    pieces: int = 0
    bytes_wanted: int = 0  # bytes of the units' chunk ranges
    bytes_fetched: int = 0  # of them, what came from the origin (the rest was warm)
    retries: int = 0
    failed_units: int = 0


class OriginPrefetcher:
    """Warms units' byte ranges into ``cache`` ahead of their decode (see the module doc).

    :param open_file: opens an MCAP URL for reading its summary (the trainer's ``CachedFileSystem.open``).
    :param read_set: the topic groups, cameras and video stream the loader reads.
    :param parallel: pieces fetched at once (each at most one cache page).
    :param attempts: tries of a piece before its unit is failed; ``retry_wait_s`` doubles after each.
    """

    def __init__(
        self,
        cache: PageCache,
        open_file: Callable[[str], IO[bytes]],
        read_set: ReadSet,
        *,
        parallel: int = 8,
        attempts: int = 3,
        retry_wait_s: float = 0.5,
        keep_units: int = 4096,
    ):
        if parallel < 1 or attempts < 1:
            raise ValueError("parallel and attempts must be >= 1")
        self.cache, self.open_file, self.read_set = cache, open_file, read_set
        self.attempts, self.retry_wait_s, self.keep_units = attempts, retry_wait_s, keep_units
        self.stats = PrefetchStats()
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="dyna-prefetch")
        self._lock = threading.Lock()
        self._units: OrderedDict[object, UnitFetch] = OrderedDict()
        self._readers: OrderedDict[str, EpisodeReader] = OrderedDict()
        self._closed = False
        self._stop = threading.Event()  # wakes a retry's back-off when the prefetcher closes

    def add(self, key: object, url: str, starts_ns: Sequence[int], ends_ns: Sequence[int]) -> None:
        """Fetch what reading ``url`` over the windows ``[starts_ns[i], ends_ns[i]]`` touches, under ``key``
        (the caller's unit identity; a key already added is not fetched again)."""
        with self._lock:
            if self._closed or key in self._units:
                return
            unit = self._units[key] = UnitFetch(url)
            while len(self._units) > self.keep_units:
                self._units.popitem(last=False)
            self.stats.units += 1
        self._pool.submit(self._plan, unit, np.asarray(starts_ns, np.int64), np.asarray(ends_ns, np.int64))

    def error(self, key: object) -> str | None:
        """Why the unit's bytes could not be fetched (None: fine, or still in flight, or never added)."""
        unit = self._units.get(key)
        return unit.error if unit is not None else None

    def unit(self, key: object) -> UnitFetch | None:
        return self._units.get(key)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)  # the pieces in flight end (no more retries)
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()

    # ---- in the pool --------------------------------------------------------------------------
    def _plan(self, unit: UnitFetch, starts: np.ndarray, ends: np.ndarray) -> None:
        try:
            reader = self._reader(unit.url)
            info = self.cache.info(unit.url)
            ranges = episode_ranges(reader, starts.tolist(), ends.tolist(), self.read_set)
        except FileNotFoundError:
            unit.gone = True
            unit.done.set()
            return
        except ObjectChangedError as e:
            self._fail(unit, str(e))
            return
        except Exception as e:  # the summary unreadable (store down, damaged file): the decode will say which
            self._fail(unit, f"its chunk index could not be read: {type(e).__name__}: {e}")
            return
        pieces = page_pieces(ranges, self.cache.config.page_size)
        unit.pieces_left = len(pieces)
        unit.bytes_wanted = sum(b - a for a, b in pieces)
        with self._lock:
            self.stats.pieces += len(pieces)
            self.stats.bytes_wanted += unit.bytes_wanted
        if not pieces:
            unit.done.set()
        for a, b in pieces:
            if self._closed:
                return
            self._pool.submit(self._piece, unit, info, a, b)

    def _piece(self, unit: UnitFetch, info, a: int, b: int) -> None:
        why = None
        for attempt in range(self.attempts):
            if unit.error is not None or self._closed:
                break
            try:
                _, fetched, _, _ = self.cache.warm(unit.url, a, b, info=info)
                with self._lock:  # the unit's pieces finish on several threads
                    unit.bytes_fetched += fetched
                    self.stats.bytes_fetched += fetched
                why = None
                break
            except FileNotFoundError:  # gone: the decode's read names it (the trainer stops on a gone object)
                unit.gone = True
                break
            except ObjectChangedError as e:  # another version: no retry helps
                why = f"{type(e).__name__}: {e}"
                break
            except (StoreUnavailableError, OSError, TimeoutError) as e:
                why = f"{type(e).__name__}: {e}"
                if attempt + 1 < self.attempts:
                    with self._lock:
                        self.stats.retries += 1
                    self._stop.wait(self.retry_wait_s * 2**attempt)
        if why is not None and unit.error is None:
            self._fail(unit, f"bytes {a}-{b} could not be fetched after {self.attempts} attempt(s): {why}")
        with self._lock:
            unit.pieces_left -= 1
            if unit.pieces_left <= 0:
                unit.done.set()

    def _fail(self, unit: UnitFetch, why: str) -> None:
        unit.error = redact(f"{unit.url}: {why}")
        with self._lock:
            self.stats.failed_units += 1
        log.warning("prefetch failed: %s", unit.error)
        unit.done.set()

    def _reader(self, url: str) -> EpisodeReader:
        with self._lock:
            r = self._readers.get(url)
            if r is not None:
                self._readers.move_to_end(url)
                return r
        r = EpisodeReader(self.open_file(url))
        with self._lock:
            self._readers[url] = r
            while len(self._readers) > _READERS:
                self._readers.popitem(last=False)[1].close()
        return r


__all__ = ["OriginPrefetcher", "PrefetchStats", "UnitFetch"]
