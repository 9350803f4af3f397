"""Registry rows read as Arrow record batches through ADBC's PostgreSQL driver: it reads by binary
COPY in C, so no Python object is made per value. What the warehouse's CDC reads from PostgreSQL:
a first sync's whole episodes table, an incremental sync's changed rows. Every batch is cast to
the warehouse's column types.

Not for SQLite: ADBC's SQLite driver links its own copy of the SQLite library, and two copies in
one process do not share POSIX locks or the WAL index (SQLite's "multiple copies" hazard; tried:
it read a state from before the last checkpoint). SQLite is read through Python's sqlite3.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager

import pyarrow as pa
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
