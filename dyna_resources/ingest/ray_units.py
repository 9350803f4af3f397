"""Run a partition's work units on Ray: each unit a Ray task with its own CPUs, memory and GPUs,
results as each finishes, failures typed, progress reported as it happens (no Dagster here).

A unit whose worker dies (the kernel's out-of-memory killer, a crash in a codec library, a lost
node) is retried by Ray itself, up to ``max_retries`` times; an exception the unit raises is
retried only when ``retry_exceptions`` says so. What is still failing after that comes back as a
:class:`UnitFailed` naming the unit and the reason, and the other units go on.

A retried unit reruns from the start, in a fresh worker: what its first attempt did before it
died is not undone. Idempotence is the unit function's job (the ingest engine records each
episode's outcome in the registry the moment it is known and writes under temporary names, so a
rerun redoes only what had not finished).

Ray is imported inside the functions: importing this module costs nothing until units run.
Connect first, with :func:`ray_cluster` here or a ``dagster_ray`` resource in a Dagster run.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

P = TypeVar("P")
R = TypeVar("R")

FailureKind = Literal["raised", "died", "cancelled", "system"]


@dataclass(frozen=True)
class UnitResources:
    """What one unit asks Ray for. Ray schedules by these figures (a unit starts only where they
    are free); it does not cap what the unit then uses: that is left to the pod limits, the unit
    function's own limits, and Ray's memory monitor (which kills a worker when its node runs short
    of memory; the unit is then retried).

    :param num_cpus: logical CPUs, fractions allowed.
    :param memory: bytes of memory to reserve, or ``None`` to reserve none.
    :param num_gpus: GPUs (fractions share one); Ray sets ``CUDA_VISIBLE_DEVICES`` for the task.
    :param custom: other logical resources, e.g. ``{"nvenc": 1}``.
    """

    num_cpus: float = 1.0
    memory: int | None = None
    num_gpus: float = 0.0
    custom: dict[str, float] = field(default_factory=dict)

    def as_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            opts["memory"] = int(self.memory)
        if self.custom:
            opts["resources"] = dict(self.custom)
        return opts


@dataclass(frozen=True)
class WorkUnit(Generic[P]):
    """One unit of a partition's work, e.g. one byte-balanced ingest batch.

    :param id: unique within a call to :func:`run_units`; names the Ray task.
    :param payload: what the unit function receives (it must pickle).
    :param bytes: input bytes, for progress and MB/s.
    :param episode_s: seconds of episodes it holds, for progress.
    :param episodes: episodes (or files) it holds, for progress; an estimate its run may correct.
    :param resources: this unit's own request; ``None`` takes the one given to :func:`run_units`.
    """

    id: str
    payload: P
    bytes: int = 0
    episode_s: float = 0.0
    episodes: int = 0
    resources: UnitResources | None = None


@dataclass(frozen=True)
class UnitDone(Generic[R]):
    """A unit whose function returned. ``wall_s``/``cpu_s`` are its last attempt's, measured in the
    worker (CPU of the processes it waited for included)."""

    unit: WorkUnit
    value: R
    wall_s: float
    cpu_s: float

    @property
    def ok(self) -> bool:
        return True


@dataclass(frozen=True)
class UnitFailed:
    """A unit that returned nothing after its retries.

    :param kind: ``"raised"`` the function raised; ``"died"`` its worker process or node died;
        ``"cancelled"`` it was cancelled; ``"system"`` Ray could not run it or bring its result back.
    :param reason: ``"<ExceptionType>: <message>"``, e.g. ``"ValueError: bad unit"``.
    """

    unit: WorkUnit
    kind: FailureKind
    reason: str

    @property
    def ok(self) -> bool:
        return False

    @property
    def unit_id(self) -> str:
        return self.unit.id


UnitResult = UnitDone[R] | UnitFailed


@dataclass(frozen=True)
class Progress:
    """Where a call to :func:`run_units` stands. Finished units count whether they succeeded or
    failed (a failed unit is dealt with: its outcome is in the registry), so ``units_done`` ends at
    ``units_total``. ``episodes_done``/``episodes_total`` count the units' episodes (or files): on Ray
    as units finish; in this process (``partitions.run_in_process``) also as the running unit's
    episodes finish, with its bytes, so a long unit's rate and ETA move before it ends."""

    units_done: int
    units_failed: int
    units_total: int
    bytes_done: int
    bytes_total: int
    episode_s_done: float
    episode_s_total: float
    elapsed_s: float
    episodes_done: int = 0
    episodes_total: int = 0

    @property
    def episode_hours_done(self) -> float:
        return self.episode_s_done / 3600

    @property
    def mb_per_s(self) -> float:
        return self.bytes_done / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (by bytes, or by units when they carry no sizes);
        ``None`` before the first unit finishes."""
        done, total = (self.bytes_done, self.bytes_total) if self.bytes_total else (self.units_done, self.units_total)
        if done <= 0 or self.elapsed_s <= 0:
            return None if done < total else 0.0
        return (total - done) * self.elapsed_s / done

    def summary(self) -> str:
        eta = self.eta_s
        failed = f" ({self.units_failed} failed)" if self.units_failed else ""
        episodes = f"{self.episodes_done}/{self.episodes_total} episodes, " if self.episodes_total else ""
        return (
            f"{self.units_done}/{self.units_total} units{failed}, {episodes}"
            f"{self.episode_hours_done:.2f}/{self.episode_s_total / 3600:.2f} episode-h, "
            f"{self.bytes_done / 1e6:,.0f}/{self.bytes_total / 1e6:,.0f} MB at {self.mb_per_s:.1f} MB/s, "
            f"{_hms(self.elapsed_s)} elapsed, ETA {_hms(eta) if eta is not None else '?'}"
        )


def _hms(s: float) -> str:
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass(frozen=True)
class RayCluster:
    """The cluster :func:`ray_cluster` connected to.

    :param address: what was connected to (``"local"`` for a cluster started here).
    :param started_here: a local cluster this process started (and shuts down).
    :param resources: the cluster's total logical resources when connected, e.g. ``{"CPU": 2.0, ...}``.
    """

    address: str
    started_here: bool
    resources: dict[str, float]


@contextmanager
def ray_cluster(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    runtime_env: dict[str, Any] | None = None,
    namespace: str | None = None,
    temp_dir: str | None = None,
    log_to_driver: bool = False,
) -> Iterator[RayCluster]:
    """Connect to a Ray cluster, or start a local one, for the duration of the block.

    Already connected (e.g. by a ``dagster_ray`` resource): that connection is used and left open.

    :param address: ``"ray://head:10001"`` (Ray Client) or ``"head:6379"`` to connect; ``"local"``
        to start a local cluster whatever ``RAY_ADDRESS`` says; ``None`` reads ``RAY_ADDRESS`` and
        starts a local cluster when it is unset.
    :param num_cpus: CPUs of a local cluster (default: all of this machine's); ignored when connecting.
    :param num_gpus: GPUs of a local cluster (default: those Ray detects); ignored when connecting.
    :param runtime_env: Ray runtime environment for the tasks (env vars, working dir, pip).
    :param namespace: Ray namespace of this job.
    :param temp_dir: a local cluster's session/log folder (Ray's default: ``/tmp/ray``).
    :param log_to_driver: print the workers' stdout/stderr here.
    """
    import ray

    if ray.is_initialized():
        yield RayCluster(address="connected", started_here=False, resources=dict(ray.cluster_resources()))
        return
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    local = address == "local"
    opts: dict[str, Any] = {"runtime_env": runtime_env, "namespace": namespace, "log_to_driver": log_to_driver}
    if local:
        # The dashboard's web server is the heaviest of Ray's daemons and nothing here reads it.
        opts.update(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, _temp_dir=temp_dir)
    ray.init(address=address, **{k: v for k, v in opts.items() if v is not None})
    try:
        yield RayCluster(address=address, started_here=local, resources=dict(ray.cluster_resources()))
    finally:
        ray.shutdown()


def run_units(
    fn: Callable[[WorkUnit[P]], R],
    units: Sequence[WorkUnit[P]],
    *,
    resources: UnitResources | None = None,
    max_retries: int = 3,
    retry_exceptions: bool | Sequence[type[BaseException]] = False,
    on_progress: Callable[[Progress], None] = lambda p: None,
    progress_every_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> Generator[UnitResult[R], None, None]:
    """Run ``fn(unit)`` for every unit as a Ray task; yield each unit's :class:`UnitDone` or
    :class:`UnitFailed` once, as it finishes. Needs a Ray connection (:func:`ray_cluster`).

    Units are submitted in the order given (Ray starts queued tasks roughly in that order: put
    the largest first). Closing the generator early cancels the units still queued or running.

    :param fn: the unit function; runs in a Ray worker, so it and its payload must pickle.
    :param units: the work units; ids must be unique.
    :param resources: the request of every unit that does not carry its own (default: one CPU).
    :param max_retries: how many times Ray reruns a unit whose worker died (and, with
        ``retry_exceptions``, one that raised). Each retry reruns the whole unit.
    :param retry_exceptions: also retry a unit that raised: ``True`` for any exception, or only
        these types. Off by default: a unit that raises has usually met something that will not
        change on a rerun (its bad episodes are quarantined inside it, not raised).
    :param on_progress: called with a :class:`Progress` once before the first result, after each
        result, and at least every ``progress_every_s`` while units run (a Dagster asset passes
        ``lambda p: context.log.info(p.summary())``).
    :param progress_every_s: longest gap between two progress reports.
    :param clock: seconds, for elapsed time and the report interval.
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError("run_units needs a Ray connection: run it inside ray_cluster() or a dagster_ray resource")
    ids = [u.id for u in units]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"work unit ids must be unique; repeated: {dup[:10]}")
    retry: bool | list[type[BaseException]] = (
        retry_exceptions if isinstance(retry_exceptions, bool) else list(retry_exceptions)
    )
    resources = resources or UnitResources()
    remote = ray.remote(_run_unit)
    fn_ref = ray.put(fn)  # serialized once, not once per unit
    t0 = clock()
    pending = {}
    for u in units:
        opts = (u.resources or resources).as_options()
        ref = remote.options(name=f"unit:{u.id}", max_retries=max_retries, retry_exceptions=retry, **opts).remote(
            fn_ref, u
        )
        pending[ref] = u
    done = failed = bytes_done = episodes_done = 0
    episode_s_done = 0.0
    total_bytes, total_s = sum(u.bytes for u in units), sum(u.episode_s for u in units)
    total_episodes = sum(u.episodes for u in units)

    def report() -> float:
        now = clock()
        on_progress(
            Progress(
                done,
                failed,
                len(units),
                bytes_done,
                total_bytes,
                episode_s_done,
                total_s,
                now - t0,
                episodes_done,
                total_episodes,
            )
        )
        return now + progress_every_s

    next_report = report()
    try:
        while pending:
            ready, rest = ray.wait(list(pending), num_returns=1, timeout=max(0.0, next_report - clock()))
            if not ready:
                next_report = report()
                continue
            if rest:  # take every unit finished by now in one sweep: one wait per wake-up, not per unit
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in ready:
                unit = pending.pop(ref)
                result = _collect(ray, ref, unit)
                done += 1
                failed += not result.ok
                bytes_done += unit.bytes
                episode_s_done += unit.episode_s
                episodes_done += unit.episodes
                next_report = report()
                yield result
    finally:
        _cancel(ray, list(pending))


