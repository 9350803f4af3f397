"""The registry: transactional system of record for landed files, ingest partitions and their
work units (batches), episodes, gate results and quarantine.

One code path for both backends (SQLAlchemy Core): SQLite for the embedded default,
PostgreSQL in production (``DYNA_REGISTRY_URL=postgresql+psycopg2://...``; the password
comes from the environment and is never logged). Every write is an upsert keyed by a
natural key inside one transaction, so re-running any step never duplicates a row.
Values from input files only ever reach SQL as bound parameters.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import orjson
from sqlalchemy import String, Table, and_, bindparam, func, not_, or_, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from . import bulk, bulk_aside, changelog, partition_versions, pipelined
from . import schema as t
from .partition_versions import partition_versions as pv_summary

# Statuses of an episode row.
# accepted: passed the pre gates, not transcoded yet; rejected: held back by a pre gate (redone
# only when raw_episodes is replayed); transcoded: MCAP written and post gates passed;
# quarantined: transcode or a post gate failed (retried once the pipeline version changes).
ACCEPTED, REJECTED, TRANSCODED, QUARANTINED = "accepted", "rejected", "transcoded", "quarantined"
# Accepted, and its transcode was cut short by a fault of the machine (ingest/faults.py) or its quarantine
# released: no verdict; the next run of its partition redoes it, and the drift sensor launches that run.
PENDING = "pending"
# Was transcoded, but its MCAP is gone from the store or not as recorded (ingest/presence.py): no curation
# query selects it; the next run of its partition transcodes it again (the drift sensor launches it).
MISSING = "missing"
REVIEW_VERDICTS = ("accept", "reject")


class RegistryUnavailableError(RuntimeError):
    """The registry database cannot be reached: critical, the run must fail (nothing is lost)."""


class FieldValueError(ValueError):
    """A value the registry refuses on every backend (too long for its column, or holding a NUL,
    which PostgreSQL cannot store): raised before anything is written, naming the column."""

    def __init__(self, table: str, column: str, problem: str):
        self.table, self.column, self.problem = table, column, problem
        super().__init__(f"{table}.{column}: {problem}")


def check_values(table, row: dict) -> None:
    """Refuse a row the registry would store on one backend and not the other: text longer than
    its column (VARCHAR(n) on PostgreSQL, unbounded on SQLite) or holding a NUL character."""
    limits = _STRING_LIMITS[table.name]  # per row of every bulk write: no copy, no isinstance
    for col, v in row.items():
        if v.__class__ is not str and not isinstance(v, str):
            continue
        limit = limits.get(col)
        if limit is not None and len(v) > limit:
            raise FieldValueError(table.name, col, f"{len(v)} characters, the registry stores at most {limit}")
        if "\x00" in v:
            raise FieldValueError(table.name, col, "contains a NUL character, which PostgreSQL cannot store")


_STRING_LIMITS = {tab.name: t.string_limits(tab) for tab in t.metadata.sorted_tables}


def check_rows(table, rows: Sequence[dict]) -> None:
    """:func:`check_values` of many rows, column by column: one length scan and one NUL search
    per text column over all of them (C loops), the row-by-row check only where a column fails.
    Columns the registry encodes as JSON itself (NUL escaped, unbounded) and non-text columns are
    not scanned; a text value in a non-text column is refused by the database."""
    if not rows:
        return
    limits = _STRING_LIMITS[table.name]
    text_columns = _TEXT_COLUMNS[table.name]
    by_columns: dict[tuple, list[dict]] = {}
    for r in rows:
        by_columns.setdefault(tuple(r), []).append(r)
    for names, some in by_columns.items():
        cols = [c for c in names if c in text_columns]
        if not cols:
            continue
        # transposed by C code (itemgetter, zip); a column's values are then scanned at C speed
        values = zip(*map(itemgetter(*cols), some)) if len(cols) > 1 else [[r[cols[0]] for r in some]]
        for col, column in zip(cols, values, strict=True):
            try:
                strs = list(filter(None, column))  # no None nor ''; a value of another type fails the join
                limit = limits.get(col)
                bad = (limit is not None and max(map(len, strs), default=0) > limit) or "\x00" in "".join(strs)
            except TypeError:
                bad = True
            if bad:
                for r in some:
                    check_values(table, {col: r.get(col)})


_JSON_COLUMNS = {"gate_results": {"gates", "failed_gates"}}  # encoded by _gate_row: NUL escaped, unbounded
_TEXT_COLUMNS = {
    tab.name: {c.name for c in tab.columns if isinstance(c.type, String)}  # Text is a String
    - _JSON_COLUMNS.get(tab.name, set())
    for tab in t.metadata.sorted_tables
}


@dataclass(frozen=True, order=True)
class LandedFile:
    path: str  # relative to the landing root
    bytes: int
    mtime_ns: int = 0


@dataclass(frozen=True)
class Batch:
    """A byte-balanced work unit of an ingest partition."""

    seq: int
    key: str
    files: int
    bytes: int
    partition_key: str | None = None


@dataclass(frozen=True)
class IngestPartition:
    """One Dagster partition of the ingest assets: consecutive work units, sealed once full or old."""

    seq: int
    key: str
    units: int
    files: int
    bytes: int
    created_at: float
    sealed_at: float | None

    @property
    def sealed(self) -> bool:
        return self.sealed_at is not None


def batch_key(seq: int, created_at: float) -> str:
    """Sortable work-unit key: creation hour (UTC) then a global sequence number."""
    return time.strftime("%Y%m%dT%H", time.gmtime(created_at)) + f"-{seq:06d}"


def partition_key(seq: int, created_at: float) -> str:
    """Sortable ingest-partition key: the UTC day it opened, then a global sequence number
    (``20261129-000042``), distinct in shape from a work unit's ``20261129T14-000123``."""
    return time.strftime("%Y%m%d", time.gmtime(created_at)) + f"-{seq:06d}"


@dataclass(frozen=True)
class Outcome:
    """What one stage did to one file: its gate results, its episode row (a whole row from the
    inventory, or the columns a transcode changes) and a quarantine record, or the release of one."""

    source_path: str
    batch_key: str
    stage: str
    gates: Sequence[dict]
    episode: dict | None = None
    quarantine: dict | None = None
    release_quarantine: bool = True


