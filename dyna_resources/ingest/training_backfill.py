"""The training-stream backfill: a read profile's training streams added to episodes already transcoded.

A new read profile (another training stream size or GOP) must not mean transcoding the fleet again:
:func:`~..episodes.training_streams.add_training_streams` keeps every record of an MCAP byte-identical
(the archive video included) and adds the streams beside them. Per episode of an ingest partition:

- one that already carries the streams (registry column ``training_streams``) is skipped without
  reading its file;
- otherwise its MCAP is rewritten in a worker process of its own (local scratch; from an object
  store it is downloaded first, pinned to the version the registry recorded), republished with that
  version as the precondition, and the registry row updated by compare-and-set, so a transcode that
  republished the episode meanwhile is never overwritten (it is reported as a conflict and left
  for the next run, which finds it current or rewrites the new MCAP);
- a damaged MCAP fails that episode alone, named with the reason; a store that does not answer
  fails the partition (critical: the run is retried);
- a machine fault (its worker killed or out of memory, a full disk) is not a verdict on the episode: it
  is tried again (:data:`~.faults.WORKER_DEATH_ATTEMPTS` attempts), then left ``pending`` (without the
  streams, nothing recorded against it) for the asset to retry the step after a back-off.

Plain Python, no Dagster import (the ``training_streams`` asset is the Dagster face).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog.registry import TRANSCODED
from ..episodes.errors import McapFormatError
from ..episodes.read_profile import carries, stream_token
from ..episodes.training_streams import TrainingStreamSpec, add_training_streams
from ..storage.publish import PreconditionFailed
from ..storage.stores import StoreUnavailableError
from .batches import IngestStores
from .episode_io import McapSink
from .faults import INFRASTRUCTURE, WORKER_DEATH_ATTEMPTS, exception_class
from .workers import WorkerFailure, run_each


@dataclass(frozen=True)
class RewriteJob:
    episode_id: str
    mcap_path: str  # local path, or the store URL
    expect_version: str | None
    sink: McapSink
    specs: tuple[TrainingStreamSpec, ...]


@dataclass
class RewriteOutcome:
    version: str | None = None
    bytes_after: int = 0
    bytes_added: int = 0
    error: str | None = None  # the episode's own: a damaged MCAP
    conflict: str | None = None  # someone else's MCAP is there now
    unavailable: tuple[str, str] | None = None  # (url, reason): the store did not answer
    machine: str | None = None  # a fault of the machine (disk full, out of memory): tried again
    cpu_s: float = 0.0


@dataclass
class BackfillReport:
    partition: str
    streams: list[str]  # the tokens wanted (read_profile.stream_token)
    episodes: int  # transcoded episodes of the partition
    current: list[str] = field(default_factory=list)  # already carried every stream
    added: list[str] = field(default_factory=list)
    conflicts: dict[str, str] = field(default_factory=dict)  # republished meanwhile: left for the next run
    failed: dict[str, str] = field(default_factory=dict)  # episode -> why (its MCAP is damaged)
    pending: dict[str, str] = field(default_factory=dict)  # episode -> the machine fault met on every attempt
    bytes_added: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0


def rewrite_job(job: RewriteJob) -> RewriteOutcome:
    """One episode, in a worker process: its MCAP to scratch, the streams added, republished."""
    c0 = time.process_time()
    sink = job.sink
    work = Path(sink.folder) / f".{job.episode_id}.mcap.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    src = work.with_suffix(".src")
    try:
        out = _rewrite(job, src, work)
    except StoreUnavailableError as e:
        out = RewriteOutcome(unavailable=(e.url, e.reason))
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        out = RewriteOutcome(machine=why) if exception_class(e) == INFRASTRUCTURE else RewriteOutcome(error=why)
    finally:
        src.unlink(missing_ok=True)
        work.unlink(missing_ok=True)
    out.cpu_s = time.process_time() - c0
    return out


def _rewrite(job: RewriteJob, src: Path, work: Path) -> RewriteOutcome:
    sink = job.sink
    if sink.store is None:
        local = Path(job.mcap_path)
        if not local.is_file():
            return RewriteOutcome(error=f"MCAP {local} is gone")
    else:
        store, key = sink._store(), f"{job.episode_id}.mcap"
        try:
            info = store.info(key)
        except FileNotFoundError:
            return RewriteOutcome(error=f"MCAP {store.url(key)} is gone")
        if job.expect_version and info.version != job.expect_version:
            return RewriteOutcome(conflict=f"{store.url(key)} is version {info.version}, not {job.expect_version}")
        with store.open(key, "rb") as fin, open(src, "wb") as fout:
            shutil.copyfileobj(fin, fout, 8 << 20)
        local = src
    try:
        report = add_training_streams(local, work, job.specs)
    except McapFormatError as e:
        return RewriteOutcome(error=str(e))
    try:
        published = sink.publish(job.episode_id, work, job.expect_version)
    except PreconditionFailed as e:
        return RewriteOutcome(conflict=f"not published: {e}")
    added = sum(r.bytes for r in report.streams.values() if r.action != "kept")
    return RewriteOutcome(version=published.version, bytes_after=report.bytes_after, bytes_added=added)


def _record(
    stores: IngestStores,
    rep: BackfillReport,
    row: dict,
    out: RewriteOutcome,
    specs: Sequence[TrainingStreamSpec],
    wanted: list[str],
) -> None:
    assert out.version is not None
    # the streams the file now holds: the wanted ones beside any other it carried
    kept = [tok for tok in (row.get("training_streams") or "").split(",") if tok]
    names = {s.name for s in specs}
    column = ",".join(sorted({*(t for t in kept if t.split("@")[0] not in names), *wanted}))
    recorded = stores.registry.record_rewrite(
        row["episode_id"],
        expect_version=row.get("mcap_version"),
        mcap_version=out.version,
        mcap_bytes=out.bytes_after,
        training_streams=column,
    )
    if recorded:
        rep.added.append(row["episode_id"])
        rep.bytes_added += out.bytes_added
    else:
        rep.conflicts[row["episode_id"]] = "the registry's row changed while its MCAP was rewritten"


def backfill_partition(
    partition_key: str,
    stores: IngestStores,
    specs: Sequence[TrainingStreamSpec],
    *,
    workers: int = 1,
    stall_s: float = 300.0,
    log: Callable[[str], None] = lambda m: None,
) -> BackfillReport:
    """Add ``specs`` to every transcoded episode of ingest partition ``partition_key`` lacking them.
    ``stall_s``: a rewrite whose worker uses no CPU for that many seconds is killed and tried again.

    :raises StoreUnavailableError: the MCAP store or the registry did not answer (what finished is recorded).
    """
    t0, c0 = time.perf_counter(), time.process_time()
    specs = tuple(specs)
    stores.check()
    wanted = [stream_token(s) for s in specs]
    rows = [r for r in stores.registry.partition_episodes(partition_key) if r["status"] == TRANSCODED]
    rep = BackfillReport(partition_key, wanted, len(rows))
    todo = []
    for r in rows:
        if all(carries(r.get("training_streams"), w) for w in wanted):
            rep.current.append(r["episode_id"])
        else:
            todo.append(r)
    sink = stores.sink()
    jobs = [RewriteJob(r["episode_id"], r["mcap_path"], r.get("mcap_version"), sink, specs) for r in todo]
    unavailable: tuple[str, str] | None = None
    episodes_cpu = 0.0
    attempt, faults = list(range(len(todo))), dict[int, list[str]]()
    while attempt and unavailable is None:
        again = []
        with closing(
            run_each(rewrite_job, [(jobs[i],) for i in attempt], max(1, min(workers, len(attempt))), stall_s=stall_s)
        ) as results:
            for k, _slot, out in results:
                i = attempt[k]
                eid = todo[i]["episode_id"]
                if isinstance(out, WorkerFailure):  # killed, out of memory: rewrite_job itself never raises
                    out = RewriteOutcome(machine=out.reason)
                episodes_cpu += out.cpu_s
                if out.unavailable:
                    unavailable = out.unavailable
                elif out.machine:
                    faults.setdefault(i, []).append(out.machine)
                    log(
                        f"{eid}: attempt {len(faults[i])} of {WORKER_DEATH_ATTEMPTS} met a machine fault: {out.machine}"
                    )
                    if len(faults[i]) < WORKER_DEATH_ATTEMPTS:
                        again.append(i)
                    else:
                        rep.pending[eid] = out.machine
                elif out.error:
                    rep.failed[eid] = out.error
                    log(f"{eid}: training streams not added: {out.error}")
                elif out.conflict:
                    rep.conflicts[eid] = out.conflict
                else:
                    _record(stores, rep, todo[i], out, specs, wanted)
        attempt = again
    for i in attempt:  # left when the store stopped answering
        rep.pending.setdefault(todo[i]["episode_id"], faults[i][-1])
    rep.seconds = time.perf_counter() - t0
    rep.cpu_s = time.process_time() - c0 + episodes_cpu
    if unavailable is not None:
        raise StoreUnavailableError(*unavailable)
    return rep
