"""Run jobs each in its own worker process, at most ``workers`` at once, results as each finishes.

One process per job rather than a shared pool: a worker that dies (a crash in a codec
library, the kernel's out-of-memory killer, the CPU limit) takes down only its own job,
which is reported with how it died, and the other jobs go on. A ``ProcessPoolExecutor``
fails every job in flight with ``BrokenProcessPool`` and cannot say which one killed it.
A fork costs milliseconds, an episode's transcode seconds.

A job whose process uses no CPU for ``stall_s`` seconds is stuck (a deadlock in a native library,
a read that never returns): it is killed and reported as a :class:`WorkerFailure` like any other
death, so the caller retries it as a machine fault instead of waiting forever.

No job outlives the process that started it: each asks the kernel to kill it when its parent dies
(``PR_SET_PDEATHSIG``; a fork server's children when the fork server goes, which it does when its
own parent does), and ``should_stop`` lets the caller end every job in flight at once.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing as mp
import os
import resource
import signal
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TypeVar, cast

R = TypeVar("R")

_HOW = {
    signal.SIGXCPU: "over its CPU time limit",
    signal.SIGKILL: "killed, e.g. out of memory",
    signal.SIGSEGV: "crashed: segmentation fault",
    signal.SIGABRT: "aborted",
    signal.SIGBUS: "crashed: bus error",
}


class Stopped(RuntimeError):
    """``should_stop`` said so: the jobs in flight were killed, the rest never started."""

    def __init__(self, unfinished: list[int]):
        self.unfinished = unfinished
        super().__init__(f"stopped with {len(unfinished)} job(s) unfinished")


@dataclass(frozen=True)
class WorkerFailure:
    """A job that returned nothing: its process died, or the function raised (or its result
    could not be sent back)."""

    reason: str
    exitcode: int | None = None


def died(exitcode: int | None, cpu_limit_s: float = 0.0) -> WorkerFailure:
    if exitcode is not None and exitcode < 0:
        sig = signal.Signals(-exitcode)
        how = _HOW.get(sig, "killed")
        if sig == signal.SIGXCPU and cpu_limit_s:
            how += f" of {cpu_limit_s:g} s"
        return WorkerFailure(f"the worker process died ({sig.name}: {how})", exitcode)
    return WorkerFailure(f"the worker process exited with status {exitcode} without a result", exitcode)


def run_each(
    fn: Callable[..., R],
    jobs: Sequence[tuple],
    workers: int,
    *,
    cpu_limit_s: float = 0.0,
    context: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    poll_s: float = 1.0,
    stall_s: float = 0.0,
) -> Generator[tuple[int, int, R | WorkerFailure], None, None]:
    """Run ``fn(*job)`` for every job, each in a fresh process; yield ``(job index, worker slot,
    result or WorkerFailure)`` as each finishes. ``cpu_limit_s`` (> 0) caps each job's CPU time
    (all its threads). ``context`` is the multiprocessing start method (default: the platform's,
    fork on Linux; ``"forkserver"`` where this process runs threads a fork must not copy, e.g. a
    Ray worker). ``should_stop`` is asked before each job starts and at least every ``poll_s``
    while jobs run: when it says so, the jobs in flight are killed and :class:`Stopped` is raised.
    ``stall_s`` (> 0): a job whose process used no CPU in that many seconds is killed and yields a
    WorkerFailure (checked every ``poll_s``; Linux only). Closing the iterator early kills the jobs
    still running."""
    ctx = mp.get_context(context)
    todo = list(enumerate(jobs))[::-1]
    free = list(range(max(1, workers)))[::-1]
    running: dict[Connection, tuple[int, int, BaseProcess]] = {}
    progress: dict[Connection, tuple[int | None, float]] = {}  # its CPU ticks when last seen to change, and when
    watch = should_stop is not None or stall_s > 0
    try:
        while todo or running:
            if should_stop is not None and should_stop():
                raise Stopped(sorted([i for i, _ in todo] + [i for i, _, _ in running.values()]))
            while todo and free:
                i, args = todo.pop()
                slot = free.pop()
                recv, send = ctx.Pipe(duplex=False)
                p: BaseProcess = ctx.Process(  # type: ignore[attr-defined]  # typeshed's BaseContext lacks Process
                    target=_child,
                    args=(send, fn, args, cpu_limit_s, os.getpid() if ctx.get_start_method() == "fork" else None),
                    name=f"worker-{slot}-job-{i}",
                )
                p.start()
                send.close()  # the child holds the only writer: its death reads as EOF here
                running[recv] = (i, slot, p)
                progress[recv] = (None, time.monotonic())
            for ready in wait(list(running), timeout=poll_s if watch else None):
                conn = cast(Connection, ready)
                i, slot, done = running.pop(conn)
                progress.pop(conn, None)
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    kind, value = "died", None
                conn.close()
                done.join()
                free.append(slot)
                if kind == "died":
                    value = died(done.exitcode, cpu_limit_s)
                elif kind == "raised":
                    value = WorkerFailure(value, done.exitcode)
                yield i, slot, value
            if stall_s > 0:
                for conn, (i, slot, stuck) in _stalled(running, progress, stall_s):
                    running.pop(conn)
                    progress.pop(conn)
                    stuck.kill()
                    stuck.join()
                    conn.close()
                    free.append(slot)
                    how = f"the worker process died (SIGKILL: stalled, it used no CPU in {stall_s:g} s)"
                    yield i, slot, WorkerFailure(how, stuck.exitcode)
    finally:
        for conn, (_, _, left) in running.items():
            left.kill()
            left.join()
            conn.close()


def _stalled(
    running: dict[Connection, tuple[int, int, BaseProcess]],
    progress: dict[Connection, tuple[int | None, float]],
    stall_s: float,
) -> list[tuple[Connection, tuple[int, int, BaseProcess]]]:
    """The running jobs whose CPU time has not moved in ``stall_s`` seconds (``progress`` updated)."""
    now, out = time.monotonic(), []
    for conn, job in running.items():
        ticks = _cpu_ticks(job[2].pid)
        if ticks is None:  # not Linux, or the process is gone (its pipe's EOF reports it)
            continue
        seen, since = progress[conn]
        if ticks != seen:
            progress[conn] = (ticks, now)
        elif now - since >= stall_s:
            out.append((conn, job))
    return out


def _cpu_ticks(pid: int | None) -> int | None:
    """User plus system CPU time of process ``pid``, all its threads, in clock ticks (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15, counting from the pid


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux); if the parent is already
    gone, exit now. ``parent``: the expected parent (a forked child's is the caller; a fork server's
    child's is the fork server: its parent as first seen). The standard library has no prctl: ctypes
    calls libc's."""
    parent = os.getppid() if parent is None else parent
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the caller's should_stop still ends the jobs
        return
    if os.getppid() != parent:
        os._exit(1)


def _child(conn: Connection, fn: Callable, args: tuple, cpu_limit_s: float, parent: int | None) -> None:
    die_with_parent(parent)
    if cpu_limit_s > 0:
        # Soft limit only: SIGXCPU's default action ends the process; the hard limit is left as it is.
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft = math.ceil(used + cpu_limit_s)
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    try:
        msg: tuple[str, object] = ("ok", fn(*args))
    except Exception as e:
        msg = ("raised", f"{type(e).__name__}: {e}")
    try:
        conn.send(msg)
    except Exception as e:
        conn.send(("raised", f"the result could not be sent back: {type(e).__name__}: {e}"))
    conn.close()