def _gate_row(o: Outcome, episode_id: str | None, now: float, encoded: dict | None = None) -> dict | None:
    """The stage's row of gate results (None when the outcome ran no gate), its fields checked.
    ``encoded``: a cache of encoded gate lists by their content, shared by one call's outcomes (the
    gates of passing episodes are identical within a run: no detail, same actions)."""
    if not o.gates:
        return None
    key = None
    if encoded is not None:
        try:
            key = orjson.dumps(o.gates, option=orjson.OPT_SERIALIZE_NUMPY)  # C-speed; the rest is ~10 µs of Python
        except TypeError:  # a value orjson cannot encode: no caching, the slow path says what is wrong
            key = None
    # a key only with a cache (encoded is not None)
    enc = encoded.get(key) if encoded is not None and key is not None else None
    if enc is None:
        enc = _encode_gates(o.gates)
        if encoded is not None and key is not None:
            encoded[key] = enc
    version, checked, failed, failed_gates, gates = enc
    return {
        "source_path": o.source_path,
        "stage": o.stage,
        "batch_key": o.batch_key,
        "episode_id": episode_id,
        "checked": checked,
        "failed": failed,
        "failed_gates": failed_gates,
        "gates": gates,
        "pipeline_version": version,
        "checked_at": now,
    }


def _encode_gates(raw: Sequence[dict]) -> tuple[str, int, int, str, str]:
    """(pipeline version, checked, failed, failed gates' JSON, gates' JSON) of one stage's gates."""
    version = raw[0]["pipeline_version"]
    gates = [
        {"gate": g["gate"], "passed": bool(g["passed"]), "action": g["action"], "detail": g.get("detail", "")}
        for g in raw
    ]
    for field, limit in t.GATE_FIELD_LIMITS.items():
        longest = max(len(g[field]) for g in gates)
        if longest > limit:
            raise FieldValueError("gate_results", field, f"{longest} characters, the registry stores at most {limit}")
    for g, rec in zip(raw, gates, strict=True):
        if g["pipeline_version"] != version:  # a stage's gates come from one run: seldom
            rec["pipeline_version"] = g["pipeline_version"]
    failed = [g["gate"] for g in gates if not g["passed"]]
    return version, len(gates), len(failed), orjson.dumps(failed).decode(), orjson.dumps(gates).decode()


def _outcome_rows(o: Outcome, now: float, encoded: dict | None = None) -> tuple[dict | None, dict | None, dict | None]:
    """The rows an outcome writes (its stage's gate results, episode row, quarantine record)."""
    episode_id = (o.episode or {}).get("episode_id") or (o.quarantine or {}).get("episode_id")
    results = _gate_row(o, episode_id, now, encoded)
    row = None
    if o.episode is not None:
        row = {**o.episode, "source_path": o.source_path, "batch_key": o.batch_key, "updated_at": now}
        cams = row.get("cameras")
        if cams is not None and not isinstance(cams, str):
            row["cameras"] = _cameras_json(cams, encoded)
    q = o.quarantine
    held = (
        None
        if q is None
        else {
            "source_path": o.source_path,
            "batch_key": o.batch_key,
            "episode_id": episode_id,
            "stage": q.get("stage", o.stage),
            "gate": q["gate"],
            "reason": q["reason"],
            "stream": q.get("stream"),
            "pipeline_version": q["pipeline_version"],
            "quarantined_at": now,
        }
    )
    return results, row, held


def _cameras_json(cameras, encoded: dict | None) -> str:
    """An episode's camera list as stored (``json.dumps``'s text); cached per call like the gates."""
    if encoded is None or not isinstance(cameras, (list, tuple)):
        return json.dumps(cameras)
    key = ("cameras", *cameras)
    text = encoded.get(key)
    if text is None:
        text = encoded[key] = json.dumps(cameras)
    return text


def _check_outcome_rows(results: list[dict], rows: list[dict], held: list[dict]) -> None:
    for table, some in ((t.gate_results, results), (t.episodes, rows), (t.quarantine, held)):
        check_rows(table, some)


# PostgreSQL counts an episode's score in the statement that writes its row, from the gate results
# this transaction has just written (the rule of Registry._score, which SQLite runs in Python: there
# a read is a function call, here a round trip and a Python pass per row). 1 - failed/checked is
# rounded to 6 places as Python's round does (no k/n with n < 128 lies on a half).
_SCORED_BY_SERVER = bulk.Derived(
    source="SELECT coalesce(sum(checked), 0) AS checked, coalesce(sum(failed), 0) AS failed "
    "FROM gate_results WHERE gate_results.source_path = v.source_path",
    columns=(
        ("gates_checked", "d.checked"),
        ("gates_failed", "d.failed"),
        (
            "quality_score",
            "CASE WHEN d.checked > 0 THEN round((1 - d.failed::float8 / d.checked)::numeric, 6)::float8 END",
        ),
    ),
)


OUTCOME_PART = 1024  # outcomes a part of a PostgreSQL call, written while the next is built

# PostgreSQL aborts one of two transactions that wait on each other's locks (deadlock_detected), or
# that conflict under stricter isolation (serialization_failure), and the application is to run it
# again (PostgreSQL manual, 13.6). Two transcode steps committing units of one partition at once
# bump the same summary rows (partition_versions.py) in their own orders. Outcome writes are
# idempotent, so the whole call is run again, up to OUTCOME_ATTEMPTS times.
_RUN_AGAIN = {"40P01": "deadlock detected", "40001": "serialization failure"}
OUTCOME_ATTEMPTS = 5

log = logging.getLogger(__name__)


def _lock_files(c, paths: list[str]) -> None:
    """Serialise the outcome writes of these files across transactions (PostgreSQL). Under READ COMMITTED
    a file's pre and post outcomes written at once by two transactions would each score the episode from
    the gate results it sees, without the other's uncommitted row, and the later commit's score would miss
    a stage. A transaction-scoped advisory lock per file, all taken first and in one order (no cycle among
    them), makes the second writer wait for the first's commit; its statements then see the first's rows."""
    c.exec_driver_sql(
        "SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtextextended(p, 0) AS h "
        "FROM unnest(%s::text[]) AS p ORDER BY h) AS files",
        (paths,),
    )


def _outcome_keys(o: Outcome) -> tuple:
    """What an outcome's writes are keyed by: its file, and its episode."""
    eid = (o.episode or {}).get("episode_id") or (o.quarantine or {}).get("episode_id")
    return (("file", o.source_path), ("episode", eid)) if eid else (("file", o.source_path),)


@dataclass(frozen=True)
class _OutcomeWrites:
    """The statements of :meth:`Registry.record_outcomes` for some outcomes, built."""

    gate_results: list[bulk.Write]
    episodes: list[bulk.Write]
    quarantine: list[bulk.Write]
    episode_ids: list[str]  # every episode row written
    inserted: list[str]  # of them, the whole rows (inventory)
    released: list[str]  # files whose quarantine record goes


