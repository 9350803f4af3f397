"""A bag camera that is already H.264 (foxglove_msgs/msg/CompressedVideo): copied into the MCAP access unit
for access unit when its layout meets the read profile, re-encoded (decoded in display order, cut GOPs
decoded from their keyframe) when it does not; either way the episode passes the post gates."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
import yaml

from dyna_resources.episodes.codec import VideoSettings, encode_gop
from dyna_resources.episodes.errors import CorruptFrameError, RawFormatError
from dyna_resources.episodes.h264_layout import check_layout
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.post_gates import check_video, post_gates
from dyna_resources.sources.open import open_episodes

from .bags import BagSpec, frame, h264_units, topic_map_yaml, write_bag

PROFILE = TranscodeSettings(video=VideoSettings(gop_frames=10, preset="veryfast"))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255**2 / mse)) if mse else 99.0


def episodes(tmp_path, spec: BagSpec, **topic_map):
    written = write_bag(tmp_path / "bag", spec)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "ros2_topics.yaml").write_text(yaml.safe_dump(topic_map_yaml(spec, **topic_map)))
    fmt, eps = open_episodes(tmp_path / "bag", home)
    assert fmt == "ros2"
    return written, eps


def transcode(tmp_path, ep, name="ep.mcap", settings=PROFILE):
    out = tmp_path / name
    report = transcode_episode(tmp_path / "bag", out, settings, episode=ep)
    assert all(g.passed for g in post_gates(out, report.as_dict(), GateConfig())), name
    return out, report


def mcap_units(path, camera):
    with EpisodeReader(path) as r:
        return [(t, au) for t, au in r.iter_video(camera)]


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_h264_in_the_read_profile_layout_is_copied_unit_for_unit(tmp_path, storage):
    spec = BagSpec(storage=storage, duration_s=3.0, width=96, height=64, h264_camera="wrist", h264_gop=10)
    written, (ep,) = episodes(tmp_path, spec)
    source = list(ep.cameras["wrist"].units)
    out, report = transcode(tmp_path, ep)
    wrist, scene = report.cameras["wrist"], report.cameras["scene_left"]
    assert (wrist.copied, wrist.reencode_reason, wrist.keyframes, wrist.frames) == (True, "", 3, 30)
    assert (wrist.width, wrist.height) == (96, 64) and wrist.video_bytes == sum(map(len, source))
    assert not scene.copied and scene.reencode_reason == ""  # JPEG: encoded as always
    got = mcap_units(out, "wrist")
    assert [au for _, au in got] == source
    with EpisodeReader(out) as r:  # the post gate takes the transcoder's word for the 3 keyframes it decoded
        check = check_video(r, "wrist", set(), wrist.decoded_keyframes)
    assert (check.vouched_keyframes, check.decoded_frames, report.cameras["scene_left"].decoded_keyframes) == (3, 0, "")
    assert [t for t, _ in got] == [t for t, _ in written["frames"]["wrist"]]
    with EpisodeReader(out) as r:  # random access into a copied GOP: the source's own pictures
        times = [t for t, _ in written["frames"]["wrist"]]
        images = r.read_frames(["wrist"], [times[4], times[17]])["wrist"].images
    assert psnr(images[0], frame(4, 0, 96, 64)) > 27 and psnr(images[1], frame(17, 0, 96, 64)) > 27


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (
            BagSpec(h264_camera="wrist", h264_gop=25, duration_s=4.0),
            "a GOP of 25 frames (the read profile's is at most 10)",
        ),
        (BagSpec(h264_camera="wrist", h264_gop=10, h264_bframes=2, duration_s=4.0), "has B slices"),
    ],
    ids=["long-gop", "b-frames"],
)
def test_h264_in_another_layout_is_reencoded_in_display_order(tmp_path, spec, reason):
    written, (ep,) = episodes(tmp_path, spec)
    out, report = transcode(tmp_path, ep)
    wrist = report.cameras["wrist"]
    assert not wrist.copied and reason in wrist.reencode_reason
    assert (wrist.frames, wrist.keyframes) == (40, 4)  # the profile's GOPs now
    units = [au for _, au in mcap_units(out, "wrist")]
    assert check_layout(units, 10).copyable
    dec = av.CodecContext.create("h264", "r")
    pictures = [f.to_ndarray(format="rgb24") for u in units for f in dec.decode(av.Packet(u))]
    pictures += [f.to_ndarray(format="rgb24") for f in dec.decode(None)]
    assert len(pictures) == 40
    assert min(psnr(p, frame(i, 0, 64, 48)) for i, p in enumerate(pictures)) > 25  # each in its place


def test_an_episode_cut_inside_a_gop_decodes_from_the_keyframe_before_it(tmp_path):
    """A gap at 1.5 s splits the bag where the camera is mid-GOP (keyframes every 10 frames at 10 Hz): the
    second episode does not open with a keyframe, so it is re-encoded, its first frames decoded from the
    keyframe at 1.0 s of the first episode's part."""
    spec = BagSpec(h264_camera="wrist", h264_gop=10, duration_s=3.0, pauses=(1.5,))
    written, eps = episodes(tmp_path, spec, split={"rule": "gap", "gap_s": 2.0})
    assert [len(e.cameras["wrist"]) for e in eps] == [15, 15]
    first, second = (transcode(tmp_path, e, f"ep{k}.mcap")[1] for k, e in enumerate(eps))
    assert first.cameras["wrist"].copied and not second.cameras["wrist"].copied
    assert "does not open with an IDR picture" in second.cameras["wrist"].reencode_reason
    with EpisodeReader(tmp_path / "ep1.mcap") as r:
        t = [t for t, _ in written["frames"]["wrist"]][15]
        (image,) = r.read_frames(["wrist"], [t])["wrist"].images
    assert psnr(image, frame(15, 0, 64, 48)) > 25


