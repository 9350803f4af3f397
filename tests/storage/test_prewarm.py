"""Prewarm plans exactly a manifest's working set from the MCAP chunk index; after it, reading every
sample of the manifest costs the origin nothing."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from dyna_resources.storage.cache_fs import CachedFileSystem
from dyna_resources.storage.page_cache import CacheConfig, PageCache
from dyna_resources.storage.prewarm import (
    PrewarmProgress,
    ReadSet,
    _overlaps,
    _union,
    plan_manifest,
    prewarm,
    prewarm_manifest,
)

PAGE = 64 * 1024
SEGMENT_NS, STRIDE_NS = 2_000_000_000, 1_000_000_000


@pytest.fixture(scope="module")
def fleet(episode_factory, tmp_path_factory):
    """Three transcoded episodes (1 s GOPs); the manifest uses two of them."""
    out = tmp_path_factory.mktemp("mcap")
    uris = []
    for i in range(3):
        gen = episode_factory(episode_id=f"ep-prewarm-{i}", seed=100 + i, duration_s=6.0, width=160, height=120)
        path = out / f"ep{i}.mcap"
        transcode_episode(gen.path, path, TranscodeSettings(video=VideoSettings(gop_frames=30)))
        uris.append(f"file://{path}")
    return uris


def segments(uris: list[str]) -> pa.Table:
    rows = {"uri": [], "start_ns": [], "end_ns": []}
    for u in uris:
        with EpisodeReader(u.removeprefix("file://")) as r:
            start, end = r.start_ns, r.end_ns
        t = start
        while t + SEGMENT_NS <= end:
            rows["uri"].append(u)
            rows["start_ns"].append(t)
            rows["end_ns"].append(t + SEGMENT_NS)
            t += STRIDE_NS
    return pa.table(
        {"uri": pa.array(rows["uri"]).dictionary_encode(), "start_ns": rows["start_ns"], "end_ns": rows["end_ns"]}
    )


def read_every_sample(fs: CachedFileSystem, manifest: pa.Table, *, frames: bool = True) -> int:
    n = 0
    for row in manifest.to_pylist():
        with fs.open(row["uri"]) as f, EpisodeReader(f) as r:
            r.metadata()
            mid = (row["start_ns"] + row["end_ns"]) // 2
            times = [row["start_ns"], mid, row["end_ns"]] if frames else []
            got, streams = r.read_window(row["start_ns"], row["end_ns"], frame_times_ns=times, decode=False)
            assert streams and (not frames or all(len(fr.timestamps_ns) == 3 for fr in got.values()))
            n += 1
    return n


def cache_at(path) -> PageCache:
    return PageCache(CacheConfig(root=str(path), page_size=PAGE, block_size=4096))


def test_prewarm_then_every_sample_reads_nothing_from_the_origin(tmp_path, fleet):
    manifest = segments(fleet[:2])
    with cache_at(tmp_path / "c") as cache:
        report = prewarm_manifest(manifest, cache, dataset="train-a", parallel=4)
        assert report.errors == {}
        assert (report.files, report.segments) == (2, len(manifest))
        assert report.fetched_pages > 0 and report.warm_pages >= 0
        assert report.pages == report.fetched_pages + report.warm_pages
        assert set(cache.usage()) == {"train-a"}
        before = cache.stats.origin_bytes
        fs = CachedFileSystem(cache, dataset="train-a")
        assert read_every_sample(fs, manifest) == len(manifest)
        assert cache.stats.origin_bytes == before  # zero bytes from the origin after prewarm

        again = prewarm_manifest(manifest, cache, dataset="train-a")
        assert (again.fetched_pages, again.fetched_bytes) == (0, 0)
        assert again.warm_pages == again.pages == report.pages

        # an episode outside the manifest was not warmed
        other = segments(fleet[2:])
        before = cache.stats.origin_bytes
        read_every_sample(fs, other.slice(0, 1))
        assert cache.stats.origin_bytes > before


def test_plan_covers_only_the_groups_read(tmp_path, fleet):
    manifest = segments(fleet[:1])
    with cache_at(tmp_path / "c") as cache:
        fs = CachedFileSystem(cache)
        full = plan_manifest(manifest, fs)
        proprio = plan_manifest(manifest, fs, ReadSet(groups=("proprio",)))
        assert 0 < proprio.bytes < full.bytes / 3  # the camera chunks are most of the file
        prewarm(proprio, cache)
        before = cache.stats.origin_bytes
        read_every_sample(fs, manifest, frames=False)
        assert cache.stats.origin_bytes == before
        read_every_sample(fs, manifest.slice(0, 1), frames=True)
        assert cache.stats.origin_bytes > before  # frames were not in the proprio working set


def test_plan_of_a_short_window_holds_what_a_read_fetches_and_little_else(tmp_path, fleet):
    u = fleet[0]
    with EpisodeReader(u.removeprefix("file://")) as r:
        lo, hi = r.start_ns + 2_000_000_000, r.start_ns + 2_500_000_000
        whole = (r.start_ns, r.end_ns)
        r.metadata()
        r.read_window(lo, hi, frame_times_ns=np.linspace(lo, hi, 16).astype(np.int64).tolist(), decode=False)
        fetched = [(f.offset, f.offset + f.length) for f in r.open_log.fetches + r.log.fetches]
    with cache_at(tmp_path / "c") as cache:
        fs = CachedFileSystem(cache)
        plan = plan_manifest(pa.table({"uri": [u], "start_ns": [lo], "end_ns": [hi]}), fs)
        full = plan_manifest(pa.table({"uri": [u], "start_ns": [whole[0]], "end_ns": [whole[1]]}), fs)
    ranges = plan.files[0].ranges
    for s, e in fetched:
        assert any(a <= s and e <= b for a, b in ranges), (s, e)
    assert plan.bytes < 0.75 * full.bytes  # half a second of a six-second episode


def test_missing_file_is_reported_and_the_rest_is_warmed(tmp_path, fleet):
    manifest = pa.concat_tables(
        [
            segments(fleet[:1]).cast(
                pa.schema([("uri", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64())])
            ),
            pa.table({"uri": [f"file://{tmp_path}/gone.mcap"], "start_ns": [0], "end_ns": [1]}),
        ]
    )
    with cache_at(tmp_path / "c") as cache:
        report = prewarm_manifest(manifest, cache)
        assert list(report.errors) == [f"file://{tmp_path}/gone.mcap"]
        assert "not found" in report.errors[f"file://{tmp_path}/gone.mcap"]
        assert report.files == 1 and report.fetched_pages > 0


def test_corrupt_mcap_is_reported_not_raised(tmp_path, fleet):
    bad = tmp_path / "bad.mcap"
    bad.write_bytes(b"not an mcap at all" * 100)
    manifest = pa.table({"uri": [f"file://{bad}"], "start_ns": [0], "end_ns": [1]})
    with cache_at(tmp_path / "c") as cache:
        report = prewarm_manifest(manifest, cache)
    assert report.files == 0 and "MCAP" in report.errors[f"file://{bad}"]


def test_unknown_group_is_refused():
    with pytest.raises(ValueError, match="unknown topic groups"):
        ReadSet(groups=("cameras", "lidar"))


def test_interval_helpers():
    s, e = _union(np.array([5, 0, 2, 20]), np.array([6, 3, 4, 25]))
    assert s.tolist() == [0, 5, 20] and e.tolist() == [4, 6, 25]
    hit = _overlaps(np.array([-5, 4, 7, 10, 25, 26]), np.array([-1, 4, 9, 19, 30, 27]), s, e)
    assert hit.tolist() == [False, True, False, False, True, False]


def test_training_streams_are_warmed_only_when_the_run_reads_them(mcap_fleet, tmp_path):
    from dyna_resources.episodes.training_streams import TrainingStreamSpec, add_training_streams
    from dyna_resources.storage.prewarm import ReadSet, episode_ranges

    paths, _ = mcap_fleet
    path = tmp_path / "with-stream.mcap"
    add_training_streams(paths[0], path, [TrainingStreamSpec("t32", 32, 32, gop_frames=10, preset="veryfast")])
    with EpisodeReader(path) as r:
        start, end = [r.start_ns], [r.start_ns + 2_000_000_000]
        archive = set(episode_ranges(r, start, end, ReadSet()))
        stream = set(episode_ranges(r, start, end, ReadSet(video_stream="t32")))
        training_chunks = {
            (c.chunk_start_offset, c.chunk_start_offset + c.chunk_length)
            for cam in r.training_streams["t32"]
            for c in r.chunks_of(f"/training/t32/camera/{cam}")
        }
        camera_chunks = {
            (c.chunk_start_offset, c.chunk_start_offset + c.chunk_length)
            for cam in r.cameras
            for c in r.chunks_of(f"/camera/{cam}")
        }
        # chunks in the file's tail are warmed anyway: the open reads the last 64 KiB (footer + summary)
        tail = min(f.offset for f in r.open_log.fetches)
        training_chunks = {c for c in training_chunks if c[1] <= tail}
        assert training_chunks

    def covers(ranges, chunk):
        return any(s <= chunk[0] and chunk[1] <= e for s, e in ranges)

    assert not any(covers(archive, c) for c in training_chunks)  # the archive run never warms t32 ...
    assert any(covers(archive, c) for c in camera_chunks)
    assert any(covers(stream, c) for c in training_chunks)  # ... the t32 run warms t32, not the archive video
    assert not any(covers(stream, c) for c in camera_chunks)


def test_progress_is_heard_at_the_start_on_every_interval_and_at_the_end(tmp_path, fleet):
    manifest = segments(fleet[:1])
    with cache_at(tmp_path / "c") as cache:
        plan = plan_manifest(manifest, CachedFileSystem(cache))
        # A clock on which every page takes 10 s. It moves when a page's warm returns, in the pool's thread;
        # left alone, that thread can run pages ahead of the main loop (which reads the clock once before
        # and once after each page it counts), and one report would then cover several intervals. So each
        # warm waits until the main loop has counted the page before it: the reports fall where they must.
        warmed, main_reads = [0], [0]
        turn = threading.Condition()
        warm = cache.warm

        def clock() -> float:
            if threading.current_thread() is threading.main_thread():
                with turn:
                    main_reads[0] += 1
                    turn.notify_all()
            return 10.0 * warmed[0]

        def counted_warm(*args, **kwargs):
            out = warm(*args, **kwargs)
            with turn:  # the reporter's first read, then two for each page counted
                turn.wait_for(lambda: main_reads[0] >= 1 + 2 * warmed[0], timeout=10)
                warmed[0] += 1
            return out

        cache.warm = counted_warm  # type: ignore[method-assign]  # this cache's pages only, no global patch
        heard: list[PrewarmProgress] = []
        report = prewarm(plan, cache, parallel=1, progress=heard.append, progress_every_s=25, clock=clock)
    assert heard[0] == PrewarmProgress(0, report.pages, 0, 0, 0.0)
    last = heard[-1]
    assert (last.pages_done, last.bytes_done, last.fetched_bytes) == (report.pages, report.bytes, report.fetched_bytes)
    assert last.eta_s == 0.0 and f"{report.pages}/{report.pages} pages" in last.summary()
    # a report every third page (30 clock seconds), the start and the end: not one per page
    middle = [p.pages_done for p in heard[1:-1]]
    assert middle == list(range(3, report.pages, 3)), (middle, report.pages)
    assert all(b.elapsed_s - a.elapsed_s >= 25 for a, b in zip(heard, heard[1:-1]))
    assert [p.pages_done for p in heard] == sorted(p.pages_done for p in heard)


def test_progress_is_reported_while_a_page_is_slow(tmp_path, fleet):
    """No page finishes, yet a report comes: the log shows a slow prewarm is alive."""
    manifest = segments(fleet[:1])
    with cache_at(tmp_path / "c") as cache:
        plan = plan_manifest(manifest, CachedFileSystem(cache))
        heartbeat = threading.Event()
        warm = cache.warm

        def slow_warm(*args, **kwargs):
            assert heartbeat.wait(timeout=60), "no progress report while the page was slow"
            return warm(*args, **kwargs)

        def heard(p: PrewarmProgress) -> None:
            if p.elapsed_s > 0 and p.pages_done == 0:  # a report with nothing done: the heartbeat
                heartbeat.set()

        cache.warm = slow_warm  # type: ignore[method-assign]  # this cache's pages only, no global patch
        report = prewarm(plan, cache, parallel=2, progress=heard, progress_every_s=0.01)
    assert heartbeat.is_set() and report.errors == {}
