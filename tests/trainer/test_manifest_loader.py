"""Manifests: written as Parquet + Arrow IPC, downloaded once per node, mmapped, sliced without copies."""

import multiprocessing as mp
import os
import shutil
from pathlib import Path

import gcsfs.core
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from dyna_resources.catalog.manifest import write_manifest
from trainer.manifest_loader import ManifestError, local_copy, open_manifest, rank_slice

N = 200_003
PART = 1 << 20  # small parts: the ~8 MB manifest downloads in several ranges


def table() -> pa.Table:
    ids = np.arange(N)
    return pa.table(
        {"episode_id": [f"ep-{i // 10:06d}" for i in ids], "start_ns": ids * 10**9, "weight": np.ones(N), "row": ids}
    )


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_manifest(table(), tmp_path_factory.mktemp("store"), "spec-a", extra={"sql": "SELECT 1"})


def test_parquet_and_ipc_hold_the_same_rows_in_fixed_batches(manifest):
    assert manifest.rows == N
    pt = pq.read_table(manifest.parquet)
    assert pt.column("row").to_pylist() == list(range(N))
    with pa.memory_map(manifest.arrow) as src:
        reader = ipc.open_file(src)
        sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        assert sizes[:-1] == [65536] * (len(sizes) - 1) and sum(sizes) == N
        assert reader.schema.field("episode_id").type == pa.large_string()
    again = write_manifest(table(), Path(manifest.arrow).parent / "again", "spec-a")
    assert again.sha256 == manifest.sha256  # deterministic content hash


class CountingLocalFS(LocalFileSystem):
    """Local files that log every range read of an .arrow file (pid and range) to ``log``."""

    def __init__(self, log: str, **kwargs):
        super().__init__(**kwargs)
        self.log = log

    def cat_file(self, path, start=None, end=None, **kwargs):
        if str(path).endswith(".arrow"):
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()} {start} {end}\n")
        return super().cat_file(path, start, end, **kwargs)


def parts(size: int, part_bytes: int) -> int:
    return -(-size // part_bytes)


def _load(args):
    src, cache, fs = args
    path = local_copy(src, cache, fs=fs, parallel=4, part_bytes=PART)
    t = open_manifest(path)
    return str(path), t.num_rows


def _map_in_fork_pool(n: int, fn, args: list) -> list:
    """``Pool.map`` on n forked ranks, ended by close + join rather than the context manager's terminate():
    a worker that inherited a Python SIGTERM handler from an earlier test in this process ignores
    terminate() while it waits on the task queue, and the join then hangs forever."""
    pool = mp.get_context("fork").Pool(n)
    try:
        return pool.map(fn, args)
    finally:
        pool.close()
        pool.join()


def test_one_download_per_node_whatever_the_number_of_ranks(manifest, tmp_path):
    log = tmp_path / "downloads.log"
    fs = CountingLocalFS(str(log), skip_instance_cache=True)
    got = _map_in_fork_pool(6, _load, [(f"file://{manifest.arrow}", tmp_path / "cache", fs)] * 12)
    assert len({p for p, _ in got}) == 1 and {n for _, n in got} == {N}
    reads = [line.split() for line in log.read_text().splitlines()]
    assert len({pid for pid, _, _ in reads}) == 1  # one rank downloaded
    assert sorted(int(s) for _, s, _ in reads) == list(range(0, manifest.arrow_bytes, PART))  # each part once
    assert len(reads) == parts(manifest.arrow_bytes, PART) > 1


def test_plain_path_and_file_url_give_the_same_verified_copy(manifest, tmp_path):
    a = local_copy(manifest.arrow, tmp_path / "cache", part_bytes=PART)
    b = local_copy(f"file://{manifest.arrow}", tmp_path / "cache", part_bytes=PART)
    assert a == b == tmp_path / "cache" / f"{manifest.sha256}.arrow"
    assert a.read_bytes() == Path(manifest.arrow).read_bytes()


@pytest.mark.parametrize("world", [1, 7, 8])
@pytest.mark.parametrize("strided", [False, True])
def test_slices_cover_every_row_exactly_once(manifest, world, strided):
    t = open_manifest(manifest.arrow)
    seen = np.concatenate([rank_slice(t, r, world, strided=strided).column("row").to_numpy() for r in range(world)])
    assert len(seen) == N and np.array_equal(np.sort(seen), np.arange(N))


def test_contiguous_slices_are_views_of_the_memory_map(manifest):
    before = pa.total_allocated_bytes()
    t = open_manifest(manifest.arrow)
    parts = [rank_slice(t, r, 8) for r in range(8)]
    assert sum(p.num_rows for p in parts) == N
    assert pa.total_allocated_bytes() == before  # no heap: the rows stay in the mapped file


class CorruptingLocalFS(LocalFileSystem):
    """Local files whose .arrow bytes come back with byte 100 flipped."""

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start, end, **kwargs)
        if str(path).endswith(".arrow") and (start or 0) <= 100 < (start or 0) + len(data):
            data = bytearray(data)
            data[100 - (start or 0)] ^= 0xFF
        return bytes(data)


