"""Checkpoints: async DCP save, bit-identical resume, retention, killed and corrupted saves,
upload to S3 (moto) and restore from it, two gloo ranks with FSDP2 shards, an unreachable store."""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainer.checkpoint import (
    MARKER,
    AppState,
    CheckpointError,
    CheckpointManager,
    RNGState,
    step_dir,
)

REPO = Path(__file__).resolve().parents[2]


# ---- a tiny deterministic training run -------------------------------------------------------------
class Loader:
    """Batches from a fixed tensor; its position is the data state a resume must restore."""

    def __init__(self, offset: int = 0):
        g = torch.Generator().manual_seed(123 + offset)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
        self.pos = 0

    def next(self):
        i = self.pos % 16
        self.pos += 1
        return self.x[4 * i : 4 * i + 4], self.y[4 * i : 4 * i + 4]

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))


def fresh(seed: int):
    """Model, optimizer and loader with every RNG seeded from ``seed``."""
    seed_all(seed)
    model = make_model()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), Loader()


def train_step(model, opt, loader) -> float:
    x, y = loader.next()
    # dropout draws from torch's RNG; python's and numpy's feed the loss too, so all three must resume
    noise = 1e-3 * random.random() + 1e-3 * float(np.random.rand())
    loss = ((model(x) - y) ** 2).mean() + noise
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def app_state(model, opt, loader):
    return {"app": AppState(model, opt), "rng": RNGState(), "data": loader}


def tensor_state(value: float, n: int = 1000):
    return {"w": {"a": torch.full((n,), value), "b": torch.arange(n, dtype=torch.float64) * value}}


def complete_steps(folder: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in folder.glob("step-*") if (p / MARKER).exists())


# ---- single process -------------------------------------------------------------------------------
def test_async_save_and_resume_give_bit_identical_losses(tmp_path):
    model, opt, loader = fresh(0)
    reference = [train_step(model, opt, loader) for _ in range(10)]

    model, opt, loader = fresh(0)
    losses = [train_step(model, opt, loader) for _ in range(5)]
    with CheckpointManager(tmp_path / "ckpt") as mgr:
        handle = mgr.save(5, app_state(model, opt, loader), extra={"commit": "abc123"})
        # training goes on (mutating parameters and RNGs) while the checkpoint is written
        losses += [train_step(model, opt, loader) for _ in range(5)]
        mgr.wait()
    assert losses == reference
    assert handle.done() and handle.write_s is not None and handle.total_s >= handle.write_s
    assert handle.blocking_s >= 0 and handle.upload_s is None  # no store
    assert [h.step for h in mgr.history] == [5]

    model, opt, loader = fresh(1)  # other weights, other RNG states, data position 0
    mgr = CheckpointManager(tmp_path / "ckpt")
    info = mgr.latest()
    assert info.step == 5 and info.extra == {"commit": "abc123"}
    assert set(info.files) == {".metadata", "__0_0.distcp"}
    assert mgr.load(info, app_state(model, opt, loader)) == {"commit": "abc123"}
    assert loader.pos == 5
    assert [train_step(model, opt, loader) for _ in range(5)] == reference[5:]


