"""Measurements the gates and the quality score judge, kept below both so neither imports the other."""

from __future__ import annotations

import math

import numpy as np


def drop_fraction(ts_ns: np.ndarray) -> float:
    """Share of a regular stream's frames that are missing, from gaps in its timestamps."""
    if len(ts_ns) < 3:
        return 0.0
    d: np.ndarray = np.diff(ts_ns.astype(np.int64))  # numpy's stubs type an int64 diff as timedelta64
    period = float(np.median(d))
    if period <= 0:
        return 0.0
    missing = np.rint(d[d > 1.5 * period] / period).astype(np.int64) - 1
    dropped = int(missing.sum())
    return dropped / (len(ts_ns) + dropped)


def non_finite(a: np.ndarray) -> tuple[int, int, int, int]:
    """(NaN count, +inf count, -inf count, first row holding any of them or -1) of a 2-D block."""
    nan, pos, neg = np.isnan(a), np.isposinf(a), np.isneginf(a)
    bad = np.flatnonzero((nan | pos | neg).any(axis=1))
    return int(nan.sum()), int(pos.sum()), int(neg.sum()), int(bad[0]) if len(bad) else -1


def flat_frames(lumas: list[np.ndarray], flat_std: float) -> list[int]:
    """Indices of sampled frames that carry no picture (dark or frozen to one level)."""
    return [i for i, y in enumerate(lumas) if float(y.std()) < flat_std]


def size_ratio_ok(bytes_out: int, bytes_in: int, lo: float, hi: float) -> tuple[bool, float]:
    r = bytes_out / bytes_in if bytes_in else math.inf
    return lo <= r <= hi, r
