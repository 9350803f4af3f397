"""Ingest one partition: its byte-balanced work units, each through the batch engine
(:mod:`.batches`), fanned out as Ray tasks (:mod:`.ray_units`) or run one after another in
this process, with progress reported as units finish and at least every 30 s while they run (in
this process, counting the running unit's episodes as they finish).

A partition holds a few TiB in production (thousands of episodes), so its run is where the
parallel work is: every unit is independent (its own files, episodes and registry rows), each
runs with its own CPUs and memory, a unit's outcome is durable the moment each of its episodes is
recorded, and a unit whose worker dies is rerun by Ray (a rerun redoes only what is still stale).
A unit that still fails after its retries fails alone: the others go on and the report names it.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..catalog.leases import RunLease
from ..catalog.registry import REJECTED, Batch, RegistryUnavailableError
from ..episodes.transcode import TranscodeSettings
from ..storage.stores import StoreUnavailableError
from .batches import EpisodeProgress, IngestStores, StageReport, inventory_batch, transcode_batch
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


def run_unit(unit: WorkUnit[UnitJob], on_episode: EpisodeProgress | None = None) -> StageReport:
    """One work unit: the batch engine over its files (runs in a Ray worker or in this process);
    ``on_episode`` hears the unit's episodes as they finish (:data:`.batches.EpisodeProgress`)."""
    job = unit.payload
    messages: list[str] = []
    if job.stage == "pre":
        rep = inventory_batch(
            unit.id, job.stores, job.gates, log=messages.append, lease=job.lease, on_episode=on_episode
        )
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
            on_episode=on_episode,
        )
    rep.messages = messages
    return rep


def _preload_fork_server() -> None:
    # The fork server imports the transcoder once; each episode process then forks from it warm.
    # "__main__" too: a process started by the fork server re-runs its parent's main module (Ray's
    # default_worker.py, which imports ray: ~0.25 s of CPU per episode) unless the fork server
    # already holds it; default_worker.py does nothing more when imported under another name.
    mp.set_forkserver_preload(["__main__", "dyna_resources.ingest.batches"])


class _Meter:
    """Where :func:`run_in_process` stands: finished units whole, the running unit by the episodes its
    engine has finished (and their bytes), the units still to come by their estimates. Called from the
    units' thread and the heartbeat's, so every change and report holds the lock."""

    def __init__(
        self,
        units: Sequence[WorkUnit],
        on_progress: Callable[[Progress], None],
        every_s: float,
        clock: Callable[[], float],
    ):
        self.units, self.on_progress, self.every_s, self.clock = units, on_progress, every_s, clock
        self.lock = threading.Lock()
        self.t0 = clock()
        self.episodes = [u.episodes for u in units]  # each unit's total, as its engine last said
        self.done = self.failed = self.done_bytes = self.done_episodes = 0
        self.done_s = 0.0
        self.running = (0, 0)  # the running unit's episodes done and their bytes
        self.next_report = self.t0

    def episode(self, done: int, total: int, nbytes: int) -> None:
        """The running unit's engine: ``done`` of its ``total`` episodes finished, ``nbytes`` of input."""
        with self.lock:
            self.episodes[self.done] = total
            self.running = (done, min(nbytes, self.units[self.done].bytes))

    def unit_done(self, ok: bool) -> None:
        with self.lock:
            u = self.units[self.done]
            self.done, self.failed = self.done + 1, self.failed + (not ok)
            self.done_bytes, self.done_s = self.done_bytes + u.bytes, self.done_s + u.episode_s
            self.done_episodes += self.episodes[self.done - 1]
            self.running = (0, 0)
            self._report()

    def beat(self) -> None:
        """A report when ``every_s`` (by the clock) passed since the last one."""
        with self.lock:
            if self.clock() >= self.next_report:
                self._report()

    def report(self) -> None:
        with self.lock:
            self._report()

    def _report(self) -> None:
        now = self.clock()
        episodes, nbytes = self.running
        self.on_progress(
            Progress(
                self.done,
                self.failed,
                len(self.units),
                self.done_bytes + nbytes,
                sum(u.bytes for u in self.units),
                self.done_s,
                sum(u.episode_s for u in self.units),
                now - self.t0,
                self.done_episodes + episodes,
                sum(self.episodes),
            )
        )
        self.next_report = now + self.every_s


def run_in_process(
    fn: Callable[[WorkUnit, EpisodeProgress], StageReport],
    units: Sequence[WorkUnit],
    *,
    on_progress: Callable[[Progress], None] = lambda p: None,
    progress_every_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = 1.0,
) -> Iterator[UnitResult]:
    """The same contract as :func:`run_units`, one unit after another in this process (the engine
    used without a cluster: the CLI, engine tests); a unit that raises comes back as failed.

    ``fn(unit, on_episode)`` runs a unit and tells ``on_episode`` of its episodes as they finish. A
    heartbeat thread looks every ``poll_s`` (wall seconds) and reports when ``progress_every_s`` by
    ``clock`` passed since the last report, so a long unit is heard with its episodes done, MB/s and
    ETA while it runs; there is a report before the first unit and after each, as on Ray."""
    meter = _Meter(units, on_progress, progress_every_s, clock)
    meter.report()
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(poll_s):
            meter.beat()

    beating = threading.Thread(target=heartbeat, name="ingest-progress", daemon=True)
    beating.start()
    try:
        for u in units:
            c0, w0 = time.process_time(), clock()
            try:
                result: UnitResult = UnitDone(u, fn(u, meter.episode), clock() - w0, time.process_time() - c0)
            except Exception as e:
                result = UnitFailed(u, "raised", f"{type(e).__name__}: {e}")
            meter.unit_done(result.ok)
            yield result
    finally:
        stop.set()
        beating.join()


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
    :param on_progress: receives units and episodes done / total, episode-hours, MB/s, ETA, after
        every unit and at least every ``progress_every_s`` while units run (here, with the running
        unit's episodes counted as they finish; on Ray, by finished units).
    :param progress_every_s: longest gap between two progress reports.
    """
    job.stores.check()  # critical dependencies: an unreachable store or registry fails the run here
    registry = job.stores.registry
    units = sorted(registry.partition_units(partition_key), key=lambda u: (-u.bytes, u.seq))
    seconds, episodes = _episode_figures(registry, units) if job.stage == "post" else ({}, {})
    work = [
        WorkUnit(
            u.key,
            job,
            bytes=u.bytes,
            episode_s=seconds.get(u.key, 0.0),
            episodes=episodes.get(u.key, 0) if job.stage == "post" else u.files,
        )
        for u in units
    ]
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
        results = run_in_process(run_unit, work, on_progress=on_progress, progress_every_s=progress_every_s)
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


def _episode_figures(registry, units: Sequence[Batch]) -> tuple[dict[str, float], dict[str, int]]:
    """Per unit: seconds of its episodes, and how many the transcode stage takes up (all but the
    rejected; an estimate the unit's engine corrects once it runs)."""
    seconds: dict[str, float] = {}
    count: dict[str, int] = {}
    for e in registry.episodes([u.key for u in units]):
        seconds[e["batch_key"]] = seconds.get(e["batch_key"], 0.0) + (e["duration_s"] or 0.0)
        count[e["batch_key"]] = count.get(e["batch_key"], 0) + (e["status"] != REJECTED)
    return seconds, count
