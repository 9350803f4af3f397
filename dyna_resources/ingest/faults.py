"""Two kinds of failure, kept apart (docs/ingest.md, "Faults are not verdicts"): a fault of the file
is a verdict, a fault of the machine is not.

- A **data** fault is a fact about the file (unreadable, bad values, a failed gate): the file is
  quarantined with its reason, final until the file or the pipeline version changes.
- An **infrastructure** fault is a fact about the machine (a worker killed or out of memory, a full
  disk, an I/O error, a store that does not answer, a timeout): never a verdict. The episode stays
  pending and is tried again with a bounded policy; when the attempts run out the run fails naming
  the episodes and the cause, and the next run takes them up.

Two faults of the machine follow the file and so become verdicts, saying why: the per-episode CPU
cap (it measures the file's own work), and a worker that dies on every one of
:data:`WORKER_DEATH_ATTEMPTS` attempts at the same episode while other episodes of its unit finish
on the same workers.

:data:`REASONS` classifies every quarantine reason the engine writes, or wrote in earlier
versions, by its text: it is how ``dyna quarantine release --reason-class infrastructure`` finds the
records earlier versions wrote for machine faults. New infrastructure faults are never written
as quarantine records.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FaultClass = Literal["data", "infrastructure"]
DATA: FaultClass = "data"
INFRASTRUCTURE: FaultClass = "infrastructure"

# Attempts at one episode within a call of the transcode engine before its worker's deaths are held
# against the file (a death on every attempt while the unit's other episodes finish).
WORKER_DEATH_ATTEMPTS = 3
# Attempts at one episode that met a machine fault that does not follow the file (a full disk, a
# store down): it is not the file's, so no verdict; after these the unit fails, the episode pending.
INFRASTRUCTURE_ATTEMPTS = 2

# errno values that say something about the machine, not the file being read or written.
MACHINE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,  # the disk (or a quota) is full
        errno.EIO,
        errno.EROFS,
        errno.ESTALE,  # the device failed, went read-only, an NFS handle went stale
        errno.ENOMEM,
        errno.EMFILE,
        errno.ENFILE,  # memory, file descriptors
        errno.ETIMEDOUT,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EPIPE,  # the network
    }
)


@dataclass(frozen=True)
class ReasonKind:
    """One kind of quarantine reason: its name, its class, and the text that identifies it.

    :param name: a short stable name (``disk_full``, ``cpu_limit``).
    :param fault: ``"data"`` or ``"infrastructure"``.
    :param pattern: a regular expression searched in the reason text (first kind that matches wins).
    :param gates: when set, the kind applies only to records of these gates.
    :param means: what the reason says, for people.
    """

    name: str
    fault: FaultClass
    pattern: str
    means: str
    gates: tuple[str, ...] = ()

    def matches(self, gate: str, reason: str) -> bool:
        if self.gates and gate not in self.gates:
            return False
        return re.search(self.pattern, reason) is not None


_ENGINE_GATES = ("transcode", "readable")  # the gates under which the engine writes its own failures

# Order matters: the first kind that matches a record classifies it; the last is the catch-all.
REASONS: tuple[ReasonKind, ...] = (
    ReasonKind(
        "cpu_limit",
        DATA,
        r"\(SIGXCPU",
        "the episode took more CPU than the per-episode cap: the file's own work",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "worker_died_every_attempt",
        DATA,
        r"died on each of \d+ attempts",
        "its worker died on every attempt while the unit's other episodes finished: the file kills its worker",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "worker_died",
        INFRASTRUCTURE,
        r"the worker process (died|exited with status)",
        "the worker process was killed (out of memory, a signal) or crashed once",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "disk_full",
        INFRASTRUCTURE,
        r"No space left on device|Disk quota exceeded|\[Errno (28|122)\]"
        r"|File too large|\[Errno 27\]",
        "a disk or quota was full",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "io_error",
        INFRASTRUCTURE,
        r"Input/output error|\[Errno 5\]|Read-only file system|\[Errno 30\]"
        r"|Stale file handle|\[Errno 116\]",
        "the device failed or went read-only",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "out_of_memory",
        INFRASTRUCTURE,
        r"MemoryError|Cannot allocate memory|\[Errno 12\]"
        r"|Too many open files|\[Errno 2[34]\]",
        "the machine ran out of memory or file descriptors",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "store_unavailable",
        INFRASTRUCTURE,
        r"is unavailable:|StoreUnavailableError|RegistryUnavailableError"
        r"|ConnectionError|Connection (refused|reset|aborted)|TimeoutError|timed out|Network is unreachable"
        r"|No route to host|Broken pipe",
        "a store, the registry or the network did not answer in time",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "vanished", DATA, r"vanished from the landing zone", "the raw file is gone from the landing zone", _ENGINE_GATES
    ),
    ReasonKind(
        "duplicate_episode_id",
        DATA,
        r"^duplicate episode_id",
        "another file landed with the same episode id first",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "publish_conflict",
        DATA,
        r"^not published:",
        "a newer MCAP of the episode is at its key (written by someone else): kept, this one held back",
        _ENGINE_GATES,
    ),
    ReasonKind(
        "registry_field",
        DATA,
        r"registry cannot store|^not recorded:|^attribute '",
        "a value from the file the registry cannot hold",
        _ENGINE_GATES,
    ),
    ReasonKind("gate", DATA, r"", "a quality gate quarantined the file"),  # any gate but the engine's own
    ReasonKind("unreadable", DATA, r"", "the file cannot be read or transcoded"),  # the engine's own, else
)


def _gate_kind(gate: str) -> bool:
    return gate not in _ENGINE_GATES


def reason_kind(gate: str, reason: str) -> ReasonKind:
    """The kind of a quarantine record, from its gate and reason text."""
    for kind in REASONS:
        if kind.name == "gate":
            if _gate_kind(gate):
                return kind
            continue
        if kind.matches(gate, reason):
            return kind
    return REASONS[-1]


def reason_class(gate: str, reason: str) -> FaultClass:
    """``"data"`` or ``"infrastructure"`` for a quarantine record."""
    return reason_kind(gate, reason).fault


def exception_class(e: BaseException) -> FaultClass:
    """The class of an exception a worker met, by its type (and its causes'), then by its text: an
    error that wraps an ``OSError`` keeps the errno only in its message (h5py does that)."""
    from ..catalog.registry import RegistryUnavailableError
    from ..storage.stores import StoreUnavailableError

    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(
            cur, (MemoryError, StoreUnavailableError, RegistryUnavailableError, ConnectionError, TimeoutError)
        ):
            return INFRASTRUCTURE
        if isinstance(cur, OSError) and cur.errno in MACHINE_ERRNOS:
            return INFRASTRUCTURE
        cur = cur.__cause__ or cur.__context__
    return reason_class("transcode", f"{type(e).__name__}: {e}")


class InfrastructureFault(RuntimeError):
    """Episodes that could not be done for a reason outside their files, after their attempts: the
    unit fails with this (Ray reruns it; the run fails naming them), and they stay pending.

    :param unit: the work unit.
    :param pending: ``{episode id or landing key: the last reason}``.
    """

    def __init__(self, unit: str, pending: dict[str, str]):
        self.unit = unit
        self.pending = dict(pending)
        shown = "; ".join(f"{k}: {why}" for k, why in list(self.pending.items())[:10])
        more = f" (and {len(self.pending) - 10} more)" if len(self.pending) > 10 else ""
        super().__init__(
            f"work unit {unit}: {len(self.pending)} episode(s) left pending after an infrastructure "
            f"fault (not quarantined; the next run takes them up): {shown}{more}"
        )

    def __reduce__(self):  # crosses from a Ray worker to the driver
        return type(self), (self.unit, self.pending)


def is_infrastructure_failure(kind: str, reason: str) -> bool:
    """Whether a work unit that failed whole failed for the machine's sake: its worker or node died, Ray
    could not run it, or it raised an infrastructure fault (``reason`` is ``"<Type>: <message>"``)."""
    if kind in ("died", "system", "cancelled"):
        return True
    return reason.startswith(f"{InfrastructureFault.__name__}:") or reason_class("transcode", reason) == INFRASTRUCTURE


def classify_all(records: Sequence[dict]) -> dict[FaultClass, list[dict]]:
    """Quarantine records (with ``gate`` and ``reason``) by class."""
    out: dict[FaultClass, list[dict]] = {DATA: [], INFRASTRUCTURE: []}
    for r in records:
        out[reason_class(r["gate"], r["reason"])].append(r)
    return out
