"""The episode model for sources read whole into memory (a ROS 2 bag's episode): cameras whose frames are
compressed images (JPEG, PNG), raw RGB arrays or H.264 access units (:class:`H264Camera`), with the
interface the transcoder and the gates use on the legacy HDF5's cameras (``raw_format.CameraStream``); and
depth streams, which the legacy HDF5 has none of: 16-bit frames the transcoder keeps lossless, beside the
cameras' video.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import av
import numpy as np
from PIL import Image, UnidentifiedImageError

from ..episodes.codec import H264Decoder, decoded_to_rgb, is_keyframe, jpeg_to_yuv, to_yuv
from ..episodes.errors import CorruptFrameError
from ..episodes.raw_format import EpisodeMeta, SampleStream, decode_jpeg

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class MemoryCamera:
    """``frames``: JPEG bytes (``encoding="jpeg"``), or PNG bytes and RGB arrays (``"rgb"``: decoded on use)."""

    name: str
    timestamps_ns: np.ndarray
    encoding: str  # "jpeg" | "rgb"
    frames: Sequence[bytes | np.ndarray]
    _path: str = ""
    topic: str = ""

    def __len__(self) -> int:
        return len(self.timestamps_ns)

    @property
    def _stream(self) -> str:
        return self.topic or f"images/{self.name}"

    def frame_bytes(self, i: int) -> bytes:
        if self.encoding != "jpeg":
            raise ValueError(f"camera {self.name} holds raw frames, not JPEG")
        data = self.frames[i]
        assert isinstance(data, bytes)
        return data

    def iter_jpeg(self, batch: int = 32) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self.frame_bytes(i)

    def frame(self, i: int) -> np.ndarray:
        data = self.frames[i]
        if isinstance(data, np.ndarray):
            return data
        if self.encoding == "jpeg":
            return decode_jpeg(data, self._path, self.name, i)
        return self._png(data, i)

    def iter_frames(self, batch: int = 32) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self.frame(i)

    def iter_yuv(self, batch: int = 32) -> Iterator[av.VideoFrame]:
        for i in range(len(self)):
            try:
                data = self.frames[i]
                if self.encoding == "jpeg":
                    assert isinstance(data, bytes)
                    yield jpeg_to_yuv(data)
                else:
                    yield to_yuv(self.frame(i))
            except ValueError as e:
                raise CorruptFrameError(self._path, self._stream, i, str(e)) from None

    def _png(self, data: bytes, i: int) -> np.ndarray:
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()  # a truncated PNG fails here, not later
                return np.asarray(im.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise CorruptFrameError(self._path, self._stream, i, f"PNG decode failed: {e}") from None


class H264Camera(MemoryCamera):
    """A camera whose frames are H.264 access units (Annex B, one per frame: a ``foxglove_msgs/msg/
    CompressedVideo`` topic). The transcoder copies them when their layout meets the read profile
    (``episodes.h264_layout``) and re-encodes :meth:`iter_yuv` otherwise; :meth:`frame` decodes from the
    keyframe before it, so the gates sample keyframes (:meth:`keyframe_before`). ``preroll``: the units
    from the keyframe before the first frame (an episode cut from a longer recording), decoded, not kept."""

    def __init__(
        self,
        name: str,
        timestamps_ns: np.ndarray,
        units: Sequence[bytes],
        path: str = "",
        topic: str = "",
        preroll: Sequence[bytes] = (),
    ):
        super().__init__(name, timestamps_ns, "h264", units, path, topic)
        self.preroll = list(preroll)
        self.keyframes = np.flatnonzero([is_keyframe(u) for u in units])

    @property
    def units(self) -> Sequence[bytes]:
        return self.frames  # type: ignore[return-value]

    def keyframe_before(self, i: int) -> int:
        """The index of the keyframe at or before frame ``i`` (``i`` itself when there is none)."""
        k = int(np.searchsorted(self.keyframes, i, side="right")) - 1
        return int(self.keyframes[k]) if k >= 0 else i

    def frame_bytes(self, i: int) -> bytes:
        raise ValueError(f"camera {self.name} holds H.264 access units, not JPEG")

    def luma(self, i: int, step: int = 8) -> np.ndarray:
        """Frame ``i``'s luma plane, every ``step``-th pixel (what a gate looks at: no RGB conversion)."""
        frame = self._decoded(i)
        y = np.frombuffer(memoryview(frame.planes[0]), np.uint8).reshape(frame.height, frame.planes[0].line_size)
        return y[::step, : frame.width : step].astype(np.float64)

    def frame(self, i: int) -> np.ndarray:
        return decoded_to_rgb(self._decoded(i))

    def _decoded(self, i: int) -> av.VideoFrame:
        """Frame ``i`` decoded from the keyframe before it (from the preroll's, for an episode cut mid-GOP)."""
        first = self.keyframe_before(i)
        run = (
            [*self.units[first : i + 1]]
            if first < i or is_keyframe(self.units[i])
            else [*self.preroll, *self.units[: i + 1]]
        )
        try:
            return H264Decoder().decode_yuv(run)[-1]
        except ValueError as e:
            raise CorruptFrameError(self._path, self._stream, i, f"H.264 decode failed: {e}") from None

    def iter_yuv(self, batch: int = 32) -> Iterator[av.VideoFrame]:
        """Every frame decoded, in display order (what a re-encode takes; B-frames are reordered)."""
        ctx = av.CodecContext.create("h264", "r")
        ctx.thread_type = "NONE"
        out = -len(self.preroll)  # the preroll's pictures are decoded and dropped
        try:
            for i, au in enumerate([*self.preroll, *self.units]):
                packet = av.Packet(au)
                packet.pts = i
                for frame in ctx.decode(packet):
                    out += 1
                    if out > 0:
                        yield frame
            for frame in ctx.decode(None):
                out += 1
                if out > 0:
                    yield frame
        except (av.FFmpegError, ValueError) as e:
            raise CorruptFrameError(self._path, self._stream, max(out, 0), f"H.264 decode failed: {e}") from None
        if out != len(self.units):
            reason = f"{len(self.units)} access units decode to {out} pictures"
            raise CorruptFrameError(self._path, self._stream, max(out, 0), reason)

    def iter_frames(self, batch: int = 32) -> Iterator[np.ndarray]:
        for frame in self.iter_yuv():
            yield decoded_to_rgb(frame)


