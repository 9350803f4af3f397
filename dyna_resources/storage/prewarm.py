"""Prewarm: put exactly a manifest's working set into the page cache before training starts.

A manifest row is one segment ``[start_ns, end_ns]`` of one MCAP file (``uri``). A training sample
of a segment reads, per file, what ``EpisodeReader`` reads: the footer and summary at open, the
metadata records, and the chunks of the topic groups it needs whose time span meets the segment
(camera chunks widened by the frame tolerance, proprio chunks by one block, as the reader does).
The chunk index in each file's summary says where those chunks are, so the plan is exact without
reading any chunk: only the summaries are read (through the cache, so they are warmed on the way).

``plan_manifest`` computes the byte ranges per file, ``prewarm`` turns them into pages and fetches
the missing ones in parallel, and reports bytes, pages, time, throughput and what was already warm.
Plain Python, no Dagster import.
"""

from __future__ import annotations

import hashlib
import json
import queue
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..episodes.errors import McapFormatError
from ..episodes.mcap_reader import EpisodeReader
from ..episodes.read_profile import TOPIC_GROUPS, ReadProfile
from ..episodes.topics import camera_topic, is_camera_topic, is_training_camera_topic, parse_training_camera_topic
from ..figures import gigabytes, rounded
from .cache_fs import CachedFileSystem
from .page_cache import PageCache
from .stores import ObjectInfo, StoreUnavailableError, redact


@dataclass(frozen=True)
class ReadSet:
    """What a training run reads of each segment: topic groups of the read profile, optionally
    narrowed to some cameras / streams (``None``: all of the group's topics)."""

    groups: tuple[str, ...] = ("cameras", "proprio")
    cameras: tuple[str, ...] | None = None
    streams: tuple[str, ...] | None = None
    frame_tolerance_ns: int | None = None  # default: one frame period, as EpisodeReader.read_frames
    profile: ReadProfile = TOPIC_GROUPS
    # The video the run reads: None, the archive cameras; a training stream's name (``dyna
    # training-streams``), that stream's cameras instead. Training streams are never warmed otherwise.
    video_stream: str | None = None

    def data_version(self, manifest_sha256: str) -> str:
        """The version of a cache set: the manifest's bytes, the topic groups and the video warmed of it."""
        warmed: list = [manifest_sha256, list(self.groups)]
        if self.video_stream is not None:  # the archive cameras keep the versions they always had
            warmed.append(self.video_stream)
        return hashlib.sha256(json.dumps(warmed).encode()).hexdigest()

    def __post_init__(self):
        unknown = set(self.groups) - {g.name for g in self.profile.groups}
        if unknown:
            raise ValueError(
                f"read set names unknown topic groups {sorted(unknown)} "
                f"(profile {self.profile.name!r} has {[g.name for g in self.profile.groups]})"
            )


@dataclass
class FilePlan:
    url: str
    info: ObjectInfo
    ranges: list[tuple[int, int]]  # sorted, disjoint [start, end)

    @property
    def bytes(self) -> int:
        return sum(e - s for s, e in self.ranges)


@dataclass
class Plan:
    files: list[FilePlan]
    segments: int
    errors: dict[str, str] = field(default_factory=dict)  # url -> why it cannot be prewarmed

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass
class PrewarmReport:
    files: int
    segments: int
    ranges_bytes: int  # the exact bytes the plan's reads touch
    pages: int  # pieces warmed: the ranges cut at page boundaries
    bytes: int  # bytes of those pieces (the ranges' bytes; fetched or already warm)
    fetched_pages: int
    fetched_bytes: int  # bytes from the origin: the 16 KiB blocks the pieces lacked
    warm_pages: int  # already in the cache before this prewarm
    warm_bytes: int
    plan_s: float
    fetch_s: float
    errors: dict[str, str]

    @property
    def seconds(self) -> float:
        return self.plan_s + self.fetch_s

    @property
    def fetched_MBps(self) -> float:
        return self.fetched_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_metadata(self) -> dict:
        """The figures a cache set's materialization shows: sizes in GB, floats to four significant digits
        (:mod:`dyna_resources.figures`)."""
        return {
            "files": self.files,
            "segments": self.segments,
            "working_set_GB": gigabytes(self.ranges_bytes),
            "pages": self.pages,
            "warmed_GB": gigabytes(self.bytes),
            "fetched_pages": self.fetched_pages,
            "fetched_GB": gigabytes(self.fetched_bytes),
            "already_warm_pages": self.warm_pages,
            "seconds": rounded(self.seconds),
            "fetched_MBps": rounded(self.fetched_MBps),
            "errors": dict(self.errors),
        }

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(
            seconds=round(self.seconds, 3),
            fetched_MBps=round(self.fetched_MBps, 1),
            plan_s=round(self.plan_s, 3),
            fetch_s=round(self.fetch_s, 3),
        )
        return d


