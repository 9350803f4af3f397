"""Node cache mount: mounted, read-write, writable, free space."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MountEntry:
    device: str
    mount_point: str
    fs_type: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


@dataclass(frozen=True)
class DiskUsage:
    total_bytes: int
    free_bytes: int  # available to unprivileged users (f_bavail), what the cache can use

    @property
    def free_percent(self) -> float:
        return 100.0 * self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def parse_mounts(proc_mounts: str) -> tuple[MountEntry, ...]:
    entries = []
    for line in proc_mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            entries.append(
                MountEntry(
                    device=fields[0],
                    mount_point=_unescape(fields[1]),
                    fs_type=fields[2],
                    options=tuple(fields[3].split(",")),
                )
            )
    return tuple(entries)


def mount_of(path: str, mounts: tuple[MountEntry, ...]) -> MountEntry | None:
    """The mount holding path: the longest mount point that is a prefix of it (the last one
    mounted wins when several share a mount point, as in /proc/mounts order)."""
    target = os.path.normpath(path)
    best = None
    for entry in mounts:
        point = os.path.normpath(entry.mount_point)
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(os.path.normpath(best.mount_point))):
            best = entry
    return best


def disk_usage_from_statvfs(stat: os.statvfs_result) -> DiskUsage:
    return DiskUsage(total_bytes=stat.f_blocks * stat.f_frsize, free_bytes=stat.f_bavail * stat.f_frsize)


def probe_writable(directory: str) -> str | None:
    """Creates, fsyncs and removes a probe file; returns the error text, or None when it worked."""
    probe = Path(directory) / f".preflight-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"preflight\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)
