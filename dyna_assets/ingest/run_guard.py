"""No work outlives its run (docs/ingest.md), on the Dagster side: the step's process holds its run's
lease while it drives the work units, dies with the process that started it (a run worker killed by
the OOM killer or `kill -9` takes its step with it), and gives the lease up when Dagster marks the run
failed or cancelled while this process lives on. Units check the lease (catalog/leases.py) and stop
before publishing; episode processes die with their unit."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import DagsterRunStatus

from dyna_resources.catalog.leases import RunLease
from dyna_resources.catalog.registry import Registry
from dyna_resources.ingest.workers import die_with_parent

ENDED = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.CANCELING, DagsterRunStatus.SUCCESS)
WATCH_EVERY_S = 1.0  # how often the step asks the instance whether its run is still on


@contextmanager
def held_run_lease(context, registry: Registry, step: str) -> Iterator[RunLease]:
    """The lease of this run's ``step``, held for the block (see the module docstring)."""
    die_with_parent()
    lease = RunLease(registry, f"{context.run.run_id}:{step}")
    held = lease.hold()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WATCH_EVERY_S):
            try:
                run = context.instance.get_run_by_id(context.run.run_id)
            except Exception as e:
                context.log.warning(f"cannot read run {context.run.run_id}'s status: {e}")
                continue
            if run is not None and run.status in ENDED:
                context.log.warning(
                    f"run {context.run.run_id} is {run.status.value}: its work units stop before publishing"
                )
                held.release()
                return

    watcher = threading.Thread(target=watch, name=f"dyna-run-lease-{step}", daemon=True)
    watcher.start()
    try:
        yield lease
    finally:
        stop.set()
        watcher.join()
        held.release()
