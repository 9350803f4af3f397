"""The manifest writer: one pass over a stream of batches to Parquet + fixed-batch Arrow IPC, hashed on the way."""

import hashlib
import json

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from dyna_resources.catalog.manifest import ManifestFiles, write_manifest

N = 10_007


def batches(sizes):
    """Rows 0..N-1 as batches of the given (irregular) sizes, as DuckDB hands them out."""
    task = pa.array(["pick", "fold", "wipe"]).dictionary_encode()
    start = 0
    for size in sizes:
        i = np.arange(start, start + size)
        yield pa.record_batch(
            {
                "episode_id": pa.array([f"ep-{k // 3:05d}" for k in i], pa.large_string()),
                "start_ns": i * 10**9,
                "end_ns": i * 10**9 + 2 * 10**9,
                "task": pa.DictionaryArray.from_arrays(pa.array(i % 3, pa.int8()), task.dictionary),
                "row": i,
            }
        )
        start += size


def reader(sizes):
    first = next(batches(sizes[:1]))
    return pa.RecordBatchReader.from_batches(first.schema, batches(sizes))


IRREGULAR = [1000, 3000, 1, 999, 4096, 810, 1, 100]  # sums to N


def test_batches_are_cut_to_the_exact_size_whatever_arrives(tmp_path):
    assert sum(IRREGULAR) == N
    info = write_manifest(reader(IRREGULAR), tmp_path, "m", batch_rows=1024, count_by=("task",))
    with pa.memory_map(info.arrow) as src:
        f = ipc.open_file(src)
        sizes = [f.get_batch(i).num_rows for i in range(f.num_record_batches)]
        t = f.read_all()
    assert sizes == [1024] * (N // 1024) + [N % 1024]
    assert t.column("row").to_pylist() == list(range(N))
    assert pa.types.is_dictionary(t.schema.field("task").type)
    pt = pq.read_table(info.parquet)
    assert pt.column("row").to_pylist() == list(range(N))
    assert pt.schema.field("task").type == t.schema.field("task").type
    assert info.rows == N and info.batch_rows == 1024


def test_content_hash_is_the_ipc_files_sha256_and_independent_of_input_chunking(tmp_path):
    a = write_manifest(reader(IRREGULAR), tmp_path / "a", "m", batch_rows=1024)
    b = write_manifest(reader([N]), tmp_path / "b", "m", batch_rows=1024)
    assert a.sha256 == b.sha256 == hashlib.sha256(open(a.arrow, "rb").read()).hexdigest()
    c = write_manifest(reader([N]), tmp_path / "c", "m", batch_rows=2048)
    assert c.sha256 != a.sha256  # the batch size is part of the layout ranks rely on
    side = json.loads(open(a.sidecar).read())
    assert side["sha256"] == a.sha256 and side["rows"] == N


def test_stats_count_values_episodes_and_segment_time(tmp_path):
    info = write_manifest(reader(IRREGULAR), tmp_path, "m", batch_rows=1024, count_by=("task", "nope"))
    assert info.stats["by_task"] == {"pick": 3336, "fold": 3336, "wipe": 3335}
    assert info.stats["episodes"] == len({k // 3 for k in range(N)})  # ids change across batch edges too
    assert info.stats["segment_hours"] == pytest.approx(N * 2 / 3600, abs=1e-4)
    assert "by_nope" not in info.stats


def test_the_sidecar_reads_back_as_the_record_written(tmp_path):
    info = write_manifest(reader(IRREGULAR), tmp_path, "m", batch_rows=1024, count_by=("task",), extra={"sql": "x"})
    assert ManifestFiles.read(info.sidecar) == info  # the extra keys stay in the file, not in the record
    assert json.loads((tmp_path / "m.json").read_text())["sql"] == "x"


def test_plain_strings_become_large_strings(tmp_path):
    t = pa.table({"episode_id": ["a", "b"], "start_ns": [1, 2], "end_ns": [3, 4]})
    info = write_manifest(t, tmp_path, "m")
    with pa.memory_map(info.arrow) as src:
        assert ipc.open_file(src).schema.field("episode_id").type == pa.large_string()


def test_remote_destination_gets_all_three_files_and_no_local_leftovers(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the files are staged before the upload
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    fs = fsspec.filesystem("memory")
    info = write_manifest(reader(IRREGULAR), "memory://store/manifests", "m", batch_rows=1024)
    assert info.arrow.startswith("memory://") and info.arrow.endswith("/store/manifests/m.arrow")
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("/store/manifests", detail=False)) == [
        "m.arrow",
        "m.json",
        "m.parquet",
    ]
    data = fs.cat_file("/store/manifests/m.arrow")
    assert hashlib.sha256(data).hexdigest() == info.sha256 and len(data) == info.arrow_bytes
    assert not list(tmp_path.iterdir())


def test_a_failing_stream_leaves_no_files(tmp_path):
    def broken():
        yield from batches([1000])
        raise OSError("warehouse went away")

    first = next(batches([1]))
    with pytest.raises(OSError, match="went away"):
        write_manifest(pa.RecordBatchReader.from_batches(first.schema, broken()), tmp_path, "m", batch_rows=512)
    assert list(tmp_path.iterdir()) == []


def test_gs_round_trip_through_the_emulator(gcs, tmp_path):
    """Written to gs:// (sidecar last), fetched by a node with the loader: same bytes, same rows."""
    from trainer.manifest_loader import local_copy, open_manifest

    info = write_manifest(reader(IRREGULAR), gcs.url("manifests/run-1"), "m", batch_rows=1024, fs=gcs.fs)
    assert info.arrow == gcs.url("manifests/run-1/m.arrow")
    assert sorted(p.rsplit("/", 1)[1] for p in gcs.fs.ls(f"{gcs.bucket}/manifests/run-1", detail=False)) == [
        "m.arrow",
        "m.json",
        "m.parquet",
    ]
    local = local_copy(info.arrow, tmp_path / "node", fs=gcs.fs)
    assert hashlib.sha256(local.read_bytes()).hexdigest() == info.sha256
    assert open_manifest(local).column("row").to_pylist() == list(range(N))
