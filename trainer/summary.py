"""What one training attempt reports: :class:`TrainSummary`, returned by ``trainer.train.run``, written
to ``<run_dir>/result.json`` and sent to Dagster (through Pipes) as the checkpoint's metadata."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"


@dataclass(frozen=True)
class FinalCheckpoint:
    """The verified checkpoint a run ended on; ``sha256`` (of its COMPLETE.json) is its data version."""

    step: int
    path: str
    sha256: str


@dataclass
class TrainSummary:
    attempt: int
    attempt_name: str  # "<slurm requeue>.<torchrun restart>", or the restart alone outside Slurm
    world_size: int
    optimizer_mode: str
    loader: str
    resumed_from: int | None = None  # the step of the checkpoint this attempt resumed from
    started_fresh: bool = False  # every checkpoint was damaged and all_checkpoints_damaged is "start_fresh"
    skipped_checkpoints: list[str] = field(default_factory=list)  # damaged ones, each with its damaged files
    steps: int = 0
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (mean over ranks), this attempt's
    loss_first: float | None = None
    loss_last: float | None = None
    samples_per_s: float = 0.0
    data_wait_fraction: float = 0.0
    data_wait_first_epoch: float | None = None  # None: this attempt ran no step of epoch 0
    first_epoch_steps: int = 0
    checkpoint_blocking_s: list[float] = field(default_factory=list)  # per save, the part the step waited for
    step_compute_s: list[float] = field(default_factory=list)
    step_wait_s: list[float] = field(default_factory=list)  # per step, waiting for the batch
    decoded_frames: int = 0
    delivered_frames: int = 0
    decodes_per_frame: float | None = None  # None: the loader reports no frame counts
    bytes_read: int = 0
    skipped: int = 0  # samples the loader skipped (bad_samples = "skip")
    samples_per_epoch: int = 0
    wall_s: float = 0.0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # each save's timings (CheckpointHandle)
    checkpoint: FinalCheckpoint | None = None

    def as_record(self) -> dict[str, Any]:
        """As ``result.json`` holds it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainSummary:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        values["losses"] = {int(step): loss for step, loss in (record.get("losses") or {}).items()}
        if record.get("checkpoint"):
            values["checkpoint"] = FinalCheckpoint(**record["checkpoint"])
        return cls(**values)

    def write(self, run_dir: Path) -> None:
        (run_dir / RESULT_FILE).write_text(json.dumps(self.as_record(), indent=1, default=str))

    @classmethod
    def read(cls, run_dir: str | Path) -> TrainSummary:
        """The latest attempt's summary of the run in ``run_dir``."""
        return cls.from_record(json.loads((Path(run_dir) / RESULT_FILE).read_text()))

    @property
    def data_version(self) -> str | None:
        return self.checkpoint.sha256 if self.checkpoint else None

    def as_metadata(self, run_dir: str, lineage: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint's metadata as Pipes sends it (plain values; JSON ones tagged as Pipes wants)."""
        return {
            "steps": self.steps,
            "loss_first": self.loss_first,
            "loss_last": self.loss_last,
            "samples_per_s": round(self.samples_per_s, 2),
            "data_wait_fraction": round(self.data_wait_fraction, 4),
            "data_wait_first_epoch": round(self.data_wait_first_epoch or 0.0, 4),
            "decodes_per_frame": round(self.decodes_per_frame or 0.0, 3),
            "loader": self.loader,
            "samples_per_epoch": self.samples_per_epoch,
            "skipped_samples": self.skipped,
            "checkpoint_blocking_s": max(self.checkpoint_blocking_s or [0.0]),
            "checkpoint_write_s": max((c.get("write_s") or 0.0 for c in self.checkpoints), default=0.0),
            "attempt": self.attempt,
            "world_size": self.world_size,
            "optimizer_mode": self.optimizer_mode,
            "run_dir": run_dir,
            "checkpoint": {"raw_value": dataclasses.asdict(self.checkpoint) if self.checkpoint else {}, "type": "json"},
            "lineage": {"raw_value": lineage, "type": "json"},
        }
