"""Write a curated manifest: zstd Parquet (for the store and the warehouse) plus an
uncompressed Arrow IPC copy with fixed-size record batches (what ranks memory-map).

The rows arrive as a stream of record batches (50M rows never sit in memory at once) and
are written in one pass: the IPC file in this thread, hashed as its bytes go out, the
Parquet file in a second thread (pyarrow releases the GIL while encoding and compressing).
Batches are cut to exactly ``batch_rows`` rows so a reader finds row ``i`` in batch
``i // batch_rows`` without scanning. The IPC file's SHA-256 is the manifest's content hash
(the ``DataVersion``) and goes into a small JSON sidecar that loaders verify after a
download; the sidecar is written last, so its presence means the rest is complete.

The destination is a local directory or any fsspec URL (``gs://bucket/manifests``): remote
manifests are written to a local temporary directory first, then uploaded file by file.
DuckDB cannot COPY to Arrow IPC, hence pyarrow here.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import tempfile
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from ..keys import check_key

BATCH_ROWS = 64 * 1024
ROW_GROUP_BATCHES = 16  # Parquet row groups of 1 Mi rows: few footers entries, still prunable


@dataclass(frozen=True)
class ManifestFiles:
    name: str
    parquet: str
    arrow: str
    sidecar: str
    rows: int
    sha256: str  # of the Arrow IPC file
    arrow_bytes: int
    parquet_bytes: int
    batch_rows: int
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def read(cls, sidecar_url: str, fs=None) -> ManifestFiles:
        """The record :func:`write_manifest` left in a manifest's sidecar (``<name>.json``)."""
        import fsspec

        if fs is None:
            fs, sidecar_url = fsspec.core.url_to_fs(sidecar_url)
        recorded = json.loads(fs.cat_file(sidecar_url))
        return cls(**{f.name: recorded[f.name] for f in fields(cls) if f.name in recorded})


