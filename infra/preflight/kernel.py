"""Xid events from the kernel log (`journalctl -k -b` or `dmesg`: since boot)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.
_XID_LINE = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<code>\d+),?\s*(?P<detail>.*)")


@dataclass(frozen=True)
class XidEvent:
    code: int
    device: str  # as printed, e.g. "PCI:0000:3b:00"
    detail: str
    line: str


def parse_xid_events(kernel_log: str) -> tuple[XidEvent, ...]:
    events = []
    for line in kernel_log.splitlines():
        match = _XID_LINE.search(line)
        if match:
            events.append(
                XidEvent(
                    code=int(match["code"]),
                    device=match["device"],
                    detail=match["detail"].strip(),
                    line=line.strip(),
                )
            )
    return tuple(events)
