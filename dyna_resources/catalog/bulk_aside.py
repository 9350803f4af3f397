"""SQLite's bulk episode writes with the row triggers aside (the marker and why: ``bulk_marker.py``).

Above the marker, the summary (``partition_versions.py``) and the change log (``changelog.py``), which
all need the marker: this module folds their work into one set-based pass per call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import orjson

from . import bulk_marker, changelog, partition_versions


@contextmanager
def triggers_aside(conn, episode_ids: Sequence[str], inserted: Sequence[str]) -> Iterator[None]:
    """Within ``conn``'s transaction (SQLite), the body writes episode rows of ``episode_ids`` and
    no others, and inserts every row of ``inserted`` that is new; the row triggers stand aside, and
    the summary and the change log end as the triggers would have left them."""
    ids = orjson.dumps(list(episode_ids)).decode()
    conn.exec_driver_sql(f"INSERT INTO {bulk_marker.TABLE} (writer) VALUES (1)")
    existed = {
        r[0]
        for r in conn.exec_driver_sql(
            "SELECT episode_id FROM episodes WHERE episode_id IN (SELECT value FROM json_each(?))", (ids,)
        )
    }
    touched = partition_versions.fold(conn, ids, -1)
    yield
    touched |= partition_versions.fold(conn, ids, +1)
    partition_versions.drop_empty(conn, touched)
    changelog.log_keys(conn, "episodes", inserted=[k for k in inserted if k not in existed], updated=sorted(existed))
    conn.exec_driver_sql(f"DELETE FROM {bulk_marker.TABLE}")
