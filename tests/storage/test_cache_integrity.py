"""What the page cache trusts: a page file is bound to its (object URL, version, page index), so
swapped page files are refetched, never served; a ``file://`` origin rewritten in place with its
mtime restored is seen as a new version; a cache folder of an older on-disk format is rebuilt,
not misread, also when several reader processes open it at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3
import struct
import time
from pathlib import Path

import xxhash

from dyna_resources.storage import page_cache
from dyna_resources.storage.cache_fs import CachedFileSystem
from dyna_resources.storage.origins import Origins
from dyna_resources.storage.page_cache import CacheConfig, PageCache

KiB = 1024
PAGE = 64 * KiB
BLOCK = 4 * KiB


def config(root: Path) -> CacheConfig:
    return CacheConfig(root=str(root), page_size=PAGE, block_size=BLOCK)


def write(path: Path, n: int, fill: int | None = None) -> bytes:
    data = os.urandom(n) if fill is None else bytes([fill]) * n
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def page_files(root: Path) -> dict[str, Path]:
    """Page key (``ab/<object>/N``) -> its file."""
    pages = root / "pages"
    return {p.relative_to(pages).as_posix(): p for p in pages.rglob("*") if p.is_file() and p.name.isdigit()}


def swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def test_swapped_page_files_are_refetched_not_served(tmp_path):
    a_data, b_data = write(tmp_path / "o" / "a", 2 * PAGE), write(tmp_path / "o" / "b", 2 * PAGE)
    a, b = f"file://{tmp_path}/o/a", f"file://{tmp_path}/o/b"
    with PageCache(config(tmp_path / "c")) as cache:
        fs = CachedFileSystem(cache)
        assert fs.cat_file(a) == a_data and fs.cat_file(b) == b_data
        keys = {url: [cache._key(url, cache.info(url), p) for p in range(2)] for url in (a, b)}
    files = page_files(tmp_path / "c")
    assert sorted(files) == sorted(keys[a] + keys[b])
    swap(files[keys[a][0]], files[keys[a][1]])  # two pages of one object: same size, other index
    swap(files[keys[a][0]], files[keys[b][0]])  # page 0 of two objects: same size, other object

    # another reader (a fresh process's view: nothing remembered) opens through fsspec
    with PageCache(config(tmp_path / "c")) as cache:
        fs = CachedFileSystem(cache)
        with fs.open(a) as f:
            assert f.read() == a_data
        assert fs.cat_file(b) == b_data
        assert cache.stats.corrupt_pages == 3  # a's two pages and b's first: each a miss, refetched
        assert cache.stats.origin_requests == 3 and cache.stats.hit_pages == 1
        assert fs.cat_file(a) + fs.cat_file(b) == a_data + b_data  # repaired: served from pages
        assert cache.stats.origin_requests == 3

        # swapped under a reader that already knows these pages (their headers remembered)
        files = page_files(tmp_path / "c")
        swap(files[keys[b][0]], files[keys[b][1]])
        assert fs.cat_file(b) == b_data
        assert cache.stats.corrupt_pages == 5 and cache.stats.origin_requests == 5


def test_file_origin_rewritten_in_place_with_its_mtime_kept_is_a_new_version(tmp_path):
    path = tmp_path / "o" / "ep.mcap"
    old = write(path, 3 * PAGE, fill=1)
    st = path.stat()
    fs = CachedFileSystem(PageCache(config(tmp_path / "c")))
    assert fs.cat_file(f"file://{path}") == old
    with open(path, "r+b") as f:  # the same inode, the same size, other bytes
        f.write(b"\2" * (3 * PAGE))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the mtime put back
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_ino == st.st_ino
    assert fs.cat_file(f"file://{path}") == b"\2" * (3 * PAGE)
    with fs.open(f"file://{path}") as f:
        f.seek(PAGE)
        assert f.read(10) == b"\2" * 10


# ---- an old on-disk format ------------------------------------------------------------------------
_V1_HEADER = struct.Struct("<4sBxHIQd")  # format 1: magic, format, blocks, block size, length, fetched at
_V1_SCHEMA = """
    CREATE TABLE pages (key TEXT PRIMARY KEY, dataset TEXT NOT NULL, size INTEGER NOT NULL,
                        fetched_at REAL NOT NULL, accessed_at REAL NOT NULL) WITHOUT ROWID;
    CREATE TABLE usage (dataset TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
    CREATE TABLE objects (url TEXT PRIMARY KEY, version TEXT NOT NULL, size INTEGER NOT NULL,
                          checked_at REAL NOT NULL);
"""


def _format_1_cache(root: Path, keys: list[str], wrong: bytes) -> None:
    """A cache folder as release 1 wrote it, whose pages hold ``wrong`` bytes under the current keys."""
    db = sqlite3.connect(root / "index.sqlite")
    db.executescript(_V1_SCHEMA)
    now = time.time()
    for key in keys:
        path = root / "pages" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        sums = [xxhash.xxh3_64_intdigest(wrong[i : i + BLOCK]) for i in range(0, PAGE, BLOCK)]
        path.write_bytes(
            _V1_HEADER.pack(b"DYPG", 1, len(sums), BLOCK, PAGE, now) + struct.pack(f"<{len(sums)}Q", *sums) + wrong
        )
        db.execute("INSERT INTO pages VALUES (?, '', ?, ?, ?)", (key, PAGE, now, now))
    db.execute("INSERT INTO usage VALUES ('', ?)", (PAGE * len(keys),))
    db.commit()
    db.close()


class SlowOrigins(Origins):
    """Reads take a while, so that two processes' misses overlap."""

    def read(self, url, start, end, version):
        time.sleep(0.3)
        return super().read(url, start, end, version)


def _read_in_process(root: str, target: str, n: int, barrier, results) -> None:
    barrier.wait()
    with PageCache(config(Path(root)), SlowOrigins()) as cache:
        data = bytes(cache.read(target, 0, n))
        results.put(
            (
                data,
                cache.stats.origin_requests,
                cache.stats.shared_fills + cache.stats.hit_pages,
                cache.stats.corrupt_pages,
            )
        )


def test_old_format_cache_is_rebuilt_once_by_concurrent_readers_not_misread(tmp_path):
    data = write(tmp_path / "o" / "a", 3 * PAGE)
    target = f"file://{tmp_path}/o/a"
    root = tmp_path / "c"
    with PageCache(config(tmp_path / "probe")) as probe:  # only to learn the current keys
        info = probe.info(target)
        keys = [probe._key(target, info, p) for p in range(3)]
    root.mkdir()
    _format_1_cache(root, keys, wrong=b"\0" * PAGE)

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_read_in_process, args=(str(root), target, len(data), barrier, results)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(d == data for d, *_ in got)  # never the format-1 bytes
    assert sum(corrupt for *_, corrupt in got) == 0  # rebuilt, not read and rejected page by page
    assert sum(requests for _, requests, _, _ in got) == 3  # one rebuild: each page fetched once in all
    assert sum(cached for _, _, cached, _ in got) == 3  # the other process got each page from the cache
    db = sqlite3.connect(root / "index.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == page_cache._FORMAT
    assert sorted(k for (k,) in db.execute("SELECT key FROM pages")) == sorted(keys)
    db.close()
    assert not list(root.glob(".pages-*"))  # the old pages are gone
