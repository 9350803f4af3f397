"""LeRobot datasets (v2.1, v3.0) as a native source: one landed dataset directory, its episodes, with no
detour through the legacy HDF5 (``episodes.lerobot.import_lerobot`` decodes every frame, re-encodes it as
JPEG, and the transcoder decodes that again: a generation of loss and the codec's CPU twice).

The dataset's files are parsed by ``episodes.lerobot.read_lerobot``; its cameras here decode only when
read: the transcoder streams each MP4 (or a v3.0 episode's range of a shared one) and gets the decoder's
own YUV frames, the gates seek to the few frames they look at. An episode's decoded frames are never
held whole (30 s of three 640x480 cameras would be over 1 GB). Episode ids, times, site and metadata
are ``import_lerobot``'s, so an episode is the same episode by either route.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from ..episodes.codec import FULL_RANGE, decoded_to_rgb
from ..episodes.errors import CorruptFrameError
from ..episodes.lerobot import CAMERA_PREFIX, LEROBOT_SITE, LeRobotFormatError, _full_range_yuv420, read_lerobot
from ..episodes.raw_format import EpisodeMeta, SampleStream
from .memory import MemoryEpisode

START = dt.datetime(1970, 1, 2, tzinfo=dt.UTC)  # import_lerobot's default first start


class VideoFrames(Sequence):
    """One camera's frames of an episode in an MP4, ``[start, end)`` seconds of it (a v3.0 file holds many
    episodes), found by demuxing (no decode) and decoded when read."""

    def __init__(self, path: Path, key: str, start: float | None = None, end: float | None = None, fps: float = 30.0):
        self.path, self.key, self.start, self.end, self.half = path, key, start, end, 0.5 / fps
        if not path.exists():
            raise LeRobotFormatError(str(path), "missing", stream=key)
        try:
            with av.open(str(path)) as c:
                s = c.streams.video[0]
                base = s.time_base
                assert base is not None  # a video stream read from a file has a time base
                times = sorted(float(p.pts * base) for p in c.demux(s) if p.pts is not None and p.size)
        except (av.error.FFmpegError, ValueError) as e:
            raise LeRobotFormatError(str(path), f"cannot read video: {e}", stream=key) from None
        self.times = [t for t in times if self._inside(t)]

    def _inside(self, t: float) -> bool:
        return (self.start is None or t >= self.start - self.half) and (self.end is None or t < self.end - self.half)

    def __len__(self) -> int:
        return len(self.times)

    def _frames(self, at: float | None) -> Iterator[av.VideoFrame]:
        """Decoded frames of the range, from the one at ``at`` seconds on (``None``: its first)."""
        first = at if at is not None else self.start
        k = -1
        try:
            with av.open(str(self.path)) as c:
                s = c.streams.video[0]
                s.thread_type = "NONE"
                if first:
                    assert s.time_base is not None
                    c.seek(int(max(0.0, first - self.half) / s.time_base), stream=s, backward=True)
                for frame in c.decode(s):
                    t = frame.time
                    if t is None or (first is not None and t < first - self.half):
                        continue
                    if not self._inside(t):
                        return
                    k += 1
                    yield frame
        except (av.error.FFmpegError, ValueError) as e:
            raise CorruptFrameError(str(self.path), self.key, k + 1, f"cannot decode video: {e}") from None

    def __iter__(self) -> Iterator[av.VideoFrame]:
        n = 0
        for frame in self._frames(None):
            n += 1
            yield frame
        if n != len(self):
            raise CorruptFrameError(str(self.path), self.key, n, f"decoded {n} frames of {len(self)}")

    def __getitem__(self, i):  # an int index: a gate's sampled frame
        i = int(i)
        frame = next(self._frames(self.times[i]), None)
        if frame is None:
            raise CorruptFrameError(str(self.path), self.key, i, "frame does not decode")
        return frame


def _lazy(path: Path, key: str, start: float | None = None, end: float | None = None, *, fps: float = 30.0, rgb=True):
    return VideoFrames(path, key, start, end, fps)


@dataclass
class VideoCamera:
    """A camera of a LeRobot episode: what the transcoder and the gates use of a camera."""

    name: str
    timestamps_ns: np.ndarray
    video: VideoFrames
    encoding: str = "rgb"  # frames are decoded pixels (``frame``), not JPEG bytes

    @property
    def _path(self) -> str:
        return str(self.video.path)

    def __len__(self) -> int:
        return len(self.timestamps_ns)

    def frame(self, i: int) -> np.ndarray:
        return decoded_to_rgb(self.video[i])

    def iter_frames(self, batch: int = 32) -> Iterator[np.ndarray]:
        for f in self.video:
            yield decoded_to_rgb(f)

    def iter_yuv(self, batch: int = 32) -> Iterator[av.VideoFrame]:
        """The decoder's own 4:2:0 planes in full range, as a JPEG's reach the encoder: limited range is
        expanded by import_lerobot's exact lookup (swscale's conversion costs ~5 dB, 47 against 52)."""
        for frame in self.video:
            if frame.format.name not in ("yuv420p", "yuvj420p") or frame.width % 2 or frame.height % 2:
                yield frame  # other layouts: encode_gop's to_yuv converts them
                continue
            y, u, v = _full_range_yuv420(frame)
            h, w = frame.height, frame.width
            planes = np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)]).reshape(h * 3 // 2, w)
            out = av.VideoFrame.from_ndarray(planes, format="yuvj420p")
            out.color_range = FULL_RANGE
            yield out


def read_lerobot_dataset(root: str | Path, *, name: str | None = None) -> list[MemoryEpisode]:
    """The episodes of the dataset at ``root``, in index order, as ``import_lerobot`` would land them.

    :raises LeRobotFormatError: a file or field missing or unreadable, naming it.
    """
    root = Path(root)
    try:
        info = json.loads((root / "meta/info.json").read_text())
    except (OSError, ValueError) as e:
        raise LeRobotFormatError(str(root / "meta/info.json"), f"unreadable: {e}") from None
    name = name or root.resolve().name
    start_ns = int(START.timestamp() * 1e6) * 1000
    out = []
    for ep in read_lerobot(root, decode=_lazy):
        episode_id = f"{name}-{ep.index:06d}"
        ts = start_ns + np.round(ep.timestamps * 1e9).astype(np.int64)
        started = dt.datetime.fromtimestamp(start_ns / 1e9, dt.UTC).isoformat().replace("+00:00", "Z")
        meta = EpisodeMeta(
            episode_id=episode_id,
            robot_id="lerobot",
            robot_model=str(info.get("robot_type") or ""),
            task=ep.task,
            site=LEROBOT_SITE,
            started_at=started,
        )
        cameras = {}
        for key, frames in ep.frames.items():
            assert isinstance(frames, VideoFrames)
            cam = key.removeprefix(CAMERA_PREFIX)
            cameras[cam] = VideoCamera(cam, ts, frames)
        streams = {
            "joint_states": SampleStream(
                "joint_states",
                ts,
                {"position": ep.states.astype(np.float64)},
                {"position": ep.state_names} if ep.state_names else {},
            ),
            "action": SampleStream(
                "action",
                ts,
                {"command": ep.actions.astype(np.float64)},
                {"command": ep.action_names} if ep.action_names else {},
            ),
        }
        report = {"codebase_version": str(info.get("codebase_version", "")), "episode_index": ep.index}
        out.append(MemoryEpisode(str(root), meta, streams, cameras, "lerobot", report))  # type: ignore[arg-type]
        start_ns = int(ts[-1]) + 1_000_000_000 if len(ts) else start_ns + 1_000_000_000
    return out


__all__ = ["VideoCamera", "VideoFrames", "read_lerobot_dataset"]
