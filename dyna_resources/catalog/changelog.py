"""Change-data-capture from the SQLite registry: a trigger-fed change log.

Every insert, update and delete on ``episodes`` appends (seq, op, key) to ``change_log``
inside the writer's own transaction, so a change is logged if and only if it commits.
SQLite runs one write transaction at a time, so ``seq`` (AUTOINCREMENT: monotonic, never
reused) is also commit order: a reader that has applied everything up to ``seq`` never
sees a smaller one appear later. The log carries keys, not row images: the consumer
reads each changed key's current row, which makes applying a range idempotent and lets
a range be applied again after a crash. (PostgreSQL uses logical decoding instead.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Engine

from . import bulk_marker

TRACKED = {"episodes": "episode_id"}

_DDL = [
    """CREATE TABLE IF NOT EXISTS change_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        tbl TEXT NOT NULL,
        op TEXT NOT NULL CHECK (op IN ('I', 'U', 'D')),
        pk TEXT NOT NULL,
        at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))""",
]
# The triggers stand aside for the registry's bulk writes, which log their keys themselves in one
# statement (bulk_marker.py).
_DDL.append(bulk_marker.DDL)
_TRIGGERS = []
for _tbl, _pk in TRACKED.items():
    _TRIGGERS += [f"{_tbl}_cdc_insert", f"{_tbl}_cdc_update", f"{_tbl}_cdc_delete"]
    _DDL += [
        f"""CREATE TRIGGER IF NOT EXISTS {_tbl}_cdc_insert AFTER INSERT ON {_tbl} WHEN {bulk_marker.UNLESS_BULK} BEGIN
            INSERT INTO change_log (tbl, op, pk) VALUES ('{_tbl}', 'I', NEW.{_pk}); END""",
        f"""CREATE TRIGGER IF NOT EXISTS {_tbl}_cdc_update AFTER UPDATE ON {_tbl} WHEN {bulk_marker.UNLESS_BULK} BEGIN
            INSERT INTO change_log (tbl, op, pk) SELECT '{_tbl}', 'D', OLD.{_pk} WHERE OLD.{_pk} <> NEW.{_pk};
            INSERT INTO change_log (tbl, op, pk) VALUES ('{_tbl}', 'U', NEW.{_pk}); END""",
        f"""CREATE TRIGGER IF NOT EXISTS {_tbl}_cdc_delete AFTER DELETE ON {_tbl} WHEN {bulk_marker.UNLESS_BULK} BEGIN
            INSERT INTO change_log (tbl, op, pk) VALUES ('{_tbl}', 'D', OLD.{_pk}); END""",
    ]


# Every consumer's applied position: the log is pruned only behind all of them.
_DDL.append("""CREATE TABLE IF NOT EXISTS change_log_consumers (
    name TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    updated_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))""")


@dataclass(frozen=True)
class Change:
    seq: int
    table: str
    op: str  # 'I' | 'U' | 'D'
    key: str


def install(engine: Engine) -> None:
    """Create the change log and its triggers (idempotent); triggers of older registries (without
    the bulk writes' WHEN clause) are made again."""
    with engine.begin() as c:
        if bulk_marker.triggers_current(c, _TRIGGERS):
            return
        for name in _TRIGGERS:
            c.execute(text(f"DROP TRIGGER IF EXISTS {name}"))
        for stmt in _DDL:
            c.execute(text(stmt))


def log_keys(conn, table: str, *, inserted: list[str], updated: list[str]) -> None:
    """Within a bulk write (``bulk_marker.py``): the entries the row triggers would have written
    for these keys of ``table``, one statement per kind."""
    for op, keys in (("I", inserted), ("U", updated)):
        if keys:
            conn.exec_driver_sql(
                "INSERT INTO change_log (tbl, op, pk) SELECT ?, ?, value FROM json_each(?)",
                (table, op, orjson.dumps(keys).decode()),
            )


def read_changes(engine: Engine, after: int, limit: int) -> list[Change]:
    with engine.begin() as c:
        rows = c.execute(
            text("SELECT seq, tbl, op, pk FROM change_log WHERE seq > :after ORDER BY seq LIMIT :limit"),
            {"after": after, "limit": limit},
        ).all()
    return [Change(*r) for r in rows]


# The last seq ever handed out (AUTOINCREMENT keeps it in sqlite_sequence, pruned entries included).
_HEAD = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'change_log'), 0)"


def head(engine: Engine) -> int:
    """The newest seq the log has handed out (0 before the first): any later change has a higher one."""
    with engine.begin() as c:
        return c.execute(text(_HEAD)).scalar_one()


def set_consumer(engine: Engine, name: str, position: int) -> None:
    """Record that consumer ``name`` has durably applied everything up to ``position``. A new
    consumer registers here before it takes its snapshot, at a position no later than it."""
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO change_log_consumers (name, position) VALUES (:n, :p) "
                "ON CONFLICT (name) DO UPDATE SET position = excluded.position, "
                "updated_at = (julianday('now') - 2440587.5) * 86400.0"
            ),
            {"n": name, "p": position},
        )


def drop_consumer(engine: Engine, name: str) -> None:
    """Forget a consumer (a warehouse that is gone): the log is no longer kept for it."""
    with engine.begin() as c:
        c.execute(text("DELETE FROM change_log_consumers WHERE name = :n"), {"n": name})


def consumers(engine: Engine) -> dict[str, int]:
    with engine.begin() as c:
        return dict(c.execute(text("SELECT name, position FROM change_log_consumers")).all())


def prune(engine: Engine, name: str, upto: int) -> int:
    """Consumer ``name`` has durably applied up to ``upto``: record it, then drop the entries every
    consumer has applied. Returns how many entries went."""
    set_consumer(engine, name, upto)
    with engine.begin() as c:
        return c.execute(
            text("DELETE FROM change_log WHERE seq <= (SELECT min(position) FROM change_log_consumers)")
        ).rowcount


@contextmanager
def snapshot(engine: Engine, columns: list[str]) -> Iterator[tuple[int, object]]:
    """The episodes table as of one instant, as an open DB-API cursor to fetch from in batches,
    with the log position that instant reflects: every change up to it is in the rows, every
    later one has a higher seq. One read transaction (WAL: writers go on meanwhile)."""
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("BEGIN")  # deferred: the snapshot is taken by the first read below, held to the end
        position = cur.execute(_HEAD).fetchone()[0]
        cur.execute(f"SELECT {', '.join(columns)} FROM episodes")  # column names from the schema, not input
        yield position, cur
    finally:
        with suppress(Exception):  # nothing was written; a failed BEGIN leaves nothing to roll back
            raw.cursor().execute("ROLLBACK")
        raw.close()