def write_manifest(
    rows: pa.RecordBatchReader | pa.Table,
    dest: str | Path,
    name: str,
    *,
    batch_rows: int = BATCH_ROWS,
    count_by: tuple[str, ...] = (),
    extra: dict | None = None,
    fs=None,
) -> ManifestFiles:
    """Write ``rows`` as ``<dest>/<name>.{parquet,arrow,json}``; ``count_by`` columns get value
    counts in the stats (with ``episode_id``/``start_ns``/``end_ns``: episodes and segment time).
    ``fs``: an fsspec filesystem for ``dest`` (default: resolved from the URL). ``name`` must be a
    safe key (``dyna_resources.keys``): one file name inside ``dest``, never a path out of it."""
    import fsspec

    check_key(name, "manifest name")

    if fs is None:
        fs, root = fsspec.core.url_to_fs(str(dest))
    else:
        root = fs._strip_protocol(str(dest))
    local = "file" in _protocols(fs)
    work = Path(root) if local else Path(tempfile.mkdtemp(prefix=f"manifest-{name}-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        tmp = {ext: work / f".{name}.{ext}.{os.getpid()}.tmp" for ext in ("parquet", "arrow", "json")}
        rows_n, sha, stats = _write_both(rows, tmp["parquet"], tmp["arrow"], batch_rows, count_by)
        final = {ext: f"{root.rstrip('/')}/{name}.{ext}" for ext in tmp}
        urls = {ext: (final[ext] if local else fs.unstrip_protocol(final[ext])) for ext in tmp}
        info = ManifestFiles(
            name=name,
            parquet=urls["parquet"],
            arrow=urls["arrow"],
            sidecar=urls["json"],
            rows=rows_n,
            sha256=sha,
            arrow_bytes=tmp["arrow"].stat().st_size,
            parquet_bytes=tmp["parquet"].stat().st_size,
            batch_rows=batch_rows,
            stats=stats,
        )
        tmp["json"].write_text(json.dumps({**(extra or {}), **info.as_dict()}, indent=2, sort_keys=True, default=str))
        for ext in ("parquet", "arrow", "json"):  # the sidecar last: its presence means the rest is complete
            if local:
                os.replace(tmp[ext], final[ext])
            else:
                fs.put_file(str(tmp[ext]), final[ext])
        return info
    finally:
        if local:
            for p in work.glob(f".{name}.*.{os.getpid()}.tmp"):
                p.unlink(missing_ok=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _write_both(rows, parquet_path: Path, arrow_path: Path, batch_rows: int, count_by) -> tuple[int, str, dict]:
    reader = rows.to_reader() if isinstance(rows, pa.Table) else rows
    schema = _manifest_schema(reader.schema)
    stats = _Stats(schema, count_by)
    dictionary_cols = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    handoff: queue.Queue = queue.Queue(maxsize=2 * ROW_GROUP_BATCHES)
    failure: list[BaseException] = []

    def parquet_writer():
        try:
            with pq.ParquetWriter(
                parquet_path,
                schema,
                compression="zstd",
                use_dictionary=dictionary_cols or False,
                write_statistics=["start_ns", "end_ns"] if "start_ns" in schema.names else True,
            ) as w:
                group = []
                while (b := handoff.get()) is not None:
                    group.append(b)
                    if len(group) == ROW_GROUP_BATCHES:
                        w.write_table(pa.Table.from_batches(group), row_group_size=batch_rows * ROW_GROUP_BATCHES)
                        group = []
                if group:
                    w.write_table(pa.Table.from_batches(group), row_group_size=batch_rows * ROW_GROUP_BATCHES)
        except BaseException as e:  # surfaced in the main thread
            failure.append(e)
            while handoff.get() is not None:  # drain so the producer never blocks
                pass

    thread = threading.Thread(target=parquet_writer, name="manifest-parquet", daemon=True)
    thread.start()
    n = 0
    hashing = _HashingFile(open(arrow_path, "wb", buffering=0))
    try:
        with pa.PythonFile(hashing, mode="w") as sink, ipc.new_file(sink, schema) as writer:
            for batch in _exact_batches(reader, schema, batch_rows):
                writer.write_batch(batch)
                handoff.put(batch)
                stats.add(batch)
                n += batch.num_rows
                if failure:
                    break
    finally:
        handoff.put(None)
        thread.join()
    if failure:
        raise failure[0]
    return n, hashing.hexdigest(), stats.result()


def _manifest_schema(schema: pa.Schema) -> pa.Schema:
    # large_string: a >2 GB string column cannot overflow offsets in take()/concat on the reader side
    return pa.schema(
        [pa.field(f.name, pa.large_string() if pa.types.is_string(f.type) else f.type) for f in schema],
        metadata=schema.metadata,
    )


def _exact_batches(reader, schema: pa.Schema, size: int):
    """Re-cut a stream of batches of any size into batches of exactly ``size`` rows (the last
    may be short). Pieces are views; only a batch assembled from several pieces is copied.
    (pyarrow has no re-chunking stream; DuckDB's batches vary around the size asked for.)"""
    pending: list[pa.RecordBatch] = []
    have = 0
    for batch in reader:
        if batch.schema != schema:
            batch = batch.cast(schema)
        while batch.num_rows:
            take = min(size - have, batch.num_rows)
            pending.append(batch.slice(0, take))
            batch = batch.slice(take)
            have += take
            if have == size:
                yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


class _HashingFile:
    """A raw file that hashes what goes through it (the IPC writer's bytes, in order), so the
    content hash costs no second pass over a multi-GB file. The hashing runs on its own
    thread (hashlib releases the GIL), beside the writes and the Parquet encoder."""

    closed = False

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()
        self._pending: queue.Queue = queue.Queue(maxsize=256)
        self._thread = threading.Thread(target=self._hash, name="manifest-sha256", daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        while (data := self._pending.get()) is not None:
            self.sha.update(data)

    def write(self, data) -> int:
        n = self.f.write(data)
        self._pending.put(bytes(data) if isinstance(data, memoryview) else data)  # a Buffer/bytes stays valid
        return n

    def hexdigest(self) -> str:
        self._pending.put(None)
        self._thread.join()
        return self.sha.hexdigest()

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        if not self.closed:
            self.f.close()
            self.closed = True
            if self._thread.is_alive():
                self._pending.put(None)

    def writable(self) -> bool:
        return True


class _Stats:
    """Value counts, episodes and segment time, accumulated per batch with vectorized kernels."""

    def __init__(self, schema: pa.Schema, count_by):
        self.count_by = [c for c in count_by if c in schema.names]
        self.counts: dict[str, Counter] = {c: Counter() for c in self.count_by}
        self.has_time = {"start_ns", "end_ns"} <= set(schema.names)
        self.has_episode = "episode_id" in schema.names
        self.seconds = 0.0
        self.episodes = 0
        self.last_episode = None

    def add(self, batch: pa.RecordBatch) -> None:
        for c in self.count_by:
            col = batch.column(c)
            if pa.types.is_dictionary(col.type):  # count indices, look the words up once
                idx = _ints(col.indices if not col.null_count else pc.drop_null(col.indices))
                hits = np.bincount(idx, minlength=len(col.dictionary))
                for word, k in zip(col.dictionary.to_pylist(), hits.tolist()):
                    if k:
                        self.counts[c][word] += k
                if col.null_count:
                    self.counts[c][None] += col.null_count
            else:
                vc = pc.value_counts(col)
                for v, k in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
                    self.counts[c][v] += k
        if self.has_time:
            self.seconds += (pc.sum(pc.subtract(batch.column("end_ns"), batch.column("start_ns"))).as_py() or 0) / 1e9
        if self.has_episode and batch.num_rows:
            ids = batch.column("episode_id")
            # rows come ordered by episode: count where the id changes (and across batch edges)
            changes = pc.sum(pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))).as_py() or 0
            self.episodes += changes + (ids[0].as_py() != self.last_episode)
            self.last_episode = ids[-1].as_py()

    def result(self) -> dict:
        out: dict = {}
        if self.has_time:
            out["segment_hours"] = round(self.seconds / 3600, 4)
        if self.has_episode:
            out["episodes"] = int(self.episodes)
        for c in self.count_by:
            out[f"by_{c}"] = {str(k): v for k, v in self.counts[c].most_common()}
        return out


def _ints(arr: pa.Array) -> np.ndarray:
    """A null-free integer array as numpy, zero-copy (``to_numpy`` imports pandas: 0.2 s)."""
    return np.frombuffer(arr.buffers()[1], dtype=arr.type.to_pandas_dtype())[arr.offset : arr.offset + len(arr)]


def _protocols(fs) -> set[str]:
    p = fs.protocol
    return {p} if isinstance(p, str) else set(p)
