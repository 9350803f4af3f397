"""Change-data-capture from the PostgreSQL registry: logical decoding with ``pgoutput``.

pgoutput is built into PostgreSQL (no extension to install). Changes are read with
``pg_logical_slot_peek_binary_changes``, which returns whole transactions, and the slot
is advanced only after the warehouse has committed them, past the COMMIT record (to its
end LSN; at a change's LSN, or at the commit record's own start, the transaction is
delivered again on every peek). Like the SQLite
change log, only keys are taken from the stream; the consumer reads current rows, so a
transaction delivered twice (crash between warehouse commit and slot advance) is harmless.

The decoder below covers the messages of protocol version 1 that a publication on plain
tables produces (Begin, Commit, Relation, Insert, Update, Delete, Truncate, Origin, Type);
psycopg2 has no pgoutput decoder and psycopg 3 has no replication support.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.engine import Engine

PUBLICATION = "dyna_cdc"
_SAFE = re.compile(r"[^a-z0-9_]")


def slot_name(database: str) -> str:
    """Replication slots are cluster-wide: one per registry database."""
    return ("dyna_wh_" + _SAFE.sub("_", database.lower()))[:63]


def install(engine: Engine, tables: list[str]) -> str:
    """Create the publication and the logical slot if missing; returns the slot name."""
    with engine.begin() as c:
        db = c.execute(text("SELECT current_database()")).scalar_one()
        if not c.execute(text("SELECT 1 FROM pg_publication WHERE pubname = :p"), {"p": PUBLICATION}).first():
            c.execute(text(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(tables)}"))
    slot = slot_name(db)
    with engine.connect() as c:  # slot creation must not run inside a transaction that wrote
        c = c.execution_options(isolation_level="AUTOCOMMIT")
        if not c.execute(text("SELECT 1 FROM pg_replication_slots WHERE slot_name = :s"), {"s": slot}).first():
            c.execute(text("SELECT pg_create_logical_replication_slot(:s, 'pgoutput')"), {"s": slot})
    return slot


_SNAPSHOT_NAME = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9]+)?$")


@contextmanager
def snapshot(engine: Engine, slot: str, columns, batch: int) -> Iterator[tuple[str, Iterator]]:
    """Recreate the slot and read the episodes table as of exactly its starting point: (consistent
    point LSN, Arrow record batches of ``batch`` rows read by binary COPY through ADBC). Every
    transaction that committed before the point is in the rows; the slot delivers exactly the
    later ones. (The replication protocol's CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT, then SET
    TRANSACTION SNAPSHOT in a REPEATABLE READ reader; a slot created by SQL exports no snapshot.)
    ``columns``: (name, Arrow type) pairs. Only for a consumer that has applied nothing yet: the
    slot's pending changes are dropped with it."""
    import psycopg2
    import psycopg2.extras

    from . import arrow_reads

    url = engine.url
    kw = {"host": url.host, "port": url.port, "user": url.username, "password": url.password, "dbname": url.database}
    repl = psycopg2.connect(connection_factory=psycopg2.extras.LogicalReplicationConnection, **kw)
    try:
        rcur = repl.cursor()
        for attempt in range(3):  # a sensor's install() may recreate the slot between the drop and the create
            _drop_slot(engine, slot)
            try:
                rcur.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT")  # slot: [a-z0-9_]
                break
            except psycopg2.errors.DuplicateObject:
                if attempt == 2:
                    raise
        _name, point, snap, _plugin = rcur.fetchone()
        if not _SNAPSHOT_NAME.match(snap):
            raise RuntimeError(f"unexpected snapshot name from the server: {snap!r}")
        with arrow_reads.postgres_reader(url) as reader:
            try:
                reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                reader.execute(f"SET TRANSACTION SNAPSHOT '{snap}'")  # checked above: hex digits and dashes
                repl.close()  # the export may end now: the reader holds the snapshot
                names = ", ".join(n for n, _ in columns)  # column names from the schema, not input
                yield point, arrow_reads.postgres_batches(reader, f"SELECT {names} FROM episodes", columns, batch)
            finally:
                reader.execute("ROLLBACK")
    finally:
        if not repl.closed:
            repl.close()


def drop(engine: Engine) -> None:
    """Drop the registry's slot (its warehouse is gone): PostgreSQL keeps every WAL segment a slot
    has not confirmed, so a slot nobody reads grows the server's disk without bound."""
    with engine.connect() as c:
        db = c.execute(text("SELECT current_database()")).scalar_one()
    _drop_slot(engine, slot_name(db))


def _drop_slot(engine: Engine, slot: str) -> None:
    with engine.connect() as c:
        c.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = :s"),
            {"s": slot},
        )


