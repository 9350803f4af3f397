"""Set-based writes of many rows through the DBAPI cursor: one statement text per (table, columns),
rows as tuples. SQLite: ``executemany``. PostgreSQL: a few rows through psycopg2's
``execute_values``; many through ``COPY`` into a temporary staging table, then one
``INSERT ... SELECT ... ON CONFLICT`` or ``UPDATE ... FROM`` for all of them. Each write is
built first (:func:`prepare_upsert`, :func:`prepare_update`: statement text, rows encoded, no
connection needed) and then run (:func:`run`), so a caller can build one while another runs.

SQLAlchemy Core's ``executemany`` converts and binds every row in Python (~25 µs a row of the
episodes table): at a million outcomes a stage that is most of the registry's write time, and
psycopg2's own ``executemany`` is a round trip per row. A ``VALUES`` list of thousands of typed
rows costs the server a parse and plan as long as the list (~15 µs a row); ``COPY`` parses
nothing. Statement texts are built from the schema's table and column names only (a column a row
names that its table lacks is refused), and every value is bound or travels as COPY data, never
as SQL text, so nothing from input data reaches the SQL.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter

from sqlalchemy import ColumnDefault, Table

PAGE = 1000  # rows per PostgreSQL VALUES statement
COPY_FROM = 200  # rows from which PostgreSQL writes go through COPY and a staging table


@dataclass(frozen=True)
class Derived:
    """PostgreSQL: columns the server computes for every written row in the same statement, from
    other tables, so the client neither reads them first nor writes the rows twice. ``source`` is a
    subquery over the written row (alias ``v``) returning exactly one row (alias ``d``); ``columns``
    pairs each derived column with an expression over ``d``; they are set on insert and on every
    key conflict, and the rows must not hold them. Neither may hold a ``%`` (the VALUES path's
    text goes through psycopg2's parameter formatting)."""

    source: str
    columns: tuple[tuple[str, str], ...]

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.columns)


def _rows_from(names: tuple[str, ...], staging: str | None, derived: Derived) -> str:
    """The written rows as a relation ``v`` (the staging table, else the VALUES list that
    ``execute_values`` fills in), each joined to its derived values ``d``."""
    rows = staging if staging is not None else "(VALUES %s)"
    alias = "v" if staging is not None else f"v ({', '.join(names)})"
    return f"FROM {rows} AS {alias} CROSS JOIN LATERAL ({derived.source}) AS d"


def _columns(table: Table, names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in table.c]
    if unknown:
        raise KeyError(f"table {table.name} has no column(s) {unknown}")
    return tuple(names)


@lru_cache(maxsize=256)
def _pg_types(table: Table, names: tuple[str, ...]) -> str:
    from sqlalchemy.dialects import postgresql

    return ", ".join(f"%s::{table.c[n].type.compile(dialect=postgresql.dialect())}" for n in names)


@lru_cache(maxsize=256)
def _upsert_sql(
    backend: str,
    table: Table,
    names: tuple[str, ...],
    keys: tuple[str, ...],
    update: tuple[str, ...] | None,
    staging: str | None = None,
    derived: Derived | None = None,
) -> str:
    """The upsert's text; from ``staging`` (a staging table of the same columns) when given. Rows
    must be unique by ``keys``."""
    if derived is not None:
        todo = [n for n in names if n not in keys] if update is None else list(update)
        sets = ", ".join(f"{n} = excluded.{n}" for n in [*todo, *derived.names()])
        return (
            f"INSERT INTO {table.name} ({', '.join([*names, *derived.names()])}) "
            f"SELECT {', '.join([*(f'v.{n}' for n in names), *(e for _, e in derived.columns)])} "
            f"{_rows_from(names, staging, derived)} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
        )
    cols = ", ".join(names)
    if staging is not None:
        values = f"SELECT {cols} FROM {staging}"
    else:
        values = "VALUES %s" if backend == "postgresql" else f"VALUES ({', '.join('?' * len(names))})"
    todo = [n for n in names if n not in keys] if update is None else list(update)  # update: the columns to set
    conflict = f"DO UPDATE SET {', '.join(f'{n} = excluded.{n}' for n in todo)}" if todo else "DO NOTHING"
    return f"INSERT INTO {table.name} ({cols}) {values} ON CONFLICT ({', '.join(keys)}) {conflict}"


