"""Training streams: derived small videos per camera in their own chunk group, archive kept byte for byte."""

import dataclasses
import json
import shutil
import struct

import av
import numpy as np
import pytest
from mcap.data_stream import ReadDataStream
from mcap.reader import NonSeekingReader, make_reader
from mcap.records import Chunk

from dyna_resources.cli import main as cli_main
from dyna_resources.episodes.codec import (
    FULL_RANGE,
    NAL_IDR,
    NAL_NON_IDR,
    NAL_PPS,
    NAL_SPS,
    VideoSettings,
    decoded_to_rgb,
    is_keyframe,
    nal_unit_types,
)
from dyna_resources.episodes.errors import McapFormatError, WindowError
from dyna_resources.episodes.mcap_reader import EpisodeReader, FrameCache
from dyna_resources.episodes.read_profile import TOPIC_GROUPS, ReadProfile, stream_token
from dyna_resources.episodes.topics import (
    EPISODE_METADATA,
    STATS_METADATA,
    camera_topic,
    is_training_camera_topic,
    parse_training_camera_topic,
    training_camera_topic,
)
from dyna_resources.episodes.training_streams import TrainingStreamSpec, _resize, add_training_streams
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode

# 2 s archive GOPs (so 2 archive camera chunks in a 4 s episode); training GOPs shorter than that.
SETTINGS = TranscodeSettings(video=VideoSettings(gop_frames=60, preset="veryfast"))
T128 = TrainingStreamSpec("t128", 128, 128)  # every default: 30-frame GOPs, CRF 18, chunks of one archive GOP
# half the archive size in each axis (an exact 2x2 box, so an independent reference exists), 0.5 s chunks
T80 = TrainingStreamSpec("t80", 60, 80, gop_frames=15, preset="veryfast", chunk_window_s=0.5)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / max(mse, 1e-12)))


@pytest.fixture(scope="module")
def episode(episode_factory, tmp_path_factory):
    gen = episode_factory(duration_s=4.0, width=160, height=120)
    d = tmp_path_factory.mktemp("training")
    src, dst = d / "archive.mcap", d / "training.mcap"
    transcode_episode(gen.path, src, SETTINGS)
    report = add_training_streams(src, dst, [T128, T80])
    return src, dst, report


def records(path):
    """Everything a reader sees, through the mcap library's CRC-validating reader."""
    with open(path, "rb") as f:
        r = make_reader(f, validate_crcs=True)
        summary = r.get_summary()
        msgs = {}
        for _, ch, m in r.iter_messages(log_time_order=False):
            msgs.setdefault(ch.topic, []).append((m.log_time, m.publish_time, m.sequence, m.data))
        return r.get_header(), summary, msgs, {m.name: m.metadata for m in r.iter_metadata()}


def data_section(path) -> bytes:
    data = path.read_bytes()
    _, _, summary_start, _, _ = struct.unpack_from("<BQQQI", data, len(data) - 8 - 29)
    return data[:summary_start]


def chunk_records(path) -> list[bytes]:
    data = open(path, "rb").read()
    with EpisodeReader(path) as r:
        return [data[c.chunk_start_offset : c.chunk_start_offset + c.chunk_length] for c in r.summary.chunk_indexes]


def video_messages(path, name: str, camera: str) -> list[tuple[int, bytes]]:
    with EpisodeReader(path) as r:
        return list(r.iter_video(camera, stream=name))


def archive_decoded(path, camera: str) -> tuple[list[int], list[av.VideoFrame]]:
    ctx = av.CodecContext.create("h264", "r")
    ts, frames = [], []
    for t, au in video_messages(path, None, camera):
        ts.append(t)
        frames += ctx.decode(av.Packet(au))
    frames += ctx.decode(None)
    return ts, frames