def plan_manifest(
    manifest: pa.Table, fs: CachedFileSystem, read_set: ReadSet = ReadSet(), *, parallel: int = 8
) -> Plan:
    """The exact byte ranges per MCAP file that reading every segment of ``manifest`` touches."""
    uris = manifest.column("uri").combine_chunks()
    if pa.types.is_dictionary(uris.type):
        uris = uris.dictionary_decode()
    starts = manifest.column("start_ns").to_numpy()
    ends = manifest.column("end_ns").to_numpy()
    order = np.argsort(np.asarray(uris.to_numpy(zero_copy_only=False), dtype=object), kind="stable")
    sorted_uris = uris.take(pa.array(order)).to_pylist()
    groups: dict[str, list[int]] = {}
    for pos, u in zip(order.tolist(), sorted_uris):
        groups.setdefault(u, []).append(pos)

    def one(url: str, rows: list[int]):
        idx = np.asarray(rows)
        with fs.open(url) as f, EpisodeReader(f) as reader:
            ranges = episode_ranges(reader, starts[idx], ends[idx], read_set)
            return FilePlan(url, f.info, ranges)

    files, errors = [], {}
    with ThreadPoolExecutor(max(1, parallel)) as pool:
        futures = {pool.submit(one, u, rows): u for u, rows in groups.items()}
        for fut in as_completed(futures):
            url = futures[fut]
            try:
                files.append(fut.result())
            except FileNotFoundError:
                errors[url] = "object not found at the origin"
            except (McapFormatError, StoreUnavailableError, OSError) as e:
                errors[url] = redact(str(e))
    files.sort(key=lambda p: p.url)
    return Plan(files=files, segments=len(manifest), errors=errors)


def episode_ranges(
    reader: EpisodeReader, starts_ns: Sequence[int], ends_ns: Sequence[int], read_set: ReadSet = ReadSet()
) -> list[tuple[int, int]]:
    """Byte ranges of one MCAP file read by samples of the segments ``[starts_ns[i], ends_ns[i]]``."""
    ranges = [(f.offset, f.offset + f.length) for f in reader.open_log.fetches]  # footer + summary
    ranges += [(m.offset, m.offset + m.length) for m in reader.summary.metadata_indexes]
    windows = _union(np.asarray(starts_ns, np.int64), np.asarray(ends_ns, np.int64))
    wanted = set(read_set.groups)
    for channel in reader.channels.values():
        topic = channel.topic
        chunks = reader.chunks_of(topic)
        # A training stream's camera counts as its archive camera (same group, same camera name);
        # only the video the run reads is warmed: the archive cameras or one training stream.
        stream, source = parse_training_camera_topic(topic) if is_training_camera_topic(topic) else (None, topic)
        if stream is not None:
            source = camera_topic(source)
        video = stream is not None or is_camera_topic(topic)
        group = read_set.profile.group_of(source)
        if group.name not in wanted or not chunks or (video and stream != read_set.video_stream):
            continue
        name = topic.rsplit("/", 1)[-1]
        if group.name == "cameras" or video:
            if read_set.cameras is not None and name not in read_set.cameras:
                continue
            tol = read_set.frame_tolerance_ns
            if tol is None:
                rate = float(channel.metadata.get("rate_hz", 0) or 0)
                tol = int(1e9 / rate) if rate > 0 else 0
            lo_pad, hi_pad = tol, tol
        else:
            if read_set.streams is not None and topic.lstrip("/") not in read_set.streams:
                continue
            lo_pad, hi_pad = int(channel.metadata.get("block_ns", 0)), 0
        c_start = np.fromiter((c.message_start_time for c in chunks), np.int64, len(chunks))
        c_end = np.fromiter((c.message_end_time for c in chunks), np.int64, len(chunks))
        hit = _overlaps(c_start, c_end, windows[0] - lo_pad, windows[1] + hi_pad)
        ranges += [
            (c.chunk_start_offset, c.chunk_start_offset + c.chunk_length) for c, h in zip(chunks, hit.tolist()) if h
        ]
    return _merge(ranges)