def test_keep_last_k_locally_and_in_the_store(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "store"
    (local / step_dir(5)).mkdir(parents=True)  # incomplete, older than the newest complete one: pruned
    (local / step_dir(999)).mkdir()  # incomplete and newer: left alone (it could be in flight)
    with CheckpointManager(local, store_url=f"file://{remote}", keep=2) as mgr:
        for step in range(1, 6):
            mgr.save(step * 10, tensor_state(step))
    assert [h.step for h in mgr.history] == [10, 20, 30, 40, 50]
    assert all(h.upload_s is not None for h in mgr.history)
    assert complete_steps(local) == [40, 50] and complete_steps(remote) == [40, 50]
    assert sorted(p.name for p in local.glob("step-*")) == [step_dir(40), step_dir(50), step_dir(999)]
    assert sorted(p.name for p in remote.iterdir()) == ["latest.json", step_dir(40), step_dir(50)]
    assert json.loads((local / "latest").read_text()) == {"step": 50, "dir": step_dir(50)}
    assert json.loads((remote / "latest.json").read_text()) == {"step": 50, "dir": step_dir(50)}
    record = json.loads((local / step_dir(50) / MARKER).read_text())
    for name, meta in record["files"].items():
        assert (remote / step_dir(50) / name).stat().st_size == meta["size"]


def test_folder_without_marker_is_ignored(tmp_path):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, tensor_state(1.0))
        mgr.save(2, tensor_state(2.0))
    (tmp_path / step_dir(2) / MARKER).unlink()  # as if killed after the shards, before the marker
    with pytest.warns(UserWarning, match=step_dir(2)):
        info = CheckpointManager(tmp_path).latest()
    assert info.step == 1


_KILLED_CHILD = textwrap.dedent("""
    import sys, time
    import torch
    import torch.distributed.checkpoint.filesystem as fs
    from trainer.checkpoint import CheckpointManager

    mgr = CheckpointManager(sys.argv[1])
    mgr.save(1, {"w": torch.ones(1 << 20)}).wait()

    def slow_finish(self, *args, **kwargs):  # the shards are written; .metadata would be next
        print("WRITING", flush=True)
        time.sleep(600)

    fs._FileSystemWriter.finish = slow_finish
    mgr.save(2, {"w": torch.full((1 << 20,), 2.0)})
    time.sleep(600)
""")


def test_save_killed_mid_write_is_ignored(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert select.select([child.stdout], [], [], 60)[0], "the child never reached the slow write"
        assert child.stdout.readline().strip() == "WRITING"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert any((tmp_path / step_dir(2)).glob("*.distcp")) and not (tmp_path / step_dir(2) / MARKER).exists()

    mgr = CheckpointManager(tmp_path)
    with pytest.warns(UserWarning, match=step_dir(2)):
        info = mgr.latest()
    assert info.step == 1
    state = {"w": torch.zeros(1 << 20)}
    mgr.load(info, state)
    assert torch.equal(state["w"], torch.ones(1 << 20))


def test_corrupted_shard_is_skipped_with_a_warning(tmp_path):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, tensor_state(1.0))
        mgr.save(2, tensor_state(2.0))
    assert CheckpointManager(tmp_path).latest().step == 2  # verified once (and stamped)
    shard = tmp_path / step_dir(2) / "__0_0.distcp"
    with open(shard, "r+b") as f:  # same size, other bytes
        f.seek(shard.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))

    mgr = CheckpointManager(tmp_path)
    with pytest.warns(UserWarning, match=rf"{step_dir(2)}.*__0_0\.distcp"):
        info = mgr.latest()
    assert info.step == 1
    state = tensor_state(0.0)
    mgr.load(info, state)
    assert torch.equal(state["w"]["a"], torch.full((1000,), 1.0))


# ---- object stores --------------------------------------------------------------------------------
def _s3_env(monkeypatch, secret="testing"):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


