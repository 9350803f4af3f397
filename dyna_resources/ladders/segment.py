"""Segment an episode into the steps of its task's standard procedure (its "step ladder").

The heuristic segmenter reads four signals (gripper command, opening and effort, end-effector
position), turns them into events (gripper closes/opens, the arm starts/stops moving after a
pause) and walks the procedure: each step ends at the first event of its kind after it began.
A step with a check gets an outcome from the gripper's hold; the first failed step is the
episode's ``failed_step``; steps after it are ``after_failure`` (the robot went on, but they
are not judged). A step whose event never comes runs to the end as ``incomplete``.

Another segmenter (a learned one) plugs in through :func:`register_segmenter` and is chosen
by ``segmenter:`` in the configuration; it gets the same inputs and returns the same steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from .config import SEGMENTER_NAMES, LadderConfig, Procedure

SUCCESS, FAILURE, DONE, INCOMPLETE, AFTER_FAILURE = "success", "failure", "done", "incomplete", "after_failure"


class LadderError(ValueError):
    """The episode cannot be segmented (no procedure for its task, a signal missing); says which."""


@dataclass
class Step:
    index: int
    name: str
    start_ns: int
    end_ns: int
    outcome: str  # success | failure | done (no check) | incomplete | after_failure
    failure_mode: str | None = None
    failed_at_ns: int | None = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def as_dict(self) -> dict:
        return {**asdict(self), "duration_s": round(self.duration_s, 4)}


@dataclass
class Signals:
    """What the heuristic reads, each on its own clock (int64 ns)."""

    command_t: np.ndarray
    command: np.ndarray  # 0 open .. 1 closed
    position_t: np.ndarray
    position: np.ndarray  # (N, 3) end effector, metres
    hold_t: np.ndarray
    holding: np.ndarray  # bool: closed on something


def _column(streams: Mapping, spec: Mapping | None, what: str, *, required: bool):
    """(timestamps, values) of one configured signal, or None when it is optional and absent."""
    if spec is None:
        if required:
            raise LadderError(f"signal {what} is disabled in the configuration but required")
        return None
    s = streams.get(spec["stream"])
    if s is None or spec["field"] not in s.fields or len(s) == 0:
        if required:
            raise LadderError(f"signal {what}: stream {spec['stream']!r} with field {spec['field']!r} not in episode")
        return None
    x = np.asarray(s.fields[spec["field"]], dtype=np.float64).reshape(len(s), -1)
    labels = s.labels.get(spec["field"], [])
    try:
        if "labels" in spec:
            cols = [labels.index(lab) for lab in spec["labels"]]
        elif "label" in spec:
            cols = [labels.index(spec["label"])]
        else:
            cols = [int(spec.get("index", 0))]
    except ValueError:
        if required:
            raise LadderError(
                f"signal {what}: {spec['stream']}.{spec['field']} has no column labelled "
                f"{spec.get('labels') or spec.get('label')!r} (labels: {labels})"
            ) from None
        return None
    if max(cols) >= x.shape[1]:
        raise LadderError(
            f"signal {what}: {spec['stream']}.{spec['field']} has {x.shape[1]} columns, not {max(cols) + 1}"
        )
    return np.asarray(s.timestamps_ns, dtype=np.int64), x[:, cols]


def signals_of(streams: Mapping, config: LadderConfig) -> Signals:
    th, sig = config.thresholds, config.signals
    cmd_t, cmd = _column(streams, sig.get("gripper_command"), "gripper_command", required=True)
    pos_t, pos = _column(streams, sig.get("ee_position"), "ee_position", required=True)
    closed_t, closed = cmd_t, cmd[:, 0] > th["command_closed"]
    effort = _column(streams, sig.get("gripper_effort"), "gripper_effort", required=False)
    if effort is not None:
        hold_t, grip = effort[0], effort[1][:, 0] >= th["hold_effort"]
    else:
        opening = _column(streams, sig.get("gripper_opening"), "gripper_opening or gripper_effort", required=True)
        hold_t, grip = opening[0], opening[1][:, 0] >= th["hold_min_opening_m"]
    # holding = commanded closed (command held until the next sample) and gripping something
    idx = np.searchsorted(closed_t, hold_t, side="right") - 1
    commanded = np.where(idx >= 0, closed[np.clip(idx, 0, None)], False)
    return Signals(cmd_t, cmd[:, 0], pos_t, pos, hold_t, commanded & grip)


def speed(t_ns: np.ndarray, pos: np.ndarray, window_s: float) -> np.ndarray:
    """End-effector speed (m/s) at every sample: displacement across a centred window, which
    averages sensor noise away where a per-sample difference would amplify it."""
    t = t_ns.astype(np.float64) / 1e9
    lo = np.searchsorted(t, t - window_s / 2, side="left")
    hi = np.clip(np.searchsorted(t, t + window_s / 2, side="right") - 1, 0, len(t) - 1)
    dt = t[hi] - t[lo]
    return np.linalg.norm(pos[hi] - pos[lo], axis=1) / np.where(dt > 0, dt, np.inf)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) indices of the True runs of ``mask``."""
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def events(s: Signals, config: LadderConfig) -> dict[str, np.ndarray]:
    """Event times (int64 ns, sorted) by kind."""
    th = config.thresholds
    closed = (s.command > th["command_closed"]).astype(np.int8)
    flips = np.diff(closed)
    v = speed(s.position_t, s.position, th["speed_window_s"])
    t = s.position_t
    moving = v >= th["pause_speed_m_s"]
    m0, m1 = _runs(moving)
    blip = (t[np.clip(m1, 0, len(t) - 1)] - t[m0]) < th["min_motion_s"] * 1e9
    for a, b in zip(m0[blip], m1[blip]):  # a glitch is not a move: it does not split a pause
        moving[a:b] = False
    starts, ends = _runs(~moving)
    long = (t[np.clip(ends - 1, 0, None)] - t[starts]) >= th["min_pause_s"] * 1e9
    starts, ends = starts[long], ends[long]
    ends = ends[ends < len(t)]
    # A smooth move leaves a pause slowly: date its start back to the last still sample.
    still = np.maximum.accumulate(np.where(v < th["onset_speed_m_s"], np.arange(len(v)), -1))
    onset = np.maximum(still[ends - 1] + 1, 0) if len(ends) else ends
    return {
        "grip_close": s.command_t[1:][flips == 1],
        "grip_open": s.command_t[1:][flips == -1],
        "motion_stop": t[starts[starts > 0]],
        "motion_start": t[np.minimum(onset, ends)],
    }


