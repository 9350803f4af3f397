"""run_each (ingest/workers.py): one process per job; a job that stops using CPU is killed as stuck."""

from __future__ import annotations

import threading
import time

from dyna_resources.ingest.workers import WorkerFailure, run_each


def _stuck(x: int) -> int:
    threading.Event().wait()  # a deadlock: never returns, uses no CPU
    return x


def _busy(cpu_s: float) -> float:
    while time.process_time() < cpu_s:
        pass
    return cpu_s


def _results(*args, **kwargs) -> dict:
    return {i: out for i, _slot, out in run_each(*args, **kwargs)}


def test_a_job_that_uses_no_cpu_for_stall_s_is_killed_and_reported_as_a_death():
    out = _results(_stuck, [(1,)], 1, stall_s=1.0, poll_s=0.2)
    assert isinstance(out[0], WorkerFailure)
    assert out[0].reason == "the worker process died (SIGKILL: stalled, it used no CPU in 1 s)"
    assert out[0].exitcode == -9


def test_a_stalled_job_frees_its_slot_for_the_next_one():
    out = _results(_stuck, [(1,), (2,)], 1, stall_s=0.5, poll_s=0.1)
    assert sorted(out) == [0, 1] and all(isinstance(o, WorkerFailure) for o in out.values())


def test_a_job_that_keeps_using_cpu_longer_than_stall_s_is_not_stalled():
    out = _results(_busy, [(3.0,)], 1, stall_s=1.0, poll_s=0.2)
    assert out == {0: 3.0}
