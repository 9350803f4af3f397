"""16-bit depth from ROS 2 bags (rosbags' own writer, MCAP and SQLite 3 storage) kept as its own stream:
16UC1 / mono16 millimetres as they are, 32FC1 metres rounded to millimetres (0 for no reading), either
byte order and padded rows; transcoded lossless to ``/depth/<name>`` (foxglove.RawImage) in chunks of
their own; the wrong encodings and topic maps refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from mcap.reader import make_reader

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.errors import RawFormatError
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.raw_format import RawEpisode, decode_jpeg
from dyna_resources.episodes.read_profile import TOPIC_GROUPS, ReadProfile
from dyna_resources.episodes.read_profiles import resolve
from dyna_resources.episodes.topics import STATS_METADATA
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.post_gates import post_gates
from dyna_resources.sources import samples
from dyna_resources.sources.ros2 import read_bag
from dyna_resources.sources.topic_map import TopicMapError, parse

from .bags import BagSpec, depth_topic, topic_map_yaml, write_bag

FAST = TranscodeSettings(video=VideoSettings(gop_frames=10, preset="veryfast"))
DEPTH = (("wrist_depth", "16UC1"), ("scene_depth", "32FC1"))


def mcap_depth(path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Every depth frame of an MCAP as the mcap library and protobuf read it: (log time, uint16 (H, W))."""
    out: dict[str, list[tuple[int, np.ndarray]]] = {}
    with open(path, "rb") as f:
        for schema, channel, message in make_reader(f, validate_crcs=True).iter_messages(log_time_order=True):
            if not channel.topic.startswith("/depth/"):
                continue
            assert schema is not None and schema.name == "foxglove.RawImage"
            img = RawImage.FromString(message.data)
            assert (img.encoding, img.step, img.frame_id) == ("16UC1", 2 * img.width, channel.topic[len("/depth/") :])
            assert img.timestamp.ToNanoseconds() == message.log_time
            frame = np.frombuffer(img.data, "<u2").reshape(img.height, img.width)
            out.setdefault(img.frame_id, []).append((message.log_time, frame))
    return out


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_16uc1_and_32fc1_depth_round_trip_exactly_in_chunks_of_their_own(tmp_path, storage):
    spec = BagSpec(storage=storage, duration_s=2.5, depth=DEPTH)
    written = write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    assert sorted(ep.depth) == ["scene_depth", "wrist_depth"] and sorted(ep.cameras) == ["scene_left", "wrist"]
    for name, want in written["depth"].items():
        d = ep.depth[name]
        assert d.topic == depth_topic(name) and d.timestamps_ns.tolist() == [t for t, _ in want]  # header stamps
        assert all(f.dtype == np.uint16 and np.array_equal(f, w) for f, (_, w) in zip(d.frames, want, strict=True))
    assert ep.depth["scene_depth"].frames[0][0, :6].tolist() == [0, 0, 0, 0, 0, 65535]  # NaN, inf, <0, >65.535 m

    out = tmp_path / "ep.mcap"
    report = transcode_episode(tmp_path / "bag", out, FAST, episode=ep)
    assert report.depth == {"scene_depth": 25, "wrist_depth": 25} and report.chunks["depth"] >= 3  # 1 s windows
    got = mcap_depth(out)
    for name, want in written["depth"].items():
        assert [t for t, _ in got[name]] == [t for t, _ in want]
        assert all(np.array_equal(g, w) for (_, g), (_, w) in zip(got[name], want, strict=True)), name
    with EpisodeReader(out) as r:
        assert r.depth == ["scene_depth", "wrist_depth"] and r.cameras == ["scene_left", "wrist"]
        assert r.streams == ["action", "joint_states"]  # depth is not a sample stream
        assert json.loads(r.metadata(STATS_METADATA)["depth"]) == report.depth
        for ci in r.summary.chunk_indexes:
            groups = {TOPIC_GROUPS.group_of(r.channels[c].topic).name for c in ci.message_index_offsets}
            assert len(groups) == 1 and ("depth" not in groups or ci.compression == "zstd")
        frames = list(r.iter_depth("wrist_depth"))
        assert [t for t, _ in frames] == [t for t, _ in written["depth"]["wrist_depth"]]
        assert all(np.array_equal(a, w) for (_, a), (_, w) in zip(frames, written["depth"]["wrist_depth"], strict=True))
        streams = r.read_streams(None, r.start_ns, 2**63 - 1)  # every sample
        assert np.array_equal(streams["joint_states"].timestamps_ns, written["joint_t"])