def prewarm(
    plan: Plan,
    cache: PageCache,
    *,
    dataset: str = "",
    parallel: int = 16,
    progress: Callable[[PrewarmProgress], None] | None = None,
    progress_every_s: float = 30.0,
    plan_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> PrewarmReport:
    """Fetch every page of ``plan`` that the cache lacks, ``parallel`` pages at a time. ``progress``
    hears where it stands when it starts, at least every ``progress_every_s`` (``clock`` seconds), and
    when it is done."""
    work = [(f, a, b) for f in plan.files for a, b in page_pieces(f.ranges, cache.config.page_size)]
    t0 = time.perf_counter()
    totals = np.zeros(4, np.int64)
    errors = dict(plan.errors)
    report = _Reporter(progress, len(work), progress_every_s, clock)

    def warm_page(item):
        f, a, b = item
        return cache.warm(f.url, a, b, info=f.info, dataset=dataset)

    finished: queue.SimpleQueue = queue.SimpleQueue()
    with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="prewarm") as pool:
        futures = {}
        for w in work:
            fut = pool.submit(warm_page, w)
            futures[fut] = w
            fut.add_done_callback(finished.put)
        left, done_bytes = len(futures), 0
        while left:
            # the next page done, or a report due: one is logged even while a page is slow (a queue of the
            # done futures, not wait() on all of them, which costs a pass over every pending page each time)
            try:
                fut = finished.get(timeout=report.wait_s())
            except queue.Empty:
                report.pages(0, done_bytes, int(totals[1]), final=False)
                continue
            left -= 1
            try:
                totals += fut.result()
                _, a, b = futures[fut]
                done_bytes += b - a
            except (FileNotFoundError, StoreUnavailableError, OSError, RuntimeError) as e:
                errors.setdefault(futures[fut][0].url, redact(str(e)))
            report.pages(1, done_bytes, int(totals[1]), final=not left)
    if not work:
        report.pages(0, 0, 0, final=True)
    cache.flush()
    fetch_s = time.perf_counter() - t0
    return PrewarmReport(
        files=len(plan.files),
        segments=plan.segments,
        ranges_bytes=plan.bytes,
        pages=len(work),
        bytes=done_bytes if work else 0,
        fetched_pages=int(totals[0]),
        fetched_bytes=int(totals[1]),
        warm_pages=int(totals[2]),
        warm_bytes=int(totals[3]),
        plan_s=plan_s,
        fetch_s=fetch_s,
        errors=errors,
    )


def prewarm_manifest(
    manifest: pa.Table,
    cache: PageCache,
    read_set: ReadSet = ReadSet(),
    *,
    dataset: str = "",
    parallel: int = 16,
    progress: Callable[[PrewarmProgress], None] | None = None,
    progress_every_s: float = 30.0,
) -> PrewarmReport:
    """``plan_manifest`` then ``prewarm``: the one call a launcher makes before training."""
    t0 = time.perf_counter()
    pages0, bytes0 = cache.stats.origin_requests, cache.stats.origin_bytes
    plan = plan_manifest(manifest, CachedFileSystem(cache, dataset=dataset), read_set, parallel=min(parallel, 8))
    report = prewarm(
        plan,
        cache,
        dataset=dataset,
        parallel=parallel,
        progress=progress,
        progress_every_s=progress_every_s,
        plan_s=time.perf_counter() - t0,
    )
    # Planning read each file's summary through the cache: those pages were fetched by this prewarm too.
    pages, nbytes = (
        cache.stats.origin_requests - pages0 - report.fetched_pages,
        cache.stats.origin_bytes - bytes0 - report.fetched_bytes,
    )
    pages, nbytes = min(pages, report.warm_pages), min(nbytes, report.warm_bytes)
    report.fetched_pages += pages
    report.fetched_bytes += nbytes
    report.warm_pages -= pages
    report.warm_bytes -= nbytes
    return report


