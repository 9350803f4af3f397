"""Sync the registry into the warehouse by change-data-capture: the SQLite change log, or
PostgreSQL logical decoding (pgoutput).

A warehouse's first sync streams a snapshot of the registry in Arrow batches (memory bounded by
the batch, not the table), together with the change-log position (SQLite seq) or replication-slot
point (PostgreSQL: the slot is created with an exported snapshot) it reflects, so each later
change is applied once. Then ``sync`` reads changes after the warehouse's recorded position,
folds them per key, reads the current row of every changed key (a key whose row is gone is a
delete), and applies rows and the new position in one warehouse transaction; then it prunes the
log behind the position every consumer has reached. Killing it at any point loses nothing and
duplicates nothing.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

from . import arrow_reads, changelog, pg_logical
from .registry import Registry
from .warehouse import Warehouse, arrow_columns, rows_to_arrow

# Rows per warehouse commit (~70 MB of Arrow): a first sync's batches and an incremental sync's
# steps are DuckDB's row-group size, so each commit writes whole row groups straight to the file.
# Smaller commits cost more than their rows (measured on 10^6 rows): a snapshot in batches of 100,000
# loaded in 4.70 s against 3.21 s; 99,786 changes in two steps of 50,000 committed in 2 x 1.2 s
# against 0.42 s in one.
WAREHOUSE_BATCH = 122_880

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    changes: int = 0
    upserts: int = 0
    deletes: int = 0
    position: int | str = 0  # change-log seq (SQLite) or commit LSN (PostgreSQL)
    batches: int = 0


def source_name(registry: Registry) -> str:
    return f"registry:{registry.describe()}"


def sync(
    registry: Registry,
    warehouse: Warehouse,
    *,
    batch: int = WAREHOUSE_BATCH,
    max_batches: int | None = None,
    prune: bool = True,
    snapshot_batch: int = WAREHOUSE_BATCH,
) -> SyncReport:
    """Apply what changed in the registry since the warehouse's position; returns what was done.
    A warehouse that has never synced this source first takes a full snapshot."""
    source = source_name(registry)
    slot = pg_logical.install(registry.engine, list(changelog.TRACKED)) if registry.backend == "postgresql" else None
    rep = SyncReport()
    if warehouse.position(source) is None:
        rep.upserts += _snapshot(registry, warehouse, source, slot, snapshot_batch)
        if slot is None and prune:  # what the snapshot holds is applied
            changelog.prune(registry.engine, consumer_name(warehouse), int(_synced_position(warehouse, source)))
        if slot is not None:
            # The changes after the snapshot's point come with the next sync: a new slot's first
            # decode waits for the server's next running-transactions record (PostgreSQL writes
            # one every 15 s; measured 7-13 s here), which the first sync need not wait for.
            rep.position = _synced_position(warehouse, source)
            return rep
    position = _synced_position(warehouse, source)
    rep.position = int(position) if slot is None else position
    step = _step_sqlite if slot is None else _step_postgres
    while max_batches is None or rep.batches < max_batches:
        if not step(registry, warehouse, source, slot, batch, prune, rep):
            break
        rep.batches += 1
    return rep


def _synced_position(warehouse: Warehouse, source: str) -> str:
    position = warehouse.position(source)
    assert position is not None, "a warehouse synced (or just snapshot) from this source has a position"
    return position


def consumer_name(warehouse: Warehouse) -> str:
    """The warehouse as a consumer of the SQLite change log (the log is kept for every consumer)."""
    return f"warehouse:{warehouse.path.resolve()}"


def drop_consumer(registry: Registry, warehouse: Warehouse) -> None:
    """Stop keeping changes for this warehouse (it is gone): SQLite's log is pruned without it;
    PostgreSQL's slot is dropped (one slot a registry: its one warehouse consumer)."""
    if registry.backend == "postgresql":
        pg_logical.drop(registry.engine)
    else:
        changelog.drop_consumer(registry.engine, consumer_name(warehouse))


def _snapshot(registry: Registry, warehouse: Warehouse, source: str, slot: str | None, batch: int) -> int:
    """First sync: stream the registry's episodes into the warehouse in Arrow batches of ``batch``
    rows (memory follows the batch, not the table) with the position the snapshot reflects, in one
    warehouse transaction. Changes after that position are applied once, by the steps that follow.
    Rows are read as Arrow by ADBC's drivers (``arrow_reads.py``; SQLite's in a child process);
    a SQLite snapshot the child cannot read (values of another type than their column's, which
    SQLite allows) is read again as row tuples through sqlite3, made Arrow column by column."""
    columns = arrow_columns()
    if slot is not None:
        return _load(warehouse, source, _read_ahead(pg_logical.snapshot(registry.engine, slot, columns, batch)))
    # registered first, at a position no later than the snapshot's: no one prunes what it still needs
    changelog.set_consumer(registry.engine, consumer_name(warehouse), changelog.head(registry.engine))
    path = registry.engine.url.database
    if path and path != ":memory:":
        try:
            return _load(warehouse, source, arrow_reads.sqlite_snapshot(path, columns, batch))
        except arrow_reads.SqliteReadError as e:
            log.warning("%s; reading it again through sqlite3", e)
    return _load(
        warehouse,
        source,
        _tuples_as_arrow(changelog.snapshot(registry.engine, [n for n, _ in columns]), columns, batch),
    )


