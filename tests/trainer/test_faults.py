"""Fault injection is a test-only hook of the trainer's environment (``DYNA_TRAIN_FAULT``), not a field
of its production config: the config has no such field, an old config that asked for one is refused
by name, and the hook kills the trainer at the step it names (after that step's checkpoint completed),
from which a clean launch resumes. The two-rank kill under torchrun is
tests/trainer/test_train.py::test_killed_rank_restarts_in_place_and_resumes_with_the_same_losses."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dyna_resources.catalog.manifest import write_manifest
from trainer.dataset import SampleSpec
from trainer.faults import ENV, Fault, FaultSpecError
from trainer.model import ModelConfig
from trainer.train import TrainConfig

from .processes import run_bounded

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(
    model=ModelConfig(image_size=(32, 32), channels=(8, 16), latent=16, width=64, depth=1),
    sample=SampleSpec(image_size=(32, 32)),
)


def _field_names(cls) -> set[str]:
    """Every field name of a config dataclass and of the config dataclasses it holds."""
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            names |= _field_names(type(default))
    return names


def test_the_train_config_has_no_test_hook_field():
    names = _field_names(TrainConfig)
    assert {"model", "sample", "loader", "steps"} <= names  # the walk reached the nested configs
    assert [n for n in names if "fault" in n or "test" in n or "hook" in n] == []


def test_an_old_config_with_an_empty_fault_loads_and_one_asking_for_a_fault_is_refused_by_name():
    cfg = TrainConfig(manifest="m.arrow", run_dir="r", **SMALL)
    old = json.loads(cfg.to_json())
    assert "fault" not in old
    assert TrainConfig.from_json(json.dumps({**old, "fault": {}})) == cfg  # written before the hook moved
    with pytest.raises(ValueError, match=ENV) as e:
        TrainConfig.from_json(json.dumps({**old, "fault": {"step": 7, "rank": 1}}))
    assert '"step": 7' in str(e.value)


def test_the_fault_variable_is_parsed_or_refused_naming_it():
    assert Fault.from_env({}) is None and Fault.from_env({ENV: " "}) is None
    assert Fault.from_env({ENV: '{"step": 7, "rank": 1, "attempt": 0}'}) == Fault(step=7, rank=1, attempt=0)
    assert Fault.from_env({ENV: '{"step": 3, "wait": false}'}) == Fault(step=3, wait=False)
    for bad, why in [
        ("step=7", "not JSON"),
        ("[7]", "expected an object"),
        ('{"rank": 1}', "the step .* is required"),
        ('{"step": 7, "rnak": 1}', "unknown key.*rnak"),
        ('{"step": "7"}', "step must be an integer"),
        ('{"step": 7, "rank": -1}', "rank must be an integer"),
        ('{"step": 7, "wait": "no"}', "wait must be true or false"),
    ]:
        with pytest.raises(FaultSpecError, match=f"{ENV}: {why}"):
            Fault.from_env({ENV: bad})


def _train(cfg: TrainConfig, path: Path, fault: dict | None) -> subprocess.CompletedProcess:
    path.write_text(cfg.to_json())
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if fault is not None:
        env[ENV] = json.dumps(fault)
    return run_bounded([sys.executable, "-m", "trainer.train", "--config", str(path)], env, 300, cwd=REPO)


def test_the_environment_hook_kills_the_trainer_at_the_named_step_and_a_clean_launch_resumes(tmp_path, mcap_fleet):
    _, manifest = mcap_fleet
    arrow = write_manifest(manifest, tmp_path / "manifests", "fault-test").arrow
    run_dir = tmp_path / "run"
    cfg = TrainConfig(
        manifest=arrow, run_dir=str(run_dir), steps=8, batch_size=2, workers=0, checkpoint_every=3, log_every=1, **SMALL
    )

    killed = _train(cfg, tmp_path / "run.json", fault={"step": 6})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 6 done and logged, nothing after it
    assert "SIGKILL at step 6" in (run_dir / "attempts" / "0" / "rank0.log").read_text()
    assert not (run_dir / "result.json").exists()
    # the step-6 checkpoint was in flight when the step ended: the hook let it complete first
    assert json.loads((run_dir / "checkpoints" / "latest").read_text())["step"] == 6

    resumed = _train(cfg, tmp_path / "run.json", fault=None)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from"] == 6 and result["steps"] == 8
