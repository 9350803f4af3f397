"""The analytic warehouse (DuckDB): the registry's episodes, kept in sync by change-data-capture.

One DuckDB file, one writer at a time (DuckDB's rule; Dagster serializes writers with a
pool of size 1). Each apply is one DuckDB transaction holding the rows *and* the CDC
position it reached, so a crash either keeps both or neither: the sync resumes from the
last applied position and re-applies at most one batch, which is idempotent because the
change log carries keys and the rows are read as they are now.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Text

from . import schema as t
from .arrow_reads import strings

_DUCK_TYPES = {
    BigInteger: "BIGINT",
    Integer: "INTEGER",
    Float: "DOUBLE",
    Boolean: "BOOLEAN",
    String: "VARCHAR",
    Text: "VARCHAR",
}
_ARROW_TYPES = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "VARCHAR": pa.string(),
}


_STAGING = "__snapshot"  # suffix of the tables a snapshot is loaded into before they replace the live ones

# One row per step of every episode's ladder, unnested from the episodes' ``step_ladder`` JSON
# when their rows are applied: what curation selects steps by.
STEP_COLUMNS = [
    ("episode_id", "VARCHAR"),
    ("step_index", "INTEGER"),
    ("step", "VARCHAR"),
    ("start_ns", "BIGINT"),
    ("end_ns", "BIGINT"),
    ("duration_s", "DOUBLE"),
    ("outcome", "VARCHAR"),
    ("failure_mode", "VARCHAR"),
    ("failed_at_ns", "BIGINT"),
]


def warehouse_columns() -> list[tuple[str, str]]:
    """The warehouse mirrors every column of the registry's episodes table, plus when it was synced."""
    cols = []
    for c in t.episodes.columns:
        duck = next(v for k, v in _DUCK_TYPES.items() if isinstance(c.type, k))
        cols.append((c.name, duck))
    return cols + [("synced_at", "DOUBLE")]


# DuckDB's buffer pool defaults to 80 % of the machine's memory and keeps what a long load wrote
# cached up to it: a first sync of 10^6 rows peaked at 1.1 GB of RSS, growing with the rows. A writer
# is capped (DuckDB spills to a temporary folder beyond it); readers (curation) keep the default.
WRITER_MEMORY_LIMIT = "1GB"


