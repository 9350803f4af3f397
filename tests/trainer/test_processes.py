"""The bounded launcher the trainer tests use: a hang fails in its time with each thread's stack, and
a child left holding the output does not keep the test waiting."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from .processes import run_bounded

HANG = "import time\ndef stuck_here():\n    time.sleep(600)\nstuck_here()\n"
# the child dies at once; the grandchild it forked keeps its stdout and stderr open for 10 minutes
ORPHAN = "import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(600)\nprint(pid)\nsys.exit(3)\n"


def test_a_hang_fails_in_its_time_naming_where_it_hung():
    with pytest.raises(AssertionError, match=r"ran past 2 s(.|\n)*stuck_here"):
        run_bounded([sys.executable, "-c", HANG], dict(os.environ), 2)


def test_a_child_left_holding_the_output_does_not_hold_the_test():
    done = run_bounded([sys.executable, "-c", ORPHAN], dict(os.environ), 60)
    assert done.returncode == 3
    # subprocess.run(capture_output=True) would have waited for the grandchild; here it was killed
    assert not _alive(int(done.stdout))


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (this container's init may never reap it)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.1)
    return True
