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

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Engine

TRACKED = {"episodes": "episode_id"}

_DDL = [
    """CREATE TABLE IF NOT EXISTS change_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        tbl TEXT NOT NULL,
        op TEXT NOT NULL CHECK (op IN ('I', 'U', 'D')),
        pk TEXT NOT NULL,
        at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))""",
]
for _tbl, _pk in TRACKED.items():
    _DDL += [
        f"""CREATE TRIGGER IF NOT EXISTS {_tbl}_cdc_insert AFTER INSERT ON {_tbl} BEGIN
            INSERT INTO change_log (tbl, op, pk) VALUES ('{_tbl}', 'I', NEW.{_pk}); END""",
        f"""CREATE TRIGGER IF NOT EXISTS {_tbl}_cdc_update AFTER UPDATE ON {_tbl} BEGIN
            INSERT INTO change_log (tbl, op, pk) SELECT '{_tbl}', 'D', OLD.{_pk} WHERE OLD.{_pk} <> NEW.{_pk};
            INSERT INTO change_log (tbl, op, pk) VALUES ('{_tbl}', 'U', NEW.{_pk}); END""",
        f"""CREATE TRIGGER IF NOT EXISTS {_tbl}_cdc_delete AFTER DELETE ON {_tbl} BEGIN
            INSERT INTO change_log (tbl, op, pk) VALUES ('{_tbl}', 'D', OLD.{_pk}); END""",
    ]


@dataclass(frozen=True)
class Change:
    seq: int
    table: str
    op: str  # 'I' | 'U' | 'D'
    key: str


def install(engine: Engine) -> None:
    """Create the change log and its triggers (idempotent)."""
    with engine.begin() as c:
        for stmt in _DDL:
            c.execute(text(stmt))


def read_changes(engine: Engine, after: int, limit: int) -> list[Change]:
    with engine.begin() as c:
        rows = c.execute(text("SELECT seq, tbl, op, pk FROM change_log WHERE seq > :after ORDER BY seq LIMIT :limit"),
                         {"after": after, "limit": limit}).all()
    return [Change(*r) for r in rows]


def prune(engine: Engine, upto: int) -> int:
    """Drop log entries a consumer has durably applied (one consumer: the warehouse)."""
    with engine.begin() as c:
        return c.execute(text("DELETE FROM change_log WHERE seq <= :upto"), {"upto": upto}).rowcount
