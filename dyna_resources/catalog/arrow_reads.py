"""Registry rows read as Arrow record batches through ADBC's drivers, which read in C, so no
Python object is made per value: what the warehouse's CDC reads. Every batch is cast to the
warehouse's column types.

- PostgreSQL (binary COPY): a first sync's whole episodes table, an incremental sync's changed rows.
- SQLite: a first sync's whole table, read by a child process (``python -m`` this module) that
  streams Arrow IPC to the sync through a pipe, so the reading and the warehouse's loading run on
  two cores at once. Not in the sync's own process: ADBC's SQLite driver links its own copy of the
  SQLite library, and two copies in one process do not share POSIX locks or the WAL index
  (SQLite's "multiple copies" hazard; tried: it read a state from before the last checkpoint). In
  a process of its own it is one more reader of the database, as SQLite intends.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


def _schema(columns: Sequence[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema([pa.field(n, ty) for n, ty in columns])


def _cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    arrays = [batch.column(i).cast(f.type) for i, f in enumerate(schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def rebatch(batches: Iterator[pa.RecordBatch], rows: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The same rows in batches of exactly ``rows`` (the last one smaller): memory follows ``rows``
    whatever size the driver reads in."""
    held: list[pa.RecordBatch] = []
    n = 0
    for b in batches:
        held.append(b)
        n += b.num_rows
        while n >= rows:
            table = pa.Table.from_batches(held, schema=schema)
            head, rest = table.slice(0, rows), table.slice(rows)
            yield head.combine_chunks().to_batches()[0] if head.num_rows else head
            held, n = rest.to_batches(), rest.num_rows
    if n:
        yield pa.Table.from_batches(held, schema=schema).combine_chunks().to_batches()[0]


def strings(values: Sequence[str]) -> pa.Array:
    """A string array built from its buffers: ``pa.array`` on a Python list imports pandas on first
    use (0.3 s in every sync's fresh process)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(list(map(len, encoded)), out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    if offsets[-1] < 2**31:  # 32-bit offsets directly (a cast from large_string loads pyarrow.compute: ~40 ms)
        return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets.astype(np.int32)), data)
    return pa.LargeStringArray.from_buffers(len(encoded), pa.py_buffer(offsets), data).cast(pa.string())


class AdbcSession:
    """One connection through ADBC's low-level API, its statements closed with it. (Its DB-API
    module imports pyarrow.dataset and pandas: 0.3 s in every sync's fresh process.)"""

    def __init__(self, database):
        import adbc_driver_manager

        self._lib = adbc_driver_manager
        self._opened = ExitStack()
        self.db = self._opened.enter_context(closing(database))
        self.conn = self._opened.enter_context(closing(adbc_driver_manager.AdbcConnection(self.db)))

    def _statement(self, sql: str | None = None, params: pa.RecordBatch | None = None, **options):
        stmt = self._opened.enter_context(closing(self._lib.AdbcStatement(self.conn)))
        if options:
            stmt.set_options(**options)
        if sql is not None:
            stmt.set_sql_query(sql)
        if params is not None:
            stmt.bind(params)
        return stmt

    def execute(self, sql: str) -> None:
        self._statement(sql).execute_update()

    def query(self, sql: str, params: pa.RecordBatch | None = None, **options) -> pa.RecordBatchReader:
        handle, _ = self._statement(sql, params, **options).execute_query()
        return pa.RecordBatchReader._import_from_c(handle.address)

    def ingest_temporary(self, table: str, data: pa.RecordBatch) -> None:
        self._statement(
            None,
            data,
            **{
                "adbc.ingest.target_table": table,
                "adbc.ingest.mode": "adbc.ingest.mode.create",
                "adbc.ingest.temporary": "true",
            },
        ).execute_update()

    def close(self) -> None:
        self._opened.close()

    def __enter__(self) -> AdbcSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def postgres_uri(url: URL) -> str:
    """libpq's URI of a SQLAlchemy URL (the password stays in it: never log it)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_reader(url: URL) -> AdbcSession:
    """An ADBC session on the registry's PostgreSQL (autocommit: transactions are explicit)."""
    import adbc_driver_postgresql

    return AdbcSession(adbc_driver_postgresql.connect(postgres_uri(url)))


