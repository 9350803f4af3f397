"""A ROS 2 bag (MCAP and SQLite 3 storage) transcoded to the platform's MCAP: the same outside checks as an
HDF5-sourced episode (CRCs, H.264 with no B-frames and keyframes carrying SPS/PPS, topic-group chunks),
its streams exact, its frames close to the bag's, its source recorded."""

from __future__ import annotations

import av
import numpy as np
import pytest
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from mcap.reader import NonSeekingReader, make_reader

from dyna_resources.episodes.codec import NAL_IDR, VideoSettings, nal_unit_types
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.read_profile import TOPIC_GROUPS
from dyna_resources.episodes.topics import is_camera_topic
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from dyna_resources.sources.content import content_bytes, content_sha256
from dyna_resources.sources.open import open_episodes

from .bags import BagSpec, topic_map_yaml, write_bag

FAST = TranscodeSettings(video=VideoSettings(gop_frames=10, preset="veryfast"))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255**2 / mse)) if mse else 99.0


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_bag_transcodes_to_an_episode_that_passes_the_outside_checks(tmp_path, storage):
    import yaml

    spec = BagSpec(storage=storage, duration_s=3.0, width=96, height=64, raw_camera="scene_left")
    written = write_bag(tmp_path / "bag", spec)
    home = tmp_path / "home"
    home.mkdir()
    (home / "ros2_topics.yaml").write_text(yaml.safe_dump(topic_map_yaml(spec)))
    fmt, (ep,) = open_episodes(tmp_path / "bag", home)
    assert fmt == "ros2"
    out = tmp_path / "ep.mcap"
    sha = content_sha256(tmp_path / "bag")
    report = transcode_episode(tmp_path / "bag", out, FAST, source_sha256=sha, episode=ep)
    assert report.bytes_in == content_bytes(tmp_path / "bag") and report.episode_id == "bag"
    with open(out, "rb") as f:
        n_seek = sum(1 for _ in make_reader(f, validate_crcs=True).iter_messages())
    with open(out, "rb") as f:
        assert sum(1 for _ in NonSeekingReader(f, validate_crcs=True).iter_messages()) == n_seek > 0
    with EpisodeReader(out) as r:
        meta = r.metadata()
        assert (meta["source_format"], meta["source_sha256"], meta["source_name"]) == ("ros2", sha, "bag")
        assert sorted(r.cameras) == ["scene_left", "wrist"]
        for ci in r.summary.chunk_indexes:  # cameras in their own chunks, proprio + actions in theirs
            groups = {TOPIC_GROUPS.group_of(r.channels[c].topic).name for c in ci.message_index_offsets}
            assert len(groups) == 1
        got = r.read_streams(None, r.start_ns, max(written["joint_t"][-1], written["action_t"][-1]))
        assert np.array_equal(got["joint_states"].timestamps_ns, written["joint_t"])
        assert np.array_equal(got["joint_states"].fields["position"], np.stack(written["position"]))
        assert np.array_equal(got["action"].fields["command"], np.stack(written["action"]))
        for cam in spec.cameras:
            times = [t for t, _ in written["frames"][cam]]
            frames = r.read_frames([cam], times[::7])[cam]
            for k, img in enumerate(frames.images):
                # (4:2:0 chroma of a saturated synthetic pattern at 96x64 caps it near 29 dB)
                assert psnr(img, written["frames"][cam][7 * k][1]) > 27, (cam, k)
        for cam in r.cameras:
            units = [au for _, au in r.iter_video(cam)]
            assert NAL_IDR in nal_unit_types(units[0])
            dec = av.CodecContext.create("h264", "r")
            pict = [str(fr.pict_type) for u in units for fr in dec.decode(av.Packet(u))]
            pict += [str(fr.pict_type) for fr in dec.decode(None)]
            assert len(pict) == len(units) and not any("B" in p for p in pict)
    with open(out, "rb") as f:
        topics = {ch.topic for _, ch, _ in make_reader(f).iter_messages()}
    assert sum(is_camera_topic(t) for t in topics) == 2
    assert CompressedVideo  # the cameras are foxglove.CompressedVideo (schema checked by EpisodeReader)


def test_dyna_transcode_takes_a_bag_and_a_topic_map(tmp_path, capsys):
    import yaml

    from dyna_resources.cli import main

    spec = BagSpec(duration_s=4.0, pauses=(2.0,))
    write_bag(tmp_path / "bag", spec)
    topics = tmp_path / "topics.yaml"
    topics.write_text(yaml.safe_dump(topic_map_yaml(spec, split={"rule": "gap", "gap_s": 1.0})))
    assert main(["transcode", str(tmp_path / "bag"), str(tmp_path / "out"), "--topics", str(topics)]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bag-000.mcap", "bag-001.mcap"]
    assert "bag-001 (ros2)" in capsys.readouterr().out
    topics.write_text("topics: {/a: {stream: torque}}\n")
    assert main(["transcode", str(tmp_path / "bag"), str(tmp_path / "x.mcap"), "--topics", str(topics)]) == 1
    assert f"{topics}: topics./a.stream" in capsys.readouterr().err
