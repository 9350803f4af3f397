"""Which samples an epoch holds, and in what order a GOP-aware loader reads them.

A sample is (manifest row, anchor time). ``anchors="end"`` gives one per segment (its end minus
the action chunk: the demo's sparse set); ``anchors="every"`` gives one every ``anchor_every_s``
inside each segment ``[start, end)`` (a dense set: every 3rd frame at 30 Hz is 0.1 s). A sample's
frames, proprio and actions lie around its anchor and are clamped to its episode's span in this
rank's slice (the union of its segments, LeRobot's episode-edge padding), so a dense anchor near
an episode's start still reads recorded data.

GOP-aware order, a pure function of (seed, epoch, rank), never of the worker count:

1. Decode units: the samples of one episode whose earliest frame falls in one window of
   ``unit_s`` seconds, windows counted from the episode's first segment start (the episode's first
   keyframe when segments cover whole episodes, so windows hold whole GOPs).
2. Units are permuted, their samples laid end to end (each unit's in time order) and the sequence
   is cut into ``lanes`` equal parts. A unit crossing a cut is split between two lanes (at most
   ``lanes - 1`` per epoch), each part decoded on its own.
3. Inside a lane, a bounded mix: every sample gets the key (its unit's place in the lane +
   uniform[0, ``mix_units``)) and the lane is read in key order, so at most about ``mix_units`` + 1
   units are in flight at once: the user's knob between randomness and decoded frames held.
4. Batch ``j`` of the epoch is batch ``j // lanes`` of lane ``j % lanes``. DataLoader worker ``w``
   of ``W`` serves lanes ``l ≡ w (mod W)``: with ``W`` dividing ``lanes`` every unit is decoded by
   one worker only, and the DataLoader's round-robin hands batches over in exactly this order under
   any such ``W``. The position is one number (batches consumed), as before.

An epoch uses the first ``n_use`` samples of the rank (the same count on every rank, a multiple of
``lanes * batch_size``): up to ``lanes * batch_size - 1`` samples are left out per rank, always the
same ones, as ``DistributedSampler(drop_last=True)`` does with rows. A slice with fewer samples than
``lanes`` batches runs on fewer lanes (the largest divisor of ``lanes`` that fits).

No Dagster import.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplePlan:
    """This rank's samples, in (row, anchor) order."""

    row: np.ndarray  # local manifest row per sample (int64)
    anchor_ns: np.ndarray  # int64
    code: np.ndarray  # episode code per sample (index into the dataset's episode names)
    lo_ns: np.ndarray  # per episode code: the earliest segment start in this slice
    hi_ns: np.ndarray  # per episode code: the latest segment end in this slice

    @property
    def n(self) -> int:
        return len(self.row)


def samples_per_row(start_ns: np.ndarray, end_ns: np.ndarray, anchors: str, every_ns: int) -> np.ndarray:
    """How many samples each segment holds (vectorized over rows)."""
    if anchors == "end":
        return np.ones(len(start_ns), np.int64)
    if anchors != "every":
        raise ValueError(f"anchors {anchors!r}: expected 'end' or 'every'")
    length = np.asarray(end_ns, np.int64) - np.asarray(start_ns, np.int64)
    return np.maximum(1, -(-length // every_ns))


def plan_samples(
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    code: np.ndarray,
    n_codes: int,
    *,
    anchors: str,
    every_ns: int,
    end_offset_ns: int,
) -> SamplePlan:
    """The samples of a slice: ``anchors="end"``, one per row at ``end - end_offset_ns``;
    ``anchors="every"``, one every ``every_ns`` from each row's start, before its end."""
    start_ns, end_ns, code = (np.asarray(a, np.int64) for a in (start_ns, end_ns, code))
    lo = np.full(n_codes, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_codes, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(lo, code, start_ns)
    np.maximum.at(hi, code, end_ns)
    counts = samples_per_row(start_ns, end_ns, anchors, every_ns)
    row = np.repeat(np.arange(len(start_ns), dtype=np.int64), counts)
    if anchors == "end":
        anchor = end_ns - end_offset_ns
    else:
        first = np.repeat(np.cumsum(counts) - counts, counts)
        anchor = start_ns[row] + (np.arange(len(row), dtype=np.int64) - first) * every_ns
    return SamplePlan(row, anchor, code[row], lo, hi)


def usable_samples(counts_per_rank: np.ndarray, lanes: int, batch_size: int) -> tuple[int, int]:
    """(samples each rank uses per epoch, lanes): the same count on every rank, whole batches in
    every lane. A slice too small for ``lanes`` lanes gets the largest divisor of ``lanes`` that fits
    (worker counts dividing that still work)."""
    fewest = int(np.min(counts_per_rank))
    for n_lanes in sorted((d for d in range(1, lanes + 1) if lanes % d == 0), reverse=True):
        step = n_lanes * batch_size
        if fewest >= step:
            return fewest // step * step, n_lanes
    raise ValueError(f"a rank has {fewest} samples: too few for a batch of {batch_size}")


@dataclass(frozen=True)
class LaneOrder:
    """One lane's samples of an epoch, in the order they are emitted."""

    samples: np.ndarray  # sample indices (into the SamplePlan)
    unit: np.ndarray  # per emitted sample: its decode unit (a lane-local id; split units differ per lane)


def unit_of(plan: SamplePlan, first_frame_offset_ns: int, unit_ns: int) -> np.ndarray:
    """Per sample, a decode unit id: (episode, window of ``unit_ns`` holding its earliest frame)."""
    earliest = np.clip(plan.anchor_ns + first_frame_offset_ns, plan.lo_ns[plan.code], plan.hi_ns[plan.code])
    window = (earliest - plan.lo_ns[plan.code]) // unit_ns
    return np.unique(plan.code * (1 << 31) + window, return_inverse=True)[1].astype(np.int64)


def lane_orders(
    plan: SamplePlan, units: np.ndarray, n_use: int, *, lanes: int, mix_units: float, seed: int, epoch: int, rank: int
) -> list[LaneOrder]:
    """The lanes of an epoch (see the module doc): each unit's samples stay together up to the
    bounded mix, units come in a random order from (seed, epoch, rank)."""
    rng = np.random.default_rng([seed, epoch, rank, 0x60B])
    units = units[:n_use]
    n_units = int(units.max()) + 1 if n_use else 0
    place = np.empty(n_units, np.int64)
    place[rng.permutation(n_units)] = np.arange(n_units)
    # Units end to end in permuted order, each unit's samples in (row, anchor) order.
    sequence = np.lexsort((np.arange(n_use), place[units]))
    per_lane = n_use // lanes
    out = []
    for lane in range(lanes):
        part = sequence[lane * per_lane : (lane + 1) * per_lane]
        unit_place = place[units[part]]
        # Dense rank of the unit's place inside this lane: 0, 1, 2, ... in the order units arrive.
        local = np.concatenate([[0], np.cumsum(np.diff(unit_place) != 0)]) if len(part) else unit_place
        if mix_units > 1:
            keys = local + rng.random(len(part)) * mix_units
            emit = np.argsort(keys, kind="stable")
        else:
            emit = np.arange(len(part))
        out.append(LaneOrder(part[emit], local[emit]))
    return out


__all__ = ["LaneOrder", "SamplePlan", "lane_orders", "plan_samples", "samples_per_row", "unit_of", "usable_samples"]
