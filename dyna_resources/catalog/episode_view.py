"""One episode as a person looks it up: where it came from and where its MCAP is, what every gate
and score said of it, which versions made it (and whether they are current), its failed step, and
the command that opens it (no Dagster here). ``dyna episode EPISODE_ID`` prints it; the
``mcap_episodes`` partitions show one row per episode of their units."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import versions
from .registry import Registry

_COPY = {"gs": "gcloud storage cp", "s3": "aws s3 cp"}  # a store's MCAP is fetched before Rerun opens it


@dataclass(frozen=True)
class GateVerdict:
    stage: str  # "pre" | "post"
    gate: str
    passed: bool
    action: str  # what a failure does: "quarantine" | "flag"
    detail: str


@dataclass(frozen=True)
class EpisodeView:
    episode_id: str
    batch_key: str
    source_path: str  # in the landing zone
    status: str
    task: str | None
    robot_id: str | None
    duration_s: float | None
    schema_version: str | None
    pipeline_version: str | None
    robot_sw_version: str | None
    mcap_path: str | None
    mcap_uri: str | None
    mcap_bytes: int | None
    quality_verdict: str | None
    quality_reasons: list[dict[str, Any]] = field(default_factory=list)
    review_verdict: str | None = None
    failed_step: str | None = None
    quarantine: dict[str, Any] | None = None  # stage, gate, reason
    gates: list[GateVerdict] = field(default_factory=list)
    source_format: str | None = None  # 'hdf5' | 'ros2' | 'lerobot'; None: registered before it was recorded
    source_uri: str | None = None
    source_sha256: str | None = None

    @property
    def stale(self) -> bool:
        """Made by other schema or pipeline versions than this code's: the drift sensor redoes it."""
        return self.status == "transcoded" and (
            self.schema_version != versions.SCHEMA_VERSION or self.pipeline_version != versions.PIPELINE_VERSION
        )

    @property
    def failed_gates(self) -> list[str]:
        return [f"{g.stage}/{g.gate}" for g in self.gates if not g.passed]

    def open_commands(self) -> list[str]:
        """How to look at its MCAP: Rerun and Foxglove open a local file; one in an object store is
        fetched first."""
        if not self.mcap_uri:
            return []
        local = self.mcap_path if self.mcap_path and "://" not in self.mcap_path else None
        if local is None:
            name = f"{self.episode_id}.mcap"
            copy = _COPY.get(self.mcap_uri.split("://", 1)[0], "copy")
            return [f"{copy} {self.mcap_uri} {name} && rerun {name}", f"Foxglove: open {name}"]
        return [f"rerun {local}", f"Foxglove: open {local} (desktop app, or app.foxglove.dev: Open local file)"]

    def as_row(self) -> dict[str, Any]:
        """One row of a batch's episodes table."""
        opens = self.open_commands()
        return {
            "episode_id": self.episode_id,
            "source": self.source_format or "hdf5",
            "status": self.status + (" (stale)" if self.stale else ""),
            "quality": self.quality_verdict or "",
            "failed_gates": ", ".join(self.failed_gates),
            "quarantine": f"{self.quarantine['gate']}: {self.quarantine['reason']}"[:160] if self.quarantine else "",
            "failed_step": self.failed_step or "",
            "versions": f"schema {self.schema_version} / pipeline {self.pipeline_version}",
            "open": opens[0] if opens else "",
        }

    def lines(self) -> list[str]:
        """What ``dyna episode`` prints."""
        current = f"schema {versions.SCHEMA_VERSION}, pipeline {versions.PIPELINE_VERSION}"
        out = [
            f"{self.episode_id}: {self.status}" + (f"  STALE (this code writes {current})" if self.stale else ""),
            f"  batch {self.batch_key}, source {self.source_path}",
            f"  source: {self.source_format or 'hdf5'} at {self.source_uri or self.source_path}"
            f", sha256 {self.source_sha256 or 'unknown'}",
            f"  task {self.task}, robot {self.robot_id} (software {self.robot_sw_version}), {self.duration_s or 0:.1f} s",
            f"  versions: schema {self.schema_version}, pipeline {self.pipeline_version}",
        ]
        if self.mcap_uri:
            out.append(f"  MCAP {self.mcap_uri} ({(self.mcap_bytes or 0) / 1e6:.2f} MB)")
        if self.quarantine:
            q = self.quarantine
            out.append(f"  QUARANTINED at {q['stage']}/{q['gate']}: {q['reason']}")
        for g in self.gates:
            mark = "ok" if g.passed else f"FAILED ({g.action})"
            out.append(f"  gate {g.stage}/{g.gate}: {mark}" + (f": {g.detail}" if g.detail else ""))
        verdict = self.quality_verdict or "not scored"
        out.append(f"  quality: {verdict}" + (f", reviewed: {self.review_verdict}" if self.review_verdict else ""))
        out += [f"    {r.get('check')}: {r.get('detail')}" for r in self.quality_reasons]
        if self.failed_step:
            out.append(f"  failed step: {self.failed_step}")
        out += [f"  open: {c}" for c in self.open_commands()]
        return out


def episode_view(registry: Registry, episode_id: str) -> EpisodeView | None:
    """The episode with this id, or None when the registry has none."""
    row = registry.episode_by_id(episode_id)
    if row is None:
        return None
    return _views(registry, row["batch_key"], [row])[0]


def batch_episode_views(registry: Registry, batch_keys: Sequence[str]) -> list[EpisodeView]:
    """Every episode of these work units, by id."""
    out: list[EpisodeView] = []
    for key in batch_keys:
        out += _views(registry, key, registry.episodes(key))
    return sorted(out, key=lambda v: v.episode_id)


def _views(registry: Registry, batch_key: str, rows: list[dict]) -> list[EpisodeView]:
    gates: dict[str, list[GateVerdict]] = {}
    for g in registry.gate_results(batch_key):
        verdict = GateVerdict(g["stage"], g["gate"], bool(g["passed"]), g["action"], g["detail"] or "")
        gates.setdefault(g["source_path"], []).append(verdict)
    held = {q["source_path"]: q for q in registry.quarantined(batch_key)}
    return [_view(r, gates.get(r["source_path"], []), held.get(r["source_path"])) for r in rows]


def _view(r: dict, gates: list[GateVerdict], held: dict | None) -> EpisodeView:
    reasons = r.get("quality_reasons")
    return EpisodeView(
        episode_id=r["episode_id"],
        batch_key=r["batch_key"],
        source_path=r["source_path"],
        status=r["status"],
        task=r.get("task"),
        robot_id=r.get("robot_id"),
        duration_s=r.get("duration_s"),
        schema_version=r.get("schema_version"),
        pipeline_version=r.get("pipeline_version"),
        robot_sw_version=r.get("robot_sw_version"),
        mcap_path=r.get("mcap_path"),
        mcap_uri=r.get("mcap_uri"),
        mcap_bytes=r.get("mcap_bytes"),
        quality_verdict=r.get("quality_verdict"),
        quality_reasons=json.loads(reasons) if isinstance(reasons, str) and reasons else [],
        review_verdict=r.get("review_verdict"),
        failed_step=r.get("failed_step"),
        quarantine={k: held[k] for k in ("stage", "gate", "reason")} if held else None,
        gates=sorted(gates, key=lambda g: (g.stage != "pre", g.gate)),
        source_format=r.get("source_format"),
        source_uri=r.get("source_uri"),
        source_sha256=r.get("source_sha256"),
    )


__all__ = ["EpisodeView", "GateVerdict", "batch_episode_views", "episode_view"]
