"""LeRobot interop against the `lerobot` package itself (0.4, format v3.0), both directions.

lerobot runs in its own venv (see harness.py); the tests skip when it is absent. Source frames
are made here; lerobot writes them with its own writer (AV1, limited range, a keyframe every 2
frames) and reads datasets with its own loader (torchcodec), offline.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.lerobot import (
    TRANSCODE_CRF,
    LeRobotEpisode,
    export_lerobot,
    import_lerobot,
    read_lerobot,
    write_lerobot,
)
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode

from .harness import (
    CAMERAS,
    FPS,
    LENGTHS,
    RGB_CONVERSION_DB,
    TASKS,
    V3_VENV,
    check_import_lands_exactly,
    check_read_what_lerobot_wrote,
    make_source,
    psnr,
    rows,
)

pytestmark = pytest.mark.skipif(not V3_VENV.available, reason=V3_VENV.skip_reason)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("lerobot")


@pytest.fixture(scope="module")
def source(work) -> dict:
    return make_source(work / "source.npz")


@pytest.fixture(scope="module")
def lerobot_dataset(work, source):
    root = work / "written-by-lerobot"
    V3_VENV.run("create", root, work / "source.npz", home=work)
    return root


@pytest.fixture(scope="module")
def lerobot_view_of_source(work, lerobot_dataset) -> dict:
    return V3_VENV.load(lerobot_dataset, work)


@pytest.fixture(scope="module")
def exported(work, lerobot_dataset):
    """lerobot's dataset imported as raw episodes, transcoded to MCAP, exported as v3.0."""
    landing = import_lerobot(lerobot_dataset, work / "landing")
    settings = TranscodeSettings(video=VideoSettings(crf=TRANSCODE_CRF))
    mcaps = []
    for p in landing:
        mcaps.append(work / "mcap" / f"{p.stem}.mcap")
        transcode_episode(p, mcaps[-1], settings)
    return export_lerobot([m.as_uri() for m in mcaps], work / "exported")


# -- lerobot writes, we read ---------------------------------------------------------------------
def test_read_lerobot_reads_what_lerobot_wrote(lerobot_dataset, source, lerobot_view_of_source):
    check_read_what_lerobot_wrote(lerobot_dataset, source, lerobot_view_of_source)


def test_import_lerobot_lands_lerobot_dataset_exactly(work, lerobot_dataset, source):
    check_import_lands_exactly(lerobot_dataset, work / "landing-check", source, robot_id="so100-1")


# -- we write, lerobot reads -----------------------------------------------------------------------
def test_lerobot_loads_our_export_within_1_db(work, exported, source, lerobot_view_of_source):
    got = V3_VENV.load(exported, work)
    assert got["meta"]["codebase_version"] == "v3.0" and got["meta"]["fps"] == FPS
    assert got["meta"]["total_episodes"] == 2 and got["meta"]["tasks"] == list(TASKS)
    np.testing.assert_array_equal(got["observation.state"], rows(source, "state"))
    np.testing.assert_array_equal(got["action"], rows(source, "action"))
    np.testing.assert_array_equal(got["episode_index"], np.repeat([0, 1], LENGTHS))
    np.testing.assert_array_equal(got["frame_index"], np.concatenate([np.arange(n) for n in LENGTHS]))
    np.testing.assert_allclose(got["timestamp"], got["frame_index"] / FPS, atol=1e-6)
    assert list(got["task"]) == [TASKS[e] for e in got["episode_index"]]
    for cam in CAMERAS:
        key = f"observation.images.{cam}"
        original = rows(source, cam)
        p_in = psnr(original, lerobot_view_of_source[key])
        p_out = psnr(original, got[key])
        assert p_out >= p_in - 1.0, (cam, p_in, p_out)


