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
from collections.abc import Callable
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
    raise KeyError(f"unknown evaluation {name!r}: not registered ({', '.join(sorted(EVALUATIONS))}), "
                   f"not a 'module:function' path, not in entry point group {ENTRY_POINT_GROUP!r}")


@register(DEFAULT)
@torch.no_grad()
def evaluate(model: WorldActionModel, manifest_table: pa.Table, spec, *, batch_size: int = 8,
             open_file=None) -> dict:
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
    return {"segments": n, "action_mse": sum(per_step) / chunk, "action_mse_per_step": per_step,
            "latent_mse": float(latent_sq / n)}


def load_model(run_dir: str | Path, step: int | None = None) -> tuple[WorldActionModel, TrainConfig, CheckpointInfo]:
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


def checkpoint_ref(run_dir: str | Path, info: CheckpointInfo) -> dict:
    marker = (info.path / MARKER).read_bytes()
    return {"run_dir": str(run_dir), "step": info.step, "path": str(info.path),
            "sha256": hashlib.sha256(marker).hexdigest()}


def dataset_ref(lineage: dict) -> dict:
    """The training data's version as the lineage names it: ``ref`` is the dataset registry's
    ``name@version`` when training named one, else ``manifest:<sha256 prefix>``."""
    out = {k: lineage[k] for k in ("curation_spec", "manifest", "manifest_sha256") if k in lineage}
    sha = lineage.get("manifest_sha256") or ""
    out["ref"] = lineage.get("dataset") or (f"manifest:{sha[:16]}" if sha else "")
    return out


def evaluate_checkpoint(run_dir: str | Path, manifest_url: str, *, step: int | None = None,
                        evaluation: str = DEFAULT, batch_size: int = 8, cache_dir: str | Path | None = None,
                        open_file=None, record: bool = True) -> dict:
    """Run ``evaluation`` on checkpoint ``step`` (default: latest) of ``run_dir`` against the manifest at
    ``manifest_url`` (its Arrow IPC URL). With ``record``, the result is also written to
    ``run_dir/evaluations/``, next to the checkpoints it describes."""
    run_dir = Path(run_dir)
    model, cfg, info = load_model(run_dir, step)
    local = local_copy(manifest_url, cache_dir or run_dir / "node-cache")
    heldout_sha = local.stem  # local_copy names the copy by its verified SHA-256
    torch.manual_seed(0)  # an evaluation that samples is repeatable
    metrics = resolve(evaluation)(model, open_manifest(local), cfg.sample, batch_size=batch_size,
                                  open_file=open_file)
    lineage = dict(info.extra.get("lineage", {}))
    result = {
        "evaluation": {"name": evaluation, "metrics": metrics},
        "checkpoint": checkpoint_ref(run_dir, info),
        "lineage": lineage,
        "dataset": dataset_ref(lineage),
        "code_commit": lineage.get("code_commit"),
        "heldout_manifest": manifest_url,
        "heldout_manifest_sha256": heldout_sha,
        # the same data the model trained on is no held-out set: say so instead of hiding it
        "heldout_is_training_data": heldout_sha == lineage.get("manifest_sha256"),
    }
    if record:
        out = run_dir / "evaluations" / f"step-{info.step:09d}-{_slug(evaluation)}-{heldout_sha[:12]}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
        result["path"] = str(out)
    return result


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


__all__ = ["DEFAULT", "ENTRY_POINT_GROUP", "EVALUATIONS", "checkpoint_ref", "dataset_ref", "evaluate",
           "evaluate_checkpoint", "load_model", "register", "resolve"]
