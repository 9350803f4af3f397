"""LeRobot format v2.1 against the `lerobot` package that writes it (0.3.2), both directions.

lerobot 0.3.2 runs in its own venv (see harness.py); the tests skip when it is absent.
"""

from __future__ import annotations

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
    V21_VENV,
    check_import_lands_exactly,
    check_read_what_lerobot_wrote,
    make_source,
    psnr,
    rows,
)

pytestmark = pytest.mark.skipif(not V21_VENV.available, reason=V21_VENV.skip_reason)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("lerobot-v21")


@pytest.fixture(scope="module")
def source(work) -> dict:
    return make_source(work / "source.npz")


@pytest.fixture(scope="module")
def lerobot_dataset(work, source):
    root = work / "written-by-lerobot"
    V21_VENV.run("create", root, work / "source.npz", home=work)
    return root


@pytest.fixture(scope="module")
def lerobot_view_of_source(work, lerobot_dataset) -> dict:
    return V21_VENV.load(lerobot_dataset, work)


def test_read_lerobot_reads_what_lerobot_wrote(lerobot_dataset, source, lerobot_view_of_source):
    assert lerobot_view_of_source["meta"]["codebase_version"] == "v2.1"
    check_read_what_lerobot_wrote(lerobot_dataset, source, lerobot_view_of_source)


def test_import_lerobot_lands_lerobot_dataset_exactly(work, lerobot_dataset, source):
    check_import_lands_exactly(lerobot_dataset, work / "landing", source)


def test_lerobot_loads_write_lerobot_v21(work, source):
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
    root = write_lerobot(episodes, work / "written-by-us", fps=FPS, version="v2.1", robot_type="so100")
    dt = 1 / FPS
    got = V21_VENV.load(root, work, {"observation.state": [-dt, 0.0], "observation.images.wrist": [0.0, dt]})
    assert got["meta"]["codebase_version"] == "v2.1" and got["meta"]["tasks"] == list(TASKS)
    np.testing.assert_array_equal(got["action"], rows(source, "action"))
    np.testing.assert_array_equal(got["delta/observation.state"][:, 1], rows(source, "state"))
    np.testing.assert_array_equal(got["delta/observation.state_is_pad"][:, 0], got["frame_index"] == 0)
    ours = list(read_lerobot(root))
    for cam, seen in (("top", got["observation.images.top"]), ("wrist", got["delta/observation.images.wrist"][:, 0])):
        mine = np.concatenate([e.frames[f"observation.images.{cam}"] for e in ours])
        # lerobot decodes our full-range BT.601 H.264 as we do (range and matrix honoured)
        assert psnr(rows(source, cam), seen) >= psnr(rows(source, cam), mine) - RGB_CONVERSION_DB, cam
        assert psnr(rows(source, cam), seen) > 35, cam


@pytest.mark.skipif(not V3_VENV.available, reason=V3_VENV.skip_reason)
def test_v21_round_trip_to_v3_within_1_db(work, lerobot_dataset, source, lerobot_view_of_source):
    """lerobot 0.3.2's dataset imported, transcoded, exported as v3.0 and read by lerobot 0.4."""
    settings = TranscodeSettings(video=VideoSettings(crf=TRANSCODE_CRF))
    mcaps = []
    for path in import_lerobot(lerobot_dataset, work / "landing-rt"):
        mcaps.append(work / "mcap" / f"{path.stem}.mcap")
        transcode_episode(path, mcaps[-1], settings)
    got = V3_VENV.load(export_lerobot([m.as_uri() for m in mcaps], work / "exported"), work)
    np.testing.assert_array_equal(got["observation.state"], rows(source, "state"))
    for cam in CAMERAS:
        key = f"observation.images.{cam}"
        p_in = psnr(rows(source, cam), lerobot_view_of_source[key])
        assert psnr(rows(source, cam), got[key]) >= p_in - 1.0, cam