class RewritingLocalFS(LocalFileSystem):
    """Local files where the .arrow file is replaced (same size, other bytes) as its first part is read."""

    def cat_file(self, path, start=None, end=None, **kwargs):
        if str(path).endswith(".arrow") and start == 0:
            data = bytearray(Path(path).read_bytes())
            data[-1] ^= 0xFF
            Path(path + ".new").write_bytes(data)
            os.replace(path + ".new", path)
        return super().cat_file(path, start, end, **kwargs)


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))


def test_a_corrupt_download_is_refused_and_leaves_nothing(manifest, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match="checksum mismatch"):
        local_copy(manifest.arrow, cache, fs=CorruptingLocalFS(skip_instance_cache=True), part_bytes=PART)
    assert leftovers(cache) == []
    with pytest.raises(ManifestError, match="sidecar missing"):
        local_copy(str(tmp_path / "nope.arrow"), cache)


def test_an_object_changed_during_the_download_is_refused(manifest, tmp_path):
    src = tmp_path / "store"
    shutil.copytree(Path(manifest.arrow).parent, src, ignore=shutil.ignore_patterns("again"))
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match="changed during download") as err:
        local_copy(src / "spec-a.arrow", cache, fs=RewritingLocalFS(skip_instance_cache=True), part_bytes=PART)
    assert "spec-a.arrow" in str(err.value)
    assert leftovers(cache) == []