def slice_types(au: bytes) -> list[int]:
    """slice_type of every coded slice (NAL 1 or 5): the second ue(v) of the slice header."""
    out = []
    for start in [i + 3 for i in range(len(au) - 3) if au[i : i + 3] == b"\x00\x00\x01"]:
        if au[start] & 0x1F not in (NAL_NON_IDR, NAL_IDR):
            continue
        rbsp = au[start + 1 : start + 17].replace(b"\x00\x00\x03", b"\x00\x00")
        bits = "".join(f"{b:08b}" for b in rbsp)
        pos, values = 0, []
        for _ in range(2):  # first_mb_in_slice, slice_type
            zeros = bits.index("1", pos) - pos
            values.append(int(bits[pos + zeros : pos + 2 * zeros + 1], 2) - 1)
            pos += 2 * zeros + 1
        out.append(values[1])
    return out


# -- the file -----------------------------------------------------------------------------------------
def test_every_archive_record_kept_byte_identical(episode):
    src, dst, _ = episode
    h0, s0, m0, md0 = records(src)
    h1, s1, m1, md1 = records(dst)
    assert (h1.profile, h1.library) == (h0.profile, h0.library)
    assert {k: (v.name, v.encoding, v.data) for k, v in s1.schemas.items()} == {
        k: (v.name, v.encoding, v.data) for k, v in s0.schemas.items()
    }
    for cid, c in s0.channels.items():  # same ids, topics, schemas and metadata
        d = s1.channels[cid]
        assert (d.topic, d.message_encoding, d.schema_id, d.metadata) == (
            c.topic,
            c.message_encoding,
            c.schema_id,
            c.metadata,
        )
    assert {t: v for t, v in m1.items() if not is_training_camera_topic(t)} == m0
    assert md1[STATS_METADATA] == md0[STATS_METADATA]
    episode_md = md1[EPISODE_METADATA]
    assert list(episode_md)[: len(md0[EPISODE_METADATA])] == list(md0[EPISODE_METADATA])
    assert {k: v for k, v in episode_md.items() if k != "training_streams"} == md0[EPISODE_METADATA]
    recorded = json.loads(episode_md["training_streams"])
    assert {n: TrainingStreamSpec.from_dict(d) for n, d in recorded.items()} == {"t128": T128, "t80": T80}
    # the archive's chunks are laid out as before: every source chunk record is in the output verbatim,
    # in the same order
    src_chunks = chunk_records(src)
    assert [c for c in chunk_records(dst) if c in set(src_chunks)] == src_chunks
    # header, schema and channel records too: the output starts with the same bytes up to the first
    # metadata record (the training channels come after the archive's)
    with EpisodeReader(src) as a:
        prefix = src.read_bytes()[: min(m.offset for m in a.summary.metadata_indexes)]
    assert dst.read_bytes().startswith(prefix)


def test_training_channels_in_their_own_chunks(episode):
    src, dst, report = episode
    with EpisodeReader(src) as a, EpisodeReader(dst) as r:
        assert len(r.summary.chunk_indexes) == len(a.summary.chunk_indexes) + 2 + 8  # 4 s / 2 s, 4 s / 0.5 s
        for ci in r.summary.chunk_indexes:
            names = {
                parse_training_camera_topic(r.channels[c].topic)[0]
                if is_training_camera_topic(r.channels[c].topic)
                else ""
                for c in ci.message_index_offsets
            }
            assert len(names) == 1  # no chunk mixes a training stream with anything else
            if names != {""}:
                assert ci.compression == ""
        for name, spec in (("t128", T128), ("t80", T80)):
            for cam in a.cameras:
                md = r.channels[r.topic_ids[training_camera_topic(name, cam)]].metadata
                archive_md = a.channels[a.topic_ids[camera_topic(cam)]].metadata
                assert md["source_topic"] == camera_topic(cam) and md["training_stream"] == name
                assert (md["height"], md["width"], md["gop_frames"]) == tuple(
                    map(str, (spec.height, spec.width, spec.gop_frames))
                )
                assert (md["frame_id"], md["rate_hz"]) == (archive_md["frame_id"], archive_md["rate_hz"])
                rate = int(archive_md["gop_frames"]) * 1e9 / int(archive_md["gop_ns"])
                assert int(md["gop_ns"]) == round(spec.gop_frames / rate * 1e9)
        # report: what each stream costs, measured on the output's own chunk index
        for name in ("t128", "t80"):
            s = report.streams[name]
            topics = {training_camera_topic(name, c) for c in a.cameras}
            on_disk = sum(
                ci.chunk_length + ci.message_index_length
                for ci in r.summary.chunk_indexes
                if {r.channels[c].topic for c in ci.message_index_offsets} <= topics
            )
            assert s.action == "added" and s.bytes == on_disk > s.video_bytes > 0
            assert s.frames == sum(r.summary.statistics.channel_message_counts[r.topic_ids[t]] for t in topics)
        assert report.frames_encoded == report.streams["t128"].frames + report.streams["t80"].frames
        assert report.bytes_before == src.stat().st_size and report.bytes_after == dst.stat().st_size