class Warehouse:
    def __init__(self, path: str | Path, *, read_only: bool = False, memory_limit: str | None = None):
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        limit = memory_limit if memory_limit is not None else ("" if read_only else WRITER_MEMORY_LIMIT)
        self.con = duckdb.connect(str(self.path), read_only=read_only, config={"memory_limit": limit} if limit else {})
        self.columns = warehouse_columns()
        if not read_only:
            self._create_tables("")
            self.con.execute("CREATE TABLE IF NOT EXISTS cdc_position (source VARCHAR PRIMARY KEY, position VARCHAR)")
            have = {
                r[0]
                for r in self.con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'episodes'"
                ).fetchall()
            }
            for n, ty in self.columns:  # additive migration, as in the registry
                if n not in have:
                    self.con.execute(f"ALTER TABLE episodes ADD COLUMN {n} {ty}")

    def _create_tables(self, suffix: str) -> None:
        # No PRIMARY KEY: DuckDB's index of one made an incremental commit of 10^4 rows into 10^6 cost
        # 0.41 s against 0.016 s without it. Keys stay unique because every apply deletes each key it
        # writes, in the same transaction, and a snapshot copies a table keyed in the registry.
        # (Warehouses made with the key keep it until their next snapshot; both work.)
        for table, columns in (("episodes", self.columns), ("episode_steps", STEP_COLUMNS)):
            cols = ", ".join(f"{n} {ty}" for n, ty in columns)
            self.con.execute(f"CREATE TABLE IF NOT EXISTS {table}{suffix} ({cols})")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def position(self, source: str) -> str | None:
        row = self.con.execute("SELECT position FROM cdc_position WHERE source = ?", [source]).fetchone()
        return row[0] if row else None

    def apply(
        self,
        *,
        source: str,
        position: str,
        upserts: Sequence[dict] | pa.RecordBatch,
        deletes: Sequence[str],
        replace_all: bool = False,
    ) -> None:
        """Upsert rows (dicts, or an Arrow batch of :func:`arrow_columns`) and delete keys, and record
        ``position``, in one transaction (``replace_all``: the rows are the whole table, as in a snapshot)."""
        names = [n for n, _ in self.columns]
        now = time.time()
        if isinstance(upserts, pa.RecordBatch | pa.Table):  # registry rows as Arrow (cdc): every column but synced_at
            # no pa.array of Python lists here: its first call imports pandas (0.3 s a sync)
            synced = pa.Array.from_buffers(
                pa.float64(), upserts.num_rows, [None, pa.py_buffer(np.full(upserts.num_rows, now))]
            )
            table = pa.table({n: (synced if n == "synced_at" else upserts.column(n)) for n in names})
            keys = pa.table(
                {
                    "episode_id": pa.chunked_array(
                        [strings(deletes), *pa.chunked_array(upserts.column("episode_id")).chunks], pa.string()
                    )
                }
            )
        else:
            table = pa.table(
                {
                    n: pa.array([(now if n == "synced_at" else r.get(n)) for r in upserts], type=_ARROW_TYPES[ty])
                    for n, ty in self.columns
                }
            )
            keys = pa.table({"episode_id": pa.array(list(deletes) + [r["episode_id"] for r in upserts], pa.string())})
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.register("cdc_upserts", table)
            self.con.register("cdc_keys", keys)
            # delete then insert: one statement pair for the whole batch, whatever the mix
            if replace_all:
                self.con.execute("DELETE FROM episodes")
                self.con.execute("DELETE FROM episode_steps")
            else:
                self.con.execute("DELETE FROM episodes WHERE episode_id IN (SELECT episode_id FROM cdc_keys)")
                self.con.execute("DELETE FROM episode_steps WHERE episode_id IN (SELECT episode_id FROM cdc_keys)")
            self.con.execute(f"INSERT INTO episodes ({', '.join(names)}) SELECT {', '.join(names)} FROM cdc_upserts")
            self.con.execute(_steps_from("cdc_upserts"))
            self.con.execute("INSERT OR REPLACE INTO cdc_position VALUES (?, ?)", [source, position])
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self.con.unregister("cdc_upserts")
            self.con.unregister("cdc_keys")

    @contextmanager
    def snapshot(self, source: str) -> Iterator[SnapshotLoad]:
        """Replace the whole table with a snapshot loaded batch by batch. The batches go to staging
        tables, each committed (so memory follows the batch: DuckDB holds an open transaction's rows
        in memory), and one transaction swaps them in with the position the snapshot reflects
        (``load.position``, set before the block ends). A snapshot killed half-way leaves the
        warehouse as it was; the next one starts its staging tables afresh."""
        self.con.execute(f"DROP TABLE IF EXISTS episodes{_STAGING}")
        self.con.execute(f"DROP TABLE IF EXISTS episode_steps{_STAGING}")
        self._create_tables(_STAGING)
        load = SnapshotLoad(self)
        yield load
        if load.position is None:
            raise RuntimeError("a snapshot must say which change-log position it reflects")
        self.con.execute("BEGIN TRANSACTION")
        try:
            for table in ("episodes", "episode_steps"):
                self.con.execute(f"DROP TABLE {table}")
                self.con.execute(f"ALTER TABLE {table}{_STAGING} RENAME TO {table}")
            self.con.execute("INSERT OR REPLACE INTO cdc_position VALUES (?, ?)", [source, load.position])
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def episodes(self) -> list[dict]:
        selected = ", ".join(n for n, _ in self.columns if n != "synced_at")
        cur = self.con.execute(f"SELECT {selected} FROM episodes ORDER BY episode_id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def steps(self, episode_id: str | None = None) -> list[dict]:
        where, params = ("WHERE episode_id = ?", [episode_id]) if episode_id is not None else ("", [])
        cur = self.con.execute(f"SELECT * FROM episode_steps {where} ORDER BY episode_id, step_index", params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def count(self) -> int:
        row = self.con.execute("SELECT count(*) FROM episodes").fetchone()
        assert row is not None, "an aggregate query returns one row"
        return row[0]

    def stale_count(self, *, schema: str, pipeline: str) -> int:
        """Transcoded episodes written by another pipeline or schema version than the current ones."""
        row = self.con.execute(
            "SELECT count(*) FROM episodes WHERE status = 'transcoded' AND "
            "(pipeline_version IS DISTINCT FROM ? OR schema_version IS DISTINCT FROM ?)",
            [pipeline, schema],
        ).fetchone()
        assert row is not None, "an aggregate query returns one row"
        return row[0]

    def summary(self, top_tasks: int = 50) -> dict:
        """What the warehouse holds, in aggregate queries (memory does not grow with the rows):
        rows by status, transcoded hours in all and by task (the ``top_tasks`` largest, the rest
        summed), and how many transcoded episodes carry each quality flag."""
        q = self.con.execute
        by_status = dict(q("SELECT status, count(*) FROM episodes GROUP BY status ORDER BY status").fetchall())
        totals = q(
            "SELECT coalesce(sum(duration_s), 0) / 3600, count(DISTINCT task) FROM episodes WHERE status = 'transcoded'"
        ).fetchone()
        assert totals is not None, "an aggregate query returns one row"
        hours, tasks = totals
        by_task = q(
            "SELECT task, sum(duration_s) / 3600 AS h FROM episodes WHERE status = 'transcoded' "
            "GROUP BY task ORDER BY h DESC, task LIMIT ?",
            [top_tasks],
        ).fetchall()
        flags = q("""SELECT count(*) FILTER (WHERE camera_dropped), count(*) FILTER (WHERE camera_dead),
                            count(*) FILTER (WHERE NOT timestamps_ok), count(*) FILTER (WHERE NOT quality_ok),
                            count(*) FILTER (WHERE quality_verdict = 'review'),
                            count(*) FILTER (WHERE quality_verdict = 'fail'),
                            count(*) FILTER (WHERE review_verdict IS NOT NULL)
                     FROM episodes WHERE status = 'transcoded'""").fetchone()
        assert flags is not None, "an aggregate query returns one row"
        listed = sum(h for _, h in by_task)
        return {
            "rows": sum(by_status.values()),
            "rows_by_status": by_status,
            "hours_transcoded": float(hours),
            "tasks": tasks,
            "hours_by_task": {t: float(h) for t, h in by_task}
            | ({"(other tasks)": float(hours) - listed} if tasks > len(by_task) else {}),
            "flags": dict(
                zip(
                    (
                        "camera_dropped",
                        "camera_dead",
                        "timestamps_not_ok",
                        "quality_not_ok",
                        "verdict_review",
                        "verdict_fail",
                        "reviewed",
                    ),
                    flags,
                )
            ),
        }


# One row per step of every episode's ladder, unnested by DuckDB from the step_ladder JSON of the
# rows being applied (``rows``: a registered batch).
_STEP_JSON = json.dumps(
    [
        {
            "index": "INTEGER",
            "name": "VARCHAR",
            "start_ns": "BIGINT",
            "end_ns": "BIGINT",
            "duration_s": "DOUBLE",
            "outcome": "VARCHAR",
            "failure_mode": "VARCHAR",
            "failed_at_ns": "BIGINT",
        }
    ]
)


def _steps_from(rows: str, into: str = "episode_steps") -> str:
    return (
        f"INSERT INTO {into} SELECT episode_id, s.index, s.name, s.start_ns, s.end_ns, s.duration_s, "
        "s.outcome, s.failure_mode, s.failed_at_ns FROM (SELECT episode_id, "
        f"unnest(from_json(step_ladder, '{_STEP_JSON}')) AS s FROM {rows} WHERE step_ladder IS NOT NULL)"
    )


def arrow_columns() -> list[tuple[str, pa.DataType]]:
    """The registry's episode columns with their Arrow types (what a snapshot batch holds)."""
    return [(n, _ARROW_TYPES[ty]) for n, ty in warehouse_columns() if n != "synced_at"]


def rows_to_arrow(rows: Sequence[tuple], columns: Sequence[tuple[str, pa.DataType]]) -> pa.RecordBatch:
    """Row tuples (a database cursor's) as one Arrow batch, column by column in C: no per-row dict.
    SQLite hands booleans back as 0/1, which are cast."""
    if not rows:
        return pa.RecordBatch.from_arrays([pa.array([], ty) for _, ty in columns], names=[n for n, _ in columns])
    arrays = []
    for values, (_, ty) in zip(zip(*rows), columns, strict=True):
        try:
            arrays.append(pa.array(values, ty))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if ty != pa.bool_():
                raise
            arrays.append(pa.array(values, pa.int8()).cast(pa.bool_()))
    return pa.RecordBatch.from_arrays(arrays, names=[n for n, _ in columns])


class SnapshotLoad:
    def __init__(self, warehouse: Warehouse):
        self.wh, self.rows = warehouse, 0
        self.position: str | None = None  # the change-log position the snapshot reflects, set by its loader

    def append(self, batch: pa.RecordBatch) -> None:
        con = self.wh.con
        names = [n for n, _ in self.wh.columns if n != "synced_at"]
        con.register("cdc_snapshot", batch)
        try:
            con.execute("BEGIN TRANSACTION")
            con.execute(
                f"INSERT INTO episodes{_STAGING} ({', '.join(names)}, synced_at) "
                f"SELECT {', '.join(names)}, ? FROM cdc_snapshot",
                [time.time()],
            )
            con.execute(_steps_from("cdc_snapshot", into=f"episode_steps{_STAGING}"))
            con.execute("COMMIT")
        finally:
            con.unregister("cdc_snapshot")
        self.rows += batch.num_rows