@lru_cache(maxsize=256)
def _update_sql(
    backend: str,
    table: Table,
    names: tuple[str, ...],
    key: str,
    staging: str | None = None,
    derived: Derived | None = None,
) -> str:
    sets = [n for n in names if n != key]
    if derived is not None:
        assigned = [*(f"{n} = v.{n}" for n in sets), *(f"{n} = {e}" for n, e in derived.columns)]
        return (
            f"UPDATE {table.name} AS t SET {', '.join(assigned)} {_rows_from(names, staging, derived)} "
            f"WHERE t.{key} = v.{key}"
        )
    if staging is not None:
        return (
            f"UPDATE {table.name} AS t SET {', '.join(f'{n} = v.{n}' for n in sets)} "
            f"FROM {staging} AS v WHERE t.{key} = v.{key}"
        )
    if backend == "postgresql":
        return (
            f"UPDATE {table.name} AS t SET {', '.join(f'{n} = v.{n}' for n in sets)} "
            f"FROM (VALUES %s) AS v ({', '.join(names)}) WHERE t.{key} = v.{key}"
        )
    return f"UPDATE {table.name} SET {', '.join(f'{n} = ?' for n in sets)} WHERE {key} = ?"


@dataclass(frozen=True)
class Write:
    """One set-based write, built and ready: the statement text and the rows, encoded (as COPY
    text where they go through a staging table). Building one needs no connection, so a writer
    can build the next while the server runs this one (:func:`run`)."""

    backend: str
    table: Table
    names: tuple[str, ...]
    sql: str
    rows: list[tuple] | None = None  # bound by executemany / execute_values
    copy_text: str | None = None  # COPY data for the staging table the statement reads
    index_joins: bool = False  # PostgreSQL: join the staging rows to the table by its key index


def run(conn, write: Write) -> None:
    """Run a prepared write in ``conn``'s transaction."""
    if write.copy_text is not None:
        _staged(conn, write.table, write.names, write.copy_text)
        if write.index_joins:
            with _index_joins(conn):
                conn.exec_driver_sql(write.sql)
        else:
            conn.exec_driver_sql(write.sql)
    elif write.backend == "postgresql":
        from psycopg2.extras import execute_values

        cur = conn.connection.dbapi_connection.cursor()  # the SQLAlchemy connection's transaction
        try:
            execute_values(
                cur, write.sql, write.rows, template=f"({_pg_types(write.table, write.names)})", page_size=PAGE
            )
        finally:
            cur.close()
    else:
        conn.exec_driver_sql(write.sql, write.rows)


def _staging(table: Table) -> str:
    return f"dyna_stage_{table.name}"


def _staged(conn, table: Table, names: tuple[str, ...], copy_text: str) -> None:
    """COPY rows into this transaction's staging table for ``table`` (its columns and types, no
    constraints; dropped at commit, so a column added to the table later is there next time)."""
    staging = _staging(table)
    cur = conn.connection.dbapi_connection.cursor()
    try:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DROP AS SELECT * FROM {table.name} WITH NO DATA"
        )
        cur.execute(f"TRUNCATE {staging}")
        # one read of the whole text: psycopg2 takes the GIL back for every read (8 KiB by default)
        cur.copy_expert(
            f"COPY {staging} ({', '.join(names)}) FROM STDIN", io.StringIO(copy_text), size=max(len(copy_text), 8192)
        )
    finally:
        cur.close()


@contextmanager
def _index_joins(conn):
    """PostgreSQL: the statement inside joins the staging table to its target by the target's key
    index (a nested loop), whatever the planner's statistics say. With the target's statistics
    stale (autovacuum lags a bulk load) the planner hashed the staging rows and scanned the whole
    table: 30,720 rows read to update 3,064, a scan that grows with the corpus. The settings are put
    back as they were, for the rest of the transaction."""
    cur = conn.connection.dbapi_connection.cursor()
    try:
        cur.execute(
            "SELECT current_setting('enable_hashjoin'), current_setting('enable_mergejoin'), "
            "set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
        )
        hashjoin, mergejoin, _, _ = cur.fetchone()
        yield
        cur.execute(
            "SELECT set_config('enable_hashjoin', %s, true), set_config('enable_mergejoin', %s, true)",
            (hashjoin, mergejoin),
        )
    finally:
        cur.close()


# psycopg2 reads COPY data from a file but has no encoder for it (psycopg 3 has one; the registry's
# engine is psycopg2): PostgreSQL's text format, written here.


def _copy_value(v) -> str:
    if v is None:
        return "\\N"
    cls = v.__class__
    if cls is str:
        if "\\" in v or "\t" in v or "\n" in v or "\r" in v:
            return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
        return v
    if cls is bool:
        return "t" if v else "f"
    if cls is int:
        return str(v)
    if cls is float:
        return repr(v) if math.isfinite(v) else ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity"))
    if isinstance(v, str):
        return _copy_value(str(v))
    if isinstance(v, int):  # an int subclass (an IntEnum)
        return str(int(v))
    raise TypeError(f"no COPY text for a {cls.__name__} value")


