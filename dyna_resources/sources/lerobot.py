"""LeRobot datasets (v2.1, v3.0) as a native source: one landed dataset directory, its episodes, with no
detour through the legacy HDF5 (``episodes.lerobot.import_lerobot`` decodes every frame, re-encodes it as
JPEG, and the transcoder decodes that again: a generation of loss and the codec's CPU twice).

The dataset's layout is parsed as ``episodes.lerobot.read_lerobot`` parses it (the same private helpers);
the rows (states, actions, timestamps) are read whole, they are small. Cameras are :class:`VideoCamera`:
reading the dataset opens no video. The transcoder streams each camera (an MP4, or a v3.0 episode's
``[from_timestamp, to_timestamp)`` range of a file shared by many episodes) and gets the decoder's own
4:2:0 frames; the gates seek to the few frames they look at. An episode's decoded frames are never held
whole (30 s of three 640x480 cameras would be over 1 GB).

Colour: the frames go to x264 as the decoder's planes. Full-range 4:2:0 (what ``write_lerobot`` and
H.264 exports hold) passes untouched; limited range (LeRobot's own AV1, most datasets) is expanded to
full range by the lookup ``import_lerobot`` uses for its JPEGs, two pixels at a time: ~0.2 ms a 640x480
frame, where swscale's range conversion (what ``codec.to_yuv`` would do) takes 1.5 ms and is 3.6 dB less
accurate (48.8 against 52.4 dB PSNR against the exact conversion). Other layouts (10-bit, 4:4:4) are left
to the encoder's swscale. Each frame also loses the stream's time base (:func:`for_encoder`).

Episode ids, times, site and metadata are ``import_lerobot``'s (``episodes.lerobot._Landed``), so an
episode is the same episode by either route.

Every failure names the file and the field or camera key: an unsupported ``codebase_version``, a missing
or unreadable file or column (when the dataset is read), and, as a camera is decoded, a video that does
not decode (:class:`~dyna_resources.episodes.errors.CorruptFrameError`, with the frame) or holds another
number of frames than the episode's rows (:class:`~dyna_resources.episodes.lerobot.LeRobotFormatError`).

Plain Python, no Dagster import.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ..episodes.codec import FULL_RANGE, decoded_to_rgb
from ..episodes.errors import CorruptFrameError, MissingStreamError, TimestampError
from ..episodes.lerobot import (
    _CHROMA_TO_FULL,
    _LUMA_TO_FULL,
    CAMERA_PREFIX,
    LEROBOT_SITE,
    LeRobotFormatError,
    _episode,
    _episode_files,
    _info,
    _Landed,
    _streams,
    _Video,
)
from .memory import MemoryCamera, MemoryEpisode

ROBOT_ID = "lerobot"  # import_lerobot's default robot_id


def read_lerobot_dataset(root: str | Path, *, name: str | None = None) -> list[MemoryEpisode]:
    """The episodes of the LeRobot v2.x / v3.0 dataset at ``root``, in index order, as ``import_lerobot``
    would land them: ids ``<name>-<index:06d>``, site ``"lerobot"`` (the transcoder's CRF for it), robot
    model the dataset's ``robot_type``, the same times; ``joint_states.position`` the rows'
    ``observation.state``, ``action.command`` their ``action``.

    :param root: the dataset directory (holding ``meta/info.json``).
    :param name: the dataset's name in episode ids (default: the directory's name).
    :raises LeRobotFormatError: a file, field or column missing or unreadable, or an unsupported version.
    :raises MissingStreamError: the dataset has no camera stored as video.
    :raises TimestampError: an episode's ``timestamp`` column not strictly increasing.
    """
    root = Path(root)
    info = _info(root)
    if not any(f.get("dtype") == "video" for f in info["features"].values()):
        images = sorted(k for k, f in info["features"].items() if f.get("dtype") == "image")
        raise MissingStreamError(
            str(root / "meta/info.json"),
            "no video feature"
            + (f" (image features, frames in the Parquet rows, are not read: {images})" if images else ""),
            stream="images",
        )
    fps = float(info["fps"])
    placed = _Landed(name or root.resolve().name, ROBOT_ID, str(info.get("robot_type") or ""), LEROBOT_SITE)
    episodes = []
    for files in _episode_files(root, info):
        for key, video in files.videos.items():
            if not video.path.is_file():
                raise LeRobotFormatError(str(video.path), f"missing (episode {files.index})", stream=key)
        ep = _episode(info, files.index, files.task, files.rows, files.data, {})
        back = np.flatnonzero(np.diff(ep.timestamps) <= 0)
        if len(back):
            i = int(back[0]) + 1
            raise TimestampError(
                str(files.data),
                f"episode {files.index}: timestamp not strictly increasing at row {i} "
                f"({ep.timestamps[i]:.6f} s after {ep.timestamps[i - 1]:.6f} s)",
                stream="timestamp",
            )
        meta, ts = placed.next(ep)
        cameras: dict[str, MemoryCamera] = {
            key.removeprefix(CAMERA_PREFIX): VideoCamera(
                key.removeprefix(CAMERA_PREFIX), ts, key, video, ep.timestamps, fps, root=root, episode=files.index
            )
            for key, video in files.videos.items()
        }
        report = {
            "codebase_version": str(info["codebase_version"]),
            "episode_index": files.index,
            "data": str(files.data.relative_to(root)),
            "videos": {key: str(video.path.relative_to(root)) for key, video in files.videos.items()},
        }
        episodes.append(MemoryEpisode(str(root), meta, _streams(ep, ts), cameras, "lerobot", report))
    return episodes


class VideoCamera(MemoryCamera):
    """One camera of a LeRobot episode, its frames left in the video and decoded when read.

    Row ``i`` is the range's ``i``-th frame, the frame at ``offsets_s[i]`` (the row's ``timestamp``) from
    the episode's first frame (v3.0: at ``from_timestamp + timestamp`` in the file, as LeRobot finds it).
    ``encoding`` is ``"rgb"``: :meth:`frame` gives decoded pixels, there are no JPEG bytes. Errors name the
    video (``path``), the camera key (``stream``) and, in the reason, the video within the dataset and the
    episode: a quarantine record, which keeps the reason and the stream, says which file of the dataset.
    """

    def __init__(
        self,
        name: str,
        timestamps_ns: np.ndarray,
        key: str,
        video: _Video,
        offsets_s: np.ndarray,
        fps: float,
        *,
        root: Path,
        episode: int,
    ):
        super().__init__(name, timestamps_ns, "rgb", _Frames(self), str(video.path), key)
        self.key, self.video, self.offsets_s, self.fps, self.episode = key, video, offsets_s, fps, episode
        self._where = f"{video.path.relative_to(root)}, episode {episode}"

    def frame(self, i: int) -> np.ndarray:
        """Frame ``i`` as RGB (H, W, 3) uint8: a seek to the keyframe before it and a decode up to it."""
        if not 0 <= i < len(self):
            raise IndexError(f"camera {self.name}: frame {i} of {len(self)}")
        frames = self._decoded(first=i)
        try:
            frame = next(frames, None)
        finally:
            frames.close()  # the file now, not when the generator is collected
        if frame is None:
            raise self._corrupt(i, f"no frame at {self.offsets_s[i]:.4f} s of the episode")
        return _rgb(frame)

    def iter_frames(self, batch: int = 32) -> Iterator[np.ndarray]:
        """Every frame as RGB (H, W, 3) uint8, in order, decoded as it goes."""
        for frame in self._rows():
            yield _rgb(frame)

    def iter_yuv(self, batch: int = 32) -> Iterator[av.VideoFrame]:
        """Every frame as full-range 4:2:0 for the encoder, in order: the decoder's own planes (limited
        range expanded by a lookup); no RGB round trip, no swscale pass."""
        for frame in self._rows():
            yield for_encoder(frame)

    def _rows(self) -> Iterator[av.VideoFrame]:
        """The decoded frames, one per row; a video with fewer or more frames than rows is a LeRobotFormatError,
        raised at the row where it shows (more: with the last row, before it is yielded)."""
        n = len(self)
        frames = self._decoded()
        for i in range(n):
            frame = next(frames, None)
            if frame is None:
                raise self._count_error(i)
            if i == n - 1:
                extra = sum(1 for _ in frames)
                if extra:
                    raise self._count_error(n + extra)
            yield frame

    def _count_error(self, frames: int) -> LeRobotFormatError:
        reason = f"{self._where}: {frames} frames in the video for {len(self)} data rows"
        return LeRobotFormatError(self._path, reason, stream=self.key)

    def _corrupt(self, row: int, reason: str) -> CorruptFrameError:
        return CorruptFrameError(self._path, self.key, row, f"{self._where}: {reason}")

    def _decoded(self, first: int | None = None) -> Generator[av.VideoFrame, None, None]:
        """The episode's decoded frames in order, or (``first``) row ``first``'s frame alone: a seek to the
        keyframe before it, nothing when no frame lies within half a frame of its time."""
        video, half = self.video, 0.5 / self.fps
        row = first or 0  # the row of the next frame, for an error
        try:
            with av.open(self._path) as container:
                if not container.streams.video:
                    raise self._corrupt(row, "the file holds no video stream")
                stream = container.streams.video[0]
                # One thread, as the encoder: the batch engine runs an episode per core (and libdav1d
                # would start a pool of 1.5 threads per core for every seek).
                stream.thread_type = "NONE"
                stream.codec_context.thread_count = 1
                base = stream.time_base
                assert base is not None  # a video stream read from a file has a time base
                # frames earlier than ``lo`` are skipped, decoding stops at the first at or after ``hi``
                lo = hi = None
                if video.start is not None:
                    lo, hi = video.start - half, (video.end - half if video.end is not None else None)
                if first is not None:
                    origin = video.start if video.start is not None else float((stream.start_time or 0) * base)
                    at = origin + float(self.offsets_s[first])
                    lo, hi = at - half, min(at + half, hi if hi is not None else np.inf)
                if lo is not None and lo > 0:
                    container.seek(int(lo / base), stream=stream, backward=True)
                for frame in container.decode(stream):
                    if lo is not None:
                        t = frame.time
                        if t is None:
                            raise self._corrupt(row, "a frame without a timestamp")
                        if t < lo:
                            continue
                        if hi is not None and t >= hi:
                            return
                    yield frame
                    row += 1
        except (av.error.FFmpegError, ValueError) as e:
            raise self._corrupt(row, f"cannot decode video: {e}") from None


class _Frames(Sequence):
    """A :class:`VideoCamera`'s frames as the ``MemoryCamera.frames`` sequence: RGB, decoded when indexed."""

    def __init__(self, camera: VideoCamera):
        self.camera = camera

    def __len__(self) -> int:
        return len(self.camera)

    def __getitem__(self, i):  # an int index only
        return self.camera.frame(int(i))

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.camera.iter_frames()

    def __repr__(self) -> str:
        return f"<{len(self)} frames of {self.camera._path}>"


