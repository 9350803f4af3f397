"""Decoding many frames at once: each GOP once and only up to its last wanted frame, swscale colour
matching the transcoder's reference conversion, failures kept to the frames they concern."""

from __future__ import annotations

import av
import numpy as np
import pytest

from dyna_resources.episodes.codec import VideoSettings, decoded_to_rgb, is_keyframe, yuv420_to_rgb
from dyna_resources.episodes.gop_decode import (
    CPU,
    DecoderBackend,
    cuda_decode_available,
    decode_at,
    parity_psnr,
    swscale_rgb,
)
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode


@pytest.fixture(scope="module")
def episode(episode_factory, tmp_path_factory):
    """A 4 s episode at 160x120 with 1 s (30-frame) GOPs."""
    gen = episode_factory(episode_id="ep-gop-decode", seed=77, duration_s=4.0, width=160, height=120)
    path = tmp_path_factory.mktemp("gop") / "ep.mcap"
    transcode_episode(gen.path, path, TranscodeSettings(video=VideoSettings(gop_frames=30, preset="veryfast")))
    return path


def _video(path, camera="wrist"):
    with EpisodeReader(path) as r:
        return [(t, au) for t, au in r.iter_video(camera)]


def psnr(a, b) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_swscale_conversion_matches_the_reference_within_the_stated_tolerance(episode):
    # Reference: codec.decoded_to_rgb (full-range BT.601, libjpeg's triangle chroma filter). swscale
    # upsamples chroma bilinearly: luma is the same, chroma edges differ by a few levels. The bar:
    # >= 40 dB PSNR and a mean absolute difference <= 1.5 levels per channel.
    ctx = av.CodecContext.create("h264", "r")
    frames = []
    for _, au in _video(episode)[:45]:
        frames += ctx.decode(av.Packet(au))
    assert len(frames) >= 40
    ours = np.stack([swscale_rgb(chw=False)(f) for f in frames])
    ref = np.stack([decoded_to_rgb(f) for f in frames])
    assert psnr(ours, ref) >= 40.0
    assert np.abs(ours.astype(int) - ref).mean() <= 1.5
    # The bar can fail: the same planes read as limited range miss it by far.
    limited = np.stack([yuv420_to_rgb(f.to_ndarray(), full_range=False) for f in frames])
    assert psnr(limited, ref) < 35.0 and np.abs(limited.astype(int) - ref).mean() > 3.0
    # A frame handed over as plain yuv420p with its range flag lost (unspecified) still converts as
    # full range (the decoder gives yuvj420p for these streams, which swscale always reads as full).
    plain = av.VideoFrame.from_ndarray(frames[0].to_ndarray(), format="yuv420p")  # the same planes, unflagged
    plain.color_range = 0
    assert np.array_equal(swscale_rgb(chw=False)(plain), ours[0])
    assert np.abs(plain.to_ndarray(format="rgb24").astype(int) - ours[0]).mean() > 3.0  # swscale's own guess: limited
    # Resized in the same pass: (3, h, w) for the model.
    small = swscale_rgb(32, 48)(frames[1])
    assert small.shape == (3, 32, 48) and small.dtype == np.uint8


def test_full_size_channels_first_is_the_interleaved_conversion_transposed_bit_for_bit(episode):
    """The (3, H, W) full-size path converts to planar RGB (no transpose copy): the same bytes as the
    interleaved conversion transposed, for the decoder's frames and for an unflagged yuv420p one."""
    ctx = av.CodecContext.create("h264", "r")
    frames = []
    for _, au in _video(episode)[:12]:
        frames += ctx.decode(av.Packet(au))
    plain = av.VideoFrame.from_ndarray(frames[0].to_ndarray(), format="yuv420p")
    plain.color_range = 0
    for f in [*frames, plain]:
        chw = swscale_rgb()(f)
        assert chw.shape == (3, f.height, f.width) and chw.flags["C_CONTIGUOUS"]
        assert np.array_equal(chw, swscale_rgb(chw=False)(f).transpose(2, 0, 1))
    # naming the full size explicitly takes the same path
    f = frames[3]
    assert np.array_equal(swscale_rgb(f.height, f.width)(f), swscale_rgb()(f))