def test_one_training_frame_per_archive_frame_at_its_log_time(episode):
    src, dst, _ = episode
    with EpisodeReader(src) as a:
        cameras = a.cameras
    for cam in cameras:
        archive_times = [t for t, _ in video_messages(src, None, cam)]
        for name in ("t128", "t80"):
            assert [t for t, _ in video_messages(dst, name, cam)] == archive_times, (name, cam)


def test_every_gop_starts_with_idr_and_headers_and_has_no_b_frames(episode):
    _, dst, _ = episode
    with EpisodeReader(dst) as r:
        t0 = int(r.metadata()["start_ns"])
        for name, cams in r.training_streams.items():
            for cam in cams:
                gop_ns = int(r.channels[r.topic_ids[training_camera_topic(name, cam)]].metadata["gop_ns"])
                window = None
                gops = 0
                for t, au in r.iter_video(cam, stream=name):
                    types = nal_unit_types(au)
                    assert all(st % 5 in (0, 2) for st in slice_types(au)), (name, cam, t)  # P or I, never B
                    if (t - t0) // gop_ns != window:  # first frame of a GOP window
                        window = (t - t0) // gop_ns
                        gops += 1
                        assert is_keyframe(au) and NAL_SPS in types and NAL_PPS in types
                        assert types.index(NAL_SPS) < types.index(NAL_PPS) < types.index(NAL_IDR)
                    else:
                        assert not is_keyframe(au) and NAL_IDR not in types and NAL_SPS not in types
                assert gops > 1


def test_training_frames_match_the_archive_resized_by_swscale(episode):
    """Against the archive frame resized the same way: what the training encode adds (CRF 18 -> ~40 dB;
    35 dB is the bar, the usual 'hard to tell apart' level)."""
    src, dst, _ = episode
    with EpisodeReader(src) as a, EpisodeReader(dst) as r:
        for cam in a.cameras:
            ts, frames = archive_decoded(src, cam)
            idx = list(range(0, len(ts), 11)) + [len(ts) - 1]
            for spec in (T128, T80):
                got = r.read_frames([cam], [ts[i] for i in idx], stream=spec.name)[cam]
                for k, i in enumerate(idx):
                    ref = decoded_to_rgb(_resize(frames[i], spec.height, spec.width))
                    assert psnr(got.images[k], ref) >= 35.0, (spec.name, cam, i)


def test_levels_stay_full_range(episode):
    """An independent reference: the archive frame's RGB averaged over 2x2 boxes (t80 is exactly half
    size). A full -> limited range squash would scale contrast by 219/255 and fail this by far."""
    src, dst, _ = episode
    with EpisodeReader(src) as a, EpisodeReader(dst) as r:
        cam = a.cameras[0]
        ts = [t for t, _ in video_messages(src, None, cam)][::17]
        full = a.read_frames([cam], ts)[cam].images.astype(np.float64)
        boxed = full.reshape(len(ts), 60, 2, 80, 2, 3).mean(axis=(2, 4))
        small = r.read_frames([cam], ts, stream="t80")[cam].images.astype(np.float64)
        for k in range(len(ts)):
            assert psnr(small[k], boxed[k]) >= 30.0
            assert abs(small[k].mean() - boxed[k].mean()) < 1.5
            assert np.std(small[k]) == pytest.approx(np.std(boxed[k]), rel=0.05)