def test_lerobot_delta_timestamps_on_our_export(work, exported, source):
    dt = 1 / FPS
    delta = {"observation.images.top": [-2 * dt, 0.0], "observation.state": [-dt, 0.0, dt], "action": [0.0, dt, 2 * dt]}
    got = V3_VENV.load(exported, work, delta)
    plain = V3_VENV.load(exported, work)
    ep = got["episode_index"]
    starts = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])[ep]
    ends = np.cumsum(LENGTHS)[ep]
    row = np.arange(len(ep))
    for key, name in (("observation.state", "state"), ("action", "action")):
        offsets = np.round(np.asarray(delta[key]) * FPS).astype(int)
        want = row[:, None] + offsets
        np.testing.assert_array_equal(got[f"delta/{key}_is_pad"], (want < starts[:, None]) | (want >= ends[:, None]))
        clamped = np.clip(want, starts[:, None], ends[:, None] - 1)  # lerobot repeats the edge row
        np.testing.assert_array_equal(got[f"delta/{key}"], rows(source, name)[clamped])
    key = "observation.images.top"
    want = np.clip(row[:, None] + np.array([-2, 0]), starts[:, None], ends[:, None] - 1)
    np.testing.assert_array_equal(got[f"delta/{key}"], plain[key][want])


def test_lerobot_loads_write_lerobot_pixels(work, source):
    episodes = [
        LeRobotEpisode(
            index=k,
            task=TASKS[k],
            fps=FPS,
            timestamps=np.arange(n) / FPS,
            states=source[f"state_{k}"],
            actions=source[f"action_{k}"],
            frames={f"observation.images.{c}": source[f"{c}_{k}"] for c in CAMERAS},
        )
        for k, n in enumerate(LENGTHS)
    ]
    root = write_lerobot(episodes, work / "written-by-us", fps=FPS)
    got = V3_VENV.load(root, work)
    np.testing.assert_array_equal(got["observation.state"], rows(source, "state"))
    np.testing.assert_array_equal(got["action"], rows(source, "action"))
    ours = list(read_lerobot(root))
    for cam in CAMERAS:
        key = f"observation.images.{cam}"
        original = rows(source, cam)
        # lerobot decodes our full-range BT.601 H.264 as we do (range and matrix honoured)
        mine = np.concatenate([e.frames[key] for e in ours])
        assert psnr(original, got[key]) >= psnr(original, mine) - RGB_CONVERSION_DB, cam
        assert psnr(original, got[key]) > 35, cam


def test_lerobot_dataset_tools_accept_our_export(work, exported, source):
    """lerobot's merge (it concatenates the MP4s), split and delete (they need our per-episode
    metadata and statistics). A merge needs equal features, so the same codec: a second export."""
    other = shutil.copytree(exported, work / "exported-again")
    V3_VENV.run("edit", exported, other, work / "edited", work / "edited.json", home=work)
    got = json.loads((work / "edited.json").read_text())
    total = sum(LENGTHS)
    assert got["merged"]["episodes"] == 4 and got["merged"]["frames"] == 2 * total
    assert (
        got["pruned"]
        == got["rest"]
        == {"episodes": 1, "frames": LENGTHS[1], "last_state": source["state_1"][-1].tolist()}
    )
    assert got["first"]["frames"] == LENGTHS[0]


def test_statistics_match_lerobots(exported, lerobot_dataset, source):
    ours = json.loads((exported / "meta/stats.json").read_text())
    theirs = json.loads((lerobot_dataset / "meta/stats.json").read_text())
    assert ours.keys() == theirs.keys()
    for key, stats in theirs.items():
        assert ours[key].keys() == stats.keys(), key
        spread = np.asarray(stats["max"]) - np.asarray(stats["min"])
        for name, value in stats.items():
            # Images: lerobot's are of its source frames, ours of decoded video (extremes move most).
            # Quantiles: lerobot estimates them from 5000-bin histograms.
            tol = 1e-5
            if key.startswith("observation.images."):
                if name == "std":
                    # lerobot 0.4.4 squares uint8 pixels (overflow): its per-episode std is 0, so
                    # compare with the source's true one.
                    value = (rows(source, key.removeprefix("observation.images.")) / 255.0).reshape(-1, 3).std(0)
                    value = value.reshape(3, 1, 1)
                tol = 0.2 if name in ("min", "max") else 0.02
            elif name.startswith("q"):
                tol = 2 * spread / 5000 + 1e-9
            diff = np.abs(np.asarray(ours[key][name]) - np.asarray(value))
            assert np.all(diff <= tol), (key, name, ours[key][name], value)
