"""A long bag cut into episodes by the topic map's split rule is planned in one pass that keeps no frame,
and each episode is then read from its own log-time window of the bag: the same episode the whole bag's
read makes of it, while a message that does not decode costs only the episode it is in."""

from __future__ import annotations

import numpy as np
import pytest

from dyna_resources.episodes.errors import RawFormatError
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.items import member_path
from dyna_resources.ingest.pre_gates import inspect_item
from dyna_resources.sources.content import content_bytes
from dyna_resources.sources.ros2 import BagMember, plan_bag, read_bag, read_member
from dyna_resources.sources.topic_map import parse

from .bags import T0, BagSpec, topic_map_yaml, write_bag

GAP = {"rule": "gap", "gap_s": 2.0}


def _whole(path, spec, timestamps):
    (whole,) = read_bag(path, parse(topic_map_yaml(spec, timestamps=timestamps), "t"))
    return whole


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("timestamps", ["header", "log"])
def test_each_episode_read_from_its_window_is_the_whole_bags_part_of_it(tmp_path, storage, timestamps):
    # keyframes every 10 frames at 10 Hz, pauses at 1.5 s and 3.0 s: the 2nd and 3rd episodes open mid-GOP
    spec = BagSpec(duration_s=4.5, pauses=(1.5, 3.0), h264_camera="wrist", h264_gop=10, storage=storage)
    write_bag(tmp_path / "bag", spec)
    topics = parse(topic_map_yaml(spec, timestamps=timestamps, split=GAP), "t")
    members = plan_bag(tmp_path / "bag", topics)
    assert [m.episode_id for m in members] == ["bag-000", "bag-001", "bag-002"]
    assert [m.frames for m in members] == [30, 30, 30]  # two cameras, 15 frames each
    whole = _whole(tmp_path / "bag", spec, timestamps)
    units, unit_t = whole.cameras["wrist"].frames, whole.cameras["wrist"].timestamps_ns
    for m in members:
        ep = read_member(tmp_path / "bag", topics, BagMember.parse(m.episode_id, m.window()))
        assert ep.meta.episode_id == m.episode_id
        for name, cam in whole.cameras.items():
            keep = (cam.timestamps_ns >= m.lo) & (cam.timestamps_ns < m.hi)
            assert ep.cameras[name].timestamps_ns.tolist() == cam.timestamps_ns[keep].tolist()
            assert list(ep.cameras[name].frames) == [f for f, k in zip(cam.frames, keep, strict=True) if k]
        for name, s in whole.streams.items():
            keep = (s.timestamps_ns >= m.lo) & (s.timestamps_ns < m.hi)
            assert ep.streams[name].timestamps_ns.tolist() == s.timestamps_ns[keep].tolist()
            for f, col in s.fields.items():
                np.testing.assert_array_equal(ep.streams[name].fields[f], np.asarray(col)[keep])
        # an episode opening mid-GOP carries the units from the keyframe before: frames 10-14 of the 1st part
        first = int(np.flatnonzero(unit_t >= m.lo)[0])
        want = [] if first % 10 == 0 else units[first - first % 10 : first]
        assert ep.cameras["wrist"].preroll == want
    assert members[1].log_lo < members[0].log_hi  # the 2nd window reaches back to that keyframe
    assert members[0].log_hi <= members[2].log_lo  # and no further


def test_a_message_that_does_not_decode_costs_only_its_episode(tmp_path):
    """With log times the plan decodes no camera message: a garbled frame fails its own episode's read,
    which the pre gates hold back alone, naming the topic and the message; the other two are inspected,
    each with its window for the transcode."""
    spec = BagSpec(duration_s=4.5, pauses=(1.5, 3.0), garble=("/camera/wrist/image/compressed", 20))
    write_bag(tmp_path / "bag", spec)
    topics = parse(topic_map_yaml(spec, timestamps="log", split=GAP), "t")
    members = plan_bag(tmp_path / "bag", topics)
    with pytest.raises(RawFormatError) as e:
        read_member(tmp_path / "bag", topics, members[1])
    assert e.value.stream == "/camera/wrist/image/compressed" and "message 5 " in e.value.reason  # 20th of the bag
    assert f"logged at {T0 + 7_000_000_000} ns" in e.value.reason  # frame 20 at 2.0 s, after the 5 s pause
    inspections = inspect_item(tmp_path / "bag", "d/bag/metadata.yaml", GateConfig(), topics)
    assert [i.key for i in inspections] == [member_path("d/bag/metadata.yaml", m.episode_id) for m in members]
    assert sum(i.bytes for i in inspections) == content_bytes(tmp_path / "bag")
    held = inspections[1]
    assert held.episode is None and held.quarantine is not None
    assert held.quarantine["stream"] == "/camera/wrist/image/compressed"
    for insp, m in zip(inspections[::2], members[::2], strict=True):
        assert insp.quarantine is None and insp.episode is not None
        assert BagMember.parse(m.episode_id, insp.episode["source_window"]) == BagMember(
            m.episode_id, m.lo, m.hi, m.log_lo, m.log_hi
        )


def test_with_header_stamps_a_message_cut_short_after_its_stamp_costs_only_its_episode(tmp_path):
    """The plan reads a header stamp from the bytes a message starts with, decoding nothing: a message
    whose stamp is whole but whose rest does not decode fails only its own episode's read."""
    spec = BagSpec(
        duration_s=4.5, pauses=(1.5, 3.0), garble=("/camera/wrist/image/compressed", 20), garble_after_stamp=True
    )
    write_bag(tmp_path / "bag", spec)
    topics = parse(topic_map_yaml(spec, split=GAP), "t")
    members = plan_bag(tmp_path / "bag", topics)
    assert [m.frames for m in members] == [30, 30, 30]
    inspections = inspect_item(tmp_path / "bag", "d/bag/metadata.yaml", GateConfig(), topics)
    assert [i.key for i in inspections] == [member_path("d/bag/metadata.yaml", m.episode_id) for m in members]
    held = inspections[1]
    assert held.episode is None and held.quarantine["stream"] == "/camera/wrist/image/compressed"
    assert "message 5 " in held.quarantine["reason"] and "does not decode" in held.quarantine["reason"]
    assert all(i.quarantine is None and i.episode is not None for i in inspections[::2])


def test_with_header_stamps_a_message_cut_short_before_its_stamp_holds_the_whole_bag_back(tmp_path):
    """A message too short to hold its stamp is decoded by the plan, which fails: a bag it cannot plan
    is one inspection held back, naming the bag's topic."""
    spec = BagSpec(duration_s=4.5, pauses=(1.5, 3.0), garble=("/camera/wrist/image/compressed", 20))
    write_bag(tmp_path / "bag", spec)
    topics = parse(topic_map_yaml(spec, split=GAP), "t")
    (insp,) = inspect_item(tmp_path / "bag", "d/bag/metadata.yaml", GateConfig(), topics)
    assert insp.key == "d/bag/metadata.yaml" and insp.episode is None
    assert insp.quarantine is not None and insp.quarantine["stream"] == "/camera/wrist/image/compressed"
