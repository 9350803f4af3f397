"""Evaluations and releases of a checkpoint: results trace back to the dataset and code versions,
a trained model beats random weights, a release is published once and loads back bit-identical,
its safetensors copy carries the lineage and the checkpoint's exact tensors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from dyna_resources.catalog.manifest import write_manifest
from trainer import evaluate as ev
from trainer.dataset import SampleSpec
from trainer.manifest_loader import local_copy, open_manifest
from trainer.model import ModelConfig, WorldActionModel
from trainer.release import SAFETENSORS, export_weights, load_weights, publish
from trainer.train import TrainConfig, run

SMALL = {
    "model": ModelConfig(image_size=(32, 32), channels=(8, 16), latent=16, width=64, depth=1),
    "sample": SampleSpec(image_size=(32, 32)),
}
LINEAGE = {
    "curation_spec": "eval-t",
    "manifest_sha256": "",
    "schema_version": "s1",
    "pipeline_version": "p1",
    "code_commit": "c0ffee",
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, mcap_fleet):
    _, manifest = mcap_fleet
    tmp = tmp_path_factory.mktemp("eval")
    arrow = write_manifest(manifest, tmp / "manifests", "eval-t").arrow
    sha = local_copy(arrow, tmp / "cache").stem
    lineage = {**LINEAGE, "manifest": arrow, "manifest_sha256": sha}
    cfg = TrainConfig(
        manifest=arrow,
        run_dir=str(tmp / "run"),
        steps=16,
        batch_size=4,
        workers=0,
        checkpoint_every=8,
        lineage=lineage,
        **SMALL,
    )
    (tmp / "run").mkdir()
    (tmp / "run" / "config.json").write_text(cfg.to_json())  # as TrainerResource.prepare writes it
    run(cfg)
    return tmp / "run", arrow, sha


def test_evaluation_traces_to_checkpoint_dataset_and_code(trained):
    run_dir, arrow, sha = trained
    res = ev.evaluate_checkpoint(run_dir, arrow, batch_size=8)
    m = res.metrics
    assert res.evaluation == "offline_action_error"
    assert m["segments"] > 0 and len(m["action_mse_per_step"]) == SMALL["model"].action_chunk
    assert all(torch.isfinite(torch.tensor([m["action_mse"], m["latent_mse"], *m["action_mse_per_step"]])))
    assert res.checkpoint["step"] == 16 and len(res.checkpoint["sha256"]) == 64
    done = json.loads((run_dir / "checkpoints" / "step-000000016" / "COMPLETE.json").read_text())
    assert res.lineage == done["extra"]["lineage"]
    assert res.dataset["manifest_sha256"] == sha and res.code_commit == "c0ffee"
    assert res.dataset["ref"] == f"manifest:{sha[:16]}"  # no registry dataset named: the manifest's hash
    assert res.heldout_manifest_sha256 == sha and res.heldout_is_training_data
    assert json.loads(Path(res.path).read_text())["checkpoint"] == res.checkpoint
    assert ev.latest_recorded(run_dir) == res and ev.EvaluationResult.from_record(res.as_record(), res.path) == res

    again = ev.evaluate_checkpoint(run_dir, arrow, batch_size=8, record=False)
    assert (again.evaluation, again.metrics) == (res.evaluation, res.metrics) and again.path == ""  # deterministic

    earlier = ev.evaluate_checkpoint(run_dir, arrow, step=8, batch_size=8, record=False)
    assert earlier.checkpoint["step"] == 8 and earlier.checkpoint["sha256"] != res.checkpoint["sha256"]
    assert ev.latest_recorded(run_dir) == res  # not recorded: the latest recorded is still the first

    torch.manual_seed(123)
    table = open_manifest(local_copy(arrow, run_dir / "node-cache"))
    random = ev.evaluate(WorldActionModel(SMALL["model"]), table, SMALL["sample"], batch_size=8)
    assert random["action_mse"] > m["action_mse"]


def test_evaluations_are_pluggable(trained, monkeypatch):
    run_dir, arrow, _ = trained
    calls = []

    @ev.register("count_segments")
    def count(model, table, spec, *, batch_size, open_file):
        calls.append(batch_size)
        return {"rows": table.num_rows}

    monkeypatch.setitem(ev.EVALUATIONS, "count_segments", count)
    res = ev.evaluate_checkpoint(run_dir, arrow, evaluation="count_segments", batch_size=3, record=False)
    assert res.metrics["rows"] > 0 and calls == [3]
    assert ev.resolve("trainer.evaluate:evaluate") is ev.evaluate
    with pytest.raises(KeyError):
        ev.resolve("no-such-evaluation")


def test_release_is_published_once_and_loads_back_identical(trained, tmp_path):
    run_dir, _, sha = trained
    folder = export_weights(run_dir)
    sidecar = json.loads((folder / "model.json").read_text())
    assert sidecar["lineage"]["manifest_sha256"] == sha and sidecar["code_commit"] == "c0ffee"
    assert sidecar["source"]["step"] == 16
    store = f"file://{tmp_path / 'origin'}"
    first = publish(folder, store, "wam")
    assert not first.already_released and first.url.endswith(f"models/wam/{first.sha256[:16]}")
    assert export_weights(run_dir) == folder and json.loads((folder / "model.json").read_text()) == sidecar
    second = publish(folder, store, "wam")
    assert second.already_released and (second.url, second.sha256) == (first.url, first.sha256)

    released = load_weights(tmp_path / "origin" / "models" / "wam" / first.sha256[:16])
    model, _, _ = ev.load_model(run_dir)
    torch.manual_seed(0)
    frames = torch.randint(0, 255, (2, 3, 2, 3, 32, 32), dtype=torch.uint8)
    proprio = torch.randn(2, 40, 15)
    with torch.no_grad():
        for a, b in zip(released(frames, proprio), model(frames, proprio), strict=True):
            assert torch.equal(a, b)


def test_release_has_a_safetensors_copy_with_the_lineage_and_the_checkpoint_tensors(trained, tmp_path):
    run_dir, _, sha = trained
    folder = export_weights(run_dir, out_dir=tmp_path / "rel")
    sidecar = json.loads((folder / "model.json").read_text())
    path = folder / SAFETENSORS
    assert sidecar["safetensors"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()

    model, _, _ = ev.load_model(run_dir)
    expected, got = model.state_dict(), load_file(path)
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    assert meta["lineage.manifest_sha256"] == sha and meta["lineage.code_commit"] == "c0ffee"
    assert meta["release_sha256"] == sidecar["sha256"] and meta["format"] == "pt"
    assert json.loads(meta["model_config"]) == sidecar["model_config"]
    assert json.loads(meta["source"])["step"] == 16

    # content-addressed: a second export is byte-identical (safetensors' own metadata order is not)
    again = export_weights(run_dir, out_dir=tmp_path / "rel2")
    assert (again / SAFETENSORS).read_bytes() == path.read_bytes()
    rel = publish(folder, f"file://{tmp_path / 'origin'}", "wam")
    there = tmp_path / "origin" / "models" / "wam" / rel.sha256[:16]
    assert (there / SAFETENSORS).read_bytes() == path.read_bytes()

    (there / SAFETENSORS).write_bytes(path.read_bytes()[:-4])  # an interrupted copy
    with pytest.raises(ValueError, match=rf"{SAFETENSORS} does not match its model.json"):
        load_weights(there)
    assert not publish(folder, f"file://{tmp_path / 'origin'}", "wam").already_released  # uploaded again
    assert load_weights(there).state_dict().keys() == expected.keys()
