"""A run refuses a manifest holding episodes its model cannot read (cameras, proprio and action widths),
before any rank starts, naming each episode and what it lacks; the layouts come from the episodes."""

import json

import pyarrow as pa
import pytest

from dyna_resources.episodes.layout import Layout, episode_layout
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.sources import samples
from dyna_resources.sources.lerobot import read_lerobot_dataset
from trainer.dataset import SampleSpec
from trainer.launch import LayoutMismatchError, check_manifest_layout
from trainer.model import ModelConfig

from .test_manifest_streams import write

SPEC, MODEL = SampleSpec(), ModelConfig()
ARM = {"joint_states": {"position": 7, "velocity": 7}, "gripper": {"position": 1}, "action": {"command": 8}}


def layout(cameras=("head", "left", "right"), streams=None) -> str:
    return json.dumps({"cameras": list(cameras), "streams": streams or ARM}, sort_keys=True, separators=(",", ":"))


def test_episodes_the_model_cannot_read_are_named_with_what_they_lack(tmp_path):
    good = layout()
    two_cameras = layout(cameras=("head", "left"))
    no_velocity = layout(streams={**ARM, "joint_states": {"position": 7}})
    six_joints = layout(streams={**ARM, "joint_states": {"position": 6, "velocity": 6}})
    values = [good, two_cameras, no_velocity, good, six_joints, None, two_cameras]
    ids = ["a", "b", "c", "d", "e", "f", "b"]  # a manifest has a row per segment: b twice
    arrow = write(tmp_path / "m.arrow", {"episode_id": ids, "stream_layout": pa.array(values).dictionary_encode()})
    with pytest.raises(LayoutMismatchError) as e:
        check_manifest_layout(arrow, SPEC, MODEL, "gs://m/spec.arrow")
    assert e.value.problems == {
        "2 camera(s) (head, left), the model reads 3": ["b"],
        "no joint_states.velocity": ["c"],
        "proprio joint_states.position 6 + joint_states.velocity 6 + gripper.position 1 = 13 values, "
        "the model reads 15": ["e"],
    }
    assert str(e.value).startswith("manifest gs://m/spec.arrow: 3 episode(s) the model cannot read:")
    # a, d: the model's layout; f: registered before layouts were recorded, not judged
    check_manifest_layout(write(tmp_path / "ok.arrow", {"episode_id": ["a", "f"], "stream_layout": [good, None]}),
                          SPEC, MODEL, "ok")  # fmt: skip
    check_manifest_layout(write(tmp_path / "old.arrow", {"episode_id": ["a"]}), SPEC, MODEL, "old")


def test_cameras_read_by_name_must_all_be_there_and_the_action_its_width():
    assert Layout.parse(layout()).lacks(
        cameras=("head", "top"), camera_count=3, proprio=SPEC.proprio_streams, proprio_width=15,
        action=SPEC.action_stream, action_width=8,
    ) == "no camera top (has head, left, right)"  # fmt: skip
    wide = Layout.parse(layout(streams={**ARM, "action": {"command": 14}}))
    assert wide.lacks(
        cameras=None, camera_count=3, proprio=SPEC.proprio_streams, proprio_width=15,
        action=SPEC.action_stream, action_width=8,
    ) == "action.command 14 values, the model reads 8"  # fmt: skip


def _lacks(text: str) -> str:
    return Layout.parse(text).lacks(
        cameras=SPEC.cameras,
        camera_count=MODEL.cameras,
        proprio=SPEC.proprio_streams,
        proprio_width=MODEL.proprio_dim,
        action=SPEC.action_stream,
        action_width=MODEL.action_dim,
    )


def test_the_sample_fleet_fits_the_model_and_a_lerobot_dataset_of_it_does_not(tmp_path, episode_factory):
    """The layouts the pre gates record, from the episodes themselves: the legacy HDF5 is what the sample
    model reads; the same episode as LeRobot rows holds no joint velocity and no gripper stream."""
    gen = episode_factory(episode_id="ep-layout", seed=71, duration_s=1.0)
    with RawEpisode(gen.path) as raw:
        text = episode_layout(raw)
        assert Layout.parse(text).cameras == tuple(sorted(raw.cameras))
    assert _lacks(text) == ""
    (ep,) = read_lerobot_dataset(samples.write_dataset([gen.path], tmp_path / "ds", version="v3.0"))
    assert _lacks(episode_layout(ep)) == "no joint_states.velocity, gripper.position"
