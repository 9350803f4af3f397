"""Bin-pack landed files into byte-balanced ingest batches.

A batch is released when it lies within ``target * (1 ± tol)`` bytes; files that do not
make up a whole batch stay pending for the next tick, so a trickle of arrivals does not
make a stream of tiny batches. ``flush`` (the oldest pending file has waited long enough)
releases them anyway. A file larger than the band's floor is a batch of its own.

Better than first-fit decreasing for balance, which is what keeps workers busy: FFD fills
bins one after another, so with files of a quarter of the target its batches differ by up
to a file's size. Here the pending bytes fix the number of batches k = floor(total /
target); files go largest first to the least-loaded batch (LPT), then moves and swaps
between the fullest and the emptiest batch shrink the spread while they can (a
Karmarkar-Karp-style local search). No library packs to a band with balance as the goal.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from ..catalog.registry import LandedFile

# LandedFile's own order (path, bytes, mtime), as a key: the dataclass's generated __lt__ costs ~5x more
_FILE_ORDER = attrgetter("path", "bytes", "mtime_ns")


@dataclass
class Packing:
    batches: list[list[LandedFile]] = field(default_factory=list)
    pending: list[LandedFile] = field(default_factory=list)


def pack(files: Sequence[LandedFile], target_bytes: int, *, tolerance: float = 0.1, flush: bool = False) -> Packing:
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    hi = target_bytes * (1 + tolerance)
    lo = target_bytes * (1 - tolerance)
    out = Packing()
    # Deterministic: size descending, then key; a pending file keeps its place tick after tick.
    ordered = sorted(files, key=lambda f: (-f.bytes, f.path))
    small = []
    for f in ordered:
        (out.batches.append([f]) if f.bytes >= lo else small.append(f))
    k = int(sum(f.bytes for f in small) // target_bytes)
    bins, rest = _balanced(small, k, hi)
    for b in bins:
        if lo <= sum(f.bytes for f in b) <= hi:
            out.batches.append(sorted(b, key=_FILE_ORDER))
        else:
            rest.extend(b)
    if flush and rest:
        out.batches.extend(
            sorted(b, key=_FILE_ORDER) for b in _first_fit(sorted(rest, key=lambda f: (-f.bytes, f.path)), hi)
        )
        rest = []
    out.pending = sorted(rest, key=_FILE_ORDER)
    # Oldest key first so partition keys follow arrival order as far as possible.
    out.batches.sort(key=lambda b: b[0].path)
    return out


def _balanced(files: list[LandedFile], k: int, cap: float) -> tuple[list[list[LandedFile]], list[LandedFile]]:
    """k bins of at most ``cap`` bytes, as even as possible; files that fit nowhere are returned."""
    if k <= 0:
        return [], list(files)
    bins: list[list[LandedFile]] = [[] for _ in range(k)]
    heap = [(0, i) for i in range(k)]
    rest = []
    for f in files:  # largest first, to the least-loaded bin; if that one cannot take it, none can
        load, i = heap[0]
        if load + f.bytes <= cap:
            bins[i].append(f)
            heapq.heapreplace(heap, (load + f.bytes, i))
        else:
            rest.append(f)
    loads = [0] * k
    for load, i in heap:
        loads[i] = load
    if k <= 32:
        _exchange_all_pairs(bins, loads)
    else:
        _exchange_extremes(bins, loads)
    return bins, rest


def _apply(bins: list[list[LandedFile]], loads: list[int], a: int, b: int, x: LandedFile, y: LandedFile | None) -> None:
    bins[a].remove(x)
    bins[b].append(x)
    moved = x.bytes
    if y is not None:
        bins[b].remove(y)
        bins[a].append(y)
        moved -= y.bytes
    loads[a] -= moved
    loads[b] += moved


def _exchange_all_pairs(bins: list[list[LandedFile]], loads: list[int]) -> None:
    """Few batches (big files): every pair, fullest against emptiest first, which escapes the spots
    where the extreme pair alone has no exchange left. k <= 32, so each round is cheap."""
    k = len(bins)
    for _ in range(20 * k):
        order = sorted(range(k), key=lambda i: (-loads[i], i))
        for n, a in enumerate(order):
            for b in reversed(order[n + 1 :]):
                best = _best_exchange(bins[a], bins[b], loads[a] - loads[b])
                if best is not None:
                    _apply(bins, loads, a, b, *best)
                    break
            else:
                continue
            break
        else:
            return


# Exchanges between the fullest and the emptiest batch, at most this many per packing: each one
# costs O(files per batch + log k), so a tick of 10^5 files packs in O(n log n) whatever the mix.
MAX_EXCHANGES = 4096


def _exchange_extremes(bins: list[list[LandedFile]], loads: list[int]) -> None:
    """Many batches: the fullest against the emptiest, found through two heaps (lazy entries
    carry the load they were pushed with), until no exchange helps or the budget is spent."""
    k = len(bins)
    fullest = [(-load, i) for i, load in enumerate(loads)]
    emptiest = [(load, i) for i, load in enumerate(loads)]
    heapq.heapify(fullest)
    heapq.heapify(emptiest)
    for _ in range(min(20 * k, MAX_EXCHANGES)):
        while -fullest[0][0] != loads[fullest[0][1]]:
            heapq.heappop(fullest)
        while emptiest[0][0] != loads[emptiest[0][1]]:
            heapq.heappop(emptiest)
        a, b = fullest[0][1], emptiest[0][1]
        best = _best_exchange(bins[a], bins[b], loads[a] - loads[b])
        if best is None:
            return
        _apply(bins, loads, a, b, *best)
        for i in (a, b):
            heapq.heappush(fullest, (-loads[i], i))
            heapq.heappush(emptiest, (loads[i], i))


def _best_exchange(
    full: list[LandedFile], empty: list[LandedFile], gap: int
) -> tuple[LandedFile, LandedFile | None] | None:
    """The move (x, None) or swap (x, y) between two bins that most reduces their difference
    ``gap``: shifting d bytes leaves |gap - 2d|, so the ideal d is gap / 2. None if nothing helps."""
    if gap <= 0:
        return None
    ys = sorted(empty, key=lambda f: f.bytes)
    sizes = [y.bytes for y in ys]
    best: tuple[LandedFile, LandedFile | None] | None = None
    best_gap = gap
    for x in full:
        if abs(gap - 2 * x.bytes) < best_gap:
            best, best_gap = (x, None), abs(gap - 2 * x.bytes)
        j = bisect.bisect_left(sizes, x.bytes - gap / 2)  # y nearest to x - gap/2
        for y in ys[max(0, j - 1) : j + 1]:
            d = x.bytes - y.bytes
            if d > 0 and abs(gap - 2 * d) < best_gap:
                best, best_gap = (x, y), abs(gap - 2 * d)
    return best


def _first_fit(files: list[LandedFile], cap: float) -> list[list[LandedFile]]:
    bins: list[list[LandedFile]] = []
    loads: list[int] = []
    for f in files:
        for i, load in enumerate(loads):
            if load + f.bytes <= cap:
                bins[i].append(f)
                loads[i] += f.bytes
                break
        else:
            bins.append([f])
            loads.append(f.bytes)
    return bins
