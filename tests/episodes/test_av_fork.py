"""A forked worker converts frames after its parent did (episodes/av_fork.py).

Without the after-fork hook the child's first conversion waits forever for libswscale slice
threads that only the parent has; the child's alarm turns that into a failed job, not a hung test.
"""

from __future__ import annotations

import signal

import av
import numpy as np

from dyna_resources.episodes import codec  # noqa: F401 (imported for the after-fork hook it installs)
from dyna_resources.ingest.workers import WorkerFailure, run_each


def _frame() -> av.VideoFrame:
    rgb = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
    return av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p", threads=1)


def _convert_in_child(threads: int) -> tuple[int, int]:
    signal.alarm(20)  # a hang ends the child (SIGALRM), which run_each reports as a WorkerFailure
    out = _frame().reformat(width=224, height=224, format="yuv420p", interpolation="AREA", threads=threads)
    rgb = out.to_ndarray(format="rgb24")
    signal.alarm(0)
    return rgb.shape[0], rgb.shape[1]


def test_a_forked_worker_converts_frames_after_its_parent_converted_with_slice_threads():
    frame = _frame()
    assert frame.to_ndarray(format="rgb24").shape == (480, 640, 3)  # PyAV's default: a slice thread per core
    results = {i: out for i, _slot, out in run_each(_convert_in_child, [(1,), (0,)], workers=2, context="fork")}
    assert not any(isinstance(out, WorkerFailure) for out in results.values()), results
    assert results == {0: (224, 224), 1: (224, 224)}
    # the parent's own conversions are untouched by its children's
    assert frame.reformat(width=224, height=224, format="yuv420p", interpolation="AREA").width == 224