def test_copying_can_be_turned_off_and_then_the_camera_is_reencoded(tmp_path):
    _, (ep,) = episodes(tmp_path, BagSpec(h264_camera="wrist", h264_gop=10))
    _, report = transcode(tmp_path, ep, settings=TranscodeSettings(video=PROFILE.video, copy_h264=False))
    assert not report.cameras["wrist"].copied and "copy_h264" in report.cameras["wrist"].reencode_reason


def test_a_frozen_copied_camera_is_counted_from_its_gop_starts(tmp_path):
    """Frozen frames of a copied camera are estimated from each GOP's first two frames."""
    still = [frame(0, 0, 64, 48)] * 40
    units = h264_units(still, 10)
    spec = BagSpec(h264_camera="wrist", h264_gop=10, duration_s=4.0)
    _, (ep,) = episodes(tmp_path, spec)
    ep.cameras["wrist"].frames[:] = units
    _, report = transcode(tmp_path, ep)
    # 4 GOPs: 4 pairs compared, all frozen; scaled to the 39 frames that follow another
    assert report.cameras["wrist"].copied and report.cameras["wrist"].frozen_frames == 39


def test_a_copied_keyframe_that_does_not_decode_cleanly_fails_the_transcode_naming_the_frame(tmp_path):
    """The copy's GOP-start decode is strict (what the decodable gate then takes by digest): a keyframe
    whose slice data is cut is a verdict on the file, not concealed into a picture."""
    _, (ep,) = episodes(tmp_path, BagSpec(h264_camera="wrist", h264_gop=10, duration_s=3.0))
    units = ep.cameras["wrist"].frames
    units[10] = units[10][: len(units[10]) * 2 // 3]  # GOP 1's keyframe
    with pytest.raises(CorruptFrameError) as e:
        transcode_episode(tmp_path / "bag", tmp_path / "ep.mcap", PROFILE, episode=ep)
    assert e.value.stream == "images/wrist" and "frame 10" in str(e.value) and "H.264 decode failed" in e.value.reason


def test_video_other_than_h264_is_refused_naming_the_topic(tmp_path):
    with pytest.raises(RawFormatError) as e:
        episodes(tmp_path, BagSpec(h264_camera="wrist", h264_format="h265"))
    assert e.value.stream == "/camera/wrist/image/compressed" and "'h265' (only h264 is read)" in e.value.reason


def test_the_layout_check_names_what_keeps_a_stream_from_being_copied():
    frames = [frame(i, 0, 64, 48) for i in range(20)]
    units = encode_gop(frames[:10], PROFILE.video) + encode_gop(frames[10:], PROFILE.video)
    assert check_layout(units, 10).copyable and check_layout(units, 10).gops == 2
    assert check_layout(units[:15], 10).copyable  # the last GOP may be short
    short = encode_gop(frames[:4], PROFILE.video) + encode_gop(frames[4:14], PROFILE.video)
    assert check_layout(short, 10).reason == "a GOP of 4 frames (at least 5: half the profile's)"
    assert check_layout(units[1:], 10).reason == "the stream does not open with an IDR picture"
    bare_idr = units[10][units[10].index(b"\x00\x00\x01\x65") - 1 :]  # the IDR slice without its SPS/PPS
    assert (
        check_layout([*units[:10], bare_idr, *units[11:]], 10).reason
        == "IDR access unit 10 without its SPS and PPS in front"
    )
    assert check_layout([b"\x00\x00\x01\x09\xf0"], 10).reason.startswith("access unit 0 holds no coded picture")
    assert check_layout([], 10).reason == "no access units"
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = 64, 48, "yuv444p"
    enc.time_base = Fraction(1, 30)
    enc.options = {"x264-params": "keyint=10:bframes=0:repeat-headers=1"}
    yuv444 = []
    for i, f in enumerate(frames[:10]):
        vf = av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv444p")
        vf.pts = i
        yuv444 += [bytes(p) for p in enc.encode(vf)]
    yuv444 += [bytes(p) for p in enc.encode(None)]
    assert check_layout(yuv444, 10).reason == "access unit 0: chroma format 3, 8-bit (not 8-bit 4:2:0)"
