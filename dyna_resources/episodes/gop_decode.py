"""Decode many frames of one camera at once, GOP by GOP, converting only the frames asked for.

A training loader that knows every frame a group of samples needs (a decode unit: one episode,
a window of GOPs, the cameras read) asks for all of them in one call: each GOP holding a wanted
frame is decoded once, sequentially from its keyframe up to its last wanted frame (never further:
a sparse sample set stops a GOP after its last anchor), and only the wanted frames go through
libswscale (colour conversion and resize in one C pass). A frame wanted twice is decoded once.

GOPs are closed (each starts with an IDR frame carrying SPS/PPS, see ``codec.py``), so each is
decoded by a fresh decoder: a damaged GOP fails only the frames asked of it, each failure naming
the episode, camera and time, and every other GOP of the call still decodes.

Decoders come from a :class:`DecoderBackend`: libavcodec on the CPU, or NVDEC through FFmpeg's
CUDA hwaccel (PyAV's ``HWAccel``) when the trainer runs on a GPU, with the CPU as the fallback.
No Dagster or torch import: DataLoader workers import this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import av
import numpy as np

from .codec import FULL_RANGE, is_keyframe
from .errors import McapFormatError, WindowError
from .mcap_reader import EpisodeReader, _video_payload
from .topics import camera_topic

BackendName = Literal["auto", "cpu", "cuda"]

# swscale's colour conversion as the transcoder wrote the stream: BT.601 matrix, full range in and out.
# Without the explicit source range swscale reads a frame left flagged "unspecified" as limited range.
_BT601 = "ITU601"


def swscale_rgb(
    height: int | None = None, width: int | None = None, *, interpolation: str = "AREA", chw: bool = True
) -> Callable[[av.VideoFrame], np.ndarray]:
    """A frame transform: RGB straight from the decoded YUV through libswscale, resized (area
    filter) in the same pass when a size is given; (3, H, W) uint8 with ``chw`` else (H, W, 3).

    The stream is full-range BT.601 (see ``codec.py``): both are passed to swscale explicitly, so a
    frame whose range flag was lost still converts right. swscale upsamples chroma bilinearly where
    ``codec.decoded_to_rgb`` uses libjpeg's triangle filter: the two agree within the tolerance
    ``tests/episodes/test_gop_decode.py`` states (chroma edges only; luma is identical).
    """

    def transform(frame: av.VideoFrame, out: np.ndarray | None = None) -> np.ndarray:
        w, h = width or frame.width, height or frame.height
        src_range = FULL_RANGE if frame.color_range in (0, FULL_RANGE) else frame.color_range
        options: dict[str, Any] = dict(
            width=w,
            height=h,
            src_colorspace=_BT601,
            dst_colorspace=_BT601,
            interpolation=interpolation,
            src_color_range=src_range,
            dst_color_range=FULL_RANGE,
            threads=1,
        )
        if chw and (w, h) == (frame.width, frame.height):
            # Full size, channels first: swscale writes planar RGB (gbrp) and each plane is copied into its
            # row of the output, bit for bit what rgb24 then a (H, W, 3) -> (3, H, W) transpose gives, at a
            # fifth of the CPU at 640x480 (the transpose was the dearer part). Resized frames keep rgb24:
            # swscale's gbrp and rgb24 downscales differ by a few levels, and there the transpose is small.
            planes = frame.reformat(format="gbrp", **options).planes
            out = np.empty((3, h, w), np.uint8)
            for dst, src in ((0, 2), (1, 0), (2, 1)):  # R, G, B from the planes G, B, R
                plane = planes[src]
                out[dst] = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)[
                    :, : plane.width
                ]
            return out
        rgb = frame.reformat(format="rgb24", **options).to_ndarray()
        return np.ascontiguousarray(rgb.transpose(2, 0, 1)) if chw else rgb

    return transform


# ---- decoder backends ---------------------------------------------------------------------------
class DecoderBackend:
    """Where H.264 is decoded. ``cpu``: libavcodec, one thread per decoder (the loader runs many
    decoders side by side). ``cuda``: NVDEC through FFmpeg's CUDA hwaccel; frames come back to host
    memory (NV12) for the same swscale conversion. ``auto``: cuda when a CUDA device answers, else cpu.

    The CUDA path is verified only where a GPU was lent (docs/training.md); everywhere else ``auto`` is cpu.
    """

    def __init__(self, name: BackendName = "cpu", device: str | None = None):
        if name not in ("auto", "cpu", "cuda"):
            raise ValueError(f"decoder backend {name!r}: expected 'auto', 'cpu' or 'cuda'")
        self.requested = name
        self.device = device
        self.name = "cuda" if name == "cuda" or (name == "auto" and cuda_decode_available(device)) else "cpu"
        if self.name == "cuda" and not cuda_decode_available(device):
            raise RuntimeError(
                "decoder backend 'cuda': no CUDA device answers FFmpeg's hwaccel here "
                f"(device {device or 'default'}); use 'auto' to fall back to the CPU"
            )

    def decoder(self) -> av.VideoCodecContext:
        if self.name == "cuda":
            from av.codec.hwaccel import HWAccel

            ctx = av.CodecContext.create(
                "h264", "r", hwaccel=HWAccel("cuda", device=self.device, allow_software_fallback=False)
            )
        else:
            ctx = av.CodecContext.create("h264", "r")
            ctx.thread_type = "NONE"  # one frame out per packet in; the loader's threads are per camera
            ctx.thread_count = 1
        # Damaged slices are an error, not a concealed (silently wrong) picture fed to training.
        ctx.options = {"err_detect": "explode"}
        return ctx


_cuda_probe: dict[str | None, bool] = {}
_probe_lock = threading.Lock()


def cuda_decode_available(device: str | None = None) -> bool:
    """Whether FFmpeg can open a CUDA device for decoding (probed once per process)."""
    with _probe_lock:
        if device not in _cuda_probe:
            try:
                from av.codec.hwaccel import HWAccel, hwdevices_available

                ok = "cuda" in hwdevices_available()
                if ok:
                    ctx = av.CodecContext.create(
                        "h264", "r", hwaccel=HWAccel("cuda", device=device, allow_software_fallback=False)
                    )
                    ctx.open()  # creates the device context: fails without a driver and a GPU
                    ok = ctx.is_hwaccel if hasattr(ctx, "is_hwaccel") else True
            except Exception:
                ok = False
            _cuda_probe[device] = ok
        return _cuda_probe[device]


CPU = DecoderBackend("cpu")


# ---- one camera, many frames --------------------------------------------------------------------
@dataclass
class CameraFrames:
    """The frames asked of one camera, in the order asked (repeats allowed)."""

    camera: str
    topic: str
    requested_ns: np.ndarray
    timestamps_ns: np.ndarray  # the chosen frame's own time per request (-1 where it failed)
    images: np.ndarray  # (n, ...) transformed frames; zeros where the request failed
    errors: dict[int, str] = field(default_factory=dict)  # request index -> why it failed (names the time)
    decoded: int = 0  # frames that went through the decoder for this call
    converted: int = 0  # distinct frames converted (swscale)

    def error_for(self, indices) -> str | None:
        for i in np.atleast_1d(indices).tolist():
            if i in self.errors:
                return self.errors[i]
        return None


def decode_at(
    reader: EpisodeReader,
    camera: str,
    targets_ns,
    *,
    transform: Callable | None = None,
    tolerance_ns: int | None = None,
    stream: str | None = None,
    memo: dict | None = None,
    backend: DecoderBackend = CPU,
) -> CameraFrames:
    """The frame nearest each time in ``targets_ns`` (within ``tolerance_ns``, default one frame
    period), each wanted GOP decoded once from its keyframe to its last wanted frame.

    Failures do not raise: a request with no frame near enough, or in a GOP that fails to decode, is
    listed in ``errors`` with the reason (episode, camera, time), so the caller fails only the
    samples that asked for it. Reading the file itself (summary, chunk CRCs) still raises.

    :param tolerance_ns: one bound for every request, or one per request (an array).
    :param stream: a training stream's name (``training_streams``) instead of the archive stream.
    :param memo: parsed chunks shared with other calls on the same reader (cameras share chunks).
    """
    transform = transform or swscale_rgb(chw=False)
    memo = {} if memo is None else memo
    targets = np.asarray(targets_ns, dtype=np.int64).ravel()
    topic = reader.video_topic(camera, stream) if stream else camera_topic(camera)
    cid = reader._channel(topic, "camera")
    if tolerance_ns is None:
        rate = float(reader.channels[cid].metadata.get("rate_hz", 0) or 0)
        tolerance_ns = int(1e9 / rate) if rate > 0 else 0
    out = CameraFrames(camera, topic, targets, np.full(len(targets), -1, np.int64), np.empty(0, np.uint8))
    if len(targets) == 0:
        return out
    uniq, inverse = np.unique(targets, return_inverse=True)
    # a tolerance per request (an array) becomes the widest asked of each distinct time
    per_request = np.broadcast_to(np.asarray(tolerance_ns, np.int64), targets.shape)
    tolerance = np.zeros(len(uniq), np.int64)
    np.maximum.at(tolerance, inverse, per_request)
    tolerance_ns = int(tolerance.max())
    chunks = reader._chunks_of[cid]
    span = reader._chunk_range(cid, int(uniq[0]) - tolerance_ns, int(uniq[-1]) + tolerance_ns)
    times, payloads = _messages(reader, cid, [chunks[j] for j in span], memo)

    # Nearest frame per distinct target, vectorized; a target with none near enough fails alone.
    failed: dict[int, str] = {}  # distinct target index -> reason
    if len(times) == 0:
        pick = np.zeros(len(uniq), np.int64)
        for u in range(len(uniq)):
            failed[u] = f"no frame within {tolerance_ns / 1e6:.1f} ms of {int(uniq[u])}"
    else:
        right = np.clip(np.searchsorted(times, uniq), 0, len(times) - 1)
        left = np.maximum(right - 1, 0)
        pick = np.where(np.abs(times[left] - uniq) <= np.abs(times[right] - uniq), left, right)
        gap = np.abs(times[pick] - uniq)
        for u in np.flatnonzero(gap > tolerance).tolist():
            failed[u] = (
                f"no frame within {tolerance[u] / 1e6:.1f} ms of {int(uniq[u])} (nearest {gap[u] / 1e6:.1f} ms away)"
            )
    wanted = np.unique(np.delete(pick, list(failed))) if failed else np.unique(pick)

    # The keyframe opening each wanted frame's GOP. The first may lie in an earlier chunk than the
    # span (a layout whose chunks do not start at keyframes): walk back and prepend those messages.
    first_chunk = span.start
    key_of = np.empty(0, np.int64)
    if len(wanted):
        while True:
            flags = np.fromiter(
                (_is_key(payloads[i]) for i in range(int(wanted[-1]) + 1)), bool, count=int(wanted[-1]) + 1
            )
            keys = np.flatnonzero(flags)
            if len(keys) and keys[0] <= wanted[0]:
                break
            if first_chunk == 0:
                reason = f"no keyframe before the frame at {int(times[wanted[0]])}"
                raise McapFormatError(reader.path, reason, topic)
            first_chunk -= 1
            t_prev, p_prev = _messages(reader, cid, [chunks[first_chunk]], memo)
            times, payloads = np.concatenate([t_prev, times]), p_prev + payloads
            shift = len(t_prev)
            pick, wanted = pick + shift, wanted + shift
        key_of = keys[np.searchsorted(keys, wanted, side="right") - 1]

    # Each decoded frame goes straight into its slot of the output (one row per distinct target; a frame
    # several targets chose is copied to the others at the end): no per-frame array kept, no second copy.
    slots: dict[int, list[int]] = {}  # message index -> the distinct targets that chose it
    for u in range(len(uniq)):
        if u not in failed:
            slots.setdefault(int(pick[u]), []).append(u)
    per_uniq: np.ndarray | None = None
    writes_into = getattr(transform, "writes_into", False)

    def put(i: int, frame) -> None:
        nonlocal per_uniq
        row = slots[i][0]
        if per_uniq is None:
            first = transform(frame)
            per_uniq = np.empty((len(uniq), *first.shape), first.dtype)
            per_uniq[row] = first
        elif writes_into:
            transform(frame, out=per_uniq[row])  # type: ignore[call-arg]  # a swscale_rgb transform (writes_into)
        else:
            per_uniq[row] = transform(frame)

    gop_failed: dict[int, str] = {}  # message index -> reason
    converted = 0
    for key in np.unique(key_of).tolist():
        in_gop = wanted[key_of == key]
        last = int(in_gop[-1])
        want = set(in_gop.tolist())
        ctx = backend.decoder()
        produced = key
        try:
            for i in range(key, last + 1):
                packet = av.Packet(bytes(payloads[i]))
                packet.pts = i
                for frame in ctx.decode(packet):
                    if produced in want:
                        put(produced, frame)
                    produced += 1
            if produced <= last:  # a decoder with delay (hwaccel): drain it
                for frame in ctx.decode(None):
                    if produced in want:
                        put(produced, frame)
                    produced += 1
            out.decoded += produced - key
            if produced <= last:
                raise ValueError(f"decoder produced {produced - key} frames for {last - key + 1} access units")
            converted += len(want)
        except (av.FFmpegError, ValueError) as e:
            out.decoded += produced - key
            reason = f"H.264 decode failed in the GOP starting at {int(times[key])} ({e})"
            for i in in_gop.tolist():
                gop_failed[i] = reason
    out.converted = converted  # distinct frames of the GOPs that decoded

    # Back to the order asked, repeats included; zeros where a request failed.
    if per_uniq is None:
        per_uniq = np.zeros((len(uniq), 0), np.uint8)
    stamps = np.full(len(uniq), -1, np.int64)
    for i, us in slots.items():
        if i in gop_failed:
            for u in us:
                failed[u] = gop_failed[i]
            continue
        stamps[us] = times[i]
        for u in us[1:]:
            per_uniq[u] = per_uniq[us[0]]
    for u in failed:
        if per_uniq.shape[1:]:
            per_uniq[u] = 0
    identity = len(inverse) == len(uniq)  # no request repeated (uniq is sorted, so inverse is 0, 1, 2, ...)
    out.images = per_uniq if identity else per_uniq[inverse]
    out.timestamps_ns = stamps if identity else stamps[inverse]
    if failed:
        bad = np.isin(inverse, list(failed))
        out.errors = {int(i): failed[int(inverse[i])] for i in np.flatnonzero(bad)}
    return out


def _messages(reader: EpisodeReader, cid: int, chunk_list, memo: dict) -> tuple[np.ndarray, list[bytes]]:
    """Log times (int64) and Annex B payloads of one channel's messages in these chunks, in order."""
    times: list[int] = []
    payloads: list = []
    for ci in chunk_list:
        for m in reader._load_chunk(ci, memo).get(cid, []):
            times.append(m.log_time)
            payloads.append(_LazyPayload(m.data))
    t = np.asarray(times, np.int64)
    if len(t) > 1 and np.any(np.diff(t) < 0):  # chunks overlap in time (foreign layouts): sort
        order = np.argsort(t, kind="stable")
        t, payloads = t[order], [payloads[i] for i in order]
    return t, payloads


