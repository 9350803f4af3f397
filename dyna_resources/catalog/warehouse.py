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
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Text

from . import schema as t

_DUCK_TYPES = {BigInteger: "BIGINT", Integer: "INTEGER", Float: "DOUBLE", Boolean: "BOOLEAN", String: "VARCHAR",
               Text: "VARCHAR"}
_ARROW_TYPES = {"BIGINT": pa.int64(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(),
                "VARCHAR": pa.string()}


# One row per step of every episode's ladder, unnested from the episodes' ``step_ladder`` JSON
# when their rows are applied: what curation selects steps by.
STEP_COLUMNS = [("episode_id", "VARCHAR"), ("step_index", "INTEGER"), ("step", "VARCHAR"), ("start_ns", "BIGINT"),
                ("end_ns", "BIGINT"), ("duration_s", "DOUBLE"), ("outcome", "VARCHAR"), ("failure_mode", "VARCHAR"),
                ("failed_at_ns", "BIGINT")]


def warehouse_columns() -> list[tuple[str, str]]:
    """The warehouse mirrors every column of the registry's episodes table, plus when it was synced."""
    cols = []
    for c in t.episodes.columns:
        duck = next(v for k, v in _DUCK_TYPES.items() if isinstance(c.type, k))
        cols.append((c.name, duck))
    return cols + [("synced_at", "DOUBLE")]


class Warehouse:
    def __init__(self, path: str | Path, *, read_only: bool = False):
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.con = duckdb.connect(str(self.path), read_only=read_only)
        self.columns = warehouse_columns()
        if not read_only:
            cols = ", ".join(f"{n} {ty}" for n, ty in self.columns)
            self.con.execute(f"CREATE TABLE IF NOT EXISTS episodes ({cols}, PRIMARY KEY (episode_id))")
            cols = ", ".join(f"{n} {ty}" for n, ty in STEP_COLUMNS)
            self.con.execute(f"CREATE TABLE IF NOT EXISTS episode_steps ({cols}, PRIMARY KEY (episode_id, step_index))")
            self.con.execute("CREATE TABLE IF NOT EXISTS cdc_position (source VARCHAR PRIMARY KEY, position VARCHAR)")
            have = {r[0] for r in self.con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'episodes'").fetchall()}
            for n, ty in self.columns:  # additive migration, as in the registry
                if n not in have:
                    self.con.execute(f"ALTER TABLE episodes ADD COLUMN {n} {ty}")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def position(self, source: str) -> str | None:
        row = self.con.execute("SELECT position FROM cdc_position WHERE source = ?", [source]).fetchone()
        return row[0] if row else None

    def apply(self, *, source: str, position: str, upserts: Sequence[dict], deletes: Sequence[str],
              replace_all: bool = False) -> None:
        """Upsert rows and delete keys, and record ``position``, in one transaction
        (``replace_all``: the rows are the whole table, as in a snapshot)."""
        names = [n for n, _ in self.columns]
        now = time.time()
        table = pa.table({n: pa.array([(now if n == "synced_at" else r.get(n)) for r in upserts],
                                      type=_ARROW_TYPES[ty]) for n, ty in self.columns})
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
            self.con.register("cdc_steps", _step_rows(upserts))
            self.con.execute("INSERT INTO episode_steps SELECT * FROM cdc_steps")
            self.con.execute("INSERT OR REPLACE INTO cdc_position VALUES (?, ?)", [source, position])
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self.con.unregister("cdc_upserts")
            self.con.unregister("cdc_keys")
            self.con.unregister("cdc_steps")

    def episodes(self) -> list[dict]:
        names = ", ".join(n for n, _ in self.columns if n != "synced_at")
        cur = self.con.execute(f"SELECT {names} FROM episodes ORDER BY episode_id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def steps(self, episode_id: str | None = None) -> list[dict]:
        where, params = ("WHERE episode_id = ?", [episode_id]) if episode_id is not None else ("", [])
        cur = self.con.execute(f"SELECT * FROM episode_steps {where} ORDER BY episode_id, step_index", params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def count(self) -> int:
        return self.con.execute("SELECT count(*) FROM episodes").fetchone()[0]

    def summary(self, top_tasks: int = 50) -> dict:
        """What the warehouse holds, in aggregate queries (memory does not grow with the rows):
        rows by status, transcoded hours in all and by task (the ``top_tasks`` largest, the rest
        summed), and how many transcoded episodes carry each quality flag."""
        q = self.con.execute
        by_status = dict(q("SELECT status, count(*) FROM episodes GROUP BY status ORDER BY status").fetchall())
        hours, tasks = q("SELECT coalesce(sum(duration_s), 0) / 3600, count(DISTINCT task) FROM episodes "
                         "WHERE status = 'transcoded'").fetchone()
        by_task = q("SELECT task, sum(duration_s) / 3600 AS h FROM episodes WHERE status = 'transcoded' "
                    "GROUP BY task ORDER BY h DESC, task LIMIT ?", [top_tasks]).fetchall()
        flags = q("""SELECT count(*) FILTER (WHERE camera_dropped), count(*) FILTER (WHERE camera_dead),
                            count(*) FILTER (WHERE NOT timestamps_ok), count(*) FILTER (WHERE NOT quality_ok),
                            count(*) FILTER (WHERE quality_verdict = 'review'),
                            count(*) FILTER (WHERE quality_verdict = 'fail'),
                            count(*) FILTER (WHERE review_verdict IS NOT NULL)
                     FROM episodes WHERE status = 'transcoded'""").fetchone()
        listed = sum(h for _, h in by_task)
        return {
            "rows": sum(by_status.values()), "rows_by_status": by_status, "hours_transcoded": float(hours),
            "tasks": tasks, "hours_by_task": {t: float(h) for t, h in by_task}
            | ({"(other tasks)": float(hours) - listed} if tasks > len(by_task) else {}),
            "flags": dict(zip(("camera_dropped", "camera_dead", "timestamps_not_ok", "quality_not_ok",
                               "verdict_review", "verdict_fail", "reviewed"), flags)),
        }


def _step_rows(upserts: Sequence[dict]) -> pa.Table:
    rows = []
    for r in upserts:
        for st in json.loads(r.get("step_ladder") or "[]"):
            rows.append({"episode_id": r["episode_id"], "step_index": st["index"], "step": st["name"],
                         "start_ns": st["start_ns"], "end_ns": st["end_ns"], "duration_s": st["duration_s"],
                         "outcome": st["outcome"], "failure_mode": st.get("failure_mode"),
                         "failed_at_ns": st.get("failed_at_ns")})
    return pa.table({n: pa.array([r[n] for r in rows], type=_ARROW_TYPES[ty]) for n, ty in STEP_COLUMNS})
