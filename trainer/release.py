"""Model distribution: export a checkpoint's weights (no optimizer, no data position) with its lineage,
and publish them once to the origin store, content-addressed, so that every site and inference replica
pulls the same bytes through its page cache instead of each one downloading from the training cluster.

A release folder holds ``model.pt`` (``torch.save`` of the model's state dict; safetensors is not in
this environment) and ``model.json`` (model config, SHA-256 and size of the weights, lineage, source
checkpoint). In the store it lives at ``models/<name>/<sha256[:16]>/``, ``model.json`` uploaded last:
a folder without it is an interrupted upload, never a release. Publishing the same bytes again
uploads nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dyna_resources.storage.stores import Store

from .evaluate import checkpoint_ref, dataset_ref, load_model
from .model import ModelConfig, WorldActionModel

WEIGHTS = "model.pt"
SIDECAR = "model.json"


@dataclass(frozen=True)
class Release:
    url: str  # the release folder in the store
    sha256: str
    size: int
    already_released: bool
    sidecar: dict


def export_weights(run_dir: str | os.PathLike, step: int | None = None, out_dir: str | os.PathLike | None = None
                   ) -> Path:
    """Write checkpoint ``step`` (default: latest) of ``run_dir`` as a release folder (default:
    ``run_dir/releases/step-…``); returns that folder."""
    model, cfg, info = load_model(run_dir, step)
    out = Path(out_dir) if out_dir else Path(run_dir) / "releases" / f"step-{info.step:09d}"
    out.mkdir(parents=True, exist_ok=True)
    weights = out / WEIGHTS
    tmp = out / f".{WEIGHTS}.tmp"
    torch.save({k: v.detach().contiguous() for k, v in model.state_dict().items()}, tmp)
    tmp.replace(weights)
    lineage = dict(info.extra.get("lineage", {}))
    sidecar = {"format": "torch-state-dict", "weights": WEIGHTS, "sha256": _sha256(weights),
               "size": weights.stat().st_size, "model_config": cfg.model.as_dict(), "lineage": lineage,
               "dataset": dataset_ref(lineage), "code_commit": lineage.get("code_commit"),
               "source": checkpoint_ref(run_dir, info)}
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=1, sort_keys=True))
    return out


def publish(weights_dir: str | os.PathLike, store_url: str | Store, name: str) -> Release:
    """Upload the release folder to ``<store>/models/<name>/<sha256[:16]>/`` unless it is already there."""
    weights_dir = Path(weights_dir)
    sidecar = json.loads((weights_dir / SIDECAR).read_text())
    if _sha256(weights_dir / WEIGHTS) != sidecar["sha256"]:
        raise ValueError(f"{weights_dir / WEIGHTS} does not match its {SIDECAR}")
    store = store_url if isinstance(store_url, Store) else Store.from_url(store_url)
    prefix = f"models/{name}/{sidecar['sha256'][:16]}"
    url = store.url(prefix)
    if store.exists(f"{prefix}/{SIDECAR}"):
        there = json.loads(store.cat(f"{prefix}/{SIDECAR}"))
        if there.get("sha256") == sidecar["sha256"] and store.info(f"{prefix}/{WEIGHTS}").size == sidecar["size"]:
            return Release(url=url, sha256=sidecar["sha256"], size=sidecar["size"], already_released=True,
                           sidecar=there)
    store.delete(f"{prefix}/{SIDECAR}")  # a damaged release: not a release until re-uploaded whole
    store.put_file(weights_dir / WEIGHTS, f"{prefix}/{WEIGHTS}")
    store.put_file(weights_dir / SIDECAR, f"{prefix}/{SIDECAR}")  # last: it marks the release complete
    return Release(url=url, sha256=sidecar["sha256"], size=sidecar["size"], already_released=False, sidecar=sidecar)


def load_weights(release_dir: str | os.PathLike) -> WorldActionModel:
    """A model from a (downloaded) release folder; the weights must match ``model.json``."""
    release_dir = Path(release_dir)
    sidecar = json.loads((release_dir / SIDECAR).read_text())
    if _sha256(release_dir / WEIGHTS) != sidecar["sha256"]:
        raise ValueError(f"{release_dir / WEIGHTS} does not match its {SIDECAR}")
    model = WorldActionModel(ModelConfig.from_dict(sidecar["model_config"]))
    model.load_state_dict(torch.load(release_dir / WEIGHTS, map_location="cpu", weights_only=True))
    return model.eval()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


__all__ = ["Release", "export_weights", "load_weights", "publish"]
