"""SQLite's bulk episode writes without per-row triggers.

SQLite has row-level triggers only. For every episode row a bulk outcome write inserts or updates,
the partition summary's triggers (``partition_versions.py``) ran an upsert with a subquery and the
change log's (``changelog.py``) an insert: measured ~40 µs of a bulk outcome's ~95 µs. While a
transaction holds a row in ``episode_bulk_writes`` those triggers stand aside (their ``WHEN``
clause), and ``bulk_aside.triggers_aside`` does what they would have done, set-based, once per call:
the summary loses the affected rows' counts before the writes and gains them after, and the
change log gets one entry per written key.

The marker row is written and deleted inside the writer's own transaction, so it never commits
and no other connection sees it: every other write (a hand-run UPDATE, a review, the ladders)
still fires the triggers, and a writer killed mid-transaction rolls the marker back with its rows.
SQLite runs one write transaction at a time, so no other writer runs while the marker is there.
"""

from __future__ import annotations

from collections.abc import Sequence

TABLE = "episode_bulk_writes"
UNLESS_BULK = f"NOT EXISTS (SELECT 1 FROM {TABLE})"  # the WHEN clause of every episode row trigger
DDL = f"CREATE TABLE IF NOT EXISTS {TABLE} (writer INTEGER PRIMARY KEY)"


def triggers_current(conn, names: Sequence[str]) -> bool:
    """Every trigger of ``names`` exists and stands aside for bulk writes (an older registry's
    fires on every row of one too, and would count it twice next to the writer's own fold)."""
    listed = ", ".join(f"'{n}'" for n in names)  # the schema's trigger names, not input
    found = dict(
        conn.exec_driver_sql(f"SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name IN ({listed})").all()
    )
    return len(found) == len(names) and all(TABLE in sql for sql in found.values())
