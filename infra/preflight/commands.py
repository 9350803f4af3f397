"""Running the probes' commands: argv only (never a shell), with a timeout that kills the whole tree."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandOutcome:
    command: tuple[str, ...]
    returncode: int | None  # None: it did not start, or timed out
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    not_found: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_command(command: tuple[str, ...], timeout_s: float) -> CommandOutcome:
    try:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, so a timeout can kill its children too
        )
    except FileNotFoundError:
        return CommandOutcome(command, None, not_found=True)
    except OSError as exc:  # e.g. not executable
        return CommandOutcome(command, None, stderr=exc.strerror or str(exc), not_found=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # a hung child (docker info against a dead daemon) may hold our pipes through grandchildren
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
        return CommandOutcome(command, None, timed_out=True)
    return CommandOutcome(command, process.returncode, stdout, stderr)
