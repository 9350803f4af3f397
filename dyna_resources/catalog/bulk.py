"""Set-based writes of many rows through the DBAPI cursor: one statement text per (table, columns),
rows as tuples, SQLite's ``executemany`` or psycopg2's ``execute_values`` (1,000 rows a statement).

SQLAlchemy Core's ``executemany`` converts and binds every row in Python (~25 µs a row of the
episodes table): at a million outcomes a stage that is most of the registry's write time, and
psycopg2's own ``executemany`` is a round trip per row. Statement texts are built from the
schema's table and column names only (a column a row names that its table lacks is refused), and
every value is a bound parameter, so nothing from input data reaches the SQL text.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from sqlalchemy import Table

PAGE = 1000  # rows per PostgreSQL statement


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
def _upsert_sql(backend: str, table: Table, names: tuple[str, ...], keys: tuple[str, ...],
                update: tuple[str, ...] | None) -> str:
    cols = ", ".join(names)
    values = "VALUES %s" if backend == "postgresql" else f"VALUES ({', '.join('?' * len(names))})"
    todo = [n for n in names if n not in keys] if update is None else list(update)  # update: the columns to set
    conflict = (f"DO UPDATE SET {', '.join(f'{n} = excluded.{n}' for n in todo)}" if todo else "DO NOTHING")
    return f"INSERT INTO {table.name} ({cols}) {values} ON CONFLICT ({', '.join(keys)}) {conflict}"


@lru_cache(maxsize=256)
def _update_sql(backend: str, table: Table, names: tuple[str, ...], key: str) -> str:
    sets = [n for n in names if n != key]
    if backend == "postgresql":
        return (f"UPDATE {table.name} AS t SET {', '.join(f'{n} = v.{n}' for n in sets)} "
                f"FROM (VALUES %s) AS v ({', '.join(names)}) WHERE t.{key} = v.{key}")
    return f"UPDATE {table.name} SET {', '.join(f'{n} = ?' for n in sets)} WHERE {key} = ?"


def _run(conn, backend: str, sql: str, table: Table, names: tuple[str, ...], rows: list[tuple]) -> None:
    if backend == "postgresql":
        from psycopg2.extras import execute_values

        cur = conn.connection.dbapi_connection.cursor()  # the SQLAlchemy connection's transaction
        try:
            execute_values(cur, sql, rows, template=f"({_pg_types(table, names)})", page_size=PAGE)
        finally:
            cur.close()
    else:
        conn.exec_driver_sql(sql, rows)


def upsert(conn, backend: str, table: Table, rows: Sequence[dict], keys: Sequence[str],
           update: Sequence[str] | None = None) -> None:
    """Insert ``rows`` (all with the same columns), on a key conflict update ``update`` (default:
    every column not in ``keys``; empty: leave the existing row)."""
    if not rows:
        return
    own = _columns(table, list(rows[0]))
    fill = tuple((n, v) for n, v in _defaults(table) if n not in own)  # what SQLAlchemy's insert would add
    names = own + tuple(n for n, _ in fill)
    todo = tuple(n for n in own if n not in keys) if update is None else tuple(update)
    sql = _upsert_sql(backend, table, names, tuple(keys), todo)
    extra = tuple(v for _, v in fill)
    _run(conn, backend, sql, table, names, [tuple(r[n] for n in own) + extra for r in rows])


@lru_cache(maxsize=64)
def _defaults(table: Table) -> tuple[tuple[str, object], ...]:
    """The columns' client-side scalar defaults (``Column(default=...)``), applied on insert only."""
    out = []
    for c in table.columns:
        if c.default is not None:
            if not c.default.is_scalar:
                raise TypeError(f"{table.name}.{c.name}: only scalar column defaults are written in bulk")
            out.append((c.name, c.default.arg))
    return tuple(out)


def update_by_key(conn, backend: str, table: Table, rows: Sequence[dict], key: str) -> None:
    """``UPDATE table SET <the rows' other columns> WHERE key = <the row's key>`` for every row (all
    with the same columns); a row whose key is absent changes nothing."""
    if not rows:
        return
    names = _columns(table, list(rows[0]))
    if key not in names:
        raise KeyError(f"rows to update by {key} must hold {key}")
    sql = _update_sql(backend, table, names, key)
    if backend == "postgresql":
        _run(conn, backend, sql, table, names, [tuple(r[n] for n in names) for r in rows])
    else:  # the key binds last
        sets = [n for n in names if n != key]
        conn.exec_driver_sql(sql, [tuple(r[n] for n in sets) + (r[key],) for r in rows])
