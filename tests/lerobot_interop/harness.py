"""Shared by the tests against the `lerobot` package: source data, and lerobot run in its own venv.

lerobot cannot live in .venv (lerobot 0.4 needs torch<2.11, 0.3 a torchvision matching its torch;
the project pins torch 2.13), so ``lerobot_side.py`` runs in a venv of its own (``make
lerobot-venv``, ``make lerobot-v21-venv``) as a subprocess, exchanging datasets and .npz files.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).with_name("lerobot_side.py")

FPS = 30
H, W = 96, 128
CAMERAS = ("top", "wrist")
TASKS = ("pick the cube", "place the cube")
LENGTHS = (20, 14)


def psnr(a, b) -> float:
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def frames(n: int, seed: int) -> np.ndarray:
    """Gradients, blocky texture and a moving square: every frame differs, detail to lose."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    tex = (np.random.default_rng(seed).random((H // 8, W // 8)) * 50).repeat(8, 0).repeat(8, 1)
    tex = np.roll(tex, (3, 3), (0, 1))  # block edges off the 2x2 chroma grid, as in real scenes
    i = np.arange(n, dtype=np.float64)[:, None, None]
    planes = np.broadcast_arrays(20 + x + 2 * i + 10 * seed + tex, 40 + y + i + tex, 80 + (x + y) / 3 + 17 * seed + tex)
    out = np.stack(planes, -1).clip(0, 255).astype(np.uint8)
    for k in range(n):
        cx = 7 + (k * 3) % (W - 24)
        out[k, 31:50, cx : cx + 15] = (200, 60 + seed * 10, 40)
    return out


def make_source(path: Path) -> dict:
    """What lerobot is given, saved for lerobot_side.py: per episode states, actions, RGB frames."""
    rng = np.random.default_rng(7)
    src = {"fps": np.array(FPS), "cameras": np.array(CAMERAS), "tasks": np.array(TASKS), "lengths": np.array(LENGTHS)}
    for k, n in enumerate(LENGTHS):
        src[f"state_{k}"] = rng.normal(size=(n, 6)).astype(np.float32)
        src[f"action_{k}"] = rng.normal(size=(n, 7)).astype(np.float32)
        for j, cam in enumerate(CAMERAS):
            src[f"{cam}_{k}"] = frames(n, 2 * k + j)
    np.savez(path, **src)
    return src


# lerobot converts decoded frames to RGB with swscale (chroma replicated), we with libjpeg's
# triangle filter: on the same video the two differ by up to ~0.7 dB PSNR either way, by content.
# A wrong range or matrix would cost 5-20 dB.
RGB_CONVERSION_DB = 1.0


def rows(source: dict, key: str) -> np.ndarray:
    """A per-episode source array, all episodes' rows in order."""
    return np.concatenate([source[f"{key}_{k}"] for k in range(len(LENGTHS))])


class LeRobotVenv:
    """A venv holding the lerobot package, named by an environment variable or a default path."""

    def __init__(self, env_var: str, default: str, make_target: str):
        self.path = Path(os.environ.get(env_var) or REPO / default)
        self.skip_reason = (
            f"no lerobot venv at {self.path} ({env_var}): build it with `make {make_target}` "
            "(~2 min, 7-8 GB; lerobot's torch cannot share .venv with the project's torch 2.13)"
        )

    @property
    def available(self) -> bool:
        return (self.path / ".lerobot-stamp").exists()

    def run(self, *args: str | Path, home: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(home / "hf"), TOKENIZERS_PARALLELISM="false"
        )
        out = subprocess.run(
            [str(self.path / "bin/python"), str(SIDE), *map(str, args)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert out.returncode == 0, f"lerobot_side.py {args[0]} failed:\n{out.stderr[-6000:]}"

    def load(self, root: Path, home: Path, delta: dict | None = None) -> dict:
        """Every row of a dataset as lerobot's LeRobotDataset gives it (see lerobot_side.py)."""
        out = home / f"{root.name}-{'delta' if delta else 'rows'}.npz"
        self.run("load", root, out, *([json.dumps(delta)] if delta else []), home=home)
        with np.load(out) as z:
            return {k: z[k] for k in z.files} | {"meta": json.loads(str(z["meta"]))}


V3_VENV = LeRobotVenv("DYNA_LEROBOT_VENV", "build/lerobot-venv", "lerobot-venv")
V21_VENV = LeRobotVenv("DYNA_LEROBOT_V21_VENV", "build/lerobot-v21-venv", "lerobot-v21-venv")


def check_read_what_lerobot_wrote(dataset: Path, source: dict, seen: dict) -> None:
    """Our reader on a dataset lerobot wrote: rows exactly, frames as close to the source as
    lerobot's own decode (``seen``) within ``RGB_CONVERSION_DB``, and close to lerobot's pixels."""
    from dyna_resources.episodes.lerobot import read_lerobot

    episodes = list(read_lerobot(dataset))
    assert [e.index for e in episodes] == [0, 1] and [e.task for e in episodes] == list(TASKS)
    assert [len(e) for e in episodes] == list(LENGTHS)
    start = 0
    for k, ep in enumerate(episodes):
        np.testing.assert_array_equal(ep.states, source[f"state_{k}"])
        np.testing.assert_array_equal(ep.actions, source[f"action_{k}"])
        np.testing.assert_allclose(ep.timestamps, np.arange(len(ep)) / FPS, atol=1e-6)
        assert ep.state_names == [f"j{i}" for i in range(6)]
        span = slice(start, start + len(ep))
        for cam in CAMERAS:
            key = f"observation.images.{cam}"
            ours, theirs, original = np.asarray(ep.frames[key]), seen[key][span], source[f"{cam}_{k}"]
            assert psnr(original, ours) > 33, cam
            assert psnr(original, ours) >= psnr(original, theirs) - RGB_CONVERSION_DB, cam
            assert psnr(theirs, ours) > 38, cam
        start += len(ep)


def check_import_lands_exactly(dataset: Path, landing: Path, source: dict, **kwargs) -> None:
    """``import_lerobot`` on a dataset lerobot wrote: raw episodes with its task, robot type,
    cameras, exact states and actions, and JPEGs within 45 dB of the decoded video."""
    from dyna_resources.episodes.lerobot import import_lerobot, read_lerobot
    from dyna_resources.episodes.raw_format import RawEpisode

    paths = import_lerobot(dataset, landing, **kwargs)
    for k, (path, ep) in enumerate(zip(paths, read_lerobot(dataset), strict=True)):
        with RawEpisode(path) as raw:
            assert raw.meta.task == TASKS[k] and raw.meta.robot_model == "so100"  # info.json robot_type
            assert sorted(raw.cameras) == sorted(CAMERAS)
            np.testing.assert_array_equal(
                np.asarray(raw.streams["joint_states"].fields["position"]), source[f"state_{k}"]
            )
            np.testing.assert_array_equal(np.asarray(raw.streams["action"].fields["command"]), source[f"action_{k}"])
            for cam in CAMERAS:
                jpeg = np.stack(list(raw.cameras[cam].iter_frames()))
                assert psnr(np.asarray(ep.frames[f"observation.images.{cam}"]), jpeg) > 45, cam
