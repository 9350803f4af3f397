"""Resuming trusts file contents, not file metadata: a shard with one flipped byte and its atime and
mtime put back (size and inode unchanged too) is caught by the real trainer's resume, which picks the
previous intact checkpoint and names the damaged shard; with every checkpoint damaged the run fails
(exit status, message naming the shards) unless it is configured to start fresh."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dyna_resources.catalog.manifest import write_manifest
from trainer.checkpoint import (
    MARKER,
    CheckpointManager,
    NoIntactCheckpointError,
    step_dir,
)
from trainer.dataset import SampleSpec
from trainer.model import ModelConfig
from trainer.train import TrainConfig, run

from .processes import run_bounded

REPO = Path(__file__).resolve().parents[2]
SMALL = {
    "model": ModelConfig(image_size=(32, 32), channels=(8, 16), latent=16, width=64, depth=1),
    "sample": SampleSpec(image_size=(32, 32)),
}
SHARD = "__0_0.distcp"


def flip_byte_keeping_metadata(path: Path) -> None:
    """One byte in the middle of ``path`` inverted in place; atime and mtime restored."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, mcap_fleet) -> TrainConfig:
    """A finished 8-step run with checkpoints at steps 4 and 8."""
    _, manifest = mcap_fleet
    root = tmp_path_factory.mktemp("integrity")
    arrow = write_manifest(manifest, root / "manifests", "integrity").arrow
    cfg = TrainConfig(
        manifest=arrow,
        run_dir=str(root / "run"),
        steps=8,
        batch_size=2,
        workers=0,
        checkpoint_every=4,
        log_every=4,
        **SMALL,
    )
    assert [c["step"] for c in run(cfg).checkpoints] == [4, 8]
    return cfg