def test_each_gop_decodes_once_and_stops_at_its_last_wanted_frame(episode):
    video = _video(episode)
    times = np.array([t for t, _ in video])
    keys = [i for i, (_, au) in enumerate(video) if is_keyframe(au)]
    assert keys[:3] == [0, 30, 60]
    with EpisodeReader(episode) as r:
        # frames 5 and 12 of GOP 0 (asked twice), frame 40 of GOP 1; GOP 2 and 3 not at all
        want = times[[12, 5, 40, 12]]
        got = decode_at(r, "wrist", want, transform=swscale_rgb(chw=False))
        assert got.errors == {}
        assert got.decoded == 13 + 11  # 0..12 and 30..40: never past the last wanted frame of a GOP
        assert got.converted == 3
        assert got.timestamps_ns.tolist() == want.tolist()
        single = [decode_at(r, "wrist", [t], transform=swscale_rgb(chw=False)).images[0] for t in want]
        assert all(np.array_equal(a, b) for a, b in zip(got.images, single, strict=True))


def test_a_request_with_no_frame_near_fails_alone_naming_the_time(episode):
    video = _video(episode)
    with EpisodeReader(episode) as r:
        far = int(video[-1][0] + 5_000_000_000)
        got = decode_at(r, "wrist", [video[3][0], far], transform=swscale_rgb(chw=False))
        assert list(got.errors) == [1]
        assert str(far) in got.errors[1] and "no frame within" in got.errors[1]
        assert got.timestamps_ns[0] == video[3][0] and got.images[0].any()


def test_backends_fall_back_to_the_cpu_and_agree(episode):
    assert CPU.name == "cpu"
    auto = DecoderBackend("auto")
    assert auto.name == ("cuda" if cuda_decode_available() else "cpu")
    if not cuda_decode_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            DecoderBackend("cuda")
    with pytest.raises(ValueError, match="decoder backend"):
        DecoderBackend("gpu")  # type: ignore[arg-type]
    video = _video(episode)
    with EpisodeReader(episode) as r:
        targets = [t for t, _ in video[::7]]
        assert parity_psnr(r, "wrist", targets, CPU, auto) >= 40.0  # on a GPU machine: NVDEC vs libavcodec


def test_frames_decoded_from_a_video_encode_as_the_same_planes_made_afresh(tmp_path):
    """A decoded frame carries its stream's time base (1/15360 for an MP4); the encoder must not rescale
    its pts from it (every frame at pts 0 would change what the CRF means): its GOP is bit-identical to
    the GOP of the same planes in new frames."""
    from dyna_resources.episodes.codec import encode_gop

    rng = np.random.default_rng(5)
    mp4 = tmp_path / "clip.mp4"
    with av.open(str(mp4), "w") as out:
        s = out.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = 96, 64, "yuv420p"
        base = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)
        for i in range(12):
            img = np.roll(base, 3 * i, axis=1)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    with av.open(str(mp4)) as c:
        decoded = list(c.decode(video=0))
    assert decoded[0].time_base is not None and decoded[-1].pts > 0
    fresh = [av.VideoFrame.from_ndarray(f.to_ndarray(), format=f.format.name) for f in decoded]
    settings = VideoSettings(gop_frames=12, preset="veryfast", pix_fmt="yuv420p")
    assert encode_gop(decoded, settings) == encode_gop(fresh, settings)


@pytest.mark.parametrize("height", [54, 56], ids=["2-mod-4", "0-mod-4"])
def test_a_camera_whose_height_is_2_mod_4_reads_back_in_its_colours(episode_factory, tmp_path, height):
    """480x270 and the like: the U plane ends mid-row of the stacked planes (codec.i420_planes). Split
    by rows, the decode raised on every frame; the reference conversion must match swscale's."""
    src = episode_factory(width=96, height=height, duration_s=1.0).path
    out = tmp_path / "ep.mcap"
    transcode_episode(src, out, TranscodeSettings(video=VideoSettings(gop_frames=10, preset="veryfast")))
    with EpisodeReader(out) as r:
        t = r.start_ns + 500_000_000
        images = r.read_frames(["wrist"], [t])["wrist"].images
    assert images.shape == (1, height, 96, 3)
    ctx = av.CodecContext.create("h264", "r")
    frames = [f for _, au in _video(out)[:5] for f in ctx.decode(av.Packet(au))]
    ref = np.stack([decoded_to_rgb(f) for f in frames])
    swscale = np.stack([f.to_ndarray(format="rgb24", dst_colorspace="ITU601", dst_color_range="JPEG") for f in frames])
    assert psnr(ref, swscale) >= 35.0