def _load(warehouse: Warehouse, source: str, rows) -> int:
    with rows as (position, batches), warehouse.snapshot(source) as load:
        for b in batches:
            load.append(b)
        load.position = str(position)
    return load.rows


@contextmanager
def _read_ahead(snapshot):
    with snapshot as (position, batches), arrow_reads.read_ahead(batches) as ahead:
        yield position, ahead


@contextmanager
def _tuples_as_arrow(snapshot, columns, batch: int):
    with snapshot as (position, cursor):
        yield position, (rows_to_arrow(chunk, columns) for chunk in iter(lambda: cursor.fetchmany(batch), []))


def pending(registry: Registry) -> str | None:
    """A marker of the oldest change not yet applied (None when there is none); cheap enough for a sensor."""
    if registry.backend == "postgresql":
        slot = pg_logical.install(registry.engine, list(changelog.TRACKED))
        txs = pg_logical.peek(registry.engine, slot, 1)
        return txs[0].commit_lsn if txs else None
    changes = changelog.read_changes(registry.engine, 0, 1)
    return str(changes[0].seq) if changes else None


def _apply_keys(
    registry: Registry, warehouse: Warehouse, source: str, keys: set[str], position: str, rep: SyncReport
) -> None:
    """Apply the current rows of ``keys`` (a key without a row is a delete) and the new position.
    PostgreSQL's rows are read as Arrow by the driver (ADBC); SQLite's as tuples."""
    columns = arrow_columns()
    if registry.backend == "postgresql":
        batch = arrow_reads.postgres_changed_rows(registry.engine.url, columns, sorted(keys))
    else:
        batch = _sqlite_changed_rows(registry, columns, sorted(keys))
    found = set(batch.column("episode_id").to_pylist())
    deletes = sorted(k for k in keys if k not in found)
    warehouse.apply(source=source, position=position, upserts=batch, deletes=deletes)
    rep.upserts += batch.num_rows
    rep.deletes += len(deletes)


# Fewer changed keys than this are read in the sync's own process (sqlite3 tuples); more, by the
# child process (ADBC), whose start (~0.2 s) the rows then repay.
SQLITE_CHILD_KEYS = 2_000


def _sqlite_changed_rows(registry: Registry, columns, keys: list[str]):
    path = registry.engine.url.database
    if len(keys) >= SQLITE_CHILD_KEYS and path and path != ":memory:":
        try:
            return arrow_reads.sqlite_changed_rows(path, columns, keys)
        except arrow_reads.SqliteReadError as e:
            log.warning("%s; reading the changed rows again through sqlite3", e)
    return rows_to_arrow(registry.episode_rows(keys, [n for n, _ in columns]), columns)


def _step_sqlite(registry, warehouse, source, _slot, batch, prune, rep) -> bool:
    after = int(warehouse.position(source) or 0)
    changes = changelog.read_changes(registry.engine, after, batch)
    if not changes:
        return False
    last = changes[-1].seq
    _apply_keys(registry, warehouse, source, {c.key for c in changes if c.table == "episodes"}, str(last), rep)
    if prune:
        changelog.prune(registry.engine, consumer_name(warehouse), last)
    rep.changes += len(changes)
    rep.position = last
    return True


def _step_postgres(registry, warehouse, source, slot, batch, _prune, rep) -> bool:
    txs = pg_logical.peek(registry.engine, slot, batch)
    if not txs:
        return False
    if txs[-1].end_lsn == getattr(rep, "_last_end", None):  # never loop on a slot that does not move
        raise RuntimeError(f"replication slot {slot} did not advance past {txs[-1].end_lsn}")
    rep._last_end = txs[-1].end_lsn
    applied = pg_logical.lsn_int(warehouse.position(source) or "0/0")
    todo = [tx for tx in txs if pg_logical.lsn_int(tx.commit_lsn) > applied]  # others: applied, slot not yet advanced
    if todo:
        keys = set().union(*(tx.keys.get("episodes", set()) for tx in todo))
        if any("episodes" in tx.truncated for tx in todo):  # every key may be gone: a new snapshot
            rep.upserts += _snapshot(registry, warehouse, source, slot, WAREHOUSE_BATCH)
            rep.changes += sum(len(k) for tx in todo for k in tx.keys.values())
            rep.position = warehouse.position(source)
            return True  # the slot was recreated at the snapshot's point: nothing to advance
        _apply_keys(registry, warehouse, source, keys, todo[-1].commit_lsn, rep)
        rep.changes += sum(len(k) for tx in todo for k in tx.keys.values())
    pg_logical.advance(registry.engine, slot, txs[-1].end_lsn)  # only after the warehouse committed
    rep.position = txs[-1].commit_lsn
    return True