@pytest.fixture
def trained(finished_run, tmp_path) -> TrainConfig:
    """A copy of the finished run whose checkpoints a resume has verified, so that stamps of the
    verified files' size, mtime and inode lie next to them (what used to be trusted)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run.run_dir, run_dir)
    mgr = CheckpointManager(run_dir / "checkpoints")
    assert mgr.latest().step == 8
    mgr.close()
    with CheckpointManager(run_dir / "checkpoints") as mgr:
        mgr._materialize(4, "earlier-resume")  # as a resume that found step 8 missing would have
    return replace(finished_run, run_dir=str(run_dir))


def shard(cfg: TrainConfig, step: int) -> Path:
    return Path(cfg.run_dir) / "checkpoints" / step_dir(step) / SHARD


def attempt_log(cfg: TrainConfig) -> str:
    return "".join(p.read_text() for p in sorted((Path(cfg.run_dir) / "attempts").glob("*/rank0.log")))


def test_bit_rot_with_mtime_kept_resumes_from_the_previous_intact_checkpoint(trained):
    flip_byte_keeping_metadata(shard(trained, 8))
    longer = replace(trained, steps=10)
    summary = run(longer)
    assert summary.resumed_from == 4
    assert sorted(summary.losses) == [5, 6, 7, 8, 9, 10]
    (reason,) = summary.skipped_checkpoints
    assert reason.startswith(f"{step_dir(8)} (rank 0): ") and SHARD in reason and "sha256" in reason
    assert json.loads((Path(trained.run_dir) / "result.json").read_text())["skipped_checkpoints"] == [reason]
    assert f"damaged checkpoint skipped: {reason}" in attempt_log(trained)
    # the new step-8 checkpoint replaced the damaged one: it verifies again
    assert CheckpointManager(Path(trained.run_dir) / "checkpoints").latest().step == 10


def test_every_checkpoint_damaged_fails_the_run_naming_the_shards(trained, tmp_path):
    for step in (4, 8):
        flip_byte_keeping_metadata(shard(trained, step))
    before = (Path(trained.run_dir) / "metrics.jsonl").read_text()
    config = tmp_path / "resume.json"
    config.write_text(replace(trained, steps=10).to_json())
    proc = run_bounded(
        [sys.executable, "-m", "trainer.train", "--config", str(config)],
        {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        300,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert "CheckpointError: no intact checkpoint to resume from in " in proc.stderr
    for step in (8, 4):
        assert f"{step_dir(step)} (rank 0): " in proc.stderr
    assert proc.stderr.count(SHARD) >= 2
    assert "set all_checkpoints_damaged to 'start_fresh'" in proc.stderr
    assert (Path(trained.run_dir) / "metrics.jsonl").read_text() == before  # not a single step trained


def test_every_checkpoint_damaged_starts_fresh_when_configured(trained):
    for step in (4, 8):
        flip_byte_keeping_metadata(shard(trained, step))
    summary = run(replace(trained, all_checkpoints_damaged="start_fresh"))
    assert summary.started_fresh is True and summary.resumed_from is None
    assert sorted(summary.losses) == list(range(1, 9))
    assert [r.split(" ", 1)[0] for r in summary.skipped_checkpoints] == [step_dir(8), step_dir(4)]
    assert all(SHARD in r for r in summary.skipped_checkpoints)
    assert "starting from step 0" in attempt_log(trained)
    mgr = CheckpointManager(Path(trained.run_dir) / "checkpoints")
    assert mgr.latest().step == 8 and not mgr.latest().skipped  # rewritten whole


def test_manager_rehashes_on_every_resume(tmp_path):
    """The engine alone: a stamp of verified files from an earlier resume is not trusted."""
    import torch

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, {"w": torch.ones(1000)})
    assert CheckpointManager(tmp_path).latest().step == 1  # verified once, stamped
    flip_byte_keeping_metadata(tmp_path / step_dir(1) / SHARD)
    with pytest.warns(UserWarning, match=rf"{step_dir(1)}.*{SHARD}"), pytest.raises(NoIntactCheckpointError) as err:
        CheckpointManager(tmp_path).latest()
    assert err.value.skipped == [
        (
            f"{step_dir(1)} (rank 0): {tmp_path / step_dir(1)}: files missing or not "
            f"matching {MARKER} (size/sha256): {SHARD}"
        )
    ]
    assert CheckpointManager(tmp_path / "empty").latest() is None  # nothing there: a fresh start


def test_config_rejects_an_unknown_choice():
    with pytest.raises(ValueError, match="all_checkpoints_damaged: 'ignore' is not one of 'error', 'start_fresh'"):
        TrainConfig(manifest="m.arrow", run_dir="r", all_checkpoints_damaged="ignore")  # type: ignore[arg-type]
    cfg = TrainConfig(manifest="m.arrow", run_dir="r")
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    assert cfg.identity_json() == replace(cfg, all_checkpoints_damaged="start_fresh").identity_json()


def test_trainer_resource_passes_the_switch_without_changing_the_run(tmp_path, mcap_fleet):
    """The ``checkpoints`` asset's face: switching to start_fresh trains the same run folder."""
    from dyna_resources.resources import CacheResource, HomeResource, TrainerResource

    _, manifest = mcap_fleet
    home = tmp_path / "home"
    write_manifest(manifest, home / "manifests", "spec-t")
    faces = {"home": HomeResource(root=str(home)), "cache": CacheResource(home=HomeResource(root=str(home)))}
    default = TrainerResource(steps=6).prepare(**faces, partition="spec-t")
    assert default.config["all_checkpoints_damaged"] == "error"
    fresh = TrainerResource(steps=6, all_checkpoints_damaged="start_fresh").prepare(**faces, partition="spec-t")
    assert fresh.run_dir == default.run_dir
    assert json.loads((fresh.run_dir / "config.json").read_text())["all_checkpoints_damaged"] == "start_fresh"
    with pytest.raises(ValueError, match="all_checkpoints_damaged: 'fresh'"):
        TrainerResource(all_checkpoints_damaged="fresh").prepare(**faces, partition="spec-t")
