"""ROS 2 bags written by rosbags' own writer, in both storage formats, read as episodes by a topic map:
compressed and raw images, JointState, a custom action type defined in the bag; split by a gap and by a
marker topic; and the hostile ones, each refused naming the bag and the topic."""

from __future__ import annotations

import numpy as np
import pytest

from dyna_resources.episodes.errors import MissingStreamError, RawFormatError, TimestampError
from dyna_resources.sources.ros2 import read_bag
from dyna_resources.sources.topic_map import TopicMapError, parse

from .bags import JOINTS, BagSpec, topic_map_yaml, write_bag


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_bag_reads_as_one_episode_with_header_stamps_and_the_custom_action(tmp_path, storage):
    spec = BagSpec(storage=storage, raw_camera="scene_left", custom_data={"robot_id": "arm-7", "task": "pick"})
    written = write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "test"))
    assert ep.source_format == "ros2" and ep.meta.episode_id == "bag"
    assert (ep.meta.robot_id, ep.meta.task) == ("arm-7", "pick")
    assert sorted(ep.cameras) == ["scene_left", "wrist"] and ep.cameras["wrist"].encoding == "jpeg"
    assert ep.cameras["scene_left"].encoding == "rgb"  # sensor_msgs/Image rgb8
    for cam in spec.cameras:
        want = written["frames"][cam]
        assert ep.cameras[cam].timestamps_ns.tolist() == [t for t, _ in want]  # header stamps, not log times
    assert np.array_equal(ep.cameras["scene_left"].frame(3), written["frames"]["scene_left"][3][1])  # lossless
    assert np.abs(ep.cameras["wrist"].frame(3).astype(int) - written["frames"]["wrist"][3][1]).mean() < 3  # JPEG q95
    joints = ep.streams["joint_states"]
    assert joints.timestamps_ns.tolist() == written["joint_t"]
    assert np.array_equal(joints.fields["position"], np.stack(written["position"]))
    assert set(joints.fields) == {"position", "velocity"} and joints.labels["position"] == JOINTS  # no effort sent
    action = ep.streams["action"]
    assert np.array_equal(action.fields["command"], np.stack(written["action"]))  # joints + gripper, in order
    assert ep.report["ignored_topics"] == [] and ep.duration_s > 1.8


def test_log_times_when_the_map_says_so(tmp_path):
    spec = BagSpec()
    written = write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec, timestamps="log"), "test"))
    assert ep.streams["joint_states"].timestamps_ns.tolist() == [t - spec.stamp_offset_ns for t in written["joint_t"]]


def test_a_long_bag_is_cut_at_its_pauses_or_its_markers(tmp_path):
    gap = BagSpec(duration_s=6.0, pauses=(2.0, 4.0))
    write_bag(tmp_path / "gap", gap)
    episodes = read_bag(tmp_path / "gap", parse(topic_map_yaml(gap, split={"rule": "gap", "gap_s": 1.0}), "t"))
    assert [e.meta.episode_id for e in episodes] == ["gap-000", "gap-001", "gap-002"]
    assert all(1.8 < e.duration_s < 2.05 for e in episodes)
    assert sum(len(e.streams["joint_states"]) for e in episodes) == 300  # every message in one episode
    marked = BagSpec(duration_s=4.0, markers=(0.0, 1.45, 2.95))  # log times; frames' stamps are 3 ms earlier
    write_bag(tmp_path / "marked", marked)
    split = {"rule": "marker", "topic": "/episode/start"}
    episodes = read_bag(tmp_path / "marked", parse(topic_map_yaml(marked, split=split), "t"))
    assert [len(e.cameras["wrist"]) for e in episodes] == [15, 15, 10]
    whole = read_bag(tmp_path / "marked", parse(topic_map_yaml(marked), "t"))  # the marker topic is not ignored
    assert len(whole) == 1 and whole[0].report["ignored_topics"] == ["/episode/start"]


def test_a_truncated_bag_is_refused_naming_it(tmp_path):
    write_bag(tmp_path / "bag", BagSpec())
    (storage,) = (tmp_path / "bag").glob("*.mcap")
    with open(storage, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    with pytest.raises(RawFormatError) as e:
        read_bag(tmp_path / "bag", parse(topic_map_yaml(BagSpec()), "t"))
    assert str(tmp_path / "bag") in str(e.value)


def test_a_garbled_message_is_named_with_its_topic_and_index(tmp_path):
    spec = BagSpec(storage="sqlite3", garble=("/joint_states", 17))
    write_bag(tmp_path / "bag", spec)
    with pytest.raises(RawFormatError, match=r"message 17 \(sensor_msgs/msg/JointState\) does not decode") as e:
        read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    assert e.value.stream == "/joint_states"


def test_a_mapped_topic_of_the_wrong_type_or_missing_and_an_unmapped_one_are_named(tmp_path):
    spec = BagSpec(extra_topics=("/diagnostics",))
    write_bag(tmp_path / "bag", spec)
    doc = topic_map_yaml(spec)
    doc["topics"]["/joint_states"] = {"camera": "joints"}  # a JointState as a camera
    with pytest.raises(RawFormatError, match="mapped as camera 'joints' but its type is sensor_msgs/msg/JointState"):
        read_bag(tmp_path / "bag", parse(doc, "t"))
    doc = topic_map_yaml(spec)
    doc["topics"]["/camera/top/image/compressed"] = {"camera": "top"}
    with pytest.raises(MissingStreamError, match="mapped topic /camera/top/image/compressed is not in the bag"):
        read_bag(tmp_path / "bag", parse(doc, "t"))
    with pytest.raises(RawFormatError, match="does not name: /diagnostics") as e:
        read_bag(tmp_path / "bag", parse(topic_map_yaml(spec, unmapped="refuse"), "t"))
    assert e.value.stream == "/diagnostics"
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    assert ep.report["ignored_topics"] == ["/diagnostics"]


def test_stamps_going_back_meet_the_timestamp_gate(tmp_path):
    spec = BagSpec(backwards_at=40)
    write_bag(tmp_path / "bag", spec)
    with pytest.raises(TimestampError, match="not strictly increasing at index 40") as e:
        read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    assert e.value.stream == "/joint_states"


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"topics": {"/a": {"camera": "x", "stream": "action"}}}, "topics./a"),
        ({"topics": {"/a": {"stream": "torque"}}}, "topics./a.stream"),
        ({"topics": {"no slash": {"camera": "x"}}}, "topics.no slash"),
        ({"topics": {"/a": {"camera": "x"}}, "timestamps": "wall"}, "timestamps"),
        ({"topics": {"/a": {"camera": "x"}}, "split": {"rule": "marker"}}, "split.topic"),
        ({"topics": {"/a": {"camera": "x"}, "/b": {"camera": "x"}}}, "topics"),
        ({"topics": {"/a": {"camera": "x"}}, "colour": 1}, "colour"),
    ],
)
def test_a_bad_topic_map_is_refused_naming_the_field(doc, field):
    with pytest.raises(TopicMapError, match=rf"^ros2_topics.yaml: {field}: "):
        parse(doc, "ros2_topics.yaml")