def _same_columns(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped by their set of columns: one executemany statement per group."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r), []).append(r)  # key order first (cheap), then merged by set
    merged: dict[tuple, list[dict]] = {}
    for cols, some in groups.items():
        merged.setdefault(tuple(sorted(cols)), []).extend(some)
    return list(merged.values())


def _partition(r) -> IngestPartition:
    return IngestPartition(r.seq, r.partition_key, r.units, r.files, r.bytes, r.created_at, r.sealed_at)


class Registry:
    def __init__(self, url: str):
        self.url = t.parse_url(url)
        self.engine: Engine = t.open_engine(self.url)
        try:
            t.create_tables(self.engine, t.metadata.sorted_tables)  # the whole catalog: one schema
            _fold_legacy_gate_rows(self.engine)
            partition_versions.install(self.engine)  # what the drift sensor asks, in O(partitions)
            if self.backend == "sqlite":
                changelog.install(self.engine)  # CDC for the warehouse (PostgreSQL: logical decoding)
        except OperationalError as e:
            raise RegistryUnavailableError(f"registry {self.describe()} is unreachable: {e.orig}") from None

    def __reduce__(self):
        # A registry crosses to another process (a Ray worker) as its URL without the password: the
        # other side takes the password from its own environment, so no secret rides in a task.
        return (_reopen, (self.url.render_as_string(hide_password=True), self.url.password is not None))

    @property
    def backend(self) -> str:
        return self.url.get_backend_name()

    @classmethod
    def sqlite(cls, path: str | Path) -> Registry:
        return cls(f"sqlite:///{Path(path).resolve()}")

    def describe(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def _begin(self):
        try:
            return self.engine.begin()
        except OperationalError as e:
            raise RegistryUnavailableError(f"registry {self.describe()} is unreachable: {e.orig}") from None

    def ping(self) -> None:
        with self._begin() as c:
            c.execute(select(1))

    # -- landing ---------------------------------------------------------------------
    def register_files(self, files: Sequence[LandedFile], *, now: float | None = None) -> int:
        """Record newly landed files; files already known are left as they are. Returns how many were new."""
        if not files:
            return 0
        now = time.time() if now is None else now
        new = 0
        with self._begin() as c:
            for i in range(0, len(files), 5000):  # cost follows the listing, never the table size
                part = files[i : i + 5000]
                known = set(
                    c.execute(
                        select(t.landed_files.c.path).where(t.landed_files.c.path.in_([f.path for f in part]))
                    ).scalars()
                )
                fresh = [f for f in part if f.path not in known]
                bulk.upsert(
                    c,
                    self.backend,
                    t.landed_files,
                    [
                        {
                            "path": f.path,
                            "bytes": f.bytes,
                            "mtime_ns": f.mtime_ns,
                            "registered_at": now,
                            "batch_key": None,
                        }
                        for f in fresh
                    ],
                    ["path"],
                    update=(),
                )
                new += len(fresh)
        return new

    def landed(self, paths: Sequence[str]) -> dict[str, LandedFile]:
        """The registered files among ``paths``, as registered (size and mtime or generation time)."""
        out: dict[str, LandedFile] = {}
        lf = t.landed_files.c
        with self._begin() as c:
            for i in range(0, len(paths), 5000):
                for r in c.execute(
                    select(lf.path, lf.bytes, lf.mtime_ns).where(lf.path.in_(list(paths[i : i + 5000])))
                ):
                    out[r.path] = LandedFile(r.path, r.bytes, r.mtime_ns)
        return out

    def reland(self, files: Sequence[LandedFile], *, now: float | None = None) -> list[str]:
        """New versions of files already registered whose last version was held back by the pre gates
        (a truncated upload, say): each becomes a new landed item, its size and time updated and out of
        its old work unit, so the next tick packs it into a new one. Files in use are left alone.
        Returns the paths re-landed."""
        if not files:
            return []
        now = time.time() if now is None else now
        lf, q = t.landed_files.c, t.quarantine.c
        with self._begin() as c:
            held = set()
            for i in range(0, len(files), 5000):
                held.update(
                    c.execute(
                        select(q.source_path).where(
                            q.source_path.in_([f.path for f in files[i : i + 5000]]), q.stage == "pre"
                        )
                    ).scalars()
                )
            fresh = [f for f in files if f.path in held]
            for f in fresh:
                c.execute(
                    update(t.landed_files)
                    .where(lf.path == f.path)
                    .values(bytes=f.bytes, mtime_ns=f.mtime_ns, registered_at=now, batch_key=None)
                )
        return [f.path for f in fresh]

    def held_back_files(self, after: str | None, limit: int) -> list[str]:
        """Landing keys the pre gates held back (unreadable, truncated), in key order after ``after``:
        what the landing tick looks at again for a new version."""
        q = t.quarantine.c
        sel = select(q.source_path).where(q.stage == "pre").order_by(q.source_path).limit(limit)
        if after is not None:
            sel = sel.where(q.source_path > after)
        with self._begin() as c:
            return list(c.execute(sel).scalars())

    def unbatched_files(self) -> tuple[list[LandedFile], float | None]:
        """Files not yet in a batch, and when the oldest of them was registered."""
        with self._begin() as c:
            rows = c.execute(
                select(
                    t.landed_files.c.path,
                    t.landed_files.c.bytes,
                    t.landed_files.c.mtime_ns,
                    t.landed_files.c.registered_at,
                ).where(t.landed_files.c.batch_key.is_(None))
            ).all()
        return [LandedFile(r.path, r.bytes, r.mtime_ns) for r in rows], min(
            (r.registered_at for r in rows), default=None
        )

    def create_batches(
        self, groups: Sequence[Sequence[LandedFile]], *, target_bytes: int, now: float | None = None
    ) -> list[Batch]:
        """Turn packed groups into batches in one transaction. A file already in a batch
        (another sensor tick got there first) is never moved; a group that loses files
        to that race is still created with the rest."""
        now = time.time() if now is None else now
        out = []
        with self._begin() as c:
            seq = c.execute(select(func.coalesce(func.max(t.ingest_batches.c.seq), 0))).scalar_one()
            paths = [f.path for group in groups for f in group]
            free = set()
            for i in range(0, len(paths), 5000):  # one membership query per 5000 files, not per group
                free.update(
                    c.execute(
                        select(t.landed_files.c.path).where(
                            t.landed_files.c.path.in_(paths[i : i + 5000]), t.landed_files.c.batch_key.is_(None)
                        )
                    ).scalars()
                )
            batches, members = [], []
            for group in groups:
                group = [f for f in group if f.path in free]
                free.difference_update(f.path for f in group)  # a file is taken once, by the first group
                if not group:
                    continue
                seq += 1
                key = batch_key(seq, now)
                size = sum(f.bytes for f in group)
                batches.append(
                    {
                        "seq": seq,
                        "batch_key": key,
                        "created_at": now,
                        "files": len(group),
                        "bytes": size,
                        "target_bytes": target_bytes,
                    }
                )
                members += [{"path": f.path, "batch_key": key} for f in group]
                out.append(Batch(seq, key, len(group), size))
            # one statement each, executed for many rows: a tick of 50k files is two round trips, not 10^4
            if batches:
                c.execute(t.ingest_batches.insert(), batches)
                bulk.update_by_key(c, self.backend, t.landed_files, members, "path")
        return out

    def batches_after(self, seq: int, limit: int | None = None) -> list[Batch]:
        q = select(t.ingest_batches).where(t.ingest_batches.c.seq > seq).order_by(t.ingest_batches.c.seq)
        if limit is not None:
            q = q.limit(limit)
        with self._begin() as c:
            return [Batch(r.seq, r.batch_key, r.files, r.bytes, r.partition_key) for r in c.execute(q)]

    def batch(self, key: str) -> Batch:
        with self._begin() as c:
            r = c.execute(select(t.ingest_batches).where(t.ingest_batches.c.batch_key == key)).first()
        if r is None:
            raise KeyError(f"no ingest batch {key!r} in the registry")
        return Batch(r.seq, r.batch_key, r.files, r.bytes, r.partition_key)

    # -- ingest partitions -------------------------------------------------------------
    def assign_partitions(
        self, *, target_bytes: int, max_wait_s: float, seal_open: bool = False, now: float | None = None
    ) -> list[IngestPartition]:
        """Put every work unit not yet in a partition into the open partition, in unit order, in one
        transaction; a partition is sealed once it holds ``target_bytes`` or, still short, once it
        has been open ``max_wait_s`` (or at once with ``seal_open``: nothing is left pending). A unit
        joins a partition once and never moves, so a unit's partition is the same on every replay.
        Returns the partitions this call sealed."""
        if target_bytes <= 0:
            raise ValueError(f"target_bytes must be positive, got {target_bytes}")
        now = time.time() if now is None else now
        p, b = t.ingest_partitions, t.ingest_batches
        sealed: list[IngestPartition] = []
        with self._begin() as c:
            units = c.execute(
                select(b.c.batch_key, b.c.files, b.c.bytes).where(b.c.partition_key.is_(None)).order_by(b.c.seq)
            ).all()
            row = c.execute(select(p).where(p.c.sealed_at.is_(None)).order_by(p.c.seq)).first()
            current = (
                None
                if row is None
                else {
                    "key": row.partition_key,
                    "seq": row.seq,
                    "units": row.units,
                    "files": row.files,
                    "bytes": row.bytes,
                    "created_at": row.created_at,
                    "members": [],
                    "new": False,
                }
            )
            seq = c.execute(select(func.coalesce(func.max(p.c.seq), 0))).scalar_one()
            done: list[dict] = []
            for u in units:
                if current is None:
                    seq += 1
                    current = {
                        "key": partition_key(seq, now),
                        "seq": seq,
                        "units": 0,
                        "files": 0,
                        "bytes": 0,
                        "created_at": now,
                        "members": [],
                        "new": True,
                    }
                current["members"].append(u.batch_key)
                current["units"] += 1
                current["files"] += u.files
                current["bytes"] += u.bytes
                if current["bytes"] >= target_bytes:
                    current["sealed_at"] = now
                    done.append(current)
                    current = None
            if current is not None:
                if seal_open or now - current["created_at"] >= max_wait_s:
                    current["sealed_at"] = now
                done.append(current)
            for part in done:
                values = {
                    "units": part["units"],
                    "files": part["files"],
                    "bytes": part["bytes"],
                    "sealed_at": part.get("sealed_at"),
                }
                if part["new"]:
                    c.execute(
                        p.insert().values(
                            seq=part["seq"],
                            partition_key=part["key"],
                            created_at=part["created_at"],
                            target_bytes=target_bytes,
                            **values,
                        )
                    )
                else:
                    c.execute(update(p).where(p.c.partition_key == part["key"]).values(**values))
                if part["members"]:
                    c.execute(
                        update(b).where(b.c.batch_key == bindparam("u")).values(partition_key=bindparam("pk")),
                        [{"u": u, "pk": part["key"]} for u in part["members"]],
                    )
                if part.get("sealed_at") is not None:
                    sealed.append(
                        IngestPartition(
                            part["seq"],
                            part["key"],
                            part["units"],
                            part["files"],
                            part["bytes"],
                            part["created_at"],
                            part["sealed_at"],
                        )
                    )
        return sealed

    def sealed_partitions_after(self, seq: int, limit: int | None = None) -> list[IngestPartition]:
        """Sealed partitions after sequence number ``seq``, in order: what the landing sensor hands to Dagster."""
        p = t.ingest_partitions
        q = select(p).where(p.c.seq > seq, p.c.sealed_at.is_not(None)).order_by(p.c.seq)
        if limit is not None:
            q = q.limit(limit)
        with self._begin() as c:
            return [_partition(r) for r in c.execute(q)]

    def has_partition(self, key: str) -> bool:
        p = t.ingest_partitions
        with self._begin() as c:
            return c.execute(select(p.c.partition_key).where(p.c.partition_key == key)).first() is not None

    def partition(self, key: str) -> IngestPartition:
        with self._begin() as c:
            r = c.execute(select(t.ingest_partitions).where(t.ingest_partitions.c.partition_key == key)).first()
        if r is None:
            raise KeyError(f"no ingest partition {key!r} in the registry")
        return _partition(r)

    def partition_units(self, key: str) -> list[Batch]:
        """The work units of an ingest partition, in order; an unknown partition raises KeyError."""
        b = t.ingest_batches
        with self._begin() as c:
            rows = c.execute(select(b).where(b.c.partition_key == key).order_by(b.c.seq)).all()
        if not rows:
            self.partition(key)  # raises for an unknown key
        return [Batch(r.seq, r.batch_key, r.files, r.bytes, r.partition_key) for r in rows]

    def partitions_of(self, episode_ids: Sequence[str]) -> list[str]:
        """The ingest partitions holding ``episode_ids`` (those in none are left out), sorted."""
        e, b = t.episodes.c, t.ingest_batches.c
        found: set[str] = set()
        with self._begin() as c:
            for k in range(0, len(episode_ids), 5000):
                q = (
                    select(b.partition_key)
                    .distinct()
                    .select_from(t.episodes.join(t.ingest_batches, e.batch_key == b.batch_key))
                    .where(e.episode_id.in_(list(episode_ids[k : k + 5000])), b.partition_key.is_not(None))
                )
                found.update(r[0] for r in c.execute(q))
        return sorted(found)

    def partition_episodes(self, key: str) -> list[dict]:
        """Episode rows of every work unit of an ingest partition, by id."""
        return self.episodes([u.key for u in self.partition_units(key)])

    def batch_files(self, key: str | Sequence[str]) -> list[LandedFile]:
        """Files of a work unit (or of several: a partition's units), in key order."""
        with self._begin() as c:
            rows = c.execute(
                select(t.landed_files.c.path, t.landed_files.c.bytes, t.landed_files.c.mtime_ns)
                .where(_of_batches(t.landed_files.c.batch_key, key))
                .order_by(t.landed_files.c.path)
            ).all()
        return [LandedFile(*r) for r in rows]

    def registered_at(self, paths: Sequence[str]) -> dict[str, float]:
        out = {}
        with self._begin() as c:
            for i in range(0, len(paths), 5000):
                out.update(
                    c.execute(
                        select(t.landed_files.c.path, t.landed_files.c.registered_at).where(
                            t.landed_files.c.path.in_(list(paths[i : i + 5000]))
                        )
                    ).all()
                )
        return out

    # -- episodes, gates, quarantine -------------------------------------------------------
    def record_outcome(
        self,
        *,
        source_path: str,
        batch_key: str,
        stage: str,
        gates: Sequence[dict],
        episode: dict | None = None,
        quarantine: dict | None = None,
        release_quarantine: bool = True,
        now: float | None = None,
    ) -> None:
        """Record what one stage did to one file, in one transaction: its gate results, its
        episode row (upserted) and either a quarantine record or the release of an old one.
        A value either backend would refuse raises :class:`FieldValueError` and writes nothing."""
        self.record_outcomes(
            [Outcome(source_path, batch_key, stage, gates, episode, quarantine, release_quarantine)], now=now
        )

    @staticmethod
    def check_outcome(outcome: Outcome, *, now: float = 0.0) -> None:
        """Raise :class:`FieldValueError` if the registry would refuse a value of this outcome."""
        r, row, h = _outcome_rows(outcome, now)
        _check_outcome_rows([r] if r else [], [row] if row else [], [h] if h else [])

    def record_outcomes(self, outcomes: Sequence[Outcome], *, now: float | None = None) -> None:
        """Record many outcomes (e.g. a work unit's) in one transaction, set-based: one statement per
        kind of row for all of them, not a round trip per file. Idempotent like
        :meth:`record_outcome`; later outcomes of the same file win, except that whole episode rows
        (inventory) are written before partial ones (transcode outcomes): a stage's outcomes come in
        one call, and one episode's two stages in separate calls. A value either backend would
        refuse raises :class:`FieldValueError` and nothing is written.

        PostgreSQL: a large call is written in parts (every file's and episode's outcomes in one
        part, ``OUTCOME_PART`` files about), the next part's rows built while the server runs this
        part's statements (``pipelined.py``); one transaction all the same."""
        if not outcomes:
            return
        now = time.time() if now is None else now
        for attempt in range(1, OUTCOME_ATTEMPTS + 1):
            try:
                return self._record_outcomes_once(outcomes, now)
            except Exception as e:  # SQLAlchemy's wrapper, or psycopg2's own error from a raw cursor (bulk.py)
                pgcode = getattr(e.orig if isinstance(e, DBAPIError) else e, "pgcode", None)
                reason = _RUN_AGAIN.get(pgcode) if pgcode is not None else None
                if reason is None or attempt == OUTCOME_ATTEMPTS:
                    raise
                log.warning(
                    "registry %s: %d outcomes rolled back (%s), written again: attempt %d of %d",
                    self.describe(),
                    len(outcomes),
                    reason,
                    attempt + 1,
                    OUTCOME_ATTEMPTS,
                )
                time.sleep(random.uniform(0, 0.02 * 2**attempt))  # apart, so the two do not meet again

    def _record_outcomes_once(self, outcomes: Sequence[Outcome], now: float) -> None:
        with self._begin() as c:
            if self.backend == "postgresql":
                _lock_files(c, sorted({o.source_path for o in outcomes}))
                cut = pipelined.parts(outcomes, _outcome_keys, OUTCOME_PART)
                for writes in pipelined.built_ahead(cut, lambda part: self._outcome_writes(part, now)):
                    self._run_outcome_writes(c, writes)
            else:  # SQLite: the score is read in the transaction, and executemany takes the GIL back
                # at every row (a builder thread would hold it up to a switch interval each time)
                self._run_outcome_writes(c, self._outcome_writes(outcomes, now, c))

    def _outcome_writes(self, outcomes: Sequence[Outcome], now: float, c=None) -> _OutcomeWrites:
        """The statements that record these outcomes, built and checked: no connection needed on
        PostgreSQL (the server scores the episodes); SQLite's score is read through ``c``."""
        results, held, released, scored = {}, {}, set(), {}
        whole: dict[str, dict] = {}  # episode_id -> its merged rows
        partial: dict[str, dict] = {}
        every_row, every_held = [], []
        encoded: dict[bytes, tuple[str, int, int, str, str]] = {}  # the gates' JSON -> _encode_gates of them
        for o in outcomes:  # later outcomes of a file replace earlier ones, as separate calls would
            r, row, h = _outcome_rows(o, now, encoded)
            if r is not None:
                results[(o.source_path, o.stage)] = r
            if row is not None:
                every_row.append(row)
            if h is not None:
                every_held.append(h)
            if row is not None:
                eid = row["episode_id"]
                # Two writes of one row in a call merge into one (the later's columns win): what
                # applying them one after the other leaves, in one statement per row.
                if "source_bytes" in row:  # a whole row (inventory): insert or replace
                    whole[eid] = {**whole.get(eid, {}), **row}
                else:  # an update of a known episode (transcode outcome)
                    if row.get("mcap_uri"):  # a new MCAP: its step ladder is redone from it
                        row["ladder_version"] = None
                    partial[eid] = {**partial.get(eid, {}), **row}
                scored[eid] = o.source_path
            if h is not None:
                held[o.source_path] = h
                released.discard(o.source_path)
            elif o.release_quarantine:
                released.add(o.source_path)
                held.pop(o.source_path, None)
        # every row as written, before any is merged (a refused value names its column, writes nothing)
        _check_outcome_rows(list(results.values()), every_row, every_held)
        score = _SCORED_BY_SERVER if self.backend == "postgresql" else None
        if score is None:
            self._score(c, scored, results, whole, partial)
        b = self.backend
        return _OutcomeWrites(
            gate_results=[
                bulk.prepare_upsert(b, t.gate_results, rows, ["source_path", "stage"])
                for rows in _same_columns(list(results.values()))
            ],
            episodes=[
                *(
                    bulk.prepare_upsert(b, t.episodes, rows, ["episode_id"], derived=score)
                    for rows in _same_columns(list(whole.values()))
                ),
                *(
                    bulk.prepare_update(b, t.episodes, rows, "episode_id", derived=score)
                    for rows in _same_columns(list(partial.values()))
                ),
            ],
            quarantine=[
                bulk.prepare_upsert(b, t.quarantine, rows, ["source_path"])
                for rows in _same_columns(list(held.values()))
            ],
            episode_ids=[*whole, *(k for k in partial if k not in whole)],
            inserted=list(whole),
            released=sorted(released),
        )

    def _run_outcome_writes(self, c, w: _OutcomeWrites) -> None:
        for write in w.gate_results:  # before the episodes: the server's score reads them
            bulk.run(c, write)
        with self._episode_writes(c, w.episode_ids, w.inserted):
            for write in w.episodes:
                bulk.run(c, write)
        for write in w.quarantine:
            bulk.run(c, write)
        self._release(c, w.released)

    def _release(self, c, paths: list[str]) -> None:
        """Delete the quarantine records of these files (released: their stage passed)."""
        for k in range(0, len(paths), 5000):
            part = paths[k : k + 5000]
            if self.backend == "postgresql":
                c.exec_driver_sql("DELETE FROM quarantine WHERE source_path = ANY(%s)", (part,))
            else:
                c.exec_driver_sql(
                    "DELETE FROM quarantine WHERE source_path IN (SELECT value FROM json_each(?))",
                    (orjson.dumps(part).decode(),),
                )

    def _episode_writes(self, c, episode_ids: list[str], inserted: list[str]):
        """Around a bulk write of these episodes: on SQLite the row triggers stand aside and the
        summary and change log are written set-based (bulk_marker.py); PostgreSQL's triggers are
        statement-level already and its change log is the WAL."""
        if self.backend == "sqlite" and episode_ids:
            return bulk_aside.triggers_aside(c, episode_ids, inserted)
        return nullcontext()

    def _score(self, c, scored: dict[str, str], results: dict, whole: dict, partial: dict) -> None:
        """Set each written episode's gates_checked, gates_failed and quality_score (1 - failed /
        checked, 6 places; none checked: NULL) in the rows about to be written, from the latest
        results of both stages: this call's, else the registry's (replays replace a stage's row,
        so a re-run never counts a gate twice). Counted here, not by an UPDATE after the writes,
        so each episode is written once a call (one change for CDC, one summary check)."""
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        paths = sorted(set(scored.values()))
        sql = "SELECT source_path, stage, checked, failed FROM gate_results WHERE source_path "
        cur = c.connection.dbapi_connection.cursor()  # this transaction's; tuples without SQLAlchemy's rows
        try:
            for k in range(0, len(paths), 5000):
                part = paths[k : k + 5000]
                if self.backend == "postgresql":
                    cur.execute(sql + "= ANY(%s)", (part,))
                else:
                    cur.execute(sql + "IN (SELECT value FROM json_each(?))", (orjson.dumps(part).decode(),))
                counts.update(((p, st), (n, f)) for p, st, n, f in cur.fetchall())
        finally:
            cur.close()
        counts.update((key, (r["checked"], r["failed"])) for key, r in results.items())
        per_path: dict[str, list[int]] = {}
        for (path, _), (n, f) in counts.items():
            acc = per_path.setdefault(path, [0, 0])
            acc[0] += n
            acc[1] += f
        for eid, path in scored.items():
            n, f = per_path.get(path, (0, 0))
            score = {"gates_checked": n, "gates_failed": f, "quality_score": round(1.0 - f / n, 6) if n else None}
            if eid in whole:
                whole[eid].update(score)
            if eid in partial:
                partial[eid].update(score)

    def episode_by_id(self, episode_id: str) -> dict | None:
        with self._begin() as c:
            r = c.execute(select(t.episodes).where(t.episodes.c.episode_id == episode_id)).mappings().first()
        return dict(r) if r else None

    def episodes_by_ids(self, ids: Sequence[str] | None) -> dict[str, dict]:
        """Current rows of these episode ids (all episodes when None), by id; ids without a row are absent."""
        out: dict[str, dict] = {}
        with self._begin() as c:
            if ids is None:
                return {r["episode_id"]: dict(r) for r in c.execute(select(t.episodes)).mappings()}
            ids = list(ids)
            for i in range(0, len(ids), 5000):
                for r in c.execute(select(t.episodes).where(t.episodes.c.episode_id.in_(ids[i : i + 5000]))).mappings():
                    out[r["episode_id"]] = dict(r)
        return out

    def episode_rows(self, ids: Sequence[str], columns: Sequence[str]) -> list[tuple]:
        """Rows of these episode ids as tuples of ``columns`` (schema names), in id order; ids
        without a row are absent (what CDC reads for the keys that changed)."""
        cols = [t.episodes.c[n] for n in columns]
        out: list[tuple] = []
        ids = sorted(ids)
        with self._begin() as c:
            for i in range(0, len(ids), 5000):
                out += [
                    tuple(r)
                    for r in c.execute(
                        select(*cols)
                        .where(t.episodes.c.episode_id.in_(ids[i : i + 5000]))
                        .order_by(t.episodes.c.episode_id)
                    )
                ]
        return out

    def episodes(self, batch_key: str | Sequence[str] | None = None) -> list[dict]:
        """Episode rows of a work unit, of several units, or of all (None), by id."""
        return self._rows_of_batches(t.episodes, t.episodes.c.episode_id, batch_key)

    def _rows_of_batches(self, table: Table, order, batch_key: str | Sequence[str] | None) -> list[dict]:
        """Rows of ``table`` of a work unit, of several units, or of all (None), ordered by ``order``."""
        q = select(table).order_by(order)
        if batch_key is not None:
            q = q.where(_of_batches(table.c.batch_key, batch_key))
        with self._begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # -- review of the episodes the quality scores could not decide --------------------------
    def review(
        self, episode_id: str, verdict: str, reviewer: str, note: str | None = None, *, now: float | None = None
    ) -> None:
        """Record a reviewer's verdict ('accept' | 'reject') on an episode; it reaches the warehouse
        (and curation) by CDC like any registry write. A later verdict replaces an earlier one."""
        if verdict not in REVIEW_VERDICTS:
            raise ValueError(f"review verdict must be one of {REVIEW_VERDICTS}, not {verdict!r}")
        if not reviewer or not reviewer.strip():
            raise ValueError("a review needs the reviewer's name")
        check_values(t.episodes, {"reviewed_by": reviewer.strip(), "review_note": note})
        with self._begin() as c:
            n = c.execute(
                update(t.episodes)
                .where(t.episodes.c.episode_id == episode_id)
                .values(
                    review_verdict=verdict,
                    reviewed_by=reviewer.strip(),
                    review_note=note,
                    reviewed_at=time.time() if now is None else now,
                )
            ).rowcount
        if n == 0:
            raise KeyError(f"no episode {episode_id!r} in the registry")

    def review_pool(self) -> list[dict]:
        """Episodes whose quality verdict is 'review' and that no reviewer has judged yet, with
        their scores and reasons (decoded)."""
        e = t.episodes.c
        q = (
            select(
                e.episode_id,
                e.batch_key,
                e.source_path,
                e.task,
                e.robot_id,
                e.smoothness_score,
                e.sensor_health_score,
                e.task_score,
                e.quality_reasons,
            )
            .where(e.quality_verdict == "review", e.review_verdict.is_(None))
            .order_by(e.episode_id)
        )
        with self._begin() as c:
            rows = [dict(r) for r in c.execute(q).mappings()]
        for r in rows:
            r["quality_reasons"] = json.loads(r["quality_reasons"] or "[]")
        return rows

    # -- quarantine --------------------------------------------------------------------------
    def release_quarantine(self, source_paths: Sequence[str], *, now: float | None = None) -> list[str]:
        """Release these files' quarantine records (one transaction): a record goes; an episode the
        transcode held back becomes pending (no versions, no MCAP), so the next run of its partition
        redoes it and the drift sensor launches that run. Returns the pending episodes' ids; a file held
        back before it had an episode row (pre gates) needs its partition's ``raw_episodes`` again."""
        now = time.time() if now is None else now
        e, q = t.episodes.c, t.quarantine.c
        pending: list[str] = []
        with self._begin() as c:
            for k in range(0, len(source_paths), 5000):
                part = list(source_paths[k : k + 5000])
                ids = list(
                    c.execute(select(e.episode_id).where(e.source_path.in_(part), e.status == QUARANTINED)).scalars()
                )
                if ids:
                    c.execute(
                        update(t.episodes)
                        .where(e.episode_id.in_(ids))
                        .values(
                            status=PENDING,
                            schema_version=None,
                            pipeline_version=None,
                            mcap_path=None,
                            mcap_uri=None,
                            mcap_bytes=None,
                            mcap_version=None,
                            updated_at=now,
                        )
                    )
                c.execute(t.quarantine.delete().where(q.source_path.in_(part)))
                pending += ids
        return sorted(pending)

    def mark_missing(self, episode_ids: Sequence[str], *, now: float | None = None) -> int:
        """Mark transcoded episodes whose MCAP is gone or changed (``missing``); their MCAP's URI stays, to
        name it, its version goes (the next publish expects no object). Returns how many were marked."""
        now = time.time() if now is None else now
        e = t.episodes.c
        n = 0
        with self._begin() as c:
            for k in range(0, len(episode_ids), 5000):
                n += c.execute(
                    update(t.episodes)
                    .where(e.episode_id.in_(list(episode_ids[k : k + 5000])), e.status == TRANSCODED)
                    .values(status=MISSING, mcap_version=None, updated_at=now)
                ).rowcount
        return n

    def record_rewrite(
        self,
        episode_id: str,
        *,
        expect_version: str | None,
        mcap_version: str,
        mcap_bytes: int,
        training_streams: str | None,
        now: float | None = None,
    ) -> bool:
        """An episode's MCAP rewritten in place (training streams added, the archive untouched): its new
        version, size and streams, only if the registry still records ``expect_version`` for a transcoded
        episode (compare and set). Returns whether it did: False, a transcode or another rewrite won."""
        e = t.episodes.c
        with self._begin() as c:
            return (
                c.execute(
                    update(t.episodes)
                    .where(e.episode_id == episode_id, e.status == TRANSCODED, e.mcap_version == expect_version)
                    .values(
                        mcap_version=mcap_version,
                        mcap_bytes=mcap_bytes,
                        training_streams=training_streams,
                        updated_at=time.time() if now is None else now,
                    )
                ).rowcount
                == 1
            )

    # -- step ladders ------------------------------------------------------------------------
    def ladders_to_do(self, batch_key: str | Sequence[str], version: str) -> list[dict]:
        """Transcoded episodes of the work unit(s) whose ladder is missing or was written by another
        segmenter/config version (``version``): what a step-ladder run redoes."""
        e = t.episodes.c
        q = (
            select(e.episode_id, e.task, e.mcap_uri, e.start_ns, e.end_ns)
            .where(
                _of_batches(e.batch_key, batch_key),
                e.status == TRANSCODED,
                or_(e.ladder_version.is_(None), e.ladder_version != version),
            )
            .order_by(e.episode_id)
        )
        with self._begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def outdated_ladder_batches(self, version: str) -> list[str]:
        """Batches holding ladders written by another segmenter/config version (drift). Episodes
        with no ladder yet are not drift: the ingest run that transcoded them segments them next."""
        e = t.episodes.c
        q = (
            select(e.batch_key)
            .where(e.status == TRANSCODED, e.ladder_version.is_not(None), e.ladder_version != version)
            .distinct()
            .order_by(e.batch_key)
        )
        with self._begin() as c:
            return list(c.execute(q).scalars())

    def record_ladders(self, rows: Sequence[dict], version: str) -> None:
        """Store step ladders, one transaction: ``{"episode_id", "steps"}`` (a list of step
        dicts; ``failed_step`` is the first whose outcome is 'failure') or ``{"episode_id",
        "error"}`` when the episode could not be segmented (so it is not retried until the
        version changes)."""
        with self._begin() as c:
            for r in rows:
                steps = r.get("steps")
                failed = next((s["name"] for s in steps or [] if s["outcome"] == "failure"), None)
                c.execute(
                    update(t.episodes)
                    .where(t.episodes.c.episode_id == r["episode_id"])
                    .values(
                        step_ladder=None if steps is None else json.dumps(steps),
                        ladder_version=version,
                        failed_step=failed,
                        ladder_error=r.get("error"),
                        updated_at=time.time(),
                    )
                )

    def _stale(self, schema_version: str, pipeline_version: str):
        """Episodes whose output is missing or was written (or failed) under other versions."""
        e = t.episodes.c
        current = and_(e.pipeline_version == pipeline_version, e.schema_version == schema_version)
        return or_(
            e.status.in_([ACCEPTED, PENDING, MISSING]),
            and_(e.status.in_([TRANSCODED, QUARANTINED]), or_(e.pipeline_version.is_(None), not_(current))),
        )

    def stale_episodes(self, batch_key: str, *, schema_version: str, pipeline_version: str) -> list[dict]:
        q = (
            select(t.episodes)
            .where(t.episodes.c.batch_key == batch_key, self._stale(schema_version, pipeline_version))
            .order_by(t.episodes.c.episode_id)
        )
        with self._begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def outdated_batches(self, *, schema_version: str, pipeline_version: str) -> list[str]:
        """Batches holding episodes written (or failed) by another pipeline or schema version:
        what the drift sensor backfills, and batches holding pending episodes (a machine fault cut their
        transcode short). Episodes never transcoded are not drift."""
        e = t.episodes.c
        q = (
            select(e.batch_key)
            .where(
                e.status.in_([TRANSCODED, QUARANTINED, PENDING, MISSING]), self._stale(schema_version, pipeline_version)
            )
            .distinct()
            .order_by(e.batch_key)
        )
        with self._begin() as c:
            return list(c.execute(q).scalars())

    def outdated_partitions(self, *, schema_version: str, pipeline_version: str) -> list[str]:
        """Ingest partitions holding a work unit that :meth:`outdated_batches` names, from the
        per-partition version summary: the cost follows the partitions, not the episodes."""
        v = pv_summary.c
        return self._summary_partitions(
            # pending and missing episodes are to be redone whatever their versions
            or_(
                v.status.in_([PENDING, MISSING]),
                and_(
                    v.status.in_([TRANSCODED, QUARANTINED]),
                    or_(v.pipeline_version != pipeline_version, v.schema_version != schema_version),
                ),
            ),
        )

    def outdated_ladder_partitions(self, version: str) -> list[str]:
        """Ingest partitions holding a work unit that :meth:`outdated_ladder_batches` names (summary)."""
        v = pv_summary.c
        return self._summary_partitions(v.status == TRANSCODED, v.ladder_version != "", v.ladder_version != version)

    def _summary_partitions(self, *where) -> list[str]:
        """Ingest partitions of the per-partition version summary with episodes in a row meeting ``where``."""
        v = pv_summary.c
        q = (
            select(v.partition_key)
            .where(v.partition_key != "", v.episodes > 0, *where)
            .distinct()
            .order_by(v.partition_key)
        )
        with self._begin() as c:
            return list(c.execute(q).scalars())

    def partition_version_counts(self, partition_keys: Sequence[str] | None = None) -> list[dict]:
        """The summary itself: episodes per (partition, status, pipeline, schema, ladder version), of every
        partition or of ``partition_keys``."""
        q = select(pv_summary).order_by(*pv_summary.primary_key.columns)
        if partition_keys is not None:
            q = q.where(pv_summary.c.partition_key.in_(list(partition_keys)))
        with self._begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def quarantined(self, batch_key: str | Sequence[str] | None = None) -> list[dict]:
        return self._rows_of_batches(t.quarantine, t.quarantine.c.source_path, batch_key)

    def gate_results(self, batch_key: str, stage: str | None = None) -> list[dict]:
        """The latest result of every gate of a work unit's files, a dict a gate (source_path, stage,
        gate, batch_key, episode_id, passed, action, detail, pipeline_version, checked_at), by gate
        then file."""
        g = t.gate_results
        q = select(g).where(g.c.batch_key == batch_key)
        if stage is not None:
            q = q.where(g.c.stage == stage)
        out = []
        with self._begin() as c:
            for r in c.execute(q).mappings():
                for x in json.loads(r["gates"]):
                    out.append(
                        {
                            "source_path": r["source_path"],
                            "stage": r["stage"],
                            "gate": x["gate"],
                            "batch_key": r["batch_key"],
                            "episode_id": r["episode_id"],
                            "passed": x["passed"],
                            "action": x["action"],
                            "detail": x["detail"],
                            "pipeline_version": x.get("pipeline_version", r["pipeline_version"]),
                            "checked_at": r["checked_at"],
                        }
                    )
        return sorted(out, key=lambda x: (x["gate"], x["source_path"], x["stage"]))

    def counts(self) -> dict[str, int]:
        """Row counts of every table (tests and the demo use them to prove no duplicates)."""
        with self._begin() as c:
            return {
                tab.name: c.execute(select(func.count()).select_from(tab)).scalar_one() for tab in t.REGISTRY_TABLES
            }


_OPENED: dict[str, Registry] = {}  # per process: one engine per URL, reused by every unit a worker runs


def _reopen(url: str, has_password: bool) -> Registry:
    """The registry at ``url`` (pickled without its password), opened once per process. The password
    comes from ``DYNA_REGISTRY_URL`` in this process's environment, which must name the same database."""
    if url not in _OPENED:
        full = url
        if has_password:
            env = os.environ.get("DYNA_REGISTRY_URL")
            if not env or make_url(env).render_as_string(hide_password=True) != url:
                raise RegistryUnavailableError(
                    f"registry {url} needs its password: set DYNA_REGISTRY_URL to it in this worker's environment"
                )
            full = env
        _OPENED[url] = Registry(full)
    return _OPENED[url]


def _of_batches(column, keys: str | Sequence[str]):
    """``column`` is one work unit's key, or any of several (a partition's units)."""
    return column == keys if isinstance(keys, str) else column.in_(list(keys))


LEGACY_PAGE = 50_000  # rows of the old per-gate table read at a time


def _fold_legacy_gate_rows(engine: Engine) -> None:
    """A registry from before ``gate_results`` kept one row a gate in ``quality_results``: fold
    them into one row per file and stage, in one transaction (killed midway, the old table is
    still whole and the next open folds again), then drop the old table."""
    from sqlalchemy import MetaData, inspect, tuple_

    if "quality_results" not in inspect(engine).get_table_names():
        return
    legacy = Table("quality_results", MetaData(), autoload_with=engine)
    q = legacy.c
    backend = engine.dialect.name
    with engine.begin() as c:
        last: tuple | None = None
        group: list[dict] = []
        while True:
            page = select(legacy).order_by(q.source_path, q.stage, q.gate).limit(LEGACY_PAGE)
            if last is not None:
                page = page.where(tuple_(q.source_path, q.stage, q.gate) > tuple_(*last))
            rows = [dict(r) for r in c.execute(page).mappings()]
            if not rows:
                break
            last = (rows[-1]["source_path"], rows[-1]["stage"], rows[-1]["gate"])
            done: list[list[dict]] = []
            for r in group + rows:
                if done and (done[-1][0]["source_path"], done[-1][0]["stage"]) == (r["source_path"], r["stage"]):
                    done[-1].append(r)
                else:
                    done.append([r])
            group = done.pop()  # the last file's stage may go on in the next page
            _write_folded(c, backend, done)
        if group:
            _write_folded(c, backend, [group])
        c.exec_driver_sql("DROP TABLE quality_results")


def _write_folded(c, backend: str, groups: list[list[dict]]) -> None:
    rows: list[dict] = []
    for g in groups:
        first = max(g, key=lambda r: r["checked_at"])
        o = Outcome(
            first["source_path"],
            first["batch_key"],
            first["stage"],
            [
                {
                    "gate": r["gate"],
                    "passed": r["passed"],
                    "action": r["action"],
                    "detail": r["detail"],
                    "pipeline_version": r["pipeline_version"],
                }
                for r in g
            ],
        )
        row = _gate_row(o, first["episode_id"], first["checked_at"])
        assert row is not None, "a group holds one legacy row per gate: at least one gate"
        rows.append(row)
    bulk.upsert(c, backend, t.gate_results, rows, ["source_path", "stage"])


def registry_url_from_env(home_root: str | Path) -> str:
    """``DYNA_REGISTRY_URL`` if set (production: PostgreSQL), else SQLite in the home folder."""
    return os.environ.get("DYNA_REGISTRY_URL") or f"sqlite:///{Path(home_root).resolve() / 'registry.sqlite'}"
