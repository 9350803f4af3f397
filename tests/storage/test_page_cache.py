"""The node page cache: byte-identical reads, eviction, TTL, integrity, fetch-once across processes,
versioned keys, and fallback to the origin when the cache directory is missing, full, unwritable
or corrupt."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import signal
import time
from pathlib import Path

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyna_resources.storage.cache_fs import CachedFileSystem
from dyna_resources.storage.origins import ObjectChangedError, Origins
from dyna_resources.storage.page_cache import CacheConfig, PageCache
from dyna_resources.storage.stores import StoreUnavailableError
from tests.gcs import gcs, gcs_emulator  # noqa: F401  (pytest fixtures, used as parameters)

KiB = 1024
PAGE = 64 * KiB
BLOCK = 4 * KiB


def small_config(root, **kw) -> CacheConfig:
    return CacheConfig(
        root=str(root), page_size=PAGE, block_size=BLOCK, capacity_bytes=kw.pop("capacity", 1 << 30), **kw
    )


def write(path: Path, n: int, seed: int = 0) -> bytes:
    data = os.urandom(n) if seed == 0 else bytes((i * seed + i // 7) % 251 for i in range(n))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def url(path: Path) -> str:
    return f"file://{path}"


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    root = tmp_path_factory.mktemp("origin")
    sizes = {"empty": 0, "tiny": 17, "page": PAGE, "odd": 5 * PAGE + 1234, "big": 11 * PAGE - 1}
    return {name: (url(root / name), write(root / name, n)) for name, n in sizes.items()}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    with PageCache(small_config(tmp_path_factory.mktemp("cache"), capacity=6 * PAGE)) as cache:
        yield cache


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["empty", "tiny", "page", "odd", "big"]),
    a=st.integers(0, 12 * PAGE),
    n=st.integers(0, 4 * PAGE),
)
def test_random_ranges_are_byte_identical_to_the_origin(objects, shared_cache, name, a, n):
    u, data = objects[name]
    assert bytes(shared_cache.read(u, a, a + n)) == data[a : a + n]
    assert sum(shared_cache.usage().values()) <= 6 * PAGE  # the small capacity forces evictions on the way


def test_a_miss_fetches_only_the_blocks_of_the_bytes_wanted_and_adds_to_the_page(tmp_path):
    """Ranged fills: a read fetches the blocks its bytes touch, not the page; a second range of the same
    page adds its blocks to the page file (in place) and the index counts the bytes the page holds."""
    origin = tmp_path / "o"
    data = write(origin / "a", 3 * PAGE)
    u = url(origin / "a")
    with PageCache(small_config(tmp_path / "c")) as cache:
        assert bytes(cache.read(u, 100, 200)) == data[100:200]  # inside block 0
        assert (cache.stats.origin_requests, cache.stats.origin_bytes) == (1, BLOCK)
        assert bytes(cache.read(u, 5 * BLOCK - 10, 7 * BLOCK + 1)) == data[5 * BLOCK - 10 : 7 * BLOCK + 1]
        assert cache.stats.origin_bytes == BLOCK + 4 * BLOCK  # blocks 4..7
        assert cache.page_count() == 1 and cache.usage() == {"": 5 * BLOCK}
        # the whole page: only its 11 missing blocks come from the origin, in runs (1-3, 8-15)
        assert bytes(cache.read(u, 0, PAGE)) == data[:PAGE]
        assert cache.stats.origin_bytes == PAGE and cache.stats.origin_requests == 4
        assert cache.usage() == {"": PAGE}
        assert bytes(cache.read(u, 0, PAGE)) == data[:PAGE] and cache.stats.origin_bytes == PAGE
    with PageCache(small_config(tmp_path / "c")) as again:  # another process's view: the same page file
        assert bytes(again.read(u, 3 * BLOCK, PAGE + 10)) == data[3 * BLOCK : PAGE + 10]
        assert again.stats.origin_bytes == BLOCK  # block 0 of page 1 only
        assert again.warm(u, 0, PAGE) == (0, 0, 1, PAGE)


def test_a_corrupt_block_of_a_partial_page_is_dropped_and_refetched(tmp_path):
    origin = tmp_path / "o"
    data = write(origin / "a", PAGE)
    u = url(origin / "a")
    with PageCache(small_config(tmp_path / "c")) as cache:
        cache.read(u, 0, 2 * BLOCK)
        (page,) = [p for p in (tmp_path / "c" / "pages").rglob("*") if p.is_file() and p.name.isdigit()]
        raw = bytearray(page.read_bytes())
        raw[len(raw) - PAGE + 10] ^= 0xFF  # block 0's data
        page.write_bytes(raw)
        assert bytes(cache.read(u, 0, 2 * BLOCK)) == data[: 2 * BLOCK]
        assert cache.stats.corrupt_pages == 1 and cache.stats.origin_bytes == 4 * BLOCK


def _fill_blocks(root: str, u: str, blocks: list[int], barrier, results) -> None:
    with PageCache(small_config(root)) as cache:
        barrier.wait()
        got = [bytes(cache.read(u, k * BLOCK, (k + 1) * BLOCK)) for k in blocks]
        results.put((blocks, got, cache.stats.origin_bytes))


def test_processes_filling_blocks_of_one_page_build_it_together(tmp_path):
    """Two processes adding different blocks to one page at once: every read is byte-identical, each
    block is fetched by one of them only, and the page ends whole."""
    origin = tmp_path / "o"
    data = write(origin / "a", PAGE)
    u = url(origin / "a")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    halves = [list(range(0, PAGE // BLOCK, 2)), list(range(1, PAGE // BLOCK, 2)) + [0, 2]]
    procs = [ctx.Process(target=_fill_blocks, args=(str(tmp_path / "c"), u, h, barrier, results)) for h in halves]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    for blocks, chunks, _ in got:
        assert chunks == [data[k * BLOCK : (k + 1) * BLOCK] for k in blocks]
    assert sum(fetched for *_, fetched in got) == PAGE  # blocks 0 and 2 were read twice, fetched once
    with PageCache(small_config(tmp_path / "c")) as cache:
        assert bytes(cache.read(u, 0, PAGE)) == data and cache.stats.origin_bytes == 0


def test_second_read_is_served_from_pages_without_the_origin(tmp_path, objects):
    u, data = objects["odd"]
    with PageCache(small_config(tmp_path / "c")) as cache:
        assert bytes(cache.read(u, 0, len(data))) == data
        assert (cache.stats.miss_pages, cache.stats.origin_bytes) == (6, len(data))
        assert bytes(cache.read(u, 100, len(data) - 5)) == data[100:-5]
        assert cache.stats.origin_bytes == len(data)
        assert cache.stats.hit_pages == 6
        assert cache.page_count() == 6


def test_eviction_keeps_usage_under_capacity_and_drops_least_recently_used(tmp_path):
    origin = tmp_path / "o"
    files = {i: write(origin / f"f{i}", 2 * PAGE) for i in range(6)}
    with PageCache(small_config(tmp_path / "c", capacity=5 * PAGE)) as cache:
        for i in (0, 1):
            cache.read(url(origin / f"f{i}"), 0, 2 * PAGE)
        cache.read(url(origin / "f0"), 0, 2 * PAGE)  # f0 is now more recent than f1
        cache.flush()
        for i in (2, 3):
            cache.read(url(origin / f"f{i}"), 0, 2 * PAGE)
            assert sum(cache.usage().values()) <= 5 * PAGE
        assert cache.page_count() == 5
        before = cache.stats.origin_bytes
        assert bytes(cache.read(url(origin / "f3"), 0, 2 * PAGE)) == files[3]
        assert cache.stats.origin_bytes == before  # the newest stayed
        cache.read(url(origin / "f1"), 0, PAGE)
        assert cache.stats.origin_bytes == before + PAGE  # f1 (least recent) was evicted first
        assert cache.stats.evicted_pages >= 3


def test_a_replaced_versions_pages_are_never_served_and_are_evicted_first(tmp_path):
    """A batch re-transcoded at a new pipeline version rewrites its MCAPs in place: the manifest's cache set
    is warmed again, the new version gets new keys, and the old version's pages, read by no one any more,
    are the least recently used: they go before any page still in use."""
    origin = tmp_path / "o"
    write(origin / "ep", 2 * PAGE, seed=3)
    other = write(origin / "kept", 2 * PAGE)
    with PageCache(small_config(tmp_path / "c", capacity=4 * PAGE)) as cache:
        assert cache.warm(url(origin / "ep"), 0, 2 * PAGE, dataset="spec")[0] == 2
        cache.warm(url(origin / "kept"), 0, 2 * PAGE, dataset="spec")
        cache.read(url(origin / "kept"), 0, 2 * PAGE)  # still read by training: more recent than ep's old pages
        cache.flush()
        time.sleep(0.01)  # a new mtime: the file origin's version is (size, mtime_ns)
        new = write(origin / "ep", 2 * PAGE, seed=5)
        assert cache.warm(url(origin / "ep"), 0, 2 * PAGE, dataset="spec")[0] == 2  # the new version fetched
        assert cache.page_count() == 4 and sum(cache.usage().values()) == 4 * PAGE
        before = cache.stats.origin_bytes
        assert bytes(cache.read(url(origin / "ep"), 0, 2 * PAGE)) == new
        assert bytes(cache.read(url(origin / "kept"), 0, 2 * PAGE)) == other
        assert cache.stats.origin_bytes == before and cache.stats.evicted_pages == 2  # the old version's two


def test_quota_per_dataset(tmp_path):
    origin = tmp_path / "o"
    data = write(origin / "a", 8 * PAGE)
    other = write(origin / "b", 2 * PAGE)
    with PageCache(small_config(tmp_path / "c", capacity=20 * PAGE, quotas={"small": 3 * PAGE})) as cache:
        assert bytes(cache.read(url(origin / "a"), 0, 8 * PAGE, dataset="small")) == data
        assert cache.usage()["small"] <= 3 * PAGE
        cache.read(url(origin / "b"), 0, 2 * PAGE, dataset="big")
        assert cache.usage() == {"small": 3 * PAGE, "big": 2 * PAGE}
        assert bytes(cache.read(url(origin / "b"), 0, 2 * PAGE, dataset="small")) == other


class FakeClock:
    """Wall-clock seconds that move only when the test says so (the cache's ``clock``)."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_pages_expire_after_ttl(tmp_path):
    origin = tmp_path / "o"
    data = write(origin / "a", 3 * PAGE)
    clock = FakeClock(1_000_000.0)
    with PageCache(small_config(tmp_path / "c", ttl_s=60), clock=clock) as cache:
        cache.read(url(origin / "a"), 0, 3 * PAGE)
        clock.advance(30)
        cache.read(url(origin / "a"), 0, 3 * PAGE)
        assert cache.stats.origin_bytes == 3 * PAGE
        clock.advance(31)  # 61 s after the fetch
        assert bytes(cache.read(url(origin / "a"), 0, PAGE)) == data[:PAGE]
        assert cache.stats.expired_pages == 1
        assert cache.stats.origin_bytes == 4 * PAGE
        clock.advance(100)  # now every page is over 60 s old, the refetched one included
        assert cache.expire() == 3
        assert cache.page_count() == 0


def test_expire_drops_exactly_the_old_pages(tmp_path):
    origin = tmp_path / "o"
    write(origin / "a", 4 * PAGE)
    clock = FakeClock(5_000.0)
    with PageCache(small_config(tmp_path / "c", ttl_s=10), clock=clock) as cache:
        cache.read(url(origin / "a"), 0, 2 * PAGE)
        clock.advance(8)
        cache.read(url(origin / "a"), 2 * PAGE, 4 * PAGE)
        clock.advance(5)  # first two pages 13 s old, the others 5 s
        assert cache.expire() == 2
        assert cache.page_count() == 2


def test_a_fresh_cache_object_expires_pages_by_the_fetch_time_in_their_header(tmp_path):
    """A page fetched under one cache object expires for a fresh one (nothing remembered): the
    fetch time the header records comes from the clock too."""
    origin = tmp_path / "o"
    data = write(origin / "a", PAGE)
    clock = FakeClock(2_000.0)
    with PageCache(small_config(tmp_path / "c", ttl_s=10), clock=clock) as cache:
        cache.read(url(origin / "a"), 0, PAGE)
    clock.advance(9)
    with PageCache(small_config(tmp_path / "c", ttl_s=10), clock=clock) as cache:
        assert bytes(cache.read(url(origin / "a"), 0, PAGE)) == data
        assert (cache.stats.hit_pages, cache.stats.origin_requests) == (1, 0)
    clock.advance(2)  # 11 s after the fetch
    with PageCache(small_config(tmp_path / "c", ttl_s=10), clock=clock) as cache:
        assert bytes(cache.read(url(origin / "a"), 0, PAGE)) == data
        assert (cache.stats.expired_pages, cache.stats.origin_requests) == (1, 1)


class CountingOrigins(Origins):
    """A file origin that counts ``info`` calls."""

    def __init__(self):
        super().__init__()
        self.infos = 0

    def info(self, url):
        self.infos += 1
        return super().info(url)


def test_object_metadata_is_trusted_for_metadata_ttl_then_asked_again(tmp_path):
    path = tmp_path / "o" / "a"
    write(path, PAGE, seed=3)
    clock, origins = FakeClock(7_000.0), CountingOrigins()
    with PageCache(small_config(tmp_path / "c", metadata_ttl_s=30), origins, clock=clock) as cache:
        first = cache.info(url(path))
        clock.advance(29)
        assert cache.info(url(path)) == first and origins.infos == 1  # within the TTL: not asked
        write(path, 2 * PAGE, seed=5)  # rewritten meanwhile: seen once the TTL is over
        clock.advance(2)
        assert cache.info(url(path)).size == 2 * PAGE and origins.infos == 2
    with PageCache(small_config(tmp_path / "c", metadata_ttl_s=30), origins, clock=clock) as cache:
        clock.advance(10)  # a fresh cache object trusts the index's record (checked 10 s ago)
        assert cache.info(url(path)).size == 2 * PAGE and origins.infos == 2


def test_corrupt_page_is_detected_and_refetched(tmp_path, objects):
    u, data = objects["odd"]
    with PageCache(small_config(tmp_path / "c")) as cache:
        cache.read(u, 0, len(data))
        pages = sorted(
            (p for p in (tmp_path / "c" / "pages").rglob("*") if p.is_file() and p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        raw = bytearray(pages[2].read_bytes())
        raw[-100] ^= 0xFF  # one flipped bit pattern in the data of page 2
        pages[2].write_bytes(raw)
        pages[4].write_bytes(pages[4].read_bytes()[:1000])  # a truncated page
        assert bytes(cache.read(u, 0, len(data))) == data
        assert cache.stats.corrupt_pages == 2
        assert cache.stats.origin_bytes == len(data) + 2 * PAGE
        assert bytes(cache.read(u, 0, len(data))) == data  # repaired: no more origin reads
        assert cache.stats.origin_bytes == len(data) + 2 * PAGE


class SlowCountingOrigins(Origins):
    """A file origin that takes ``delay`` per read, so two readers' misses overlap."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def read(self, url, start, end, version):
        time.sleep(self.delay)
        return super().read(url, start, end, version)


def _read_in_process(root: str, target: str, n: int, barrier, results) -> None:
    cache = PageCache(small_config(root), SlowCountingOrigins(0.4))
    barrier.wait()
    data = bytes(cache.read(target, 0, n))
    results.put((len(data), cache.stats.origin_requests, cache.stats.shared_fills, cache.stats.hit_pages))
    cache.close()


def test_two_processes_missing_the_same_pages_fetch_each_once(tmp_path):
    data = write(tmp_path / "o" / "a", 3 * PAGE)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(
            target=_read_in_process, args=(str(tmp_path / "c"), url(tmp_path / "o" / "a"), len(data), barrier, results)
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(n == len(data) for n, *_ in got)
    assert sum(r for _, r, _, _ in got) == 3  # three pages, one origin read each, across both processes
    assert sum(s + h for _, _, s, h in got) == 3  # the other process got each page from the cache


def test_threads_missing_the_same_page_fetch_it_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    data = write(tmp_path / "o" / "a", PAGE)
    with PageCache(small_config(tmp_path / "c"), SlowCountingOrigins(0.3)) as cache:
        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda _: bytes(cache.read(url(tmp_path / "o" / "a"), 0, PAGE)), range(6)))
        assert outs == [data] * 6
        assert cache.stats.origin_requests == 1


def test_changed_object_is_never_served_from_old_pages(tmp_path):
    path = tmp_path / "o" / "a"
    old = write(path, 3 * PAGE)
    fs = CachedFileSystem(PageCache(small_config(tmp_path / "c")))
    assert fs.cat_file(url(path)) == old
    pinned = fs.open(url(path))  # pinned to the old version; its first page is cached
    assert pinned.read(10) == old[:10]
    new = write(path, 3 * PAGE, seed=3)
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert fs.cat_file(url(path)) == new
    assert fs.cat_file(url(path), 5, 100) == new[5:100]
    pinned.seek(PAGE)  # a page of the old version that the cache may hold or not
    try:
        assert pinned.read(10) == old[PAGE : PAGE + 10]
    except ObjectChangedError as e:
        assert "changed while reading" in str(e)


def test_rewrite_during_fetch_is_refused(tmp_path):
    path = tmp_path / "o" / "a"
    write(path, 2 * PAGE)
    cache = PageCache(small_config(tmp_path / "c"))
    info = cache.info(url(path))
    write(path, 2 * PAGE, seed=5)
    with pytest.raises(ObjectChangedError, match="changed while reading"):
        cache.read(url(path), 0, 10, info=info)
    assert cache.page_count() == 0


def test_deleting_the_cache_dir_mid_read_falls_back_and_rebuilds(tmp_path, objects):
    u, data = objects["big"]
    root = tmp_path / "c"
    fs = CachedFileSystem(PageCache(small_config(root)))
    with fs.open(u) as f:
        assert f.read(3 * PAGE) == data[: 3 * PAGE]
        shutil.rmtree(root)
        assert f.read(3 * PAGE) == data[3 * PAGE : 6 * PAGE]
        assert f.read() == data[6 * PAGE :]
    assert fs.cache.stats.warnings >= 1
    assert fs.cat_file(u) == data  # the cache came back
    assert (root / "index.sqlite").exists() and fs.cache.page_count() > 0


def _read_with_file_size_limit(root: str, target: str, limit: int, results) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    cache = PageCache(small_config(root))
    cache.read(target, 0, 1)  # the index exists before the limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    data = bytes(cache.read(target, 0, 1 << 30))
    results.put((data, cache.stats.warnings, cache.stats.last_warning))


def test_full_cache_disk_falls_back_to_the_origin(tmp_path, objects):
    u, data = objects["big"]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    p = ctx.Process(target=_read_with_file_size_limit, args=(str(tmp_path / "c"), u, PAGE // 2, results))
    p.start()
    got, warnings, last = results.get(timeout=120)
    p.join(60)
    assert got == data
    # whichever write hits the limit first, a page file ("disk full") or the index's WAL ("disk I/O error")
    assert warnings >= 1 and ("full" in last or "disk I/O error" in last)


def test_capacity_below_one_page_reads_through(tmp_path, objects):
    u, data = objects["odd"]
    with PageCache(small_config(tmp_path / "c", capacity=PAGE // 2)) as cache:
        assert bytes(cache.read(u, 0, len(data))) == data
        assert cache.page_count() == 1  # only the 1234-byte tail page fits
        assert cache.stats.warnings == 5


def test_unwritable_cache_location_reads_from_the_origin(tmp_path, objects):
    u, data = objects["odd"]
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = PageCache(small_config(blocker / "cache"))
    assert bytes(cache.read(u, 0, len(data))) == data
    assert cache.stats.warnings >= 1 and cache.stats.origin_bytes == len(data)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_cache_folder_reads_from_the_origin(tmp_path, objects):
    u, data = objects["odd"]
    root = tmp_path / "c"
    root.mkdir()
    root.chmod(0o500)
    try:
        cache = PageCache(small_config(root))
        assert bytes(cache.read(u, 0, len(data))) == data
        assert cache.stats.warnings >= 1
    finally:
        root.chmod(0o700)


def test_corrupt_index_resets_the_cache(tmp_path, objects):
    u, data = objects["odd"]
    root = tmp_path / "c"
    with PageCache(small_config(root)) as cache:
        cache.read(u, 0, len(data))
    for name in ("index.sqlite-wal", "index.sqlite-shm"):
        (root / name).unlink(missing_ok=True)
    (root / "index.sqlite").write_bytes(b"garbage" * 1000)
    with PageCache(small_config(root)) as cache:
        assert bytes(cache.read(u, 0, len(data))) == data
        assert cache.stats.warnings >= 1
        assert cache.page_count() == 6


class DownOrigins(Origins):
    def info(self, url):
        raise StoreUnavailableError(url, "connection refused")


def test_origin_down_serves_the_last_known_version_from_the_cache(tmp_path, objects):
    u, data = objects["odd"]
    root = tmp_path / "c"
    with PageCache(small_config(root)) as cache:
        cache.read(u, 0, len(data))
    with PageCache(small_config(root), DownOrigins()) as cache:
        assert bytes(cache.read(u, 0, len(data))) == data
        assert cache.stats.origin_bytes == 0 and cache.stats.warnings == 1
        assert "last known version" in cache.stats.last_warning


def test_origin_down_and_nothing_cached_is_an_error_naming_the_store(tmp_path, objects):
    u, _ = objects["odd"]
    with (
        PageCache(small_config(tmp_path / "c"), DownOrigins()) as cache,
        pytest.raises(StoreUnavailableError, match="connection refused"),
    ):
        cache.read(u, 0, 10)


def test_missing_object_is_file_not_found(tmp_path):
    with PageCache(small_config(tmp_path / "c")) as cache, pytest.raises(FileNotFoundError):
        cache.read(url(tmp_path / "nope"), 0, 10)


def test_fsspec_url_chaining_and_file_api(tmp_path, objects):
    u, data = objects["odd"]
    with fsspec.open(
        f"dynacache::{u}", dynacache={"cache_dir": str(tmp_path / "c"), "page_size": PAGE, "block_size": BLOCK}
    ) as f:
        f.seek(-1000, os.SEEK_END)
        assert f.read() == data[-1000:]
        f.seek(7)
        buf = bytearray(50)
        assert f.readinto(buf) == 50 and bytes(buf) == data[7:57]
    fs = CachedFileSystem(cache_dir=str(tmp_path / "c"), page_size=PAGE, block_size=BLOCK)
    assert fs.info(u)["size"] == len(data)
    assert fs.cat_file(u, -10) == data[-10:]
    with pytest.raises(NotImplementedError, match="read-only"):
        fs.open(u, "wb")


def test_gcs_generations_key_the_pages(tmp_path, gcs):
    from dyna_resources.storage.stores import Store

    gcs.fs.pipe_file(f"{gcs.bucket}/cache/a.bin", b"A" * (2 * PAGE + 5))
    origins = Origins(stores={f"gs://{gcs.bucket}": Store.from_url(f"gs://{gcs.bucket}", fs=gcs.fs)})
    fs = CachedFileSystem(PageCache(small_config(tmp_path / "c"), origins))
    u = gcs.url("cache/a.bin")
    assert fs.cat_file(u) == b"A" * (2 * PAGE + 5)
    gcs.emulator.clear()
    assert fs.cat_file(u, 3, 9) == b"A" * 6
    assert gcs.emulator.media_gets(u) == []  # served from pages
    gcs.fs.pipe_file(f"{gcs.bucket}/cache/a.bin", b"B" * (2 * PAGE + 5))
    assert fs.cat_file(u, 3, 9) == b"B" * 6  # the new generation, fetched anew
    assert len(gcs.emulator.media_gets(u)) == 1


def _read_in_fork(cache: PageCache, target: str, n: int, results) -> None:
    data = bytes(cache.read(target, 0, n))
    results.put((data, cache.stats.hit_pages, cache.stats.origin_requests))


def test_forked_workers_share_the_parents_cache(tmp_path, objects):
    """DataLoader workers are forked after the dataset (and its cache) was built in the parent."""
    u, data = objects["odd"]
    with PageCache(small_config(tmp_path / "c")) as cache:
        cache.read(u, 0, 3 * PAGE)  # the parent caches the first three pages
        ctx = mp.get_context("fork")
        results = ctx.Queue()
        procs = [ctx.Process(target=_read_in_fork, args=(cache, u, len(data), results)) for _ in range(2)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert all(d == data for d, _, _ in got)
        assert all(hits >= 3 for _, hits, _ in got)  # the parent's pages
        # the other three pages: fetched once between both children (whose counters start at the parent's 3)
        assert sum(r - 3 for _, _, r in got) == 3
        assert bytes(cache.read(u, 0, len(data))) == data  # and the parent still works
        assert cache.stats.origin_requests == 3
