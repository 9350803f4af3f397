"""Quality gates before (pre) and after (post) transcoding, configured at run time.

Each gate has a setting, read from a gates file (YAML) or run config, never from code:

    enabled             run the gate at all
    action              what a failing episode gets: "quarantine" (held back, the batch goes
                        on) or "flag" (recorded in the registry for curation, kept)
    blocking            whether a batch whose failures exceed ``max_failed_fraction`` stops
                        downstream steps (Dagster blocking check with ERROR severity)
    max_failed_fraction the batch-level bar for that
    params              gate-specific thresholds

A gate that is off is not evaluated. The structural pre gates (readable, required
streams, monotonic timestamps) are what the reader itself needs: when one is off, a file
that would fail it is caught at transcode time instead and quarantined there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from .quality import QualityConfig, QualityConfigError

PRE_GATES = (
    "readable",
    "required_streams",
    "timestamps_monotonic",
    "max_duration",
    "min_frames",
    "finite_values",
    "frame_drops",
    "dead_camera",
    "min_duration",
)
POST_GATES = ("decodable", "frame_counts", "durations", "size_sanity")
ACTIONS = ("quarantine", "flag")

GATE_DOCS = {
    "readable": "the file opens as a legacy HDF5 episode with a safe episode id and attributes that fit the registry",
    "required_streams": "joint states, actions and a camera (the reader's minimum), plus params.streams "
    "(e.g. [wrench, images/wrist])",
    "timestamps_monotonic": "every stream's timestamps strictly increase",
    "max_duration": "the episode's timestamps span at most params.max_s seconds (a clock jump would "
    "otherwise be transcoded as years of empty time)",
    "min_frames": "every camera holds at least params.min_frames frames",
    "finite_values": "no NaN or infinite value in joint states, actions or any other numeric stream",
    "frame_drops": "no camera misses more than params.max_drop_fraction of its frames",
    "dead_camera": "no camera goes dark or frozen (params.samples frames per camera are checked)",
    "min_duration": "the episode lasts at least params.min_s seconds",
    "decodable": "every GOP of the MCAP opens with a keyframe that decodes, and params.sample_gops whole GOPs "
    "per episode (chosen from its name; 0: every GOP) decode to one picture per access unit",
    "frame_counts": "the MCAP holds exactly the source's frames (cameras and depth) and samples",
    "durations": "each camera's first/last time equals the source's (params.tolerance_s)",
    "size_sanity": "MCAP bytes / source bytes within [params.min_ratio, params.max_ratio]",
}


@dataclass(frozen=True)
class GateSetting:
    enabled: bool = True
    action: str = "quarantine"
    blocking: bool = True
    max_failed_fraction: float = 0.5
    params: Mapping = field(default_factory=dict)


DEFAULTS: dict[str, GateSetting] = {
    "readable": GateSetting(),
    "required_streams": GateSetting(params={"streams": []}),
    "timestamps_monotonic": GateSetting(),
    "max_duration": GateSetting(params={"max_s": 4 * 3600.0}),
    "min_frames": GateSetting(params={"min_frames": 1}),
    "finite_values": GateSetting(),
    "frame_drops": GateSetting(action="flag", blocking=False, params={"max_drop_fraction": 0.02}),
    "dead_camera": GateSetting(action="flag", blocking=False, params={"samples": 12, "flat_std": 1.5}),
    "min_duration": GateSetting(params={"min_s": 1.0}),
    "decodable": GateSetting(params={"sample_gops": 1}),
    "frame_counts": GateSetting(),
    "durations": GateSetting(params={"tolerance_s": 0.001}),
    "size_sanity": GateSetting(action="flag", blocking=False, params={"min_ratio": 0.005, "max_ratio": 1.0}),
}


class GateConfigError(ValueError):
    pass


@dataclass(frozen=True)
class GateConfig:
    gates: Mapping[str, GateSetting] = field(default_factory=lambda: dict(DEFAULTS))
    quality: Mapping = field(default_factory=dict)  # the ``quality:`` section: see quality.QualityConfig

    def quality_config(self) -> QualityConfig:
        return QualityConfig.from_mapping(self.quality)

    def __getitem__(self, name: str) -> GateSetting:
        return self.gates[name]

    def enabled(self, stage: str) -> list[str]:
        names = PRE_GATES if stage == "pre" else POST_GATES
        return [g for g in names if self.gates[g].enabled]

    def param(self, gate: str, name: str):
        return self.gates[gate].params.get(name, DEFAULTS[gate].params.get(name))

    @classmethod
    def from_mapping(cls, overrides: Mapping | None, *, source: str = "gates config") -> GateConfig:
        """Defaults overlaid with ``{gate: {enabled, action, blocking, max_failed_fraction, params}}``;
        a boolean instead of a mapping switches the gate on or off; ``quality`` holds the quality
        score settings."""
        gates = dict(DEFAULTS)
        overrides = dict(overrides or {})
        quality = overrides.pop("quality", None) or {}
        if not isinstance(quality, Mapping):
            raise GateConfigError(f"{source}: quality must be a mapping")
        try:
            QualityConfig.from_mapping(quality, source=source)
        except QualityConfigError as e:
            raise GateConfigError(str(e)) from None
        for name, value in overrides.items():
            if name not in DEFAULTS:
                raise GateConfigError(f"{source}: unknown gate {name!r}; known: {', '.join(DEFAULTS)}")
            if isinstance(value, bool):
                gates[name] = replace(gates[name], enabled=value)
                continue
            if not isinstance(value, Mapping):
                raise GateConfigError(f"{source}: gate {name!r} must be a mapping or true/false")
            unknown = set(value) - {"enabled", "action", "blocking", "max_failed_fraction", "params"}
            if unknown:
                raise GateConfigError(f"{source}: gate {name!r} has unknown field(s) {sorted(unknown)}")
            if value.get("action", gates[name].action) not in ACTIONS:
                raise GateConfigError(f"{source}: gate {name!r} action must be one of {ACTIONS}")
            frac = float(value.get("max_failed_fraction", gates[name].max_failed_fraction))
            if not 0.0 <= frac <= 1.0:
                raise GateConfigError(f"{source}: gate {name!r} max_failed_fraction must be in [0, 1]")
            params = {**gates[name].params, **(value.get("params") or {})}
            unknown = set(params) - set(DEFAULTS[name].params)
            if unknown:
                raise GateConfigError(f"{source}: gate {name!r} has unknown param(s) {sorted(unknown)}")
            gates[name] = GateSetting(
                enabled=bool(value.get("enabled", gates[name].enabled)),
                action=value.get("action", gates[name].action),
                blocking=bool(value.get("blocking", gates[name].blocking)),
                max_failed_fraction=frac,
                params=params,
            )
        return cls(gates, dict(quality))

    @classmethod
    def load(cls, path: str | Path | None, overrides: Mapping | None = None, *, required: bool = False) -> GateConfig:
        """A gates file (absent: defaults, unless ``required``), then run-time overrides on top."""
        if required and not (path is not None and Path(path).is_file()):
            raise GateConfigError(f"{path}: gates file not found")
        merged: dict = {}
        if path is not None and Path(path).is_file():
            data = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(data, Mapping):
                raise GateConfigError(f"{path}: expected a mapping of gate names")
            merged.update(data.get("gates", data))
            if "gates" in data and "quality" in data:
                merged["quality"] = data["quality"]
        for k, v in (overrides or {}).items():
            if isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
                merged[k] = {**merged[k], **v}
            else:
                merged[k] = v
        return cls.from_mapping(merged, source=str(path) if path else "gates config")


@dataclass
class GateResult:
    gate: str
    passed: bool
    action: str
    detail: str = ""

    def as_record(self, pipeline_version: str) -> dict:
        return {
            "gate": self.gate,
            "passed": self.passed,
            "action": self.action,
            "detail": self.detail,
            "pipeline_version": pipeline_version,
        }