def _cancel(ray: Any, refs: list, rounds: int = 5) -> None:
    """Cancel tasks, again while some still run: a cancel that reaches a task between its scheduling and
    its start can be lost (seen on a loaded machine), and that task would then run to its end."""
    for _ in range(rounds):
        if not refs:
            return
        for ref in refs:
            ray.cancel(ref, force=True)
        _, refs = ray.wait(refs, num_returns=len(refs), timeout=0.5)


def _collect(ray: Any, ref: Any, unit: WorkUnit) -> UnitResult:
    try:
        value, wall_s, cpu_s = ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(e.cause, BaseException) else e
        return UnitFailed(unit, "raised", f"{type(cause).__name__}: {cause}")
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError) as e:
        return UnitFailed(unit, "died", f"{type(e).__name__}: {e}")
    except ray.exceptions.TaskCancelledError as e:
        return UnitFailed(unit, "cancelled", f"{type(e).__name__}: {e}")
    except Exception as e:
        return UnitFailed(unit, "system", f"{type(e).__name__}: {e}")
    return UnitDone(unit, value, wall_s, cpu_s)


def _run_unit(fn: Callable[[WorkUnit], Any], unit: WorkUnit) -> tuple[Any, float, float]:
    t0, c0 = time.perf_counter(), _cpu_s()
    value = fn(unit)
    return value, time.perf_counter() - t0, _cpu_s() - c0


def _cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
