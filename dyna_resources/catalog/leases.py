"""Run leases: a run's work units (on Ray workers, perhaps on other nodes) ask whether the run they
belong to is still alive, and stop before publishing when it is not: no work outlives its run, so
once Dagster marks a run failed nothing of it still writes (docs/ingest.md).

The lease is a lock held by the process that drives the run's step, for as long as it drives it,
so it goes the instant that process dies, by any death (SIGKILL included), with nobody to clean up:

- PostgreSQL registry: a session-level advisory lock on a connection of the holder's own; the server
  drops it with the session. A unit on any node checks it with ``pg_try_advisory_lock_shared``.
- SQLite registry (embedded: one machine): an exclusive ``flock`` on ``<registry>.leases/<key>``;
  the kernel drops it with the process. A unit checks it with a non-blocking shared ``flock``.

The holder also gives the lease up on purpose, e.g. when Dagster marks its run failed or cancelled
while the process lives on. Plain Python, no Dagster.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from .registry import Registry

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _pg_key(key: str) -> int:
    """A lease key as PostgreSQL's 64-bit advisory lock key (signed)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


def _lease_file(registry: Registry, key: str) -> Path:
    db = Path(registry.url.database or "")
    name = _SAFE.sub("_", key)[:100] + "-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return db.parent / f"{db.name}.leases" / name


class HeldLease:
    """A lease held by this process (see :meth:`RunLease.hold`); :meth:`release` gives it up."""

    def __init__(self, registry: Registry, key: str):
        self.key = key
        self._conn = self._fd = None
        if registry.backend == "postgresql":
            self._conn = registry.engine.connect()
            self._conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _pg_key(key)})
            self._conn.commit()  # a session lock: it outlives transactions, not the session
        else:
            path = _lease_file(registry, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _pg_key(self.key)})
                self._conn.commit()
            finally:
                self._conn.close()
                self._conn = None
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> HeldLease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class RunLease:
    """A run's lease, by its key (the Dagster run id), as a unit checks it. It pickles (the registry
    crosses as its URL), so it travels with a work unit to a Ray worker and into episode processes.

    :param registry: the registry the run records into.
    :param key: the run's identity.
    :param check_every_s: :meth:`alive` asks the registry at most this often; in between it answers
        from its last look (a dead lease is final).
    """

    registry: Registry
    key: str
    check_every_s: float = 1.0
    _seen_at: float = field(default=float("-inf"), repr=False, compare=False)
    _alive: bool = field(default=True, repr=False, compare=False)

    def hold(self) -> HeldLease:
        """Take the lease for this process (the run's driver). Blocks while another process holds it."""
        return HeldLease(self.registry, self.key)

    def alive(self, *, now: float | None = None) -> bool:
        """Whether the run's driver still holds the lease."""
        now = time.monotonic() if now is None else now
        if self._alive and now - self._seen_at >= self.check_every_s:
            self._alive = self._held()
            self._seen_at = now
        return self._alive

    def _held(self) -> bool:
        if self.registry.backend == "postgresql":
            with self.registry.engine.connect() as c:
                got = c.execute(text("SELECT pg_try_advisory_lock_shared(:k)"), {"k": _pg_key(self.key)}).scalar_one()
                if got:
                    c.execute(text("SELECT pg_advisory_unlock_shared(:k)"), {"k": _pg_key(self.key)})
                c.commit()
            return not got
        path = _lease_file(self.registry, self.key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False  # never taken, or taken on another machine: no driver here holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also drops the shared lock if it was granted
        return False

    def __getstate__(self):
        return {"registry": self.registry, "key": self.key, "check_every_s": self.check_every_s}

    def __setstate__(self, state):
        self.__init__(**state)


class RunEnded(RuntimeError):
    """The run a unit belongs to has ended (its driver died, or Dagster marked it failed or cancelled):
    the unit stopped before publishing anything more; its unfinished episodes are left as they were."""

    def __init__(self, key: str, unit: str, left: int):
        self.key, self.unit, self.left = key, unit, left
        super().__init__(
            f"run {key} is no longer alive: work unit {unit} stopped before publishing, "
            f"{left} episode(s) left for the next run"
        )

    def __reduce__(self):
        return type(self), (self.key, self.unit, self.left)
