"""The trainer end to end: a falling loss on CPU, a rank killed mid-run restarts in place and resumes
from the latest complete checkpoint with the losses the run would have had, and the checkpoints
asset launches it through Dagster Pipes and records lineage."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dyna_resources.catalog.manifest import write_manifest
from trainer.dataset import SampleSpec
from trainer.faults import ENV as FAULT_ENV
from trainer.model import ModelConfig
from trainer.summary import TrainSummary
from trainer.train import TrainConfig, run

from .processes import run_bounded

SMALL = dict(
    model=ModelConfig(image_size=(32, 32), channels=(8, 16), latent=16, width=64, depth=1),
    sample=SampleSpec(image_size=(32, 32)),
)


def manifest_file(tmp_path, manifest) -> str:
    info = write_manifest(manifest, tmp_path / "manifests", "train-test")
    return info.arrow


def test_single_process_run_lowers_the_loss_and_checkpoints(tmp_path, mcap_fleet):
    _, manifest = mcap_fleet
    cfg = TrainConfig(
        manifest=manifest_file(tmp_path, manifest),
        run_dir=str(tmp_path / "run"),
        steps=24,
        batch_size=4,
        workers=0,
        checkpoint_every=10,
        log_every=4,
        lineage={"manifest_sha256": "abc"},
        **SMALL,
    )
    summary = run(cfg)
    losses = summary.losses
    assert summary.steps == 24 and len(losses) == 24
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (22, 23, 24)) / 3
    assert last < 0.7 * first
    assert [c["step"] for c in summary.checkpoints] == [10, 20, 24]
    done = json.loads((tmp_path / "run" / "checkpoints" / "step-000000024" / "COMPLETE.json").read_text())
    assert done["extra"]["lineage"] == {"manifest_sha256": "abc"}
    assert (tmp_path / "run" / "attempts" / "0" / "rank0.log").exists()
    assert TrainSummary.read(tmp_path / "run") == summary  # result.json holds the whole summary, types and all
    assert summary.checkpoint is not None and summary.checkpoint.step == 24 and summary.data_version
    again = run(cfg)  # the same run again: resumes at its last checkpoint and has nothing left to do
    assert again.resumed_from == 24 and again.losses == {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(cfg: TrainConfig, tmp_path: Path, name: str, fault: dict | None = None) -> subprocess.CompletedProcess:
    """torchrun with 2 workers; ``fault``: the test-only kill (trainer/faults.py), through the
    environment the workers inherit."""
    path = tmp_path / f"{name}.json"
    path.write_text(cfg.to_json())
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = json.dumps(fault)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        "-m",
        "trainer.train",
        "--config",
        str(path),
    ]
    return run_bounded(cmd, env, 400)


def test_killed_rank_restarts_in_place_and_resumes_with_the_same_losses(tmp_path, mcap_fleet):
    _, manifest = mcap_fleet
    base = dict(
        manifest=manifest_file(tmp_path, manifest),
        steps=9,
        batch_size=2,
        workers=0,
        checkpoint_every=4,
        log_every=1,
        **SMALL,
    )
    clean = _torchrun(TrainConfig(run_dir=str(tmp_path / "clean"), **base), tmp_path, "clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    faulty = _torchrun(
        TrainConfig(run_dir=str(tmp_path / "faulty"), **base),
        tmp_path,
        "faulty",
        fault={"step": 6, "rank": 1, "attempt": 0},
    )
    assert faulty.returncode == 0, faulty.stderr[-3000:]

    def losses(run_dir):
        out = {}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            out.setdefault(m["attempt"], {})[m["step"]] = m["loss"]
        return out

    clean_losses, faulty_losses = losses(tmp_path / "clean"), losses(tmp_path / "faulty")
    assert sorted(faulty_losses) == [0, 1]  # a second attempt ran
    assert max(faulty_losses[0]) == 6  # rank 1 died after step 6 (rank 0, which logs, finished it)
    assert sorted(faulty_losses[1]) == [5, 6, 7, 8, 9]  # resumed after the step-4 checkpoint
    for step in range(1, 10):
        got = faulty_losses[1].get(step, faulty_losses[0].get(step))
        assert got == pytest.approx(clean_losses[0][step], rel=1e-6, abs=1e-7), step
    result = json.loads((tmp_path / "faulty" / "result.json").read_text())
    assert result["attempt"] == 1 and result["resumed_from"] == 4 and result["steps"] == 9
    assert (tmp_path / "faulty" / "attempts" / "0" / "rank1.log").read_text().count("fault injection") == 1
    assert (tmp_path / "faulty" / "attempts" / "1" / "rank0.log").exists()


def test_training_curves_draw_loss_and_data_wait_and_refuse_nothing_to_draw():
    from trainer.plots import training_curves_png

    png = training_curves_png(
        [{"step": 1, "loss": 2.0, "data_wait_fraction": 0.5}, {"step": 2, "loss": 1.0, "data_wait_fraction": 0.1}]
    )
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no progress point"):
        training_curves_png([{"loss": 1.0}])
