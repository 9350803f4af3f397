"""Step-ladder configuration: which signals the segmenter reads, its thresholds, and each task's
standard procedure.

A procedure is a ``cycle`` of steps, each ending at the first *event* of a kind after it began
(``grip_close``, ``grip_open``, ``motion_start``, ``motion_stop``), optionally with a ``check``
that decides the step's outcome (``holding``: the gripper holds something when the step ends;
``kept_hold``: it never loses its hold during the step) and the failure mode a failed check
names. ``repeat: true`` runs the cycle again while its first step's event still comes (one
pick-and-place per object); ``final`` names the step from the end of the last cycle to the end
of the episode. The defaults below fit the sample fleet's tasks; a deployment overrides any
part in ``$DYNA_HOME/step_ladders.yaml``::

    segmenter: heuristic
    thresholds: {pause_speed_m_s: 0.012, min_pause_s: 0.12}
    procedures:
      fold_shirt:
        cycle:
          - {step: reach, ends_at: grip_close}
          - {step: grasp, ends_at: motion_start, check: holding, failure_mode: miss}
          - {step: fold, ends_at: grip_open, check: kept_hold, failure_mode: slip}
        final: smooth
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

# The segmenters a configuration may name; segment.register_segmenter adds to it (the functions
# live in segment.py, which imports this module).
SEGMENTER_NAMES: set[str] = {"heuristic"}

EVENTS = ("grip_close", "grip_open", "motion_start", "motion_stop")
CHECKS = ("holding", "kept_hold")
SEGMENTER_VERSION = "1"  # bump when the heuristic's logic changes: every ladder becomes stale

_PICK = [
    {"step": "reach", "ends_at": "grip_close"},
    {"step": "grasp", "ends_at": "motion_start", "check": "holding", "failure_mode": "miss"},
]
_LET_GO = {"step": "release", "ends_at": "motion_start"}

DEFAULTS: dict = {
    "segmenter": "heuristic",
    "signals": {
        # stream, field, and the column by label (or index): 0 = open .. 1 = closed
        "gripper_command": {"stream": "action", "field": "command", "label": "gripper_cmd"},
        "gripper_opening": {"stream": "gripper", "field": "position", "index": 0},  # metres
        "gripper_effort": {"stream": "joint_states", "field": "effort", "label": "gripper"},
        "ee_position": {"stream": "ee_pose", "field": "pose", "labels": ["x", "y", "z"]},  # metres
    },
    "thresholds": {
        "command_closed": 0.5,  # gripper command above this = close
        "speed_window_s": 0.1,  # end-effector speed = displacement over this window (noise-robust)
        "pause_speed_m_s": 0.012,  # slower than this is a pause ...
        "min_pause_s": 0.12,  # ... when it lasts this long (waypoint dips of a smooth move are shorter)
        "min_motion_s": 0.1,  # a faster blip shorter than this (a glitch) does not end a pause
        "onset_speed_m_s": 0.003,  # a move starts at the last sample slower than this (above the noise)
        "hold_effort": 24.0,  # gripper effort at or above this while closed = holding something
        "hold_min_opening_m": 0.001,  # without an effort signal: fingers stopped this far apart = holding
        "hold_window_s": 0.15,  # "holding" judges the last this-many seconds of a step
        "drop_min_s": 0.08,  # "kept_hold" fails when the hold is lost for this long
    },
    "procedures": {
        "pick_place": {
            "cycle": [
                *_PICK,
                {"step": "transport", "ends_at": "grip_open", "check": "kept_hold", "failure_mode": "slip"},
                _LET_GO,
            ],
            "repeat": True,
            "final": "return",
        },
        "fold_towel": {
            "cycle": [
                *_PICK,
                {"step": "fold", "ends_at": "grip_open", "check": "kept_hold", "failure_mode": "slip"},
                _LET_GO,
            ],
            "final": "smooth",
        },
        "open_drawer": {
            "cycle": [
                *_PICK,
                {"step": "pull", "ends_at": "grip_open", "check": "kept_hold", "failure_mode": "slip"},
                _LET_GO,
            ],
            "final": "return",
        },
        "wipe_table": {
            "cycle": [
                *_PICK,
                {"step": "wipe", "ends_at": "grip_open", "check": "kept_hold", "failure_mode": "slip"},
                _LET_GO,
            ],
            "final": "return",
        },
    },
}


class LadderConfigError(ValueError):
    pass


@dataclass(frozen=True)
class StepSpec:
    step: str
    ends_at: str
    check: str | None = None
    failure_mode: str | None = None


@dataclass(frozen=True)
class Procedure:
    cycle: tuple[StepSpec, ...]
    repeat: bool = False
    final: str | None = None

    def step_names(self) -> list[str]:
        return [s.step for s in self.cycle] + ([self.final] if self.final else [])


@dataclass(frozen=True)
class LadderConfig:
    segmenter: str
    signals: Mapping[str, Mapping]
    thresholds: Mapping[str, float]
    procedures: Mapping[str, Procedure]
    digest: str  # of the whole effective configuration: part of every ladder's version

    @property
    def version(self) -> str:
        return f"{self.segmenter}-{SEGMENTER_VERSION}.{self.digest}"  # a valid Dagster tag value

    @classmethod
    def load(cls, path: str | Path | None) -> LadderConfig:
        """Defaults, overridden by the file at ``path`` when it exists."""
        data = None
        if path is not None and Path(path).is_file():
            try:
                data = yaml.safe_load(Path(path).read_text())
            except yaml.YAMLError as e:
                raise LadderConfigError(f"{path}: not valid YAML: {e}") from None
        return cls.from_mapping(data, source=str(path or "step ladder config"))

    @classmethod
    def from_mapping(cls, data: Mapping | None, *, source: str = "step ladder config") -> LadderConfig:
        if data is not None and not isinstance(data, Mapping):
            raise LadderConfigError(f"{source}: expected a mapping")
        data = dict(data or {})
        unknown = set(data) - set(DEFAULTS)
        if unknown:
            raise LadderConfigError(f"{source}: unknown field(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
        merged = copy.deepcopy(DEFAULTS)
        for key in ("signals", "thresholds", "procedures"):
            part = data.get(key) or {}
            if not isinstance(part, Mapping):
                raise LadderConfigError(f"{source}: {key} must be a mapping")
            merged[key].update(part)
        merged["segmenter"] = str(data.get("segmenter", DEFAULTS["segmenter"]))
        if merged["segmenter"] not in SEGMENTER_NAMES:
            raise LadderConfigError(
                f"{source}: segmenter: unknown {merged['segmenter']!r}; known: {sorted(SEGMENTER_NAMES)}"
            )
        for name, value in merged["thresholds"].items():
            if name not in DEFAULTS["thresholds"]:
                raise LadderConfigError(
                    f"{source}: thresholds.{name}: unknown; known: {sorted(DEFAULTS['thresholds'])}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise LadderConfigError(f"{source}: thresholds.{name}: must be a number >= 0, got {value!r}")
        for name, sig in merged["signals"].items():
            if name not in DEFAULTS["signals"]:
                raise LadderConfigError(f"{source}: signals.{name}: unknown; known: {sorted(DEFAULTS['signals'])}")
            if sig is not None and (not isinstance(sig, Mapping) or not {"stream", "field"} <= set(sig)):
                raise LadderConfigError(f"{source}: signals.{name}: needs stream and field (or null to disable)")
        procedures = {
            str(task): _procedure(p, f"{source}: procedures.{task}") for task, p in merged["procedures"].items()
        }
        digest = hashlib.sha256(json.dumps(merged, sort_keys=True).encode()).hexdigest()[:10]
        return cls(
            segmenter=merged["segmenter"],
            signals=merged["signals"],
            thresholds={k: float(v) for k, v in merged["thresholds"].items()},
            procedures=procedures,
            digest=digest,
        )


def _procedure(p, where: str) -> Procedure:
    if not isinstance(p, Mapping) or set(p) - {"cycle", "repeat", "final"}:
        raise LadderConfigError(f"{where}: expected {{cycle, repeat, final}}")
    cycle = p.get("cycle")
    if not isinstance(cycle, list) or not cycle:
        raise LadderConfigError(f"{where}.cycle: a non-empty list of steps")
    steps = []
    for i, s in enumerate(cycle):
        at = f"{where}.cycle[{i}]"
        if not isinstance(s, Mapping) or set(s) - {"step", "ends_at", "check", "failure_mode"}:
            raise LadderConfigError(f"{at}: expected {{step, ends_at, check, failure_mode}}")
        if not isinstance(s.get("step"), str) or not s["step"]:
            raise LadderConfigError(f"{at}.step: a name is required")
        if s.get("ends_at") not in EVENTS:
            raise LadderConfigError(f"{at}.ends_at: one of {EVENTS}, got {s.get('ends_at')!r}")
        if s.get("check") is not None and s["check"] not in CHECKS:
            raise LadderConfigError(f"{at}.check: one of {CHECKS}, got {s['check']!r}")
        steps.append(
            StepSpec(
                s["step"],
                s["ends_at"],
                s.get("check"),
                s.get("failure_mode") or (f"{s['step']}_failed" if s.get("check") else None),
            )
        )
    final = p.get("final")
    if final is not None and not isinstance(final, str):
        raise LadderConfigError(f"{where}.final: a step name")
    return Procedure(tuple(steps), bool(p.get("repeat", False)), final)
