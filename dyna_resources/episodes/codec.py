"""H.264 through PyAV/libx264: encoder settings, one-GOP encoding, decoding, NAL inspection.

Colour path. Legacy JPEGs are already YUV 4:2:0 (full range, BT.601). We hand the
JPEG's own planes to x264 (no RGB round trip) and flag the stream as full-range
BT.601 with centred chroma, and the reader converts back to RGB with the same
triangle chroma filter libjpeg uses. Going through RGB with swscale instead costs
~1.5 dB PSNR before any compression, and time on the ingest hot path.

Every GOP is encoded by a fresh encoder. A GOP therefore always starts with an IDR
frame that carries SPS and PPS (what Foxglove needs to start playback anywhere),
GOP boundaries sit at fixed times for every camera even when a camera drops frames,
encoders hold at most one GOP of frames, and GOPs could be encoded in parallel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction

import av
import numpy as np
import simplejpeg

from . import av_fork  # noqa: F401 (imported for its after-fork hook: every PyAV user imports codec)

NAL_IDR = 5
NAL_SPS = 7
NAL_PPS = 8
NAL_NON_IDR = 1
_START_CODE = re.compile(b"\x00\x00\x01")


@dataclass(frozen=True)
class VideoSettings:
    """libx264 settings. Output bytes depend only on these and the input frames."""

    gop_frames: int = 150  # frames per GOP at the nominal rate (5 s at 30 Hz)
    # Chosen by `python -m benchmarks encode` (preset x CRF x options at equal quality, priced by the
    # cost model of episodes/encode_cost.py under a fleet-rate floor of 1 episode-hour per core-hour):
    # "faster" at CRF 18.5 with trellis and mbtree off is within 1 dB PSNR of JPEG q90 against the raw
    # frames at 0.185x its bytes and ~7.4 ms a 640x480 frame per core (1.5 episode-hours per core-hour);
    # "slower" at equal PSNR saves ~7 % of the bytes for ~8x the CPU. Each CRF +1 trades ~0.2 dB for
    # ~25 % fewer bytes.
    crf: float = 18.5
    preset: str = "faster"
    tune: str = "psnr"  # no psycho-visual tuning: training data wants fidelity, not looks
    # trellis and mbtree (rc-lookahead) spend bits copying the JPEG's noise and blocking: off, every preset
    # needs 15-30 % fewer bytes at equal PSNR against the raw frames (benchmarks encode)
    x264_options: str = "trellis=0:rc-lookahead=0"
    pix_fmt: str = "yuv420p"
    # Pinned: libx264's default (frame/slice threads = cores) makes bytes depend on the machine.
    threads: int = 1

    def x264_params(self) -> str:
        # No B-frames (Foxglove refuses them), no scene-cut keyframes: keyframes only
        # where a GOP starts; SPS/PPS repeated on every keyframe.
        return (
            f"keyint={self.gop_frames * 2}:min-keyint={self.gop_frames * 2}:scenecut=0:"
            f"bframes=0:repeat-headers=1:threads={self.threads}:sliced-threads=0:lookahead-threads=1:"
            "colormatrix=bt470bg:colorprim=bt470bg:transfer=bt470bg:range=pc:chromaloc=1"
            + (f":{self.x264_options}" if self.x264_options else "")  # after the preset's: they override it
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d["codec"] = "libx264"
        d["x264_params"] = self.x264_params()
        return d


def encode_gop(
    frames: Iterable[av.VideoFrame | np.ndarray], settings: VideoSettings, rate_hz: float = 30.0
) -> list[bytes]:
    """Encode frames as one closed GOP; one Annex B access unit per frame.

    Frames are full-range YUV 4:2:0 ``av.VideoFrame``s (see :func:`jpeg_to_yuv`) or RGB
    (H, W, 3) uint8 arrays. The first frame is an IDR frame with SPS and PPS in front.
    """
    enc: av.VideoCodecContext | None = None
    out: list[bytes] = []
    for i, frame in enumerate(frames):
        frame = to_yuv(frame)
        if enc is None:
            enc = _open_encoder(frame.width, frame.height, settings, rate_hz, frame.format.name)
        else:
            assert enc.pix_fmt is not None  # an opened encoder has its pixel format (set in _open_encoder)
            frame = as_format(frame, enc.pix_fmt)
        frame.pts = i
        # A decoded video frame keeps its stream's time base, and PyAV would rescale pts from it to the
        # encoder's: every frame of a GOP at pts 0 and x264's CRF (which weighs frames by duration)
        # spending ~30 % fewer bits. The frame index is in the encoder's time base.
        frame.time_base = enc.time_base
        # A decoded JPEG is flagged as an I picture and libx264 honours the flag: without this
        # reset every frame would be intra-coded.
        frame.pict_type = av.video.frame.PictureType.NONE
        out.extend(bytes(p) for p in enc.encode(frame))
    if enc is not None:
        out.extend(bytes(p) for p in enc.encode(None))
    return out


def _open_encoder(
    width: int, height: int, settings: VideoSettings, rate_hz: float, input_format: str = "yuv420p"
) -> av.VideoCodecContext:
    if width % 2 or height % 2:
        raise ValueError(f"{settings.pix_fmt} needs even frame sizes, got {width}x{height}")
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height = width, height
    # A decoded JPEG's planes arrive as yuvj420p (FFmpeg's name for full-range 4:2:0): x264 takes
    # them as they are, and the bitstream is bit-identical to the same planes as range-flagged
    # yuv420p (checked), without PyAV's swscale copy of every frame (~0.15 ms at 640x480).
    enc.pix_fmt = "yuvj420p" if settings.pix_fmt == "yuv420p" and input_format == "yuvj420p" else settings.pix_fmt
    enc.color_range = FULL_RANGE
    # x264's rate control works in frame durations: a time base that does not match the
    # frame rate (e.g. 1 ms ticks with pts = frame index) silently changes what a CRF means.
    fps = Fraction(rate_hz).limit_denominator(1000)
    enc.framerate = fps
    enc.time_base = 1 / fps
    enc.thread_count = settings.threads
    enc.thread_type = "NONE" if settings.threads == 1 else "FRAME"
    options = {"crf": f"{settings.crf:g}", "preset": settings.preset, "x264-params": settings.x264_params()}
    if settings.tune:
        options["tune"] = settings.tune
    enc.options = options
    enc.open()
    return enc


FULL_RANGE = 2  # AVCOL_RANGE_JPEG
_FULL_RANGE_420 = ("yuv420p", "yuvj420p")


def jpeg_to_yuv(data: bytes) -> av.VideoFrame:
    """Decode a JPEG to its own YUV 4:2:0 planes (full range), strictly.

    Raises ValueError for anything libjpeg-turbo or FFmpeg's MJPEG decoder flags:
    missing markers, truncation, bad headers or scan data. (JPEG has no checksum, so
    corruption that still parses as valid entropy-coded data cannot be detected.)
    """
    if len(data) < 4 or data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (missing SOI marker)")
    if data[-2:] != b"\xff\xd9":
        raise ValueError("truncated JPEG (missing EOI marker)")
    height, width, _, _ = simplejpeg.decode_jpeg_header(data, strict=True)
    ctx = av.CodecContext.create("mjpeg", "r")
    # Pinned like the encoder (see VideoSettings.threads): PyAV's default is thread_count=0
    # (one per core). FFmpeg's mjpeg decoder has no threading today, so this changes no
    # pixel, but the encoder's input must not depend on the machine or its load.
    ctx.thread_count = 1
    ctx.thread_type = "NONE"
    ctx.options = {"err_detect": "explode+crccheck+bitstream+buffer"}
    try:
        frames = ctx.decode(av.Packet(data)) + ctx.decode(None)
    except av.FFmpegError as e:
        raise ValueError(f"MJPEG decoder: {e}") from None
    if len(frames) != 1 or (frames[0].width, frames[0].height) != (width, height):
        raise ValueError("JPEG decoded to no frame or to a size other than its header's")
    return to_yuv(frames[0])


def to_yuv(frame: av.VideoFrame | np.ndarray) -> av.VideoFrame:
    """Full-range YUV 4:2:0: JPEG's 4:2:0 planes pass through; anything else is converted.

    4:2:0 (and H.264 in 4:2:0, whose cropping window moves in 2-pixel steps) cannot hold an odd
    width or height, so an odd-sized frame loses its last column and/or row here, ffmpeg's usual
    ``crop=trunc(iw/2)*2:trunc(ih/2)*2``: only source pixels are kept (padding would invent an
    edge), at most one line per axis. Raises ValueError for a frame under 2x2 pixels.
    """
    if isinstance(frame, np.ndarray):
        if frame.ndim != 3 or frame.shape[2] != 3 or min(frame.shape[:2]) < 2:
            raise ValueError(f"expected an RGB frame of at least 2x2 pixels, got shape {frame.shape}")
        frame = av.VideoFrame.from_ndarray(
            np.ascontiguousarray(frame[: frame.shape[0] & ~1, : frame.shape[1] & ~1]), format="rgb24"
        )
    # threads=1: PyAV's reformat defaults to threads=0, i.e. a fresh swscale slice-thread
    # pool of one thread per core for every frame (each frame carries its own reformatter).
    # The pixels are the same at any thread count (checked: 1-16 threads, bit-identical), but
    # spawning and joining that pool per frame costs more than the copy itself (0.58 vs
    # 0.30 ms per 320x240 JPEG decode+copy on 2 cores, ~5x worse when the cores are busy),
    # and the encoder's input path should not depend on the core count or the scheduling.
    if frame.format.name == "yuvj420p" or (frame.format.name == "yuv420p" and frame.color_range == FULL_RANGE):
        out = frame  # full-range 4:2:0 already (yuvj420p is what FFmpeg's MJPEG decoder gives)
    else:
        out = frame.reformat(format="yuv420p", dst_color_range=FULL_RANGE, threads=1)
    out = _crop_to_even(out)
    out.color_range = FULL_RANGE
    return out


def as_format(frame: av.VideoFrame, pix_fmt: str) -> av.VideoFrame:
    """A full-range 4:2:0 frame (from :func:`to_yuv`) under the name an encoder was opened with
    (yuv420p or yuvj420p): the same planes, copied without swscale (which would rescale the range
    between the two names) when the name differs."""
    if frame.format.name == pix_fmt or pix_fmt not in _FULL_RANGE_420 or frame.format.name not in _FULL_RANGE_420:
        return frame  # nothing to relabel: the encoder converts other layouts itself
    out = av.VideoFrame.from_ndarray(frame.to_ndarray(), format=pix_fmt)
    out.color_range = FULL_RANGE
    return out


def _crop_to_even(frame: av.VideoFrame) -> av.VideoFrame:
    """A yuv420p frame without its last column/row where the width/height is odd (see :func:`to_yuv`)."""
    w, h = frame.width & ~1, frame.height & ~1
    if (w, h) == (frame.width, frame.height):
        return frame
    if w == 0 or h == 0:
        raise ValueError(f"a {frame.width}x{frame.height} frame is too small to encode (at least 2x2 pixels)")
    planes = []
    for plane, (pw, ph) in zip(frame.planes, ((w, h), (w // 2, h // 2), (w // 2, h // 2)), strict=True):
        rows = np.frombuffer(memoryview(plane), np.uint8).reshape(-1, plane.line_size)
        planes.append(rows[:ph, :pw].reshape(-1))
    return av.VideoFrame.from_ndarray(np.concatenate(planes).reshape(h * 3 // 2, w), format="yuv420p")


def i420_planes(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y (H, W), U and V (H/2, W/2) of ``VideoFrame.to_ndarray()``'s stacked (H*3/2, W) yuv420p. The
    chroma planes are split by size, not by rows: where H is 2 mod 4 (480x270) U ends mid-row."""
    h, w = planes.shape[0] * 2 // 3, planes.shape[1]
    chroma, n = planes[h:].reshape(-1), (h // 2) * (w // 2)
    return planes[:h], chroma[:n].reshape(h // 2, w // 2), chroma[n : 2 * n].reshape(h // 2, w // 2)


def yuv420_to_rgb(planes: np.ndarray, full_range: bool = True) -> np.ndarray:
    """(H*3/2, W) stacked I420 planes -> (H, W, 3) RGB, BT.601, centred chroma.

    Chroma is upsampled with libjpeg's triangle ("fancy") filter, which swscale lacks.
    """
    y8, u8, v8 = i420_planes(planes)
    h, w = y8.shape
    y, u, v = y8.astype(np.float32), _upsample2(u8), _upsample2(v8)
    if full_range:
        u -= 128.0
        v -= 128.0
    else:
        y = (y - 16.0) * (255.0 / 219.0)
        u = (u - 128.0) * (255.0 / 224.0)
        v = (v - 128.0) * (255.0 / 224.0)
    rgb = np.empty((h, w, 3), np.float32)
    rgb[..., 0] = y + 1.402 * v
    rgb[..., 1] = y - 0.344136 * u - 0.714136 * v
    rgb[..., 2] = y + 1.772 * u
    rgb += 0.5
    return np.clip(rgb, 0, 255, out=rgb).astype(np.uint8)


def _upsample2(c: np.ndarray) -> np.ndarray:
    c = c.astype(np.float32)
    h, w = c.shape
    p = np.pad(c, ((0, 0), (1, 1)), mode="edge")
    wide = np.empty((h, 2 * w), np.float32)
    wide[:, 0::2] = 0.75 * c + 0.25 * p[:, :-2]
    wide[:, 1::2] = 0.75 * c + 0.25 * p[:, 2:]
    p = np.pad(wide, ((1, 1), (0, 0)), mode="edge")
    out = np.empty((2 * h, 2 * w), np.float32)
    out[0::2] = 0.75 * wide + 0.25 * p[:-2]
    out[1::2] = 0.75 * wide + 0.25 * p[2:]
    return out


class H264Decoder:
    """Decodes a run of access units that starts at a keyframe, in order."""

    def __init__(self, strict: bool = False):
        """``strict``: any error the decoder detects fails the decode (FFmpeg's ``err_detect=explode``)
        instead of being concealed."""
        self._ctx = av.CodecContext.create("h264", "r")
        self._ctx.thread_type = "NONE"  # one frame out per packet in, no reordering delay
        if strict:
            self._ctx.options = {"err_detect": "explode"}

    def decode(self, access_units: Sequence[bytes], want: Iterable[int]) -> dict[int, np.ndarray]:
        """Decode all of ``access_units``; return RGB frames at the indices in ``want``."""
        want = set(want)
        last = max(want)
        frames: dict[int, np.ndarray] = {}
        produced = 0

        def collect(decoded: Iterable[av.VideoFrame]) -> None:
            nonlocal produced
            for frame in decoded:
                if produced in want:
                    frames[produced] = decoded_to_rgb(frame)
                produced += 1

        for i, au in enumerate(access_units[: last + 1]):
            packet = av.Packet(au)
            packet.pts = i
            collect(self._ctx.decode(packet))
        collect(self._ctx.decode(None))
        missing = want - frames.keys()
        if missing:
            raise ValueError(f"decoder produced {produced} frames, missing indices {sorted(missing)}")
        return frames

    def decode_yuv(self, access_units: Sequence[bytes]) -> list[av.VideoFrame]:
        """Every picture of ``access_units`` (a run from a keyframe), as the decoder's frames; ValueError
        when the decoder fails or gives another number of pictures than units."""
        frames: list[av.VideoFrame] = []
        try:
            for i, au in enumerate(access_units):
                packet = av.Packet(au)
                packet.pts = i
                frames.extend(self._ctx.decode(packet))
            frames.extend(self._ctx.decode(None))
        except av.FFmpegError as e:
            raise ValueError(str(e)) from None
        if len(frames) != len(access_units):
            raise ValueError(f"{len(access_units)} access units decode to {len(frames)} pictures")
        return frames


class StreamingH264Decoder:
    """Decodes access units one at a time (a GOP read in several steps keeps its decoder between
    them instead of decoding again from the keyframe). One frame out per unit in: no B-frames."""

    def __init__(self):
        self._ctx = av.CodecContext.create("h264", "r")
        self._ctx.thread_type = "NONE"
        self._pts = 0

    def feed(self, access_unit: bytes) -> list[av.VideoFrame]:
        packet = av.Packet(access_unit)
        packet.pts = self._pts
        self._pts += 1
        return list(self._ctx.decode(packet))


def resized_rgb(height: int, width: int):
    """A frame transform: RGB at (height, width) straight from the decoded YUV by swscale's area
    filter, (3, height, width) uint8: far cheaper than full-size RGB then a resize."""

    def transform(frame: av.VideoFrame) -> np.ndarray:
        rgb = frame.to_ndarray(width=width, height=height, format="rgb24", interpolation="AREA")
        return np.ascontiguousarray(rgb.transpose(2, 0, 1))

    return transform


def decoded_to_rgb(frame: av.VideoFrame) -> np.ndarray:
    if frame.format.name in ("yuv420p", "yuvj420p") and frame.width % 2 == 0 and frame.height % 2 == 0:
        full = frame.format.name == "yuvj420p" or frame.color_range == FULL_RANGE
        return yuv420_to_rgb(frame.to_ndarray(), full_range=full)
    return frame.to_ndarray(format="rgb24")  # other layouts (foreign files): swscale


def nal_unit_types(access_unit: bytes) -> list[int]:
    """Types of the NAL units in an Annex B access unit, in order.

    Emulation prevention guarantees 00 00 01 never occurs inside a NAL unit, so every
    match is a real start code.
    """
    return [access_unit[m.end()] & 0x1F for m in _START_CODE.finditer(access_unit) if m.end() < len(access_unit)]


def is_keyframe(access_unit: bytes) -> bool:
    """True when the access unit's first slice is IDR; stops at that slice, not the payload's end."""
    for m in _START_CODE.finditer(access_unit):
        if m.end() < len(access_unit):
            nal = access_unit[m.end()] & 0x1F
            if 1 <= nal <= 5:
                return nal == NAL_IDR
    return False
