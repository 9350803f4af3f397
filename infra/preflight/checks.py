"""The checks: pure functions of parsed readings and thresholds, one CheckResult each.

Only counters that reset at boot (volatile ECC, pending remaps/retirements, Xids since boot)
can fail a node: lifetime (aggregate) counters on some GPUs cannot be cleared, so one old
fault would condemn a healthy node forever.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .commands import CommandOutcome
from .config import CacheConfig, GpuConfig, KernelConfig, PreflightConfig, RuntimeConfig
from .disk import DiskUsage, MountEntry
from .gpu import GpuInventory, GpuState
from .kernel import XidEvent

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
GIB = 1024**3


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    severity: str  # ok | warn | fail | skip
    reason: str


def passed(name: str, reason: str) -> CheckResult:
    return CheckResult(name, True, OK, reason)


def warned(name: str, reason: str) -> CheckResult:
    return CheckResult(name, True, WARN, reason)


def failed(name: str, reason: str) -> CheckResult:
    return CheckResult(name, False, FAIL, reason)


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name, True, SKIP, reason)


@dataclass(frozen=True)
class CacheReadings:
    path: str
    exists: bool
    is_mount: bool
    mount: MountEntry | None  # the /proc/mounts entry holding path
    write_error: str | None
    usage: DiskUsage | None


@dataclass(frozen=True)
class NodeReadings:
    gpu: GpuInventory | None = None
    gpu_error: str | None = None  # nvidia-smi missing, failed or unparsable
    xids: tuple[XidEvent, ...] = ()
    kernel_log_error: str | None = None
    cache: CacheReadings | None = None
    runtime: CommandOutcome | None = None


# --- GPUs -----------------------------------------------------------------------------


def _label(gpu: GpuState) -> str:
    return f"GPU {gpu.index} ({gpu.pci_bus_id})"


def check_gpu_count(inventory: GpuInventory | None, error: str | None, config: GpuConfig) -> CheckResult:
    name = "gpu_count"
    if config.expected_count == 0:
        return skipped(name, "no GPUs expected")
    if error is not None:
        return failed(name, f"{error} (expected {config.expected_count} GPUs)")
    if inventory is None:
        return failed(name, f"no GPU inventory (expected {config.expected_count} GPUs)")
    found = len(inventory.gpus)
    if found != config.expected_count:
        return failed(name, f"expected {config.expected_count} GPUs, found {found}")
    return passed(name, f"{found} GPUs")


_GpuCheck = Callable[[GpuInventory | None, GpuConfig], CheckResult]


def _gpu_check(name: str) -> Callable[[Callable[[str, GpuInventory, GpuConfig], CheckResult]], _GpuCheck]:
    """``check(name, inventory, config)`` as the check ``name``, called ``(inventory, config)``: skipped
    where no GPUs are expected or there is no inventory (gpu_count says why), else run on the inventory."""

    def wrap(check: Callable[[str, GpuInventory, GpuConfig], CheckResult]) -> _GpuCheck:
        @functools.wraps(check)
        def run(inventory: GpuInventory | None, config: GpuConfig) -> CheckResult:
            if config.expected_count == 0:
                return skipped(name, "no GPUs expected")
            if inventory is None:
                return skipped(name, "no GPU inventory (see gpu_count)")
            return check(name, inventory, config)

        return run

    return wrap


@_gpu_check("gpu_model")
def check_gpu_model(name: str, inventory: GpuInventory, config: GpuConfig) -> CheckResult:
    if not config.expected_model:
        return skipped(name, "no model expected")
    wrong = [g for g in inventory.gpus if g.product_name != config.expected_model]
    if wrong:
        models = ", ".join(f"{_label(g)} is {g.product_name!r}" for g in wrong)
        return failed(name, f"{models}, expected {config.expected_model!r}")
    return passed(name, config.expected_model)


@_gpu_check("driver_version")
def check_driver_version(name: str, inventory: GpuInventory, config: GpuConfig) -> CheckResult:
    version = inventory.driver_version
    if config.allowed_driver_versions and version not in config.allowed_driver_versions:
        return failed(name, f"driver {version or 'unknown'} not in {', '.join(config.allowed_driver_versions)}")
    return passed(name, f"driver {version}, CUDA {inventory.cuda_version or 'unknown'}")


@_gpu_check("ecc_volatile")
def check_volatile_ecc(name: str, inventory: GpuInventory, config: GpuConfig) -> CheckResult:
    bad = [g for g in inventory.gpus if g.volatile_uncorrectable_ecc > config.max_volatile_uncorrectable_ecc]
    if bad:
        return failed(
            name,
            ", ".join(f"{_label(g)}: {g.volatile_uncorrectable_ecc} uncorrectable ECC errors since boot" for g in bad),
        )
    lifetime = sum(g.aggregate_uncorrectable_ecc for g in inventory.gpus)
    note = f" (lifetime uncorrectable: {lifetime}, not used)" if lifetime else ""
    limit = config.warn_volatile_correctable_ecc
    noisy = [g for g in inventory.gpus if limit is not None and g.volatile_correctable_ecc > limit]
    if noisy:
        return warned(
            name,
            ", ".join(f"{_label(g)}: {g.volatile_correctable_ecc} correctable ECC errors since boot" for g in noisy),
        )
    return passed(name, f"no uncorrectable ECC errors since boot{note}")


@_gpu_check("row_remapping")
def check_row_remapping(name: str, inventory: GpuInventory, config: GpuConfig) -> CheckResult:
    problems = []
    for g in inventory.gpus:
        if g.remap_pending:
            problems.append(f"{_label(g)}: row remap pending (needs GPU reset)")
        if g.remap_failure:
            problems.append(f"{_label(g)}: row remapping failed")
    return failed(name, ", ".join(problems)) if problems else passed(name, "no pending or failed row remaps")


@_gpu_check("page_retirement")
def check_page_retirement(name: str, inventory: GpuInventory, config: GpuConfig) -> CheckResult:
    pending = [g for g in inventory.gpus if g.retirement_pending]
    if pending:
        return failed(name, ", ".join(f"{_label(g)}: page retirement pending (needs GPU reset)" for g in pending))
    return passed(name, "no pending page retirements")


@_gpu_check("clocks")
def check_clocks(name: str, inventory: GpuInventory, config: GpuConfig) -> CheckResult:
    floor = config.min_max_sm_clock_mhz
    if floor is not None:
        slow = [g for g in inventory.gpus if g.max_sm_clock_mhz is None or g.max_sm_clock_mhz < floor]
        if slow:
            return failed(
                name, ", ".join(f"{_label(g)}: max SM clock {g.max_sm_clock_mhz} MHz < {floor} MHz" for g in slow)
            )
    throttled = [g for g in inventory.gpus if g.hw_slowdown_active]
    if throttled:
        return warned(name, ", ".join(f"{_label(g)}: hardware slowdown active" for g in throttled))
    return passed(name, "clocks as expected")


# --- kernel log -------------------------------------------------------------------------


def check_xids(events: tuple[XidEvent, ...], log_error: str | None, config: KernelConfig) -> CheckResult:
    name = "xid"
    if log_error is not None:
        # unreadable log: warn, so a logging misconfiguration cannot drain the whole cluster
        return warned(name, f"kernel log unreadable: {log_error}")
    fatal = Counter((e.code, e.device) for e in events if e.code in config.fatal_xids)
    other = Counter((e.code, e.device) for e in events if e.code not in config.fatal_xids)
    if fatal:
        return failed(name, ", ".join(_describe_xid(events, key, n) for key, n in fatal.items()))
    if other:
        return warned(name, ", ".join(_describe_xid(events, key, n) for key, n in other.items()) + " (non-fatal)")
    return passed(name, "no Xid errors since boot")


def _describe_xid(events: tuple[XidEvent, ...], key: tuple[int, str], count: int) -> str:
    code, device = key
    detail = next(e.detail for e in events if (e.code, e.device) == key)
    text = f"Xid {code} on {device}"
    if detail:
        text += f" ({_short_xid_detail(detail)})"
    return text + (f" x{count}" if count > 1 else "")


def _short_xid_detail(detail: str) -> str:
    # "pid=1234, name=python, GPU has fallen off the bus." -> the words; drain reasons stay short
    words = re.sub(r"^(\s*\w+=[^,]*,)*\s*", "", detail).rstrip(".")
    return words[:60] + ("..." if len(words) > 60 else "")


# --- node cache ---------------------------------------------------------------------------


def check_cache_mount(cache: CacheReadings | None, config: CacheConfig) -> CheckResult:
    name = "cache_mount"
    if config.path is None or cache is None:
        return skipped(name, "no node cache configured")
    if not cache.exists:
        return failed(name, f"cache {cache.path} missing")
    # The cache may be the mount point or a folder on it; what must not happen is the cache landing
    # on the root disk because the NVMe did not mount.
    on_own_mount = cache.is_mount or (cache.mount is not None and cache.mount.mount_point != "/")
    if config.require_mount and not on_own_mount:
        return failed(name, f"cache {cache.path} is not on a mounted volume (it would fill the root disk)")
    if cache.mount is not None and cache.mount.read_only:
        return failed(name, f"cache {cache.path} mounted read-only ({cache.mount.device})")
    where = f"{cache.mount.device} {cache.mount.fs_type}" if cache.mount else "mount unknown"
    return passed(name, f"cache {cache.path} mounted read-write ({where})")


def check_cache_writable(cache: CacheReadings | None, config: CacheConfig) -> CheckResult:
    name = "cache_writable"
    if config.path is None or cache is None:
        return skipped(name, "no node cache configured")
    if not cache.exists:
        return skipped(name, "cache missing (see cache_mount)")
    if cache.write_error is not None:
        return failed(name, f"cache {cache.path} not writable: {cache.write_error}")
    return passed(name, f"cache {cache.path} writable")


def check_cache_free_space(usage: DiskUsage | None, path: str | None, config: CacheConfig) -> CheckResult:
    name = "cache_free_space"
    if config.path is None or path is None:
        return skipped(name, "no node cache configured")
    if usage is None:
        return skipped(name, "no disk usage (see cache_mount)")
    free_gib = usage.free_bytes / GIB
    if free_gib < config.min_free_gib:
        return failed(name, f"cache {path} has {free_gib:.1f} GiB free (< {config.min_free_gib:g} GiB)")
    if usage.free_percent < config.min_free_percent:
        return failed(name, f"cache {path} is {usage.free_percent:.1f}% free (< {config.min_free_percent:g}%)")
    return passed(name, f"cache {path}: {free_gib:.1f} GiB ({usage.free_percent:.1f}%) free")


# --- container runtime --------------------------------------------------------------------


def check_container_runtime(outcome: CommandOutcome | None, config: RuntimeConfig) -> CheckResult:
    name = "container_runtime"
    if not config.command or outcome is None:
        return skipped(name, "no container runtime configured")
    shown = " ".join(config.command[:2])
    if outcome.not_found:
        return failed(name, f"container runtime `{shown}` not found")
    if outcome.timed_out:
        return failed(name, f"container runtime `{shown}` timed out after {config.timeout_s:g}s")
    if outcome.returncode != 0:
        tail = _last_line(outcome.stderr) or _last_line(outcome.stdout)
        return failed(name, f"container runtime `{shown}` exited {outcome.returncode}" + (f": {tail}" if tail else ""))
    return passed(name, f"container runtime `{shown}` responds")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:120] if lines else ""


# --- all of them ----------------------------------------------------------------------------


def run_checks(readings: NodeReadings, config: PreflightConfig) -> list[CheckResult]:
    gpu, inventory = config.gpu, readings.gpu
    cache_path = readings.cache.path if readings.cache else None
    return [
        check_gpu_count(inventory, readings.gpu_error, gpu),
        check_gpu_model(inventory, gpu),
        check_driver_version(inventory, gpu),
        check_volatile_ecc(inventory, gpu),
        check_row_remapping(inventory, gpu),
        check_page_retirement(inventory, gpu),
        check_clocks(inventory, gpu),
        check_xids(readings.xids, readings.kernel_log_error, config.kernel),
        check_cache_mount(readings.cache, config.cache),
        check_cache_writable(readings.cache, config.cache),
        check_cache_free_space(readings.cache.usage if readings.cache else None, cache_path, config.cache),
        check_container_runtime(readings.runtime, config.container_runtime),
    ]