def postgres_batches(
    session: AdbcSession, sql: str, columns: Sequence[tuple[str, pa.DataType]], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    schema = _schema(columns)
    return rebatch((_cast(b, schema) for b in session.query(sql)), batch_rows, schema)


def postgres_changed_rows(url: URL, columns: Sequence[tuple[str, pa.DataType]], ids: Sequence[str]) -> pa.Table:
    """Current rows of these episode ids: the keys go in by binary COPY into a temporary table,
    the rows come back by binary COPY."""
    schema = _schema(columns)
    names = ", ".join(f"e.{n}" for n, _ in columns)
    with postgres_reader(url) as session:
        session.execute("BEGIN")
        try:
            session.ingest_temporary("dyna_cdc_keys", pa.record_batch([strings(ids)], names=["episode_id"]))
            rows = session.query(f"SELECT {names} FROM episodes e JOIN dyna_cdc_keys k ON k.episode_id = e.episode_id")
            return pa.Table.from_batches([_cast(b, schema) for b in rows], schema=schema)
        finally:
            session.execute("ROLLBACK")


@contextmanager
def read_ahead(batches: Iterator[pa.RecordBatch]) -> Iterator[Iterator[pa.RecordBatch]]:
    """The batches, one read ahead by a thread while the consumer works on the last: the driver's
    reading (C, the GIL released) and the warehouse's loading (DuckDB, the same) overlap. The thread
    is done with the source when the block ends, however it ends."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def hand_over(item) -> bool:
        """Put ``item`` for the consumer, waiting while the queue is full; False once told to stop."""
        while not stop.is_set():
            with suppress(queue.Full):  # full: the consumer is still on the last batch; wait again
                ready.put(item, timeout=0.1)
                return True
        return False

    def produce() -> None:
        try:
            for b in batches:
                if not hand_over(b):
                    return
            item = end
        except BaseException as e:  # handed to the consumer, raised there
            item = e
        hand_over(item)

    def consume() -> Iterator[pa.RecordBatch]:
        while (item := ready.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item

    thread = threading.Thread(target=produce, name="arrow-read-ahead", daemon=True)
    thread.start()
    try:
        yield consume()
    finally:
        stop.set()
        thread.join()


# -- SQLite: read by a child process ------------------------------------------------------------------
class SqliteReadError(RuntimeError):
    """The child reading the SQLite registry failed; its own error is in the message."""


# The change-log position of a snapshot, read in the same transaction as its rows (changelog._HEAD).
_SQLITE_HEAD = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'change_log'), 0)"


@contextmanager
def sqlite_snapshot(
    path: str | Path, columns: Sequence[tuple[str, pa.DataType]], batch_rows: int
) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    """The episodes table of the SQLite registry at ``path`` as of one instant: (the change-log
    position it reflects, Arrow batches of exactly ``batch_rows`` rows but the last), read by a
    child process in one read transaction. The child runs one batch ahead of the consumer; a
    consumer that stops early kills it."""
    with _child(path, "snapshot", columns, batch_rows, b"") as (reader, batches):
        yield int(reader.schema.metadata[b"position"]), batches


def sqlite_changed_rows(path: str | Path, columns: Sequence[tuple[str, pa.DataType]], ids: Sequence[str]) -> pa.Table:
    """Current rows of these episode ids, read by a child process (the ids go to it as one JSON
    array, bound as a parameter)."""
    with _child(path, "rows", columns, 100_000, json.dumps(list(ids)).encode()) as (reader, batches):
        return pa.Table.from_batches(list(batches), schema=reader.schema.remove_metadata())


@contextmanager
def _child(path, mode: str, columns, batch_rows: int, keys: bytes):
    schema = _schema(columns).serialize().to_pybytes()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, mode, str(path), str(batch_rows)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        assert proc.stdin is not None and proc.stdout is not None, "both are pipes"
        try:
            try:
                proc.stdin.write(len(schema).to_bytes(8, "little") + schema + keys)
                proc.stdin.close()
                reader = pa.ipc.open_stream(proc.stdout)
            except (OSError, pa.ArrowInvalid) as e:
                raise _child_failed(proc, err, path) from e
            yield reader, _child_batches(reader, proc, err, path)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def _child_batches(reader, proc, err, path) -> Iterator[pa.RecordBatch]:
    try:
        yield from reader
    except (OSError, pa.ArrowInvalid) as e:
        raise _child_failed(proc, err, path) from e
    if proc.wait() != 0:
        raise _child_failed(proc, err, path)


def _child_failed(proc, err, path) -> SqliteReadError:
    proc.wait()
    err.seek(0)
    tail = err.read()[-2000:].decode(errors="replace").strip()
    return SqliteReadError(f"reading {path} failed (exit {proc.returncode}): {tail}")


def _sentinel(field: pa.Field) -> str:
    """A literal of the field's type: ADBC's SQLite driver infers a column's type from the values of
    its first batch (SQLite's columns are typed by value), so an all-NULL stretch would become int64
    and a later string an error. The first row of every read holds one value of every column's type
    and is dropped."""
    if pa.types.is_string(field.type):
        return "''"
    if pa.types.is_floating(field.type):
        return "0.5"
    return "0"


def _read_sqlite(mode: str, path: str, batch_rows: int, schema: pa.Schema, keys: bytes, out) -> None:
    """The child's work, in one read transaction: "snapshot", the position then every row; "rows",
    the rows of the keys (a JSON array). Written to ``out`` as one IPC stream."""
    import adbc_driver_sqlite

    names = ", ".join(f.name for f in schema)  # column names from the schema, not input
    first = ", ".join(_sentinel(f) for f in schema)
    with AdbcSession(adbc_driver_sqlite.connect(path)) as session:
        # autocommit off: the driver begins a (deferred) transaction, so the snapshot is taken by the
        # first read below and every statement sees the same instant
        session.conn.set_options(**{"adbc.connection.autocommit": "false"})
        if mode == "snapshot":
            meta = {"position": str(session.query(_SQLITE_HEAD).read_all().column(0)[0].as_py())}
            sql, params = f"SELECT {names} FROM episodes", None
        else:
            meta = {}
            sql = f"SELECT {names} FROM episodes WHERE episode_id IN (SELECT value FROM json_each(?))"
            params = pa.record_batch([strings([keys.decode()])], names=["keys"])
        with pa.ipc.new_stream(out, schema.with_metadata(meta)) as writer:
            out.flush()  # the position goes to the consumer before the first batch is read
            batches = session.query(
                f"SELECT {first} UNION ALL SELECT * FROM ({sql})",
                params,
                **{"adbc.sqlite.query.batch_rows": str(batch_rows)},
            )
            for b in rebatch(
                (_cast(x.slice(1) if i == 0 else x, schema) for i, x in enumerate(batches)), batch_rows, schema
            ):
                writer.write_batch(b)
            batches.close()
        session.conn.rollback()


if __name__ == "__main__":  # the SQLite reader's child process: mode, path, batch rows; the schema and keys on stdin
    _data = sys.stdin.buffer.read()
    _n = int.from_bytes(_data[:8], "little")
    _read_sqlite(
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        pa.ipc.read_schema(pa.py_buffer(_data[8 : 8 + _n])),
        _data[8 + _n :],
        sys.stdout.buffer,
    )
