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

import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

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


def postgres_uri(url: URL) -> str:
    """libpq's URI of a SQLAlchemy URL (the password stays in it: never log it)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def postgres_reader(url: URL):
    """An ADBC connection to the registry's PostgreSQL (autocommit: transactions are explicit)."""
    import adbc_driver_postgresql.dbapi

    with closing(adbc_driver_postgresql.dbapi.connect(postgres_uri(url), autocommit=True)) as conn:
        yield conn


def postgres_batches(cur, sql: str, columns: Sequence[tuple[str, pa.DataType]],
                     batch_rows: int) -> Iterator[pa.RecordBatch]:
    schema = _schema(columns)
    cur.execute(sql)
    return rebatch((_cast(b, schema) for b in cur.fetch_record_batch()), batch_rows, schema)


def postgres_changed_rows(url: URL, columns: Sequence[tuple[str, pa.DataType]], ids: Sequence[str]) -> pa.Table:
    """Current rows of these episode ids: the keys go in by binary COPY into a temporary table,
    the rows come back by binary COPY."""
    schema = _schema(columns)
    names = ", ".join(f"e.{n}" for n, _ in columns)
    with postgres_reader(url) as conn, closing(conn.cursor()) as cur:
        cur.execute("BEGIN")
        try:
            cur.adbc_ingest("dyna_cdc_keys", pa.table({"episode_id": pa.array(list(ids), pa.string())}),
                            mode="create", temporary=True)
            cur.execute(f"SELECT {names} FROM episodes e JOIN dyna_cdc_keys k ON k.episode_id = e.episode_id")
            return pa.Table.from_batches([_cast(b, schema) for b in cur.fetch_record_batch()], schema=schema)
        finally:
            cur.execute("ROLLBACK")


@contextmanager
def read_ahead(batches: Iterator[pa.RecordBatch]) -> Iterator[Iterator[pa.RecordBatch]]:
    """The batches, one read ahead by a thread while the consumer works on the last: the driver's
    reading (C, the GIL released) and the warehouse's loading (DuckDB, the same) overlap. The thread
    is done with the source when the block ends, however it ends."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        ready.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            item = end
        except BaseException as e:  # handed to the consumer, raised there
            item = e
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return
            except queue.Full:
                pass

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


# -- SQLite: a first sync read by a child process ----------------------------------------------------
class SqliteSnapshotError(RuntimeError):
    """The child reading a SQLite snapshot failed; its own error is in the message."""


# The change-log position of a snapshot, read in the same transaction as its rows (changelog._HEAD).
_SQLITE_HEAD = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'change_log'), 0)"


@contextmanager
def sqlite_snapshot(path: str | Path, columns: Sequence[tuple[str, pa.DataType]],
                    batch_rows: int) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    """The episodes table of the SQLite registry at ``path`` as of one instant: (the change-log
    position it reflects, Arrow batches of exactly ``batch_rows`` rows but the last), read by a
    child process in one read transaction. The child runs one batch ahead of the consumer; a
    consumer that stops early kills it."""
    schema = _schema(columns)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(path), str(batch_rows)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        try:
            try:
                proc.stdin.write(schema.serialize().to_pybytes())
                proc.stdin.close()
                reader = pa.ipc.open_stream(proc.stdout)
            except (OSError, pa.ArrowInvalid) as e:
                raise _child_failed(proc, err, path) from e
            yield int(reader.schema.metadata[b"position"]), _child_batches(reader, proc, err, path)
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


def _child_failed(proc, err, path) -> SqliteSnapshotError:
    proc.wait()
    err.seek(0)
    tail = err.read()[-2000:].decode(errors="replace").strip()
    return SqliteSnapshotError(f"reading a snapshot of {path} failed (exit {proc.returncode}): {tail}")


def _sentinel(field: pa.Field) -> str:
    """A literal of the field's type: ADBC's SQLite driver infers a column's type from the values of
    its first batch (SQLite's columns are typed by value), so an all-NULL stretch would become int64
    and a later string an error. The snapshot's first row holds one value of every column's type
    and is dropped."""
    if pa.types.is_string(field.type):
        return "''"
    if pa.types.is_floating(field.type):
        return "0.5"
    return "0"


def _read_sqlite_snapshot(path: str, batch_rows: int, schema: pa.Schema, out) -> None:
    """The child's work: one read transaction, its position, then every row, as an IPC stream.
    ADBC's low-level API: its DB-API module imports pyarrow.dataset and pandas (0.3 s a sync)."""
    import adbc_driver_manager
    import adbc_driver_sqlite

    with ExitStack() as opened:
        db = opened.enter_context(closing(adbc_driver_sqlite.connect(path)))
        conn = opened.enter_context(closing(adbc_driver_manager.AdbcConnection(db)))

        def query(sql: str, **options) -> pa.RecordBatchReader:
            stmt = opened.enter_context(closing(adbc_driver_manager.AdbcStatement(conn)))
            stmt.set_options(**options)
            stmt.set_sql_query(sql)
            handle, _ = stmt.execute_query()
            return pa.RecordBatchReader._import_from_c(handle.address)

        # autocommit off: the driver begins a (deferred) transaction, so the snapshot is taken by the
        # first read below and both statements see the same instant
        conn.set_options(**{"adbc.connection.autocommit": "false"})
        position = query(_SQLITE_HEAD).read_all().column(0)[0].as_py()
        with pa.ipc.new_stream(out, schema.with_metadata({"position": str(position)})) as writer:
            out.flush()  # the position goes to the consumer before the first batch is read
            names = ", ".join(f.name for f in schema)  # column names from the schema, not input
            first = ", ".join(_sentinel(f) for f in schema)
            batches = query(f"SELECT {first} UNION ALL SELECT * FROM (SELECT {names} FROM episodes)",
                            **{"adbc.sqlite.query.batch_rows": str(batch_rows)})
            for b in rebatch((_cast(x.slice(1) if i == 0 else x, schema) for i, x in enumerate(batches)),
                             batch_rows, schema):
                writer.write_batch(b)
            batches.close()
        conn.rollback()


if __name__ == "__main__":  # the snapshot reader's child process: path, batch rows; the schema on stdin
    _read_sqlite_snapshot(sys.argv[1], int(sys.argv[2]), pa.ipc.read_schema(pa.py_buffer(sys.stdin.buffer.read())),
                          sys.stdout.buffer)