def for_encoder(frame: av.VideoFrame) -> av.VideoFrame:
    """A decoded frame as ``codec.encode_gop`` takes it: without the stream's time base, and full range.

    The time base goes: the encoder would rescale the frame index it sets as pts from the stream's time base
    (1/15360 here) to its own (1/fps), every frame of a GOP at pts 0, and x264's CRF, which weighs each
    frame's complexity by its duration, would spend ~30 % fewer bits (1.5 dB PSNR at CRF 12 on the tests'
    96x64 frames). Full-range 4:2:0 passes as it is; limited-range yuv420p of even size is expanded plane
    by plane by lookup (exact rounding, no swscale); anything else is left for ``codec.to_yuv`` to convert.
    """
    if frame.format.name == "yuv420p" and frame.color_range != FULL_RANGE and not (frame.width % 2 or frame.height % 2):
        h, w = frame.height, frame.width
        out = np.empty(h * w * 3 // 2, np.uint8)
        sizes = ((h, w), (h // 2, w // 2), (h // 2, w // 2))
        at = 0
        for plane, (rows, cols), luts in zip(frame.planes, sizes, (_LUMA, _CHROMA, _CHROMA), strict=True):
            src = np.frombuffer(memoryview(plane), np.uint8).reshape(-1, plane.line_size)[:rows, :cols]
            dst = out[at : at + rows * cols].reshape(rows, cols)
            at += rows * cols
            if cols % 2:
                np.take(luts[0], src, out=dst)
            else:  # two pixels a lookup
                np.take(luts[1], src.view(np.uint16), out=dst.view(np.uint16))
        # from_numpy_buffer wraps ``out`` without a copy, but PyAV 18 gives it a height 2 short when h % 4 == 2
        make = av.VideoFrame.from_numpy_buffer if h % 4 == 0 else av.VideoFrame.from_ndarray
        frame = make(out.reshape(h * 3 // 2, w), format="yuv420p")
        frame.color_range = FULL_RANGE
    frame.time_base = Fraction(0, 1)  # none: the encoder's own
    frame.pts, frame.duration = None, 0
    return frame


def _rgb(frame: av.VideoFrame) -> np.ndarray:
    """RGB as everywhere else (``codec.decoded_to_rgb``); a frame whose height is 2 mod 4 goes through
    swscale: decoded_to_rgb cuts the chroma planes out of the stacked planes by rows, which then fails."""
    return decoded_to_rgb(frame) if frame.height % 4 == 0 else frame.to_ndarray(format="rgb24")


def _two_at_once(lut: np.ndarray) -> np.ndarray:
    """``lut`` applied to both bytes of a uint16 (whatever the byte order: each byte is looked up alone)."""
    i = np.arange(1 << 16)
    return lut[i & 0xFF].astype(np.uint16) | (lut[i >> 8].astype(np.uint16) << 8)


# import_lerobot's exact limited-to-full-range lookups: per byte, and per two bytes (the uint16 lookup takes
# 0.10 ms a 640x480 luma plane, the byte one 0.17 ms)
_LUMA = (_LUMA_TO_FULL, _two_at_once(_LUMA_TO_FULL))
_CHROMA = (_CHROMA_TO_FULL, _two_at_once(_CHROMA_TO_FULL))


__all__ = ["VideoCamera", "for_encoder", "read_lerobot_dataset"]