def _holding_at_end(s: Signals, start: int, end: int, window_ns: int) -> bool:
    sel = (s.hold_t >= max(start, end - window_ns)) & (s.hold_t <= end)
    return bool(sel.any() and s.holding[sel].mean() >= 0.5)


def _hold_lost(s: Signals, start: int, end: int, window_ns: int, drop_ns: int) -> int | None:
    """When the hold taken at the step's start is lost for at least ``drop_ns`` (None: kept)."""
    sel = (s.hold_t >= start) & (s.hold_t <= end)
    t, h = s.hold_t[sel], s.holding[sel]
    if not len(t):
        return None
    if not h[t <= start + window_ns].any():
        return int(start)  # nothing held when the step began
    lo, hi = _runs(~h)
    lost = (t[lo] > start + window_ns) & (t[hi - 1] - t[lo] >= drop_ns)
    return int(t[lo[lost][0]]) if lost.any() else None


def heuristic(streams: Mapping, start_ns: int, end_ns: int, procedure: Procedure, config: LadderConfig) -> list[Step]:
    s = signals_of(streams, config)
    ev = events(s, config)
    th = config.thresholds
    window, drop = int(th["hold_window_s"] * 1e9), int(th["drop_min_s"] * 1e9)
    steps: list[Step] = []
    t, failed = int(start_ns), False
    while True:
        first = procedure.cycle[0]
        if steps and not _next(ev[first.ends_at], t, end_ns):
            break  # no further cycle
        for spec in procedure.cycle:
            stop = _next(ev[spec.ends_at], t, end_ns)
            step = Step(len(steps), spec.step, t, stop or int(end_ns), DONE)
            if stop is None:
                step.outcome = INCOMPLETE
            elif failed:
                step.outcome = AFTER_FAILURE
            elif spec.check == "holding":
                if not _holding_at_end(s, step.start_ns, step.end_ns, window):
                    step.outcome, step.failure_mode, step.failed_at_ns = FAILURE, spec.failure_mode, step.end_ns
                else:
                    step.outcome = SUCCESS
            elif spec.check == "kept_hold":
                lost = _hold_lost(s, step.start_ns, step.end_ns, window, drop)
                if lost is not None:
                    step.outcome, step.failure_mode, step.failed_at_ns = FAILURE, spec.failure_mode, lost
                else:
                    step.outcome = SUCCESS
            failed |= step.outcome == FAILURE
            steps.append(step)
            if stop is None:
                return steps
            t = stop
        if not procedure.repeat:
            break
    if procedure.final and t < end_ns:
        steps.append(Step(len(steps), procedure.final, t, int(end_ns), AFTER_FAILURE if failed else DONE))
    return steps


def _next(times: np.ndarray, after: int, end: int) -> int | None:
    i = np.searchsorted(times, after, side="right")
    return int(times[i]) if i < len(times) and times[i] <= end else None


Segmenter = Callable[[Mapping, int, int, Procedure, LadderConfig], list[Step]]
SEGMENTERS: dict[str, Segmenter] = {"heuristic": heuristic}


def register_segmenter(name: str, fn: Segmenter) -> None:
    """Make a segmenter selectable by ``segmenter:`` (register before loading the configuration).
    The name goes into every ladder's version, which is a Dagster tag value: letters, digits, - and _."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", name):
        raise ValueError(f"segmenter name {name!r}: use letters, digits, '-' and '_' (at most 40)")
    SEGMENTERS[name] = fn
    SEGMENTER_NAMES.add(name)


def segment(streams: Mapping, start_ns: int, end_ns: int, task: str, config: LadderConfig) -> list[Step]:
    """The episode's step ladder; :class:`LadderError` when its task has no procedure or a signal is missing."""
    procedure = config.procedures.get(task)
    if procedure is None:
        raise LadderError(f"no procedure for task {task!r}; configured: {sorted(config.procedures)}")
    return SEGMENTERS[config.segmenter](streams, start_ns, end_ns, procedure, config)


def failed_step(steps: list[Step]) -> Step | None:
    return next((s for s in steps if s.outcome == FAILURE), None)
