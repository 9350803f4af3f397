"""A trainer launched by a test as production launches it (its own process), bounded and diagnosable.

``subprocess.run(capture_output=True, timeout=...)`` can block past its timeout: after the kill it
reads the pipes to their end, and any process the trainer left behind that still holds them (a child
after the trainer's SIGKILL) keeps them open for ever. A clean-clone run once hung 12 minutes so. Here
the output goes to files, the trainer runs in its own session, and on timeout every process of that
session gets SIGABRT (``PYTHONFAULTHANDLER`` prints each thread's Python stack), then SIGKILL, and the
test fails with what they printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def _signal_session(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def run_bounded(
    cmd: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end; on timeout raise AssertionError with its stack dump and output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env={**env, "PYTHONFAULTHANDLER": "1"},
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_session(proc.pid, signal.SIGABRT)
            time.sleep(5)
        # whatever it left behind in its session goes with it, so that no later test meets it
        _signal_session(proc.pid, signal.SIGKILL)
        if timed_out:
            code = proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        raise AssertionError(f"{' '.join(cmd)} ran past {timeout_s:g} s; its stderr:\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(list(cmd), code, stdout, stderr)