# ---- helpers -------------------------------------------------------------------------------------
def page_pieces(ranges: Iterable[tuple[int, int]], page_size: int) -> list[tuple[int, int]]:
    """Merged ``ranges`` cut at page boundaries, in file order: the cache fetches the blocks of each
    piece only (two ranges in one page are two pieces)."""
    pieces = []
    for s, e in _merge(ranges):
        for p in range(s // page_size, (e - 1) // page_size + 1) if s < e else ():
            pieces.append((max(s, p * page_size), min(e, (p + 1) * page_size)))
    return pieces


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the closed intervals [starts[i], ends[i]]."""
    if len(starts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    tails = np.append(heads[1:] - 1, len(s) - 1)
    return s[heads], reach[tails]


def _overlaps(c_start, c_end, w_start, w_end) -> np.ndarray:
    """For each closed interval [c_start, c_end]: does it meet any of the disjoint sorted windows?"""
    if len(w_start) == 0:
        return np.zeros(len(c_start), bool)
    # the last window starting at or before the chunk's end is the only candidate
    i = np.searchsorted(w_start, c_end, side="right") - 1
    ok = i >= 0
    return ok & (w_end[np.clip(i, 0, None)] >= c_start)


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


@dataclass(frozen=True)
class PrewarmProgress:
    """Where a prewarm stands: pages done of the plan's, their bytes (``fetched_bytes`` of them came
    from the origin, the rest were warm already)."""

    pages_done: int
    pages_total: int
    bytes_done: int
    fetched_bytes: int
    elapsed_s: float

    @property
    def mb_per_s(self) -> float:
        return self.fetched_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the page rate so far; None before the first page."""
        if self.pages_done >= self.pages_total:
            return 0.0
        if self.pages_done == 0 or self.elapsed_s <= 0:
            return None
        return (self.pages_total - self.pages_done) * self.elapsed_s / self.pages_done

    def summary(self) -> str:
        eta = self.eta_s
        return (
            f"{self.pages_done}/{self.pages_total} pages, {self.bytes_done / 1e6:,.1f} MB "
            f"({self.fetched_bytes / 1e6:,.1f} MB fetched at {self.mb_per_s:.1f} MB/s), "
            f"{self.elapsed_s:.0f} s elapsed, ETA {f'{eta:.0f} s' if eta is not None else '?'}"
        )


class _Reporter:
    """Calls ``progress`` at the start, whenever ``every_s`` has passed since the last call, and at the end."""

    def __init__(self, progress, total: int, every_s: float, clock: Callable[[], float]):
        self.progress, self.total, self.every_s, self.clock = progress, total, every_s, clock
        self.t0 = self.last = clock()
        self.done = 0
        if progress is not None:
            progress(PrewarmProgress(0, total, 0, 0, 0.0))

    def wait_s(self) -> float | None:
        return None if self.progress is None else max(0.0, self.last + self.every_s - self.clock())

    def pages(self, n: int, bytes_done: int, fetched: int, *, final: bool) -> None:
        self.done += n
        now = self.clock()
        if self.progress is not None and (final or now - self.last >= self.every_s):
            self.last = now
            self.progress(PrewarmProgress(self.done, self.total, bytes_done, fetched, now - self.t0))


__all__ = [
    "FilePlan",
    "Plan",
    "PrewarmReport",
    "ReadSet",
    "episode_ranges",
    "plan_manifest",
    "prewarm",
    "prewarm_manifest",
]