def _copy_column(values: tuple) -> list[str]:
    """One column's values as COPY text: a C-speed pass where the column is all one plain type,
    value by value otherwise."""
    classes = set(map(type, values)) - {type(None)}
    if classes == {str}:
        joined = "".join([v for v in values if v is not None])
        if not ("\\" in joined or "\t" in joined or "\n" in joined or "\r" in joined):
            return ["\\N" if v is None else v for v in values]
    elif classes == {int}:
        return ["\\N" if v is None else str(v) for v in values]
    elif classes == {bool}:
        return ["\\N" if v is None else ("t" if v else "f") for v in values]
    elif classes == {float}:
        return ["\\N" if v is None else (repr(v) if v - v == 0 else _copy_value(v)) for v in values]  # inf, nan
    elif not classes:
        return ["\\N"] * len(values)
    return [_copy_value(v) for v in values]


def _copy_text(rows: list[tuple]) -> str:
    """Rows in PostgreSQL's COPY text format, encoded column by column."""
    columns = [_copy_column(col) for col in zip(*rows)]
    return "\n".join(["\t".join(r) for r in zip(*columns)]) + "\n"


def _tuples(rows: Sequence[dict], names: Sequence[str], extra: tuple = ()) -> list[tuple]:
    get = itemgetter(*names)
    if len(names) == 1:
        return [(get(r),) + extra for r in rows]
    return [get(r) + extra for r in rows] if extra else [get(r) for r in rows]


def upsert(
    conn,
    backend: str,
    table: Table,
    rows: Sequence[dict],
    keys: Sequence[str],
    update: Sequence[str] | None = None,
    derived: Derived | None = None,
) -> None:
    """Insert ``rows`` (all with the same columns), on a key conflict update ``update`` (default:
    every column not in ``keys``; empty: leave the existing row). ``derived`` (PostgreSQL only):
    columns the server computes, set on insert and on conflict."""
    if rows:
        run(conn, prepare_upsert(backend, table, rows, keys, update, derived))


def prepare_upsert(
    backend: str,
    table: Table,
    rows: Sequence[dict],
    keys: Sequence[str],
    update: Sequence[str] | None = None,
    derived: Derived | None = None,
) -> Write:
    """:func:`upsert`'s write, built (``rows`` not empty)."""
    # upsert's parameters, less conn: it runs this write; both spell them out for their callers' sake.
    _no_derived_on(backend, derived)
    own = _columns(table, list(rows[0]))
    fill = tuple((n, v) for n, v in _defaults(table) if n not in own)  # what SQLAlchemy's insert would add
    names = own + tuple(n for n, _ in fill)
    todo = tuple(n for n in own if n not in keys) if update is None else tuple(update)
    values = _tuples(rows, own, tuple(v for _, v in fill))
    if backend == "postgresql" and len(values) >= COPY_FROM:
        return Write(
            backend,
            table,
            names,
            _upsert_sql(backend, table, names, tuple(keys), todo, _staging(table), derived),
            copy_text=_copy_text(values),
        )
    return Write(backend, table, names, _upsert_sql(backend, table, names, tuple(keys), todo, None, derived), values)


def _no_derived_on(backend: str, derived: Derived | None) -> None:
    if derived is not None and backend != "postgresql":
        raise ValueError("derived columns are computed by PostgreSQL writes only")


@lru_cache(maxsize=64)
def _defaults(table: Table) -> tuple[tuple[str, object], ...]:
    """The columns' client-side scalar defaults (``Column(default=...)``), applied on insert only."""
    out = []
    for c in table.columns:
        if c.default is not None:
            if not c.default.is_scalar:
                raise TypeError(f"{table.name}.{c.name}: only scalar column defaults are written in bulk")
            assert isinstance(c.default, ColumnDefault), "a scalar default is a ColumnDefault, which has .arg"
            out.append((c.name, c.default.arg))
    return tuple(out)


def update_by_key(
    conn, backend: str, table: Table, rows: Sequence[dict], key: str, derived: Derived | None = None
) -> None:
    """``UPDATE table SET <the rows' other columns> WHERE key = <the row's key>`` for every row (all
    with the same columns); a row whose key is absent changes nothing. ``derived`` (PostgreSQL
    only): columns the server computes, set too."""
    if rows:
        run(conn, prepare_update(backend, table, rows, key, derived))


def prepare_update(backend: str, table: Table, rows: Sequence[dict], key: str, derived: Derived | None = None) -> Write:
    """:func:`update_by_key`'s write, built (``rows`` not empty)."""
    _no_derived_on(backend, derived)
    names = _columns(table, list(rows[0]))
    if key not in names:
        raise KeyError(f"rows to update by {key} must hold {key}")
    if backend == "postgresql":
        values = _tuples(rows, names)
        if len(values) >= COPY_FROM:
            return Write(
                backend,
                table,
                names,
                _update_sql(backend, table, names, key, _staging(table), derived),
                copy_text=_copy_text(values),
                index_joins=True,
            )
        return Write(backend, table, names, _update_sql(backend, table, names, key, None, derived), values)
    sets = [n for n in names if n != key]  # the key binds last
    return Write(
        backend, table, names, _update_sql(backend, table, names, key), list(map(itemgetter(*sets, key), rows))
    )
