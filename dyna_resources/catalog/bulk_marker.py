"""SQLite's bulk episode writes without per-row triggers.

SQLite has row-level triggers only. For every episode row a bulk outcome write inserts or updates,
the partition summary's triggers (``partition_versions.py``) ran an upsert with a subquery and the
change log's (``changelog.py``) an insert: measured ~40 µs of a bulk outcome's ~95 µs. While a
transaction holds a row in ``episode_bulk_writes`` those triggers stand aside (their ``WHEN``
clause), and :func:`triggers_aside` does what they would have done, set-based, once per call:
the summary loses the affected rows' counts before the writes and gains them after, and the
change log gets one entry per written key.

The marker row is written and deleted inside the writer's own transaction, so it never commits
and no other connection sees it: every other write (a hand-run UPDATE, a review, the ladders)
still fires the triggers, and a writer killed mid-transaction rolls the marker back with its rows.
SQLite runs one write transaction at a time, so no other writer runs while the marker is there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import orjson

TABLE = "episode_bulk_writes"
UNLESS_BULK = f"NOT EXISTS (SELECT 1 FROM {TABLE})"  # the WHEN clause of every episode row trigger
DDL = f"CREATE TABLE IF NOT EXISTS {TABLE} (writer INTEGER PRIMARY KEY)"

_KEYS = "SELECT value FROM json_each(?)"


def triggers_current(conn, names: Sequence[str]) -> bool:
    """Every trigger of ``names`` exists and stands aside for bulk writes (an older registry's
    fires on every row of one too, and would count it twice next to the writer's own fold)."""
    listed = ", ".join(f"'{n}'" for n in names)  # the schema's trigger names, not input
    found = dict(conn.exec_driver_sql(f"SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                                      f"AND name IN ({listed})").all())
    return len(found) == len(names) and all(TABLE in sql for sql in found.values())


@contextmanager
def triggers_aside(conn, episode_ids: Sequence[str], inserted: Sequence[str]) -> Iterator[None]:
    """Within ``conn``'s transaction (SQLite), the body writes episode rows of ``episode_ids`` and
    no others, and inserts every row of ``inserted`` that is new; the row triggers stand aside, and
    the summary and the change log end as the triggers would have left them."""
    from . import changelog, partition_versions

    ids = orjson.dumps(list(episode_ids)).decode()
    conn.exec_driver_sql(f"INSERT INTO {TABLE} (writer) VALUES (1)")
    existed = {r[0] for r in conn.exec_driver_sql(f"SELECT episode_id FROM episodes WHERE episode_id IN ({_KEYS})",
                                                  (ids,))}
    touched = partition_versions.fold(conn, ids, -1)
    yield
    touched |= partition_versions.fold(conn, ids, +1)
    partition_versions.drop_empty(conn, touched)
    changelog.log_keys(conn, "episodes", inserted=[k for k in inserted if k not in existed], updated=sorted(existed))
    conn.exec_driver_sql(f"DELETE FROM {TABLE}")
