"""The requeue path end to end: a real ``torchrun`` job (gloo, CPU) checkpoints mid-epoch on one world
size and resumes on another; the samples every rank trained on, read back from the trainer's own
sample log, are one epoch exactly, in the order a single process reads it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from trainer.dataset import SampleSpec
from trainer.elastic import ElasticStream
from trainer.model import ModelConfig
from trainer.train import LoaderConfig, TrainConfig

from .processes import run_bounded
from .test_gop_dataset import keys, loader
from .test_train import _free_port, manifest_file

SPEC = SampleSpec(image_size=(32, 32), anchors="every", anchor_every_s=0.5)
MODEL = ModelConfig(image_size=(32, 32), channels=(8, 16), latent=16, width=64, depth=1)


def launch(cfg: TrainConfig, world: int, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(cfg.to_json())
    train = ["-m", "trainer.train", "--config", str(path)]
    if world == 1:
        cmd = [sys.executable, *train]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc-per-node={world}",
            "--max-restarts=0",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
            *train,
        ]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    done = run_bounded(cmd, env, 400)
    assert done.returncode == 0, done.stderr[-3000:]


def trained_on(run_dir: Path) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(step, rank) -> the batch's samples, from every attempt's sample logs."""
    out = {}
    for log in sorted(run_dir.glob("attempts/*/samples.rank*.jsonl")):
        rank = int(log.name.split(".rank")[1].split(".")[0])
        for line in log.read_text().splitlines():
            r = json.loads(line)
            assert (r["step"], rank) not in out, f"step {r['step']} of rank {rank} logged twice"
            out[(r["step"], rank)] = list(zip(r["rows"], r["anchor_ns"], strict=True))
    return out


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_run_requeued_on_another_world_size_trains_on_one_epoch_exactly(tmp_path, mcap_fleet, before, after):
    _, manifest = mcap_fleet
    reference = ElasticStream(manifest, SPEC, batch_size=2, shards=4)
    epoch = keys(loader(reference, 0))  # global batch g, as one process reads the epoch
    per_epoch = reference.batches_per_epoch
    assert reference.n_shards == 2 and per_epoch == 24  # 48 dense samples in 2 shards of 12 batches of 2
    first_steps = 8 // before  # 8 global batches in, mid-epoch
    rest_steps = (per_epoch - 8) // after
    base = dict(
        manifest=manifest_file(tmp_path, manifest),
        run_dir=str(tmp_path / "run"),
        batch_size=2,
        workers=0,
        log_every=1,
        sample_log=True,
        model=MODEL,
        sample=SPEC,
        loader=LoaderConfig(shards=4),
    )
    launch(TrainConfig(steps=first_steps, checkpoint_every=first_steps, **base), before, tmp_path, "first")
    launch(TrainConfig(steps=first_steps + rest_steps, checkpoint_every=100, **base), after, tmp_path, "requeued")

    seen = trained_on(tmp_path / "run")
    assert len(seen) == first_steps * before + rest_steps * after == per_epoch  # every step of every rank, once
    for (step, rank), batch in seen.items():
        if step <= first_steps:
            g = (step - 1) * before + rank
        else:
            g = first_steps * before + (step - first_steps - 1) * after + rank
        assert batch == epoch[g], (step, rank, g)  # the single-process order, batch for batch
    samples = [s for b in seen.values() for s in b]
    assert len(samples) == len(set(samples)) == reference.rows  # one epoch: none repeated, none skipped
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["resumed_from"] == first_steps and result["world_size"] == after
    assert (
        "resuming a %d-rank checkpoint on %d ranks" % (before, after)
        in (tmp_path / "run" / "attempts" / "0" / "rank0.log").read_text()
    )
