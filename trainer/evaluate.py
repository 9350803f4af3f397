"""Evaluations bound to checkpoints: load a checkpoint's weights, run a pluggable evaluation on a
(held-out) manifest, and record the result with the checkpoint, the dataset version and the code commit.

An evaluation is ``fn(model, manifest_table, spec, *, batch_size, open_file) -> dict`` of JSON
metrics. ``resolve(name)`` finds one by name in ``EVALUATIONS`` (``register`` adds to it), as a
dotted path ``"package.module:function"``, or in the ``dyna.evaluations`` entry point group.
The default, ``offline_action_error``, is the mean action MSE (overall and per step of the action
chunk) and the future-latent MSE over every segment of the manifest, without gradients.

No Dagster here: the ``evaluations`` asset calls :func:`evaluate_checkpoint`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from .checkpoint import MARKER, CheckpointInfo, CheckpointManager
from .dataset import ManifestDataset
from .manifest_loader import local_copy, open_manifest
from .model import WorldActionModel
from .train import TrainConfig

Evaluation = Callable[..., dict]
EVALUATIONS: dict[str, Evaluation] = {}
ENTRY_POINT_GROUP = "dyna.evaluations"
DEFAULT = "offline_action_error"


def register(name: str) -> Callable[[Evaluation], Evaluation]:
    def deco(fn: Evaluation) -> Evaluation:
        EVALUATIONS[name] = fn
        return fn

    return deco


def resolve(name: str) -> Evaluation:
    if name in EVALUATIONS:
        return EVALUATIONS[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    raise KeyError(
        f"unknown evaluation {name!r}: not registered ({', '.join(sorted(EVALUATIONS))}), "
        f"not a 'module:function' path, not in entry point group {ENTRY_POINT_GROUP!r}"
    )


@register(DEFAULT)
@torch.no_grad()
def evaluate(model: WorldActionModel, manifest_table: pa.Table, spec, *, batch_size: int = 8, open_file=None) -> dict:
    """Offline action-prediction error over every segment of ``manifest_table`` (each exactly once)."""
    was_training = model.training
    model.eval()
    ds = ManifestDataset(manifest_table, spec, batch_size=batch_size, open_file=open_file, shuffle_buffer=1)
    chunk = model.cfg.action_chunk
    action_sq = torch.zeros(chunk, dtype=torch.float64)  # summed over samples and action dims, per step
    latent_sq = torch.zeros((), dtype=torch.float64)
    n = 0
    try:
        for batch in ds:
            actions, latents = model(batch["frames"], batch["proprio"])
            future = batch["future"]
            b, c = future.shape[:2]
            target = model.target_encoder(future.reshape(b * c, *future.shape[2:])).reshape(b, c, -1)
            action_sq += ((actions - batch["actions"].float()) ** 2).double().mean(dim=2).sum(dim=0)
            latent_sq += ((latents - target) ** 2).double().mean(dim=(1, 2)).sum()
            n += b
    finally:
        ds.close()
        model.train(was_training)
    if n == 0:
        raise ValueError("the evaluation manifest has no segments")
    per_step = (action_sq / n).tolist()
    return {
        "segments": n,
        "action_mse": sum(per_step) / chunk,
        "action_mse_per_step": per_step,
        "latent_mse": float(latent_sq / n),
    }


def load_model(
    run_dir: str | os.PathLike, step: int | None = None
) -> tuple[WorldActionModel, TrainConfig, CheckpointInfo]:
    """The model of a training run's checkpoint (the latest complete one, or ``step``): weights only,
    the optimizer state is never read."""
    run_dir = Path(run_dir)
    cfg = TrainConfig.from_json((run_dir / "config.json").read_text())
    manager = CheckpointManager(run_dir / "checkpoints", store_url=cfg.checkpoint_store or None)
    try:
        # _materialize verifies (and, with a store, completes) one given step
        info = manager.latest() if step is None else manager._materialize(step)
    finally:
        manager.close()
    if info is None:
        raise FileNotFoundError(f"no complete checkpoint in {run_dir / 'checkpoints'}")
    model = WorldActionModel(cfg.model)
    # The run saved {"app": {"model": ..., "optim": ...}}; a partial load reads the model's entries only.
    state = {"app": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=info.path, planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
    model.load_state_dict(state["app"]["model"])  # tensors load in place; this also checks every key arrived
    model.eval()
    return model, cfg, info


def checkpoint_ref(run_dir: str | os.PathLike, info: CheckpointInfo) -> dict:
    marker = (info.path / MARKER).read_bytes()
    return {
        "run_dir": str(run_dir),
        "step": info.step,
        "path": str(info.path),
        "sha256": hashlib.sha256(marker).hexdigest(),
    }


def dataset_ref(lineage: dict) -> dict:
    """The training data's version as the lineage names it: ``ref`` is the dataset registry's
    ``name@version`` when training named one, else ``manifest:<sha256 prefix>``."""
    out = {k: lineage[k] for k in ("curation_spec", "manifest", "manifest_sha256") if k in lineage}
    sha = lineage.get("manifest_sha256") or ""
    out["ref"] = lineage.get("dataset") or (f"manifest:{sha[:16]}" if sha else "")
    return out


@dataclass(frozen=True)
class EvaluationResult:
    """One evaluation of one checkpoint on one manifest, with what it traces to. ``path``: where it was
    recorded (``run_dir/evaluations/``), empty when not recorded."""

    evaluation: str
    metrics: dict
    checkpoint: dict  # checkpoint_ref
    lineage: dict  # the checkpoint's training lineage
    dataset: dict  # dataset_ref
    code_commit: str
    heldout_manifest: str
    heldout_manifest_sha256: str
    heldout_is_training_data: bool  # the same data the model trained on is no held-out set: said, not hidden
    path: str = ""

    def as_record(self) -> dict:
        """The JSON written beside the checkpoints."""
        return {
            "evaluation": {"name": self.evaluation, "metrics": self.metrics},
            "checkpoint": self.checkpoint,
            "lineage": self.lineage,
            "dataset": self.dataset,
            "code_commit": self.code_commit or None,
            "heldout_manifest": self.heldout_manifest,
            "heldout_manifest_sha256": self.heldout_manifest_sha256,
            "heldout_is_training_data": self.heldout_is_training_data,
        }

    @classmethod
    def from_record(cls, record: dict, path: str = "") -> EvaluationResult:
        return cls(
            evaluation=record["evaluation"]["name"],
            metrics=record["evaluation"]["metrics"],
            checkpoint=record["checkpoint"],
            lineage=record["lineage"],
            dataset=record["dataset"],
            code_commit=record.get("code_commit") or "",
            heldout_manifest=record["heldout_manifest"],
            heldout_manifest_sha256=record["heldout_manifest_sha256"],
            heldout_is_training_data=record["heldout_is_training_data"],
            path=path,
        )

    @property
    def version(self) -> str:
        """What makes this evaluation this one: checkpoint x held-out manifest x evaluation."""
        return hashlib.sha256(
            f"{self.checkpoint['sha256']}:{self.heldout_manifest_sha256}:{self.evaluation}".encode()
        ).hexdigest()

    def as_metadata(self) -> dict:
        """Flat values for an asset's metadata (the asset wraps dicts as JSON)."""
        md = {
            "evaluation": self.evaluation,
            "metrics": self.metrics,
            "checkpoint": self.checkpoint,
            "checkpoint_step": self.checkpoint["step"],
            "checkpoint_sha256": self.checkpoint["sha256"],
            "lineage": self.lineage,
            "dataset": self.dataset,
            "dataset_ref": self.dataset.get("ref", ""),
            "manifest_sha256": self.dataset.get("manifest_sha256", ""),
            "code_commit": self.code_commit,
            "heldout_manifest": self.heldout_manifest,
            "heldout_manifest_sha256": self.heldout_manifest_sha256,
            "heldout_is_training_data": self.heldout_is_training_data,
            "run_dir": self.checkpoint.get("run_dir", ""),
            "result_path": self.path,
        }
        if self.heldout_is_training_data:
            md["note"] = (
                "evaluated on the training manifest: not held out (set heldout_manifest to a held-out "
                "curation spec's manifest for a real held-out error)"
            )
        for k in ("action_mse", "latent_mse"):
            if isinstance(self.metrics.get(k), (int, float)):
                md[k] = float(self.metrics[k])
        return md