class _LazyPayload:
    """A message's Annex B bytes, unwrapped from the protobuf only when first used (most messages of
    a span are never decoded: they lie past a GOP's last wanted frame)."""

    __slots__ = ("_data", "_bytes")

    def __init__(self, data: memoryview):
        self._data = data
        self._bytes: bytes | None = None

    def __bytes__(self) -> bytes:
        if self._bytes is None:
            self._bytes = _video_payload(self._data)
        return self._bytes


def _is_key(p) -> bool:
    return is_keyframe(bytes(p))


__all__ = [
    "CPU",
    "CameraFrames",
    "DecoderBackend",
    "WindowError",
    "cuda_decode_available",
    "decode_at",
    "parity_psnr",
    "swscale_rgb",
]


def parity_psnr(reader: EpisodeReader, camera: str, targets_ns, a: DecoderBackend, b: DecoderBackend) -> float:
    """PSNR (dB) between the same frames decoded by two backends, full size, RGB: the check that a
    GPU decode (``cuda``) gives the CPU's pixels (bar: >= 40 dB). ``inf`` when identical."""
    rgb = swscale_rgb(chw=False)
    fa = decode_at(reader, camera, targets_ns, transform=rgb, backend=a)
    fb = decode_at(reader, camera, targets_ns, transform=rgb, backend=b)
    if fa.errors or fb.errors:
        raise McapFormatError(reader.path, f"parity frames failed: {fa.errors or fb.errors}", fa.topic)
    mse = float(np.mean((fa.images.astype(np.float64) - fb.images.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(255.0**2 / mse))
