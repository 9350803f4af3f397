"""Ingest one partition: its byte-balanced work units, each through the batch engine
(:mod:`.batches`), fanned out as Ray tasks (:mod:`.ray_units`) or run one after another in
this process, with progress reported as units finish.

A partition holds a few TiB in production (thousands of episodes), so its run is where the
parallel work is: every unit is independent (its own files, episodes and registry rows), each
runs with its own CPUs and memory, a unit's outcome is durable the moment each of its episodes is
recorded, and a unit whose worker dies is rerun by Ray (a rerun redoes only what is still stale).
A unit that still fails after its retries fails alone: the others go on and the report names it.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..catalog.leases import RunLease
from ..catalog.registry import Batch, RegistryUnavailableError
from ..episodes.transcode import TranscodeSettings
from ..storage.stores import StoreUnavailableError
from .batches import IngestStores, StageReport, inventory_batch, transcode_batch
from .faults import InfrastructureFault, is_infrastructure_failure
from .gates import GateConfig
from .ray_units import Progress, UnitDone, UnitFailed, UnitResources, UnitResult, WorkUnit, run_units

Stage = Literal["pre", "post"]
UnitsOn = Literal["ray", "process"]

# A store or registry that did not answer may answer on the next attempt, and episodes a machine fault left
# pending may go through: Ray reruns the unit (a rerun redoes only what is still stale).
RETRIED = (StoreUnavailableError, RegistryUnavailableError, ConnectionError, TimeoutError, InfrastructureFault)


@dataclass(frozen=True)
class UnitJob:
    """What a work unit's task needs (it crosses to a Ray worker, so it pickles; the registry
    crosses as its URL without the password, see :meth:`Registry.__reduce__`)."""

    stage: Stage
    stores: IngestStores
    gates: GateConfig
    settings: TranscodeSettings | None = None
    workers: int = 1  # episode processes at once inside the unit
    # Inside a Ray worker (gRPC threads running) episode processes start from a fork server, never
    # by forking the worker itself; in this process, plain fork as before.
    mp_context: str | None = None
    # The run's lease (catalog/leases.py): a unit whose run is gone stops before publishing.
    lease: RunLease | None = None


@dataclass
class PartitionReport:
    """A partition's stage: the combined report, each unit's, and the units that failed whole."""

    partition_key: str
    stage: Stage
    combined: StageReport
    units: list[StageReport] = field(default_factory=list)
    failed_units: dict[str, str] = field(default_factory=dict)  # unit key -> reason
    # of them, the units that failed for the machine's sake (faults.py): a later attempt may go through
    infrastructure_units: list[str] = field(default_factory=list)


def run_unit(unit: WorkUnit[UnitJob]) -> StageReport:
    """One work unit: the batch engine over its files (runs in a Ray worker or in this process)."""
    job = unit.payload
    messages: list[str] = []
    if job.stage == "pre":
        rep = inventory_batch(unit.id, job.stores, job.gates, log=messages.append, lease=job.lease)
    else:
        if job.mp_context == "forkserver":
            _preload_fork_server()
        rep = transcode_batch(
            unit.id,
            job.stores,
            job.gates,
            settings=job.settings,
            workers=job.workers,
            log=messages.append,
            mp_context=job.mp_context,
            lease=job.lease,
        )
    rep.messages = messages
    return rep


def _preload_fork_server() -> None:
    # The fork server imports the transcoder once; each episode process then forks from it warm.
    # "__main__" too: a process started by the fork server re-runs its parent's main module (Ray's
    # default_worker.py, which imports ray: ~0.25 s of CPU per episode) unless the fork server
    # already holds it; default_worker.py does nothing more when imported under another name.
    mp.set_forkserver_preload(["__main__", "dyna_resources.ingest.batches"])


def run_in_process(
    fn: Callable[[WorkUnit], StageReport],
    units: Sequence[WorkUnit],
    *,
    on_progress: Callable[[Progress], None] = lambda p: None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[UnitResult]:
    """The same contract as :func:`run_units`, one unit after another in this process (the engine
    used without a cluster: the CLI, engine tests); a unit that raises comes back as failed."""
    t0, done, failed, done_bytes, done_s = clock(), 0, 0, 0, 0.0
    total_bytes, total_s = sum(u.bytes for u in units), sum(u.episode_s for u in units)
    on_progress(Progress(0, 0, len(units), 0, total_bytes, 0.0, total_s, 0.0))
    for u in units:
        c0, w0 = time.process_time(), clock()
        try:
            result: UnitResult = UnitDone(u, fn(u), clock() - w0, time.process_time() - c0)
        except Exception as e:
            result = UnitFailed(u, "raised", f"{type(e).__name__}: {e}")
        done, failed = done + 1, failed + (not result.ok)
        done_bytes, done_s = done_bytes + u.bytes, done_s + u.episode_s
        on_progress(Progress(done, failed, len(units), done_bytes, total_bytes, done_s, total_s, clock() - t0))
        yield result


def ingest_partition(
    partition_key: str,
    job: UnitJob,
    *,
    units_on: UnitsOn = "process",
    resources: UnitResources | None = None,
    max_retries: int = 3,
    log: Callable[[str], None] = lambda m: None,
    on_progress: Callable[[Progress], None] = lambda p: None,
    progress_every_s: float = 30.0,
) -> PartitionReport:
    """Run one stage over every work unit of an ingest partition, largest unit first.

    :param partition_key: the ingest partition (its units come from the registry).
    :param job: the stage and what its units need.
    :param units_on: ``"ray"``: each unit a Ray task (needs a Ray connection); ``"process"``: here.
    :param resources: what each unit asks Ray for (default: ``job.workers`` CPUs).
    :param max_retries: Ray reruns of a unit whose worker died or whose store did not answer.
    :param log: receives each unit's messages (quarantined files and why) as the unit finishes.
    :param on_progress: receives units done / total, episode-hours, MB/s, ETA, at least every
        ``progress_every_s`` on Ray and after every unit.
    """
    job.stores.check()  # critical dependencies: an unreachable store or registry fails the run here
    registry = job.stores.registry
    units = sorted(registry.partition_units(partition_key), key=lambda u: (-u.bytes, u.seq))
    seconds = _episode_seconds(registry, units) if job.stage == "post" else {}
    work = [WorkUnit(u.key, job, bytes=u.bytes, episode_s=seconds.get(u.key, 0.0)) for u in units]
    results: Iterator[UnitResult]
    if units_on == "ray":
        results = run_units(
            run_unit,
            work,
            resources=resources or UnitResources(num_cpus=job.workers),
            max_retries=max_retries,
            retry_exceptions=list(RETRIED),
            on_progress=on_progress,
            progress_every_s=progress_every_s,
        )
    else:
        results = run_in_process(run_unit, work, on_progress=on_progress)
    reports: list[StageReport] = []
    failed: dict[str, str] = {}
    machine: list[str] = []
    for r in results:
        if isinstance(r, UnitDone):
            reports.append(r.value)
            for m in r.value.messages:
                log(m)
        else:
            failed[r.unit.id] = f"{r.kind}: {r.reason}"
            if is_infrastructure_failure(r.kind, r.reason):
                machine.append(r.unit.id)
            log(f"work unit {r.unit.id} failed ({r.kind}): {r.reason}")
    by_key = {r.batch_key: r for r in reports}
    ordered = [by_key[u.key] for u in sorted(units, key=lambda u: u.seq) if u.key in by_key]
    return PartitionReport(
        partition_key, job.stage, StageReport.combine(partition_key, job.stage, ordered), ordered, failed, machine
    )


def _episode_seconds(registry, units: Sequence[Batch]) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in registry.episodes([u.key for u in units]):
        out[e["batch_key"]] = out.get(e["batch_key"], 0.0) + (e["duration_s"] or 0.0)
    return out