@dataclass
class DepthStream:
    """A depth camera's frames: uint16 (H, W) arrays of millimetres (REP 118), 0 where there is no reading."""

    name: str
    timestamps_ns: np.ndarray
    frames: Sequence[np.ndarray]
    topic: str = ""  # where the source held it (a bag topic)

    def __len__(self) -> int:
        return len(self.timestamps_ns)


@dataclass
class MemoryEpisode:
    """An episode read from a source other than the legacy HDF5: what ``RawEpisode`` offers the transcoder
    and the gates, plus the source it came from."""

    path: str
    meta: EpisodeMeta
    streams: dict[str, SampleStream]
    cameras: dict[str, MemoryCamera]
    source_format: str
    report: dict = field(default_factory=dict)  # what the reader found (topics ignored, timestamps used...)
    depth: dict[str, DepthStream] = field(default_factory=dict)

    def __enter__(self) -> MemoryEpisode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is left open: the source was read whole when the episode was made."""

    @property
    def start_ns(self) -> int:
        firsts = [int(s.timestamps_ns[0]) for s in self.streams.values() if len(s)]
        firsts += [int(c.timestamps_ns[0]) for c in self.cameras.values() if len(c)]
        firsts += [int(d.timestamps_ns[0]) for d in self.depth.values() if len(d)]
        return min(firsts)

    @property
    def end_ns(self) -> int:
        lasts = [int(s.timestamps_ns[-1]) for s in self.streams.values() if len(s)]
        lasts += [int(c.timestamps_ns[-1]) for c in self.cameras.values() if len(c)]
        lasts += [int(d.timestamps_ns[-1]) for d in self.depth.values() if len(d)]
        return max(lasts)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


__all__ = ["DepthStream", "H264Camera", "MemoryCamera", "MemoryEpisode", "PNG_MAGIC"]