def test_upload_to_s3_and_restore_into_an_empty_local_dir(s3, monkeypatch, tmp_path):
    _s3_env(monkeypatch)
    prefix = f"ckpt-{uuid.uuid4().hex[:8]}"
    url, local = s3.url(prefix), tmp_path / "local"
    with CheckpointManager(local, store_url=url, endpoint_url=s3.endpoint) as mgr:
        mgr.save(1, tensor_state(1.0), extra={"manifest": "m1"})
        mgr.save(2, tensor_state(2.0), extra={"manifest": "m2"})
    keys = sorted(k.split(f"{prefix}/", 1)[1] for k in s3.fs.find(f"{s3.bucket}/{prefix}"))
    assert keys == [
        "latest.json",
        *(f"{step_dir(s)}/{n}" for s in (1, 2) for n in (".metadata", MARKER, "__0_0.distcp")),
    ]

    shutil.rmtree(local)
    mgr = CheckpointManager(local, store_url=url, endpoint_url=s3.endpoint)
    info = mgr.latest()
    assert info.step == 2 and info.extra == {"manifest": "m2"}
    state = tensor_state(0.0)
    assert mgr.load(info, state) == {"manifest": "m2"}
    assert torch.equal(state["w"]["b"], tensor_state(2.0)["w"]["b"])

    # the newest remote shard damaged (same size): skipped with a warning, the previous one is used
    key = f"{s3.bucket}/{prefix}/{step_dir(2)}/__0_0.distcp"
    data = bytearray(s3.fs.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    s3.fs.pipe_file(key, bytes(data))
    shutil.rmtree(local)
    mgr = CheckpointManager(local, store_url=url, endpoint_url=s3.endpoint)
    with pytest.warns(UserWarning, match=step_dir(2)):
        info = mgr.latest()
    assert info.step == 1
    mgr.load(info, state)
    assert torch.equal(state["w"]["a"], torch.full((1000,), 1.0))


def test_unreachable_store_surfaces_on_wait_without_credentials(s3_unreachable_endpoint, monkeypatch, tmp_path):
    secret = "sekrit-do-not-print"
    _s3_env(monkeypatch, secret)
    endpoint = s3_unreachable_endpoint.replace("//", "//user:pw-do-not-print@")
    mgr = CheckpointManager(tmp_path, store_url="s3://bucket/ckpt", endpoint_url=endpoint)
    mgr.save(1, tensor_state(1.0))
    with pytest.raises(CheckpointError) as err:
        mgr.wait()
    text = f"{err.value} {err.value.__cause__!r}"
    assert "s3://bucket/ckpt" in str(err.value) and step_dir(1) in str(err.value)
    assert secret not in text and "pw-do-not-print" not in text
    mgr.wait()  # raised once, not again
    assert (tmp_path / step_dir(1) / MARKER).exists()  # the local checkpoint is complete all the same


# ---- two ranks (gloo, FSDP2 shards) ---------------------------------------------------------------
def _two_rank_worker(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))

        def sharded(seed):
            torch.manual_seed(seed)  # the same initial weights on both ranks: FSDP shards them
            model = make_model()
            fully_shard(model, mesh=mesh)
            seed_all(seed * 10 + rank)  # RNGs and data differ per rank
            return model, torch.optim.AdamW(model.parameters(), lr=1e-2), Loader(offset=rank)

        local = Path(root) / "local"
        mgr = CheckpointManager(local, store_url=f"file://{root}/store", keep=2)
        model, opt, loader = sharded(0)
        for _ in range(3):
            train_step(model, opt, loader)
        mgr.save(3, app_state(model, opt, loader))
        after = [train_step(model, opt, loader) for _ in range(3)]
        mgr.wait()

        model, opt, loader = sharded(1)
        info = mgr.latest()
        mgr.load(info, app_state(model, opt, loader))
        resumed = [train_step(model, opt, loader) for _ in range(3)]

        # a fresh node: both ranks find the checkpoint in the store, one downloads, both load
        mgr.close()
        dist.barrier()
        if rank == 0:
            shutil.rmtree(local)
        dist.barrier()
        mgr = CheckpointManager(local, store_url=f"file://{root}/store", keep=2)
        model, opt, loader = sharded(2)
        info = mgr.latest()
        mgr.load(info, app_state(model, opt, loader))
        downloaded = [train_step(model, opt, loader) for _ in range(3)]
        Path(root, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "step": info.step,
                    "files": sorted(info.files),
                    "after": after,
                    "resumed": resumed,
                    "downloaded": downloaded,
                }
            )
        )
        mgr.close()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_save_shards_and_resume_equal(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(
        _two_rank_worker, args=(2, port, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert r["step"] == 3 and r["resumed"] == r["after"] == r["downloaded"]
        assert r["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert results[0]["after"] != results[1]["after"]  # each rank had its own data
    assert complete_steps(tmp_path / "store") == [3]