def test_resize_keeps_full_range_levels():
    h, w = 120, 160
    y = np.tile(np.linspace(0, 255, w).round().astype(np.uint8), (h, 1))
    planes = np.concatenate([y.ravel(), np.full(h * w // 2, 128, np.uint8)]).reshape(h * 3 // 2, w)
    frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
    frame.color_range = FULL_RANGE
    out = _resize(frame, 64, 64)
    luma = out.to_ndarray()[:64]
    assert out.format.name == "yuv420p" and out.color_range == FULL_RANGE
    assert luma.min() <= 2 and luma.max() >= 253  # limited range would be 16..235


# -- reader -------------------------------------------------------------------------------------------
def test_reader_lists_training_streams_apart(episode):
    src, dst, _ = episode
    with EpisodeReader(src) as a, EpisodeReader(dst) as r:
        assert r.cameras == a.cameras and r.streams == a.streams
        assert a.training_streams == {}
        assert r.training_streams == {"t128": a.cameras, "t80": a.cameras}
        cam = r.cameras[0]
        assert r.video_topic(cam) == r.video_topic(cam, "archive") == camera_topic(cam)
        assert r.video_topic(cam, "t80") == f"/training/t80/camera/{cam}"


def test_read_frames_from_a_training_stream(episode):
    src, dst, _ = episode
    with EpisodeReader(dst) as r:
        cams = r.cameras
        times = [t for t, _ in video_messages(src, None, cams[0])]
        want = [times[3], times[31], times[44], times[-1]]
        for spec in (T128, T80):
            frames = r.read_frames(None, want, stream=spec.name)
            assert sorted(frames) == cams
            assert frames[cams[0]].images.shape == (4, spec.height, spec.width, 3)
            assert list(frames[cams[0]].timestamps_ns) == want
            for cam in cams:
                assert frames[cam].images.shape == (4, spec.height, spec.width, 3)
                assert np.all(np.abs(frames[cam].timestamps_ns - np.asarray(want)) < 34_000_000)
            cached = r.read_frames(None, want, stream=spec.name, cache=FrameCache())
            for cam in cams:
                assert np.array_equal(cached[cam].images, frames[cam].images)
        # a training read fetches small chunks: t80 is a quarter of the pixels, a quarter of the chunk window
        r.log.clear()
        r.read_frames([cams[0]], [want[1]], stream="t80")
        chunk_bytes = r.log.chunk_bytes
        r.log.clear()
        r.read_frames([cams[0]], [want[1]])
        assert chunk_bytes * 5 < r.log.chunk_bytes


def test_unknown_stream_is_a_clear_window_error(episode):
    src, dst, _ = episode
    with EpisodeReader(dst) as r:
        cam = r.cameras[0]
        with pytest.raises(WindowError) as e:
            r.read_frames([cam], [r.start_ns], stream="t999")
        msg = str(e.value)
        assert str(dst) in msg and "t999" in msg and cam in msg and "t128" in msg and "t80" in msg
        assert "archive" in msg
    with EpisodeReader(src) as a:  # no training streams at all
        with pytest.raises(WindowError, match="has no video stream 't128'"):
            a.read_frames(None, [a.start_ns], stream="t128")


def test_the_mcap_library_validating_readers_read_it(episode):
    _, dst, _ = episode
    with open(dst, "rb") as f:
        reader = make_reader(f, validate_crcs=True)
        summary = reader.get_summary()
        n = sum(1 for _ in reader.iter_messages())
        assert n == summary.statistics.message_count
        for ci in summary.chunk_indexes:  # every chunk decodes and matches its index
            f.seek(ci.chunk_start_offset + 9)
            chunk = Chunk.read(ReadDataStream(f))
            assert (chunk.message_start_time, chunk.message_end_time) == (ci.message_start_time, ci.message_end_time)
    with open(dst, "rb") as f:  # a linear pass: also checks the data section CRC
        assert sum(1 for _ in NonSeekingReader(f, validate_crcs=True).iter_messages()) == n


# -- idempotence, replacement, ingest, CLI --------------------------------------------------------------
def test_same_specs_again_is_a_copy(episode, tmp_path):
    _, dst, _ = episode
    again = tmp_path / "again.mcap"
    report = add_training_streams(dst, again, [T128, T80])
    assert {n: s.action for n, s in report.streams.items()} == {"t128": "kept", "t80": "kept"}
    assert report.frames_encoded == 0
    # nothing re-encoded: the data section (every record but the summary) is the same bytes; the summary
    # only lists the per-channel message counts in another order
    assert data_section(again) == data_section(dst)
    (h0, s0, m0, md0), (h1, s1, m1, md1) = records(dst), records(again)
    assert (h1, m1, md1) == (h0, m0, md0)
    assert s1.chunk_indexes == s0.chunk_indexes and s1.statistics == s0.statistics
    assert s1.channels == s0.channels and s1.metadata_indexes == s0.metadata_indexes


def test_same_name_other_spec_replaces_only_that_stream(episode, tmp_path):
    src, dst, _ = episode
    out = tmp_path / "replaced.mcap"
    t80b = dataclasses.replace(T80, height=40, width=64)
    report = add_training_streams(dst, out, [t80b])
    assert [(n, s.action) for n, s in report.streams.items()] == [("t80", "replaced")]
    _, s1, m1, md1 = records(out)
    _, s_dst, m_dst, _ = records(dst)
    _, _, m0, _ = records(src)
    assert {t: v for t, v in m1.items() if not is_training_camera_topic(t)} == m0
    with EpisodeReader(out) as r:
        assert r.training_streams == {"t128": r.cameras, "t80": r.cameras}
        for cam in r.cameras:  # t128 untouched, channel ids kept
            t = training_camera_topic("t128", cam)
            assert m1[t] == m_dst[t]
            assert r.topic_ids[t] == next(c for c, ch in s_dst.channels.items() if ch.topic == t)
            assert r.read_frames([cam], [r.start_ns + 10**9], stream="t80")[cam].images.shape == (1, 40, 64, 3)
        assert r.topic_ids == {c.topic: cid for cid, c in s_dst.channels.items()}  # same places
    recorded = json.loads(md1[EPISODE_METADATA]["training_streams"])
    assert (
        TrainingStreamSpec.from_dict(recorded["t80"]) == t80b and TrainingStreamSpec.from_dict(recorded["t128"]) == T128
    )
    # in place: dst == src, atomically; no temporary file left behind. (Not compared byte for byte with
    # the first t80: libx264 on these VMs now and then codes a row differently, see test_transcode.)
    inplace = tmp_path / "inplace.mcap"
    shutil.copy(out, inplace)
    assert add_training_streams(inplace, inplace, [T80]).streams["t80"].action == "replaced"
    _, s2, m2, _ = records(inplace)
    assert {t: v for t, v in m2.items() if not t.startswith("/training/t80/")} == {
        t: v for t, v in m1.items() if not t.startswith("/training/t80/")
    }
    assert {t: [x[0] for x in v] for t, v in m2.items()} == {t: [x[0] for x in v] for t, v in m_dst.items()}
    assert s2.channels == s_dst.channels
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inplace.mcap", "replaced.mcap"]


def test_transcoder_writes_training_streams_when_asked(episode_factory, tmp_path):
    gen = episode_factory(duration_s=4.0, width=160, height=120)
    profile = ReadProfile("t80", TOPIC_GROUPS.groups, training_streams=(T80,), read_stream="t80")
    settings = dataclasses.replace(SETTINGS, profile=profile)
    out = tmp_path / "ingest.mcap"
    report = transcode_episode(gen.path, out, settings)
    assert report.bytes_out == out.stat().st_size
    assert report.training_streams == stream_token(T80)  # what the registry records
    with EpisodeReader(out) as r:
        assert r.training_streams == {"t80": r.cameras}
        assert r.transcode_settings()["read_profile"]["training_streams"] == [T80.as_dict()]
        assert r.transcode_settings()["read_profile"]["read_stream"] == "t80"
        assert json.loads(r.metadata()["training_streams"]) == {"t80": T80.as_dict()}
    # default off, and the layout-only profile's settings read as they always have
    assert TranscodeSettings().as_dict()["read_profile"] == {
        "name": "topic-groups",
        "groups": TOPIC_GROUPS.as_dict()["groups"],
    }
    assert "training_streams" not in TranscodeSettings().as_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ingest.mcap"]


def test_cli(episode, tmp_path, capsys):
    src, _, _ = episode
    out = tmp_path / "cli.mcap"
    assert cli_main(["training-streams", str(src), str(out), "--spec", "t32:32x48:10"]) == 0
    assert "t32: added" in capsys.readouterr().out
    with EpisodeReader(out) as r:
        assert r.training_streams == {"t32": r.cameras}
        md = r.channels[r.topic_ids[training_camera_topic("t32", r.cameras[0])]].metadata
        assert (md["height"], md["width"], md["gop_frames"]) == ("32", "48", "10")
    with pytest.raises(SystemExit) as e:
        cli_main(["training-streams", str(src), str(out), "--spec", "t32:33x48"])
    assert e.value.code == 2 and "TrainingStreamSpec.height" in capsys.readouterr().err


def test_not_an_episode_is_refused_and_leaves_nothing(tmp_path):
    from mcap.writer import Writer

    path = tmp_path / "plain.mcap"
    with open(path, "wb") as f:
        w = Writer(f)
        w.start()
        cid = w.register_channel("/joint_states", "json", w.register_schema("s", "jsonschema", b"{}"))
        w.add_message(cid, 1, b"{}", 1)
        w.finish()
    with pytest.raises(McapFormatError):
        add_training_streams(path, tmp_path / "out.mcap", [T80])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.mcap"]


# -- specs and topics -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "t/128"),
        ("name", ""),
        ("name", "t 128"),
        ("name", "archive"),
        ("name", "../x"),
        ("height", 127),
        ("height", 0),
        ("width", -2),
        ("width", 128.0),
        ("width", True),
        ("gop_frames", 0),
        ("crf", -1),
        ("crf", 52),
        ("preset", "quick"),
        ("chunk_window_s", 0),
    ],
)
def test_bad_spec_values_name_the_field(field, value):
    kwargs = {"name": "t128", "height": 128, "width": 128, field: value}
    with pytest.raises(ValueError, match=f"TrainingStreamSpec.{field}"):
        TrainingStreamSpec(**kwargs)


def test_spec_parse_and_topics():
    assert TrainingStreamSpec.parse("t224:224x224") == TrainingStreamSpec("t224", 224, 224)
    assert TrainingStreamSpec.parse("small:96x128:15") == TrainingStreamSpec("small", 96, 128, gop_frames=15)
    for bad in ("t128", "t128:128", "t128:128x128:x", "t128:axb"):
        with pytest.raises(ValueError, match="NAME:HxW"):
            TrainingStreamSpec.parse(bad)
    with pytest.raises(ValueError, match="unique"):
        add_training_streams("unused.mcap", "unused-out.mcap", [T128, T128])
    t = training_camera_topic("t128", "wrist")
    assert t == "/training/t128/camera/wrist" and parse_training_camera_topic(t) == ("t128", "wrist")
    assert is_training_camera_topic(t) and not is_training_camera_topic(camera_topic("wrist"))
    for other in ("/training/t128/wrist", "/training//camera/x", "/joint_states", "/training/a/b/camera/c"):
        assert not is_training_camera_topic(other)