def test_a_dead_downloaders_temp_file_is_cleared(manifest, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = cache / f".{manifest.sha256}.arrow.99999999.tmp"
    stale.write_bytes(b"half a download")
    local_copy(manifest.arrow, cache)
    assert leftovers(cache) == [f"{manifest.sha256}.arrow"]


def _pss_of_reader(args):
    path, rank, world, ready, go = args
    t = open_manifest(path)
    part = rank_slice(t, rank, world)
    for col in part.columns:  # touch every page of this rank's rows
        for chunk in col.chunks:
            for buf in chunk.buffers():
                if buf is not None:
                    int(np.frombuffer(buf, dtype=np.uint8)[::4096].sum())
    t.column("row").to_numpy()  # and the whole id column, as a sampler scanning the manifest would
    ready.wait()  # every rank has touched its pages before any measures
    mapped = rss = 0
    with open(f"/proc/{os.getpid()}/smaps") as f:  # PSS of the manifest's mapping alone
        inside = False
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Pss:"):
                mapped += int(line.split()[1]) * 1024
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
    go.wait()
    return mapped, rss


def test_ranks_share_the_manifest_pages(manifest, tmp_path):
    """4 ranks mmapping one copy: the mapping's PSS across ranks sums to about one file, not four."""
    path = local_copy(manifest.arrow, tmp_path / "cache", part_bytes=PART)
    size = path.stat().st_size
    ctx = mp.get_context("fork")
    with ctx.Manager() as m:
        ready, go = m.Barrier(4), m.Barrier(4)
        got = _map_in_fork_pool(4, _pss_of_reader, [(path, r, 4, ready, go) for r in range(4)])
    mapped_pss, rss = sum(g[0] for g in got), [g[1] for g in got]
    assert 0 < mapped_pss <= 1.1 * size  # shared: each rank is charged its share of the pages, not all of them
    assert sum(rss) > 1.5 * mapped_pss  # ... while RSS counts the shared pages once per rank


# --- gs:// against the GCS emulator on 127.0.0.1 -------------------------------------------


def upload(gcs, manifest, prefix: str) -> str:
    """The manifest's files under gs://bucket/prefix/, the sidecar last (as the writer does); the .arrow URL."""
    for suffix in (".parquet", ".arrow", ".json"):
        gcs.fs.put_file(manifest.arrow[: -len(".arrow")] + suffix, gcs.url(f"{prefix}/spec-a{suffix}"))
    return gcs.url(f"{prefix}/spec-a.arrow")


@pytest.fixture
def gs_manifest(gcs, manifest):
    url = upload(gcs, manifest, "manifests/a")
    gcs.emulator.clear()
    return url


def expected_ranges(size: int, part_bytes: int) -> list[str]:
    return [f"bytes={s}-{min(s + part_bytes, size) - 1}" for s in range(0, size, part_bytes)]


def test_gs_round_trip_in_parallel_ranges(gcs, gs_manifest, manifest, tmp_path):
    path = local_copy(gs_manifest, tmp_path / "cache", fs=gcs.fs, parallel=4, part_bytes=PART)
    assert path.read_bytes() == Path(manifest.arrow).read_bytes()
    assert open_manifest(path).equals(open_manifest(manifest.arrow))
    got = gcs.emulator.media_gets(gs_manifest)
    assert sorted(got) == sorted(expected_ranges(manifest.arrow_bytes, PART))  # every part once, as a range GET
    assert len(got) == parts(manifest.arrow_bytes, PART) > 1
    again = local_copy(gs_manifest, tmp_path / "cache", fs=gcs.fs, parallel=4, part_bytes=PART)
    assert again == path and len(gcs.emulator.media_gets(gs_manifest)) == len(got)  # the cached copy is reused


def test_gs_one_download_for_twelve_ranks(gcs, gs_manifest, manifest, tmp_path):
    got = _map_in_fork_pool(6, _load, [(gs_manifest, tmp_path / "cache", gcs.fs)] * 12)
    assert len({p for p, _ in got}) == 1 and {n for _, n in got} == {N}
    assert Path(got[0][0]).read_bytes() == Path(manifest.arrow).read_bytes()
    ranges = gcs.emulator.media_gets(gs_manifest)
    assert sorted(ranges) == sorted(expected_ranges(manifest.arrow_bytes, PART))  # exactly one download's parts


def test_gs_corrupt_or_replaced_object_is_refused(gcs, manifest, tmp_path):
    url = upload(gcs, manifest, "manifests/corrupt")
    data = bytearray(Path(manifest.arrow).read_bytes())
    data[100] ^= 0xFF
    gcs.fs.pipe_file(url, bytes(data))  # same size, other bytes: only the checksum can tell
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match="checksum mismatch") as err:
        local_copy(url, cache, fs=gcs.fs, parallel=4, part_bytes=PART)
    assert url in str(err.value)
    assert leftovers(cache) == []
    gcs.fs.pipe_file(url, bytes(data[:-10]))  # another size: refused before downloading
    gcs.emulator.clear()
    with pytest.raises(ManifestError, match="size mismatch"):
        local_copy(url, cache, fs=gcs.fs, parallel=4, part_bytes=PART)
    assert gcs.emulator.media_gets(url) == [] and leftovers(cache) == []


class RewritingGCSFS(gcsfs.core.GCSFileSystem):
    """gcsfs where the .arrow object is rewritten (same size, new generation) as its first part is read."""

    async def _cat_file(self, path, start=None, end=None, **kwargs):
        if path.endswith(".arrow") and start == 0:
            data = bytearray(await super()._cat_file(path))
            data[-1] ^= 0xFF
            await self._pipe_file(path, bytes(data))
        return await super()._cat_file(path, start, end, **kwargs)


def test_gs_object_rewritten_during_the_download_is_refused(gcs, manifest, tmp_path):
    url = upload(gcs, manifest, "manifests/rewritten")
    fs = RewritingGCSFS(token="anon", endpoint_url=gcs.emulator.endpoint, project="test", skip_instance_cache=True)
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match="changed during download"):
        local_copy(url, cache, fs=fs, parallel=4, part_bytes=PART)
    assert leftovers(cache) == []


def test_gs_missing_sidecar(gcs, manifest, tmp_path):
    url = gcs.url("manifests/unfinished/spec-a.arrow")
    gcs.fs.put_file(manifest.arrow, url)  # the writer died before the sidecar
    with pytest.raises(ManifestError, match=r"sidecar missing \(spec-a.json"):
        local_copy(url, tmp_path / "cache", fs=gcs.fs)


def test_gs_unreachable_store_names_the_url(gcs_unreachable, tmp_path):
    url = "gs://dyna-test/manifests/a/spec-a.arrow"
    with pytest.raises(ManifestError, match="unreachable") as err:
        local_copy(url, tmp_path / "cache", fs=gcs_unreachable)
    assert url in str(err.value) and "Cannot connect" in str(err.value)
    assert isinstance(err.value.__cause__, OSError)  # the client's error, chained