def test_big_endian_padded_rows_and_mono16_read_as_their_values(tmp_path):
    spec = BagSpec(depth=(("a", "mono16"), ("b", "32FC1")), depth_bigendian=True, depth_row_pad=6, duration_s=1.0)
    written = write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    for name, want in written["depth"].items():
        assert all(np.array_equal(f, w) for f, (_, w) in zip(ep.depth[name].frames, want, strict=True)), name


def test_a_depth_topic_is_optional_and_cut_with_its_episode(tmp_path):
    spec = BagSpec(duration_s=4.0, pauses=(2.0,), depth=(("d", "16UC1"),))
    written = write_bag(tmp_path / "bag", spec)
    episodes = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec, split={"rule": "gap", "gap_s": 1.0}), "t"))
    assert [len(e.depth["d"]) for e in episodes] == [20, 20]
    assert [t for e in episodes for t in e.depth["d"].timestamps_ns.tolist()] == [t for t, _ in written["depth"]["d"]]
    doc = topic_map_yaml(BagSpec(depth=(("d", "16UC1"),)))  # maps a depth topic the bag below lacks
    write_bag(tmp_path / "plain", BagSpec())
    (ep,) = read_bag(tmp_path / "plain", parse(doc, "t"))
    assert ep.depth == {} and sorted(ep.cameras) == ["scene_left", "wrist"]
    report = transcode_episode(tmp_path / "plain", tmp_path / "plain.mcap", FAST, episode=ep)
    assert report.depth == {} and "depth" not in report.chunks
    with EpisodeReader(tmp_path / "plain.mcap") as r:
        assert r.depth == [] and json.loads(r.metadata(STATS_METADATA)["depth"]) == {}


def test_a_depth_topic_of_another_encoding_or_type_is_refused_naming_it(tmp_path):
    spec = BagSpec(depth=(("d", "rgb8"),), duration_s=1.0)
    write_bag(tmp_path / "bag", spec)
    with pytest.raises(RawFormatError, match="frame 0: depth image encoding 'rgb8' is not one of 16UC1, mono16") as e:
        read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    assert e.value.stream == depth_topic("d") and str(tmp_path / "bag") in str(e.value)
    doc = topic_map_yaml(spec)
    doc["topics"]["/camera/wrist/image/compressed"] = {"depth": "wrist_depth"}
    with pytest.raises(RawFormatError, match="mapped as depth 'wrist_depth' but its type is .*CompressedImage") as e:
        read_bag(tmp_path / "bag", parse(doc, "t"))
    assert e.value.stream == "/camera/wrist/image/compressed"


def test_the_transcoder_refuses_a_depth_frame_of_another_size_naming_the_topic(tmp_path):
    spec = BagSpec(depth=(("d", "16UC1"),), duration_s=1.0)
    write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    ep.depth["d"].frames[4] = ep.depth["d"].frames[4][:-1]
    with pytest.raises(RawFormatError, match=r"frame 4 is uint16 \(47, 64\), expected uint16") as e:
        transcode_episode(tmp_path / "bag", tmp_path / "ep.mcap", FAST, episode=ep)
    assert e.value.stream == depth_topic("d") and not list(tmp_path.glob("*.mcap"))