def evaluate_checkpoint(
    run_dir: str | Path,
    manifest_url: str,
    *,
    step: int | None = None,
    evaluation: str = DEFAULT,
    batch_size: int = 8,
    cache_dir: str | Path | None = None,
    open_file=None,
    record: bool = True,
) -> EvaluationResult:
    """Run ``evaluation`` on checkpoint ``step`` (default: latest) of ``run_dir`` against the manifest at
    ``manifest_url`` (its Arrow IPC URL). With ``record``, the result is also written to
    ``run_dir/evaluations/``, next to the checkpoints it describes."""
    run_dir = Path(run_dir)
    model, cfg, info = load_model(run_dir, step)
    local = local_copy(manifest_url, cache_dir or run_dir / "node-cache")
    heldout_sha = local.stem  # local_copy names the copy by its verified SHA-256
    torch.manual_seed(0)  # an evaluation that samples is repeatable
    metrics = resolve(evaluation)(model, open_manifest(local), cfg.sample, batch_size=batch_size, open_file=open_file)
    lineage = dict(info.extra.get("lineage", {}))
    result = EvaluationResult(
        evaluation=evaluation,
        metrics=metrics,
        checkpoint=checkpoint_ref(run_dir, info),
        lineage=lineage,
        dataset=dataset_ref(lineage),
        code_commit=lineage.get("code_commit") or "",
        heldout_manifest=manifest_url,
        heldout_manifest_sha256=heldout_sha,
        heldout_is_training_data=heldout_sha == lineage.get("manifest_sha256"),
    )
    if not record:
        return result
    out = run_dir / "evaluations" / f"step-{info.step:09d}-{_slug(evaluation)}-{heldout_sha[:12]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.as_record(), indent=1))
    tmp.replace(out)
    return EvaluationResult.from_record(result.as_record(), path=str(out))