@dataclass
class Transaction:
    commit_lsn: str  # the COMMIT record's LSN, as PostgreSQL prints it (e.g. 0/16B3F08)
    end_lsn: str = ""  # the end of the COMMIT record: where the slot is advanced to
    keys: dict[str, set[str]] = field(default_factory=dict)  # table -> changed primary keys
    truncated: set[str] = field(default_factory=set)


def peek(engine: Engine, slot: str, max_changes: int) -> list[Transaction]:
    """Whole transactions not yet confirmed on the slot (at least one when any is pending)."""
    with engine.connect() as c:
        c = c.execution_options(isolation_level="AUTOCOMMIT")
        rows = c.execute(
            text(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
                ":s, NULL, :n, 'proto_version', '1', 'publication_names', :p)"
            ),
            {"s": slot, "n": max_changes, "p": PUBLICATION},
        ).all()
    return decode(rows)


def advance(engine: Engine, slot: str, lsn: str) -> None:
    with engine.connect() as c:
        c.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("SELECT pg_replication_slot_advance(:s, CAST(:lsn AS pg_lsn))"), {"s": slot, "lsn": lsn}
        )


def lsn_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def decode(rows) -> list[Transaction]:
    relations: dict[int, tuple[str, list[str], list[int]]] = {}  # relid -> (table, columns, key column indexes)
    out: list[Transaction] = []
    current: Transaction | None = None
    for _lsn, data in rows:
        buf = bytes(data)
        kind = buf[:1]
        if kind == b"B":
            current = Transaction(commit_lsn="")
        elif kind == b"C":
            _flags, commit_lsn, end_lsn, _ts = struct.unpack_from(">bQQq", buf, 1)
            assert current is not None, "pgoutput sends changes and Commit only inside a Begin"
            current.commit_lsn = _lsn_text(commit_lsn)
            current.end_lsn = _lsn_text(end_lsn)
            out.append(current)
            current = None
        elif kind == b"R":
            relid, pos = struct.unpack_from(">I", buf, 1)[0], 5
            namespace, pos = _cstring(buf, pos)
            name, pos = _cstring(buf, pos)
            pos += 1  # replica identity setting
            (ncols,), pos = struct.unpack_from(">h", buf, pos), pos + 2
            cols: list[str] = []
            key_cols: list[int] = []
            for i in range(ncols):
                flags, pos = buf[pos], pos + 1
                col, pos = _cstring(buf, pos)
                pos += 8  # type oid, type modifier
                cols.append(col)
                if flags & 1:
                    key_cols.append(i)
            relations[relid] = (name, cols, key_cols)
        elif kind in (b"I", b"U", b"D"):
            (relid,) = struct.unpack_from(">I", buf, 1)
            table, cols, key_idx = relations[relid]
            pos = 5
            assert current is not None, "pgoutput sends changes and Commit only inside a Begin"
            keys = current.keys.setdefault(table, set())
            while pos < len(buf):
                # I: 'N' (new row); D: 'K' (key columns, others null) or 'O' (old row); U: an
                # optional 'K'/'O' (the key changed) then 'N'. Only the key is read: the columns
                # after it are skipped unless another tuple follows.
                marker, pos = buf[pos : pos + 1], pos + 1
                more = kind == b"U" and marker in (b"K", b"O")
                value, pos = _key_of_tuple(buf, pos, key_idx[0], to_end=more)
                if value is not None:
                    keys.add(value)
                if not more:
                    break
        elif kind == b"T":
            (nrel,) = struct.unpack_from(">I", buf, 1)
            assert current is not None, "pgoutput sends changes and Commit only inside a Begin"
            for j in range(nrel):
                (relid,) = struct.unpack_from(">I", buf, 6 + 4 * j)
                current.truncated.add(relations[relid][0])
        # 'O' (origin), 'Y' (type), 'M' (message): nothing to do
    return out


def _lsn_text(v: int) -> str:
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\0", pos)
    return buf[pos:end].decode(), end + 1


def _key_of_tuple(buf: bytes, pos: int, key: int, *, to_end: bool) -> tuple[str | None, int]:
    """The text of column ``key`` of the tuple at ``pos`` and where the tuple ends (``to_end``), or
    -1 (not read that far)."""
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    value = None
    for i in range(n):
        kind, pos = buf[pos], pos + 1
        if kind == 0x74:  # 't': text, int32 length first; 'n' null and 'u' unchanged TOAST carry nothing
            (length,) = struct.unpack_from(">i", buf, pos)
            if i == key:
                value = buf[pos + 4 : pos + 4 + length].decode()
            pos += 4 + length
        if i >= key and not to_end:
            return value, -1
    return value, pos