def test_training_streams_leave_the_depth_chunks_as_they_were(tmp_path):
    spec = BagSpec(depth=(("d", "16UC1"),), duration_s=2.0)
    written = write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    profile = resolve("t64")
    assert profile.reads == TOPIC_GROUPS.reads == ("cameras", "proprio")  # no model reads depth yet: not warmed
    assert ReadProfile.from_dict(TOPIC_GROUPS.as_dict()) == TOPIC_GROUPS
    settings = TranscodeSettings(video=FAST.video, profile=profile)
    transcode_episode(tmp_path / "bag", tmp_path / "ep.mcap", settings, episode=ep)
    got = mcap_depth(tmp_path / "ep.mcap")["d"]
    assert all(np.array_equal(g, w) for (_, g), (_, w) in zip(got, written["depth"]["d"], strict=True))
    with EpisodeReader(tmp_path / "ep.mcap") as r:
        assert r.training_streams == {"t64": ["scene_left", "wrist"]}
        depth_channel = r.topic_ids["/depth/d"]
        for ci in r.summary.chunk_indexes:
            assert depth_channel not in ci.message_index_offsets or set(ci.message_index_offsets) == {depth_channel}


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_sample_bag_with_depth_holds_its_first_cameras_luma_as_millimetres(tmp_path, episode_factory, storage):
    gen = episode_factory(episode_id="ep-depth", seed=32, duration_s=1.0)
    samples.write_bag(gen.path, tmp_path / "bag", storage=storage, depth=True)
    with RawEpisode(gen.path) as raw:
        names = sorted(raw.cameras)
        (ep,) = read_bag(tmp_path / "bag", parse(samples.topic_map(names, depth=True), "t"))
        d = ep.depth[samples.depth_name(names[0])]
        cam = raw.cameras[names[0]]
        assert d.topic == samples.depth_topic(names[0]) and np.array_equal(d.timestamps_ns, cam.timestamps_ns)
        for i in (0, len(cam) - 1):
            want = samples.synthetic_depth(decode_jpeg(cam.frame_bytes(i), "", names[0], i))
            assert np.array_equal(d.frames[i], want) and 400 <= want.min() and want.max() <= 2950
    assert "depth" not in json.dumps(samples.topic_map(names))


@pytest.mark.parametrize(
    ("topics", "field", "why"),
    [
        ({"/a": {"camera": "x"}, "/d": {"depth": "x"}}, "topics", "'x' names both a camera and a depth stream"),
        ({"/a": {"camera": "x"}, "/d": {"depth": "y"}, "/e": {"depth": "y"}}, "topics", "depth 'y' is fed by more"),
        ({"/d": {"depth": "no spaces"}}, "topics./d.depth", "a depth stream name"),
        ({"/d": {"depth": "y", "fields": ["z"]}}, "topics./d.depth", "no fields"),
        ({"/d": {"depth": "y", "camera": "x"}}, "topics./d", "exactly one of camera, depth or stream"),
    ],
)
def test_a_bad_depth_role_is_refused_naming_the_field(topics, field, why):
    with pytest.raises(TopicMapError, match=rf"^ros2_topics.yaml: {field}: .*{why}"):
        parse({"topics": topics}, "ros2_topics.yaml")


def test_the_topic_map_lists_its_depth_topics():
    m = parse({"topics": {"/a": {"camera": "x"}, "/d": {"depth": "y"}, "/j": {"stream": "joint_states"}}}, "t")
    assert list(m.depth) == ["/d"] and m.depth["/d"].depth == "y" and list(m.cameras) == ["/a"]


def test_the_frame_counts_gate_reads_the_depth_frames_back_and_names_a_stream_short_of_its_source(tmp_path):
    spec = BagSpec(duration_s=2.0, depth=DEPTH)
    write_bag(tmp_path / "bag", spec)
    (ep,) = read_bag(tmp_path / "bag", parse(topic_map_yaml(spec), "t"))
    out = tmp_path / "ep.mcap"
    source = transcode_episode(tmp_path / "bag", out, FAST, episode=ep).as_dict()
    assert source["depth"] == {"scene_depth": 20, "wrist_depth": 20}
    with EpisodeReader(out) as r:
        assert r.depth_times("wrist_depth").tolist() == ep.depth["wrist_depth"].timestamps_ns.tolist()
    assert all(g.passed for g in post_gates(out, source, GateConfig()))

    counts = {
        g.gate: g for g in post_gates(out, {**source, "depth": {**source["depth"], "wrist_depth": 21}}, GateConfig())
    }
    assert (
        not counts["frame_counts"].passed
        and counts["frame_counts"].detail == "depth wrist_depth: 20 frames, source has 21"
    )
    gone = {g.gate: g for g in post_gates(out, {**source, "depth": {**source["depth"], "knee_depth": 5}}, GateConfig())}
    assert not gone["frame_counts"].passed and gone["frame_counts"].detail.startswith("depth knee_depth: ")
    assert "knee_depth" in gone["frame_counts"].detail.split(": ", 1)[1]