def latest_recorded(run_dir: str | Path) -> EvaluationResult | None:
    """The evaluation last recorded in ``run_dir/evaluations/`` (by write time), or None."""
    found = sorted((Path(run_dir) / "evaluations").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    return EvaluationResult.from_record(json.loads(found[-1].read_text()), str(found[-1])) if found else None


def _row(md: dict, this: bool = False) -> str:
    metrics, ck, ds = md.get("metrics") or {}, md.get("checkpoint") or {}, md.get("dataset") or {}

    def num(k):
        v = metrics.get(k)
        return f"{v:.5g}" if isinstance(v, (int, float)) else "–"

    held = (md.get("heldout_manifest_sha256") or "")[:12]
    return (
        f"| {ck.get('step', '?')}{' (this)' if this else ''} | `{(ck.get('sha256') or '')[:12]}` | "
        f"{ds.get('ref') or ''} | `{(md.get('code_commit') or '')[:12]}` | "
        f"{md.get('evaluation', '?')} | `{held}` | {num('action_mse')} | {num('latent_mse')} |"
    )


def comparison_table(current: dict, earlier: list[dict]) -> str:
    """Markdown: this evaluation (``EvaluationResult.as_metadata``), then earlier ones (newest first, one row
    per checkpoint x held-out manifest x evaluation)."""
    head = (
        "| step | checkpoint | dataset | code | evaluation | held-out | action MSE | latent MSE |\n"
        "|---|---|---|---|---|---|---|---|"
    )

    def ident(md):
        return ((md.get("checkpoint") or {}).get("sha256"), md.get("heldout_manifest_sha256"), md.get("evaluation"))

    seen, rows = {ident(current)}, [_row(current, this=True)]
    for md in earlier:
        if ident(md) not in seen:
            seen.add(ident(md))
            rows.append(_row(md))
    return "\n".join([head, *rows])


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


__all__ = [
    "DEFAULT",
    "ENTRY_POINT_GROUP",
    "EVALUATIONS",
    "EvaluationResult",
    "checkpoint_ref",
    "comparison_table",
    "dataset_ref",
    "evaluate",
    "evaluate_checkpoint",
    "latest_recorded",
    "load_model",
    "register",
    "resolve",
]
