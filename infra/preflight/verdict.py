"""The verdict: drain the node when any check failed, print a summary, pick the exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict

from .checks import FAIL, CheckResult
from .config import DrainConfig

EXIT_HEALTHY = 0
EXIT_DRAINED = 1  # a failing Prolog makes Slurm requeue the job (and drain the node itself)
EXIT_USAGE = 2


def drain_reason(results: Sequence[CheckResult], config: DrainConfig) -> str:
    reasons = "; ".join(r.reason for r in results if r.severity == FAIL)
    text = f"{config.reason_prefix}{reasons}"
    # keep reasons short: sinfo -R and squeue columns are narrow, and the first failure matters most
    if len(text) > config.max_reason_chars:
        text = text[: config.max_reason_chars - 3].rstrip() + "..."
    return text


def drain_command(node: str, reason: str, config: DrainConfig) -> list[str]:
    # argv, never a shell: the reason carries spaces, quotes and parentheses as they are
    return [config.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def drain_node(command: list[str], timeout_s: float = 30.0) -> str | None:
    """Runs scontrol; returns an error text, or None when it worked."""
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return f"{command[0]} not found"
    except subprocess.TimeoutExpired:
        return f"{command[0]} timed out"
    except OSError as exc:
        return f"{command[0]}: {exc.strerror or exc}"
    if done.returncode != 0:
        return f"{command[0]} exited {done.returncode}: {done.stderr.strip()[:200]}"
    return None


def summary_lines(results: Sequence[CheckResult]) -> list[str]:
    return [f"{r.severity.upper():4}  {r.name:18} {r.reason}" for r in results]


def conclude(
    results: Sequence[CheckResult],
    node: str,
    config: DrainConfig,
    *,
    dry_run: bool = False,
    as_json: bool = False,
) -> int:
    failing = [r for r in results if r.severity == FAIL]
    command = drain_command(node, drain_reason(results, config), config) if failing else None
    drain_error = None
    if command and not dry_run:
        drain_error = drain_node(command)
    if as_json:
        print(
            json.dumps(
                {
                    "node": node,
                    "healthy": not failing,
                    "results": [asdict(r) for r in results],
                    "drain_command": command,
                    "drained": bool(command) and not dry_run and drain_error is None,
                    "drain_error": drain_error,
                }
            )
        )
    else:
        for line in summary_lines(results):
            print(line)
        if not failing:
            print(f"preflight: {node} healthy")
        elif dry_run:
            print(f"preflight: {node} unhealthy; would run: {command}")
        else:
            assert command is not None, "a failing check always has a drain command"
            print(f"preflight: {node} unhealthy; drained: {command[-1]}")
    if drain_error:
        print(f"preflight: could not drain {node}: {drain_error}", file=sys.stderr)
    return EXIT_DRAINED if failing else EXIT_HEALTHY
