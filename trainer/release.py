"""Model distribution: export a checkpoint's weights (no optimizer, no data position) with its lineage,
and publish them once to the origin store, content-addressed, so that every site and inference replica
pulls the same bytes through its page cache instead of each one downloading from the training cluster.

A release folder holds:

- ``model.pt``: ``torch.save`` of the model's state dict; its SHA-256 addresses the release;
- ``model.safetensors``: the same tensors in the safetensors format (no pickle: any framework
  reads it), with the lineage in its metadata header, so the file alone says where it came from;
- ``model.json``: model config, SHA-256 and size of both weight files, lineage, source checkpoint.

In the store it lives at ``models/<name>/<sha256[:16]>/``, ``model.json`` uploaded last: a folder
without it is an interrupted upload, never a release. Publishing the same bytes again uploads nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from dyna_resources.storage.stores import Store

from .evaluate import checkpoint_ref, dataset_ref, load_model
from .model import ModelConfig, WorldActionModel

WEIGHTS = "model.pt"
SAFETENSORS = "model.safetensors"
SIDECAR = "model.json"


@dataclass(frozen=True)
class Release:
    url: str  # the release folder in the store
    sha256: str
    size: int
    already_released: bool
    sidecar: dict


def export_weights(
    run_dir: str | os.PathLike, step: int | None = None, out_dir: str | os.PathLike | None = None
) -> Path:
    """Write checkpoint ``step`` (default: latest) of ``run_dir`` as a release folder (default:
    ``run_dir/releases/step-…``); returns that folder."""
    model, cfg, info = load_model(run_dir, step)
    out = Path(out_dir) if out_dir else Path(run_dir) / "releases" / f"step-{info.step:09d}"
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    weights = out / WEIGHTS
    tmp = out / f".{WEIGHTS}.tmp"
    torch.save(state, tmp)
    tmp.replace(weights)
    lineage = dict(info.extra.get("lineage", {}))
    sidecar = {
        "format": "torch-state-dict",
        "weights": WEIGHTS,
        "sha256": _sha256(weights),
        "size": weights.stat().st_size,
        "model_config": cfg.model.as_dict(),
        "lineage": lineage,
        "dataset": dataset_ref(lineage),
        "code_commit": lineage.get("code_commit"),
        "source": checkpoint_ref(run_dir, info),
    }
    sidecar["safetensors"] = _write_safetensors(state, out / SAFETENSORS, safetensors_metadata(sidecar))
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=1, sort_keys=True))
    return out


def safetensors_metadata(sidecar: dict) -> dict[str, str]:
    """The safetensors header's metadata (string -> string): one ``lineage.<key>`` entry per lineage
    field, the model config and source checkpoint as JSON, and the ``model.pt`` hash that addresses
    the release. ``format: pt`` is what Hugging Face loaders expect of PyTorch weights."""

    def text(v) -> str:
        return v if isinstance(v, str) else json.dumps(v, sort_keys=True)

    return {
        "format": "pt",
        "model_config": text(sidecar["model_config"]),
        "source": text(sidecar["source"]),
        "release_sha256": sidecar["sha256"],
        **{f"lineage.{k}": text(v) for k, v in sidecar["lineage"].items()},
    }


def publish(weights_dir: str | os.PathLike, store_url: str | Store, name: str) -> Release:
    """Upload the release folder to ``<store>/models/<name>/<sha256[:16]>/`` unless it is already there."""
    weights_dir = Path(weights_dir)
    sidecar = _verified_sidecar(weights_dir)
    store = store_url if isinstance(store_url, Store) else Store.from_url(store_url)
    prefix = f"models/{name}/{sidecar['sha256'][:16]}"
    url = store.url(prefix)
    if store.exists(f"{prefix}/{SIDECAR}"):
        there = json.loads(store.cat(f"{prefix}/{SIDECAR}"))
        if _files(there) == _files(sidecar) and all(
            store.info(f"{prefix}/{f}").size == size for f, (_, size) in _files(there).items()
        ):
            return Release(
                url=url, sha256=sidecar["sha256"], size=sidecar["size"], already_released=True, sidecar=there
            )
    # damaged, or from before the safetensors copy: not a release until re-uploaded whole
    store.delete(f"{prefix}/{SIDECAR}")
    for f in _files(sidecar):
        store.put_file(weights_dir / f, f"{prefix}/{f}")
    store.put_file(weights_dir / SIDECAR, f"{prefix}/{SIDECAR}")  # last: it marks the release complete
    return Release(url=url, sha256=sidecar["sha256"], size=sidecar["size"], already_released=False, sidecar=sidecar)


def load_weights(release_dir: str | os.PathLike) -> WorldActionModel:
    """A model from a (downloaded) release folder, read from its safetensors copy (no pickle) when
    it has one, else from ``model.pt``; the weights must match ``model.json``."""
    release_dir = Path(release_dir)
    sidecar = _verified_sidecar(release_dir)
    model = WorldActionModel(ModelConfig.from_dict(sidecar["model_config"]))
    if "safetensors" in sidecar:
        state = safetensors.torch.load_file(release_dir / SAFETENSORS, device="cpu")
    else:
        state = torch.load(release_dir / WEIGHTS, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def _files(sidecar: dict) -> dict[str, tuple[str | None, int | None]]:
    """The weight files a ``model.json`` lists: name -> (SHA-256, size)."""
    out = {WEIGHTS: (sidecar.get("sha256"), sidecar.get("size"))}
    if "safetensors" in sidecar:
        out[SAFETENSORS] = (sidecar["safetensors"]["sha256"], sidecar["safetensors"]["size"])
    return out


def _verified_sidecar(folder: Path) -> dict:
    """``model.json`` of ``folder``, after checking that every weight file it lists matches its hash."""
    sidecar = json.loads((folder / SIDECAR).read_text())
    for f, (sha, _) in _files(sidecar).items():
        actual = _sha256(folder / f)
        if actual != sha:
            raise ValueError(f"{folder / f} does not match its {SIDECAR}: SHA-256 {actual}, expected {sha}")
    return sidecar


def _write_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> dict:
    """Write ``state`` as safetensors at ``path`` (atomically); returns its file name, SHA-256 and size."""
    data = _sorted_metadata(safetensors.torch.save(state, metadata=metadata))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "format": "safetensors"}


def _sorted_metadata(data: bytes) -> bytes:
    """``data`` with its header's ``__metadata__`` keys sorted. safetensors serializes the metadata
    from a Rust HashMap, whose order (so the file's bytes and hash) changes from process to process;
    sorted, one checkpoint always exports to the same bytes. Only the order changes, never a length,
    so the tensors' offsets stay valid."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:
        raise ValueError(f"safetensors header grew from {n} to {len(text)} bytes when its metadata was sorted")
    return data[:8] + text.ljust(n, b" ") + data[8 + n :]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


__all__ = ["Release", "export_weights", "load_weights", "publish", "safetensors_metadata"]
