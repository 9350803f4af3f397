"""Reading the real node: runs nvidia-smi, the kernel log command, the runtime probe, and
looks at the cache mount. Everything here feeds the pure checks in checks.py."""

from __future__ import annotations

import os
from pathlib import Path

from .checks import CacheReadings, NodeReadings
from .commands import CommandOutcome, run_command
from .config import CacheConfig, GpuConfig, KernelConfig, PreflightConfig
from .disk import (
    DiskUsage,
    disk_usage_from_statvfs,
    mount_of,
    parse_mounts,
    probe_writable,
)
from .gpu import GpuInventory, parse_nvidia_smi_xml
from .kernel import XidEvent, parse_xid_events

PROC_MOUNTS = "/proc/mounts"


def read_node(config: PreflightConfig) -> NodeReadings:
    inventory, gpu_error = read_gpus(config.gpu)
    xids, kernel_error = read_xids(config.kernel)
    runtime = (
        run_command(config.container_runtime.command, config.container_runtime.timeout_s)
        if config.container_runtime.command
        else None
    )
    return NodeReadings(
        gpu=inventory,
        gpu_error=gpu_error,
        xids=xids,
        kernel_log_error=kernel_error,
        cache=read_cache(config.cache),
        runtime=runtime,
    )


def read_gpus(config: GpuConfig) -> tuple[GpuInventory | None, str | None]:
    if config.expected_count == 0:
        return None, None
    outcome = run_command(config.nvidia_smi, config.timeout_s)
    if not outcome.ok:
        return None, _describe_failure(outcome)
    try:
        return parse_nvidia_smi_xml(outcome.stdout), None
    except ValueError as exc:
        return None, str(exc)


def read_xids(config: KernelConfig) -> tuple[tuple[XidEvent, ...], str | None]:
    """The first log command that works wins (journalctl -k -b, else dmesg)."""
    errors = []
    for command in config.log_commands:
        outcome = run_command(command, config.timeout_s)
        if outcome.ok:
            return parse_xid_events(outcome.stdout), None
        errors.append(_describe_failure(outcome))
    return (), "; ".join(errors)


def read_cache(config: CacheConfig) -> CacheReadings | None:
    if config.path is None:
        return None
    path = config.path
    exists = os.path.isdir(path)
    try:
        mounts = parse_mounts(Path(PROC_MOUNTS).read_text())
    except OSError:
        mounts = ()
    return CacheReadings(
        path=path,
        exists=exists,
        is_mount=os.path.ismount(path),
        mount=mount_of(path, mounts) if exists else None,
        write_error=probe_writable(path) if exists else None,
        usage=_disk_usage(path) if exists else None,
    )


def _disk_usage(path: str) -> DiskUsage | None:
    try:
        return disk_usage_from_statvfs(os.statvfs(path))
    except OSError:
        return None


def _describe_failure(outcome: CommandOutcome) -> str:
    program = outcome.command[0] if outcome.command else "command"
    if outcome.not_found:
        return f"{program} not found"
    if outcome.timed_out:
        return f"{program} timed out"
    tail = [line.strip() for line in outcome.stderr.splitlines() if line.strip()]
    return f"{program} exited {outcome.returncode}" + (f": {tail[-1][:120]}" if tail else "")
