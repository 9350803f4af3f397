"""Manifests: written as Parquet + Arrow IPC, downloaded once per node, mmapped, sliced without copies."""

import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from dyna_resources.catalog.manifest import write_manifest
from trainer.manifest_loader import ManifestError, local_copy, open_manifest, rank_slice

N = 200_003


def table() -> pa.Table:
    ids = np.arange(N)
    return pa.table({"episode_id": [f"ep-{i // 10:06d}" for i in ids], "start_ns": ids * 10**9,
                     "weight": np.ones(N), "row": ids})


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


def _load(args):
    src, cache, log = args

    def opener(path, mode):
        if path.endswith(".arrow"):
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return open(path, mode)

    path = local_copy(src, cache, opener=opener)
    t = open_manifest(path)
    return str(path), t.num_rows


def test_one_download_per_node_whatever_the_number_of_ranks(manifest, tmp_path):
    log = tmp_path / "downloads.log"
    with mp.get_context("fork").Pool(6) as pool:
        got = pool.map(_load, [(manifest.arrow, tmp_path / "cache", log)] * 12)
    assert len({p for p, _ in got}) == 1 and {n for _, n in got} == {N}
    assert len(log.read_text().splitlines()) == 1


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


def test_a_corrupt_download_is_refused_and_leaves_nothing(manifest, tmp_path):
    def corrupting(path, mode):
        f = open(path, mode)
        if path.endswith(".arrow"):
            import io
            data = bytearray(f.read())
            f.close()
            data[100] ^= 0xFF
            return io.BytesIO(bytes(data))
        return f

    with pytest.raises(ManifestError, match="checksum mismatch"):
        local_copy(manifest.arrow, tmp_path / "cache", opener=corrupting)
    assert [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []
    with pytest.raises(ManifestError, match="sidecar missing"):
        local_copy(str(tmp_path / "nope.arrow"), tmp_path / "cache")


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
    path = local_copy(manifest.arrow, tmp_path / "cache")
    size = path.stat().st_size
    ctx = mp.get_context("fork")
    with ctx.Manager() as m:
        ready, go = m.Barrier(4), m.Barrier(4)
        with ctx.Pool(4) as pool:
            got = pool.map(_pss_of_reader, [(path, r, 4, ready, go) for r in range(4)])
    mapped_pss, rss = sum(g[0] for g in got), [g[1] for g in got]
    assert 0 < mapped_pss <= 1.1 * size  # shared: each rank is charged its share of the pages, not all of them
    assert sum(rss) > 1.5 * mapped_pss  # ... while RSS counts the shared pages once per rank
