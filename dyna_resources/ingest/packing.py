"""Bin-pack landed files into byte-balanced ingest batches.

First-fit decreasing with a tolerance band: a bin holds at most ``target * (1 + tol)``
bytes and is released as a batch once it reaches ``target * (1 - tol)``. Files that do
not fill a bin stay pending for the next tick, so a trickle of arrivals does not make
a stream of tiny batches; ``flush`` (the oldest pending file has waited long enough)
releases them anyway. A file larger than the band is a batch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..catalog.registry import LandedFile


@dataclass
class Packing:
    batches: list[list[LandedFile]] = field(default_factory=list)
    pending: list[LandedFile] = field(default_factory=list)


def pack(files: Sequence[LandedFile], target_bytes: int, *, tolerance: float = 0.1, flush: bool = False) -> Packing:
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    hi = target_bytes * (1 + tolerance)
    lo = target_bytes * (1 - tolerance)
    bins: list[list[LandedFile]] = []
    loads: list[int] = []
    out = Packing()
    # Deterministic: size descending, then key; a pending file keeps its place tick after tick.
    for f in sorted(files, key=lambda f: (-f.bytes, f.path)):
        if f.bytes >= lo:
            out.batches.append([f])
            continue
        for i, load in enumerate(loads):
            if load + f.bytes <= hi:
                bins[i].append(f)
                loads[i] += f.bytes
                break
        else:
            bins.append([f])
            loads.append(f.bytes)
    for b, load in zip(bins, loads):
        if load >= lo or flush:
            out.batches.append(sorted(b))
        else:
            out.pending.extend(b)
    # Emit full batches oldest-key first so partition keys follow arrival order as far as possible.
    out.batches.sort(key=lambda b: b[0].path)
    return out
