"""LeRobot dataset interop: read v2.1 / v3.0 datasets, land them as raw episodes, export v3.0.

Plain pyarrow + PyAV; the ``lerobot`` package is not imported. Fields relied on:

``meta/info.json`` (both versions): ``codebase_version`` ("v2.0"/"v2.1" or "v3.0"), ``fps``,
``features`` (``{key: {"dtype", "shape", "names"}}``; cameras are the keys whose dtype is
"video"), ``data_path`` and ``video_path`` (format templates), ``chunks_size``.

v2.x: ``meta/episodes.jsonl`` (``episode_index``, ``tasks`` (list of str), ``length``); one data
file per episode at ``data_path.format(episode_chunk=i // chunks_size, episode_index=i)`` and
one MP4 per camera at ``video_path.format(episode_chunk=..., video_key=key, episode_index=i)``
whose frames are the episode's rows in order.

v3.0: ``meta/episodes/chunk-*/file-*.parquet`` with ``episode_index``, ``tasks``, ``length``,
``data/chunk_index``, ``data/file_index``, ``videos/<key>/chunk_index``,
``videos/<key>/file_index``, ``videos/<key>/from_timestamp``, ``videos/<key>/to_timestamp``;
``data_path.format(chunk_index=, file_index=)`` holds many episodes (rows selected by
``episode_index``); ``video_path.format(video_key=, chunk_index=, file_index=)`` holds many
episodes back to back, an episode's frames being those with ``from_timestamp <= t < to_timestamp``.
``meta/tasks.parquet``: ``task_index`` and the task string (the pandas index, column ``task``).

Data rows (both): ``observation.state``, ``action`` (fixed-length float lists), ``timestamp``
(float seconds from episode start), ``frame_index``, ``episode_index``, ``index``, ``task_index``.

Import keeps the decoded video's own YUV 4:2:0 planes: the JPEG of a raw episode is encoded
from them (no RGB round trip, no second chroma subsampling), and the transcoder hands a JPEG's
planes to x264 as they are, so the import adds only the JPEG's quantization (``jpeg_quality``).

Export writes v3.0 as LeRobot's own writer does: one MP4 per camera holding the episodes back
to back, every episode starting with a keyframe, frame ``k`` of the file at pts ``k / fps``,
``timestamp = frame_index / fps`` (LeRobot checks timestamps against that grid). The MCAP's
H.264 access units are muxed into the MP4 as they are (no decode, no re-encode, so no loss:
LeRobot decodes any FFmpeg codec; its own writer picks AV1 with a keyframe every 2 frames). The
MCAP episode's first camera (sorted by name) is the clock: each of its frames is one row. A
camera with exactly one frame per row is muxed too; any other camera contributes its frame
nearest in time and is re-encoded (H.264, ``crf``, a keyframe every ``gop`` frames), as are
frames handed to :func:`write_lerobot` as pixels. ``observation.state`` (joint positions) and
``action`` take the sample nearest in time (no interpolation, so values survive exactly).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import simplejpeg

from .codec import (
    FULL_RANGE,
    NAL_PPS,
    NAL_SPS,
    StreamingH264Decoder,
    as_format,
    decoded_to_rgb,
    i420_planes,
    is_keyframe,
    to_yuv,
)
from .errors import EpisodeError
from .raw_format import EpisodeMeta, SampleStream, encode_jpeg, write_raw_episode
from .transcode import CRF_BY_SITE

log = logging.getLogger(__name__)

CAMERA_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
V3 = "v3.0"
V3_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V3_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V3_EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
CHUNKS_SIZE = 1000
VIDEO_FILE_MB = 200  # as LeRobot 0.4: a v3.0 video file takes episodes until it reaches this size
# Imported episodes land with this site; the transcoder encodes that site's footage at its own CRF
# (transcode.CRF_BY_SITE), so the round trip (import, transcode, export) stays within 1 dB PSNR of
# the imported frames where the fleet's default CRF 21 loses 1-4.4 dB on already-compressed video.
LEROBOT_SITE = "lerobot"
TRANSCODE_CRF = dict(CRF_BY_SITE)[LEROBOT_SITE]


class LeRobotFormatError(EpisodeError):
    """A LeRobot dataset is missing a file or field, or its files disagree."""

    kind = "lerobot_format"


@dataclass(frozen=True)
class H264Clip:
    """One camera's frames of an episode as H.264 Annex B access units, one per row, in order.

    The first unit must be an IDR frame carrying SPS and PPS, as every MCAP GOP starts. Written
    to the MP4 as they are: no decode, no re-encode.
    """

    units: Sequence[bytes]

    def __len__(self) -> int:
        return len(self.units)


@dataclass
class LeRobotEpisode:
    index: int
    task: str
    fps: float
    timestamps: np.ndarray  # (T,) float64 seconds from the episode's start
    states: np.ndarray  # (T, S) as stored (LeRobot: float32)
    actions: np.ndarray  # (T, A)
    # camera key -> T frames: RGB (H, W, 3) uint8 arrays or av.VideoFrame, or an H264Clip
    frames: dict[str, Sequence | H264Clip]
    state_names: list[str] | None = None
    action_names: list[str] | None = None
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.timestamps)


# -- reading ----------------------------------------------------------------------------------
def read_lerobot(root: str | Path, *, rgb: bool = True) -> Iterator[LeRobotEpisode]:
    """Episodes of a LeRobot v2.x or v3.0 dataset in index order.

    Frames are decoded to RGB (H, W, 3) uint8, or with ``rgb=False`` left as the decoder's
    ``av.VideoFrame`` (its own YUV planes, for re-encoding without a colour round trip).
    """
    root = Path(root)
    info = _info(root)
    for files in _episode_files(root, info):
        frames = {
            key: _decode(v.path, key, v.start, v.end, fps=float(info["fps"]), rgb=rgb)
            for key, v in files.videos.items()
        }
        yield _episode(info, files.index, files.task, files.rows, files.data, frames)


@dataclass(frozen=True)
class _Video:
    """Where a camera's frames of one episode are: the MP4 ``path``, the whole of it (v2.x) or the
    frames of its ``[start, end)`` seconds (v3.0: episodes back to back in one file)."""

    path: Path
    start: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class _EpisodeFiles:
    """One episode as the dataset's files hold it, before any frame is decoded."""

    index: int
    task: str
    data: Path  # the Parquet file holding its rows
    rows: pa.Table  # its rows (v3.0: those of the shared file with its episode_index)
    videos: dict[str, _Video]  # camera key -> where its frames are


def _info(root: Path) -> dict:
    """``meta/info.json``, with the fields every version has and a version this reads."""
    info = _json(root / "meta/info.json")
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise LeRobotFormatError(str(root / "meta/info.json"), f"no '{key}' field")
    version = str(info.get("codebase_version", ""))
    if not (version.startswith("v2.") or version == V3):
        raise LeRobotFormatError(
            str(root / "meta/info.json"), f"unsupported codebase_version {version!r} (expected v2.x or v3.0)"
        )
    return info


def _episode_files(root: Path, info: dict) -> Iterator[_EpisodeFiles]:
    """The episodes of a dataset whose ``info`` (:func:`_info`) was read, in index order."""
    if str(info["codebase_version"]).startswith("v2."):
        return _files_v2(root, info)
    return _files_v3(root, info)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LeRobotFormatError(str(path), "missing") from None
    except (OSError, ValueError) as e:
        raise LeRobotFormatError(str(path), f"unreadable JSON: {e}") from None


def _parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except FileNotFoundError:
        raise LeRobotFormatError(str(path), "missing") from None
    except (OSError, pa.ArrowException) as e:
        raise LeRobotFormatError(str(path), f"unreadable Parquet: {e}") from None


def _video_keys(info: dict) -> list[str]:
    return [k for k, f in info["features"].items() if f.get("dtype") == "video"]


def _names(info: dict, key: str) -> list[str] | None:
    names = info["features"].get(key, {}).get("names")
    if isinstance(names, dict):  # some datasets nest: {"motors": [...]}
        names = next(iter(names.values()), None)
    return [str(n) for n in names] if isinstance(names, list) else None


def _episode(info: dict, index: int, task: str, rows: pa.Table, path: Path, frames: dict) -> LeRobotEpisode:
    for col in (STATE_KEY, ACTION_KEY, "timestamp"):
        if col not in rows.column_names:
            raise LeRobotFormatError(str(path), f"no '{col}' column", stream=col)
    n = rows.num_rows
    for key, fr in frames.items():
        if len(fr) != n:
            raise LeRobotFormatError(
                str(path), f"episode {index}: {len(fr)} frames in the video for {n} data rows", stream=key
            )
    if "frame_index" in rows.column_names:
        rows = rows.sort_by("frame_index")
    return LeRobotEpisode(
        index=index,
        task=task,
        fps=float(info["fps"]),
        timestamps=rows.column("timestamp").to_numpy().astype(np.float64),
        states=_matrix(rows.column(STATE_KEY)),
        actions=_matrix(rows.column(ACTION_KEY)),
        frames=frames,
        state_names=_names(info, STATE_KEY),
        action_names=_names(info, ACTION_KEY),
    )


def _matrix(col: pa.ChunkedArray) -> np.ndarray:
    arr = col.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        width = arr.type.list_size if pa.types.is_fixed_size_list(arr.type) else (len(arr[0]) if len(arr) else 0)
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), width)
    return arr.to_numpy(zero_copy_only=False).reshape(len(arr), 1)


def _files_v2(root: Path, info: dict) -> Iterator[_EpisodeFiles]:
    episodes_path = root / "meta/episodes.jsonl"
    try:
        lines = episodes_path.read_text().splitlines()
    except FileNotFoundError:
        raise LeRobotFormatError(str(episodes_path), "missing") from None
    episodes = []
    for n, line in enumerate(lines, start=1):
        if line.strip():
            try:
                episodes.append(json.loads(line))
            except ValueError as e:
                raise LeRobotFormatError(str(episodes_path), f"line {n}: not JSON: {e}") from None
            if not isinstance(episodes[-1], dict) or "episode_index" not in episodes[-1]:
                raise LeRobotFormatError(str(episodes_path), f"line {n}: no 'episode_index'", stream="episode_index")
    chunks = int(info.get("chunks_size", CHUNKS_SIZE))
    for ep in sorted(episodes, key=lambda e: int(e["episode_index"])):
        i = int(ep["episode_index"])
        data = root / info["data_path"].format(episode_chunk=i // chunks, episode_index=i)
        videos = {
            key: _Video(
                root / _video_path(root, info).format(episode_chunk=i // chunks, video_key=key, episode_index=i)
            )
            for key in _video_keys(info)
        }
        yield _EpisodeFiles(i, (ep.get("tasks") or [""])[0], data, _parquet(data), videos)


def _files_v3(root: Path, info: dict) -> Iterator[_EpisodeFiles]:
    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise LeRobotFormatError(str(root / "meta/episodes"), "no chunk-*/file-*.parquet episode metadata")
    keys = _video_keys(info)
    columns = ["episode_index", "data/chunk_index", "data/file_index"]
    columns += [
        f"videos/{k}/{c}" for k in keys for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    ]
    tables = []
    for f in files:
        table = _parquet(f)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise LeRobotFormatError(str(f), f"no '{missing[0]}' column", stream=missing[0])
        tables.append(table)
    try:
        episodes = pa.concat_tables(tables, promote_options="default").sort_by("episode_index").to_pylist()
    except pa.ArrowException as e:
        raise LeRobotFormatError(str(root / "meta/episodes"), f"episode metadata files disagree: {e}") from None
    data_cache: dict[Path, pa.Table] = {}
    for ep in episodes:
        i = int(ep["episode_index"])
        data = root / info["data_path"].format(chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"])
        if data not in data_cache:
            data_cache.clear()
            data_cache[data] = _parquet(data)
            if "episode_index" not in data_cache[data].column_names:
                raise LeRobotFormatError(str(data), "no 'episode_index' column", stream="episode_index")
        table = data_cache[data]
        rows = table.filter(pc.equal(table.column("episode_index"), i))
        videos = {}
        for key in keys:
            video = root / _video_path(root, info).format(
                video_key=key, chunk_index=ep[f"videos/{key}/chunk_index"], file_index=ep[f"videos/{key}/file_index"]
            )
            videos[key] = _Video(video, ep[f"videos/{key}/from_timestamp"], ep[f"videos/{key}/to_timestamp"])
        yield _EpisodeFiles(i, (ep.get("tasks") or [""])[0], data, rows, videos)


def _video_path(root: Path, info: dict) -> str:
    if not isinstance(info.get("video_path"), str):
        raise LeRobotFormatError(
            str(root / "meta/info.json"), "video features but no 'video_path'", stream="video_path"
        )
    return info["video_path"]


def _decode(
    path: Path, key: str, start: float | None = None, end: float | None = None, *, fps: float = 30.0, rgb: bool = True
) -> list:
    """Frames of an MP4, or of its [start, end) seconds (seeking to the keyframe before start)."""
    if not path.exists():
        raise LeRobotFormatError(str(path), "missing", stream=key)
    half = 0.5 / fps
    out = []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "NONE"
            if start:
                assert stream.time_base is not None  # a video stream read from a file has a time base
                container.seek(int(max(0.0, start - half) / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                t = frame.time
                if start is not None and t < start - half:
                    continue
                if end is not None and t >= end - half:
                    break
                out.append(decoded_to_rgb(frame) if rgb else frame)
    except (av.error.FFmpegError, ValueError) as e:
        raise LeRobotFormatError(str(path), f"cannot decode video: {e}", stream=key) from None
    return out


# -- landing as raw episodes -------------------------------------------------------------------
def import_lerobot(
    root: str | Path,
    landing_dir: str | Path,
    *,
    robot_id: str = "lerobot",
    robot_model: str | None = None,
    site: str = LEROBOT_SITE,
    start_time: dt.datetime | None = None,
    dataset_name: str | None = None,
    jpeg_quality: int = 100,
) -> list[Path]:
    """Write every episode as a raw HDF5 episode ``<landing_dir>/<episode_id>.h5`` (atomically).

    The landing sensor then ingests them like any robot's files, through the same gates.
    Episodes start one after another from ``start_time`` (default: the Unix epoch + 1 day, so
    a re-import yields identical files), one second apart. ``robot_model`` defaults to the
    dataset's ``robot_type``. ``jpeg_quality`` 100 keeps the import within ~0.15 dB of the
    decoded video; the transcoder's H.264 is the lossy step (see ``TRANSCODE_CRF``).
    """
    if robot_model is None:
        robot_model = _json(Path(root) / "meta/info.json").get("robot_type") or ""
    landing = Path(landing_dir)
    landing.mkdir(parents=True, exist_ok=True)
    placed = _Landed(dataset_name or Path(root).resolve().name, robot_id, robot_model, site, start_time)
    written = []
    for ep in read_lerobot(root, rgb=False):
        meta, ts = placed.next(ep)
        cameras = {}
        for key, frames in ep.frames.items():
            assert not isinstance(frames, H264Clip)  # read_lerobot yields decoded frames, never a clip
            cameras[key.removeprefix(CAMERA_PREFIX)] = (ts, (frame_to_jpeg(f, jpeg_quality) for f in frames))
        streams = _streams(ep, ts)
        path = landing / f"{meta.episode_id}.h5"
        tmp = landing / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            write_raw_episode(tmp, meta, cameras, streams)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(path)
    return written


class _Landed:
    """A dataset's episodes as they land, in index order: id ``<name>-<index:06d>``, metadata, and
    sample times (ns), the episodes one after another from ``start`` (default: the Unix epoch + 1
    day), one second apart. What :func:`import_lerobot` writes and ``sources.lerobot`` reads: an
    episode is the same episode, at the same times, by either route."""

    def __init__(self, name: str, robot_id: str, robot_model: str, site: str, start: dt.datetime | None = None):
        self.name, self.robot_id, self.robot_model, self.site = name, robot_id, robot_model, site
        self.start_ns = int((start or dt.datetime(1970, 1, 2, tzinfo=dt.UTC)).timestamp() * 1e6) * 1000

    def next(self, ep: LeRobotEpisode) -> tuple[EpisodeMeta, np.ndarray]:
        """The next episode's metadata and its rows' times."""
        ts = self.start_ns + np.round(ep.timestamps * 1e9).astype(np.int64)
        started = dt.datetime.fromtimestamp(self.start_ns / 1e9, dt.UTC).isoformat().replace("+00:00", "Z")
        meta = EpisodeMeta(
            episode_id=f"{self.name}-{ep.index:06d}",
            robot_id=self.robot_id,
            robot_model=self.robot_model,
            task=ep.task,
            site=self.site,
            started_at=started,
        )
        self.start_ns = int(ts[-1]) + 1_000_000_000 if len(ts) else self.start_ns + 1_000_000_000
        return meta, ts


def _streams(ep: LeRobotEpisode, ts: np.ndarray) -> dict[str, SampleStream]:
    """An episode's rows as the raw episode's streams: joint positions and action commands, at ``ts``."""
    return {
        "joint_states": SampleStream(
            "joint_states", ts, {"position": ep.states}, {"position": ep.state_names} if ep.state_names else {}
        ),
        "action": SampleStream(
            "action", ts, {"command": ep.actions}, {"command": ep.action_names} if ep.action_names else {}
        ),
    }


def frame_to_jpeg(frame: av.VideoFrame | np.ndarray, quality: int) -> bytes:
    """A baseline 4:2:0 JPEG of a decoded video frame, encoded from the frame's own planes.

    Going through RGB instead would subsample the chroma a second time and cost ~2 dB.
    RGB arrays and odd-sized frames do go through RGB.
    """
    if isinstance(frame, np.ndarray) or frame.width % 2 or frame.height % 2:
        return encode_jpeg(frame if isinstance(frame, np.ndarray) else decoded_to_rgb(frame), quality)
    y, u, v = _full_range_yuv420(frame)
    return simplejpeg.encode_jpeg_yuv_planes(y, u, v, quality=quality)


# Limited ("TV") range to full range, rounded: a lookup keeps it exact (swscale's own
# conversion is ~5 dB less accurate, 47 against 52 dB on decoded LeRobot frames).
_LUMA_TO_FULL = np.clip(np.round((np.arange(256) - 16) * (255 / 219)), 0, 255).astype(np.uint8)
_CHROMA_TO_FULL = np.clip(np.round((np.arange(256) - 128) * (255 / 224) + 128), 0, 255).astype(np.uint8)


def _full_range_yuv420(frame: av.VideoFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full-range Y, U, V planes of an even-sized frame; 4:2:0 input keeps its own samples."""
    if frame.format.name not in ("yuv420p", "yuvj420p"):
        frame = to_yuv(frame)  # other layouts (4:4:4, 10-bit, ...): swscale
    y, u, v = i420_planes(frame.to_ndarray())
    if frame.format.name == "yuv420p" and frame.color_range != FULL_RANGE:
        y, u, v = _LUMA_TO_FULL[y], _CHROMA_TO_FULL[u], _CHROMA_TO_FULL[v]
    return y, u, v


# -- writing -----------------------------------------------------------------------------------
def encode_h264(frames: Iterable, fps: float, crf: float, gop: int) -> H264Clip:
    """Frames (RGB arrays or av.VideoFrame) encoded by a fresh libx264 as LeRobot lays video out:
    a keyframe every ``gop`` frames, no B-frames, SPS/PPS on every keyframe; full-range BT.601
    4:2:0 like the MCAP episodes, so a JPEG's or a decoded frame's planes pass untouched."""
    # The loop of codec.encode_gop, kept apart: that one opens its encoder at the first frame's own pixel
    # format with the transcode's VideoSettings; this one encodes LeRobot's fixed yuv420p, relabels every
    # frame (the first too) and refuses a frame size that changes.
    enc: av.VideoCodecContext | None = None
    units: list[bytes] = []
    for i, frame in enumerate(frames):
        frame = to_yuv(frame)
        if enc is None:
            enc = _h264_encoder(frame.width, frame.height, fps, crf, gop)
        elif (frame.width, frame.height) != (enc.width, enc.height):
            raise ValueError(f"frame {i} is {frame.width}x{frame.height}, earlier frames {enc.width}x{enc.height}")
        assert enc.pix_fmt is not None  # set in _h264_encoder
        frame = as_format(frame, enc.pix_fmt)
        frame.pts = i
        frame.time_base = enc.time_base  # not a decoded frame's own (see codec.encode_gop)
        # A decoded JPEG or video frame keeps its picture type, which libx264 would honour.
        frame.pict_type = av.video.frame.PictureType.NONE
        units.extend(bytes(p) for p in enc.encode(frame))
    if enc is not None:
        units.extend(bytes(p) for p in enc.encode(None))
    return H264Clip(units)


def _h264_encoder(width: int, height: int, fps: float, crf: float, gop: int) -> av.VideoCodecContext:
    if width % 2 or height % 2:
        raise ValueError(f"yuv420p needs even frame sizes, got {width}x{height}")
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = width, height, "yuv420p"
    enc.color_range = FULL_RANGE
    rate = Fraction(fps).limit_denominator(1000)
    enc.framerate, enc.time_base = rate, 1 / rate
    enc.thread_count, enc.thread_type = 1, "NONE"
    enc.options = {
        "crf": f"{crf:g}",
        "preset": "medium",
        "tune": "psnr",
        "x264-params": f"keyint={gop}:scenecut=0:bframes=0:repeat-headers=1:threads=1:sliced-threads=0:"
        "colormatrix=bt470bg:colorprim=bt470bg:transfer=bt470bg:range=pc:chromaloc=1",
    }
    enc.open()
    return enc


def _parameter_sets(unit: bytes) -> bytes:
    """The SPS and PPS NAL units of an Annex B access unit, concatenated (b"" when none)."""
    nals = (n.rstrip(b"\0") for n in unit.split(b"\x00\x00\x01")[1:])
    return b"".join(n for n in nals if n and n[0] & 0x1F in (NAL_SPS, NAL_PPS))


def _frame_size(unit: bytes) -> tuple[int, int]:
    frames = StreamingH264Decoder().feed(unit)
    if len(frames) != 1:
        raise ValueError("the first access unit does not decode to a frame on its own")
    return frames[0].width, frames[0].height


class _Mp4:
    """An MP4 that episodes' H.264 access units are muxed into; frame k at pts k (time base 1/fps).

    Its sample description holds one SPS/PPS pair: episodes whose parameter sets differ (the
    SPS holds the frame size) go to another file: the in-band copies would decode, but the file
    would misdescribe them. The index goes first ("faststart"), as LeRobot writes, for streaming.
    """

    def __init__(self, path: Path, fps: float, first_unit: bytes):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.params, self.size = path, _parameter_sets(first_unit), _frame_size(first_unit)
        self.frames = self.bytes = 0
        self.container = av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"})
        rate = Fraction(fps).limit_denominator(1000)
        self.stream = self.container.add_mux_stream("h264", rate=rate, width=self.size[0], height=self.size[1])
        # The muxer replaces the stream's time base with its own when it writes the header.
        self.time_base = self.stream.time_base = 1 / rate

    def takes(self, clip: H264Clip) -> bool:
        return _parameter_sets(clip.units[0]) == self.params

    def add(self, clip: H264Clip) -> None:
        for k, unit in enumerate(clip.units, start=self.frames):
            packet = av.Packet(unit)
            packet.stream, packet.time_base = self.stream, self.time_base
            packet.pts = packet.dts = k  # no B-frames: decode order is display order
            packet.is_keyframe = is_keyframe(unit)
            self.container.mux(packet)
            self.bytes += len(unit)
        self.frames += len(clip)

    def close(self) -> None:
        self.container.close()


class _CameraVideo:
    """A camera's MP4 files in a v3.0 dataset: episodes go back to back into the current file; the
    next file starts when an episode's parameter sets or size differ or the file is full."""

    def __init__(self, root: Path, key: str, fps: float, max_bytes: int):
        self.root, self.key, self.fps, self.max_bytes = root, key, fps, max_bytes
        self.file: _Mp4 | None = None
        self.count = 0  # files opened so far

    def add(self, clip: H264Clip) -> dict:
        """Append an episode; return its ``videos/<key>/...`` episode metadata."""
        if self.file is None or self.file.bytes >= self.max_bytes or not self.file.takes(clip):
            self.close()
            self.count += 1
            chunk, index = divmod(self.count - 1, CHUNKS_SIZE)
            path = self.root / V3_VIDEO_PATH.format(video_key=self.key, chunk_index=chunk, file_index=index)
            self.file = _Mp4(path, self.fps, clip.units[0])
        first = self.file.frames
        self.file.add(clip)
        chunk, index = divmod(self.count - 1, CHUNKS_SIZE)
        prefix = f"videos/{self.key}/"
        return {
            prefix + "chunk_index": chunk,
            prefix + "file_index": index,
            prefix + "from_timestamp": first / self.fps,
            prefix + "to_timestamp": self.file.frames / self.fps,
        }

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _clip(frames, fps: float, crf: float, gop: int, where: str) -> H264Clip:
    clip = frames if isinstance(frames, H264Clip) else encode_h264(frames, fps, crf, gop)
    if not len(clip):
        raise ValueError(f"{where}: no frames")
    if not is_keyframe(clip.units[0]) or not _parameter_sets(clip.units[0]):
        raise ValueError(f"{where}: the first access unit is not a keyframe with SPS/PPS")
    return clip


def write_lerobot(
    episodes: Iterable[LeRobotEpisode],
    out_root: str | Path,
    *,
    fps: float,
    version: str = V3,
    crf: float = 12.0,
    gop: int = 2,
    robot_type: str | None = None,
) -> Path:
    """Write episodes (consumed one at a time) as a LeRobot dataset, v3.0 (default) or v2.1.

    Rows are stored as LeRobot stores them: float32 state/action, ``timestamp = frame_index / fps``.
    Cameras given as :class:`H264Clip` are muxed as they are; pixels are encoded (``crf``, ``gop``).
    Statistics are LeRobot's: per episode (in the episode metadata) and aggregated
    (``meta/stats.json``), for every numeric feature and, per channel, for every camera.
    ``robot_type`` defaults to the episodes' ``extra["robot_type"]`` when they all agree.
    """
    if version not in (V3, "v2.1"):
        raise ValueError(f"cannot write LeRobot {version!r}; v3.0 or v2.1")
    out_root = Path(out_root)
    if out_root.exists() and any(out_root.iterdir()):
        raise FileExistsError(f"{out_root}: not empty; a dataset is written whole into a new folder")
    # Written under a temporary sibling and renamed when complete: a failed export leaves nothing
    # that LeRobot could load as a (partial) dataset.
    tmp = out_root.parent / f".{out_root.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        writer = _Writer(tmp, fps, version, crf, gop)
        try:
            for ep in episodes:
                writer.add(ep)
        finally:
            writer.close_videos()
        if not writer.episodes:
            raise ValueError("no episodes to write")
        writer.write_meta(robot_type)
        if out_root.exists():
            out_root.rmdir()  # empty, checked above
        os.replace(tmp, out_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_root


class _Writer:
    """A dataset being written: rows, videos, episode metadata and statistics, episode by episode."""

    def __init__(self, root: Path, fps: float, version: str, crf: float, gop: int):
        self.root, self.fps, self.version, self.crf, self.gop = root, fps, version, crf, gop
        (root / "meta").mkdir(parents=True, exist_ok=True)
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict] = []  # LeRobot's episode metadata, one row per episode
        self.episode_stats: list[dict] = []
        self.data_parts: list[pa.Table] = []
        self.videos: dict[str, _CameraVideo] = {}
        self.shapes: dict[str, tuple[int, int, int]] = {}
        self.names: dict[str, list[str] | None] = {}
        self.widths: dict[str, int] = {}
        self.robot_types: set[str] = set()
        self.total = 0

    def add(self, ep: LeRobotEpisode) -> None:
        k, n = len(self.episodes), len(ep)
        columns = self._columns(ep, k)
        row = {"episode_index": k, "tasks": [ep.task], "length": n}
        stats = {key: _vector_stats(values) for key, values in columns.items()}
        for key, frames in ep.frames.items():
            key = key if key.startswith(CAMERA_PREFIX) else CAMERA_PREFIX + key
            clip = _clip(frames, self.fps, self.crf, self.gop, f"episode {ep.index}, camera {key}")
            if len(clip) != n:
                raise ValueError(f"episode {ep.index}, camera {key}: {len(clip)} frames for {n} rows")
            row.update(self._add_video(key, clip, k))
            stats[key] = _image_stats(_sampled_rgb(frames, n))
        table = pa.table({key: _arrow(values) for key, values in columns.items()})
        if self.version == V3:
            self.data_parts.append(table)
            row.update(
                {
                    "data/chunk_index": 0,
                    "data/file_index": 0,
                    "dataset_from_index": self.total,
                    "dataset_to_index": self.total + n,
                }
            )
        else:
            path = self.root / V21_DATA_PATH.format(episode_chunk=k // CHUNKS_SIZE, episode_index=k)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, path)
        self.names.setdefault(STATE_KEY, ep.state_names)
        self.names.setdefault(ACTION_KEY, ep.action_names)
        self.robot_types.add(ep.extra.get("robot_type") or "")
        self.episodes.append(row)
        self.episode_stats.append(stats)
        self.total += n

    def _columns(self, ep: LeRobotEpisode, k: int) -> dict[str, np.ndarray]:
        n = len(ep)
        frame_index = np.arange(n, dtype=np.int64)
        columns = {
            STATE_KEY: np.asarray(ep.states, np.float32).reshape(n, -1),
            ACTION_KEY: np.asarray(ep.actions, np.float32).reshape(n, -1),
        }
        for key, values in columns.items():
            width = self.widths.setdefault(key, values.shape[1])
            if values.shape[1] != width:
                raise ValueError(
                    f"episode {ep.index}: {key} has {values.shape[1]} values per row, earlier episodes {width}"
                )
        return columns | {
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(n, k, np.int64),
            "index": self.total + frame_index,
            "task_index": np.full(n, self.tasks.setdefault(ep.task, len(self.tasks)), np.int64),
        }

    def _add_video(self, key: str, clip: H264Clip, k: int) -> dict:
        if self.version == V3:
            video = self.videos.get(key) or self.videos.setdefault(
                key, _CameraVideo(self.root, key, self.fps, VIDEO_FILE_MB * 1_000_000)
            )
            meta = video.add(clip)
            assert video.file is not None  # add() leaves the file it wrote to open
            width, height = video.file.size
        else:
            path = self.root / V21_VIDEO_PATH.format(episode_chunk=k // CHUNKS_SIZE, video_key=key, episode_index=k)
            mp4 = _Mp4(path, self.fps, clip.units[0])
            mp4.add(clip)
            mp4.close()
            meta, (width, height) = {}, mp4.size
        self.shapes[key] = (height, width, 3)
        return meta

    def close_videos(self) -> None:
        for video in self.videos.values():
            video.close()

    def write_meta(self, robot_type: str | None) -> None:
        if robot_type is None:
            robot_type = next(iter(self.robot_types)) if len(self.robot_types) == 1 else ""
        stats = _aggregate_stats(self.episode_stats)
        info = {
            "codebase_version": self.version,
            "robot_type": robot_type or None,
            "total_episodes": len(self.episodes),
            "total_frames": self.total,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "fps": _number(self.fps),
            "splits": {"train": f"0:{len(self.episodes)}"},
            "features": self._features(),
        }
        if self.version == V3:
            self._write_v3(info)
        else:
            self._write_v21(info)
        (self.root / "meta/stats.json").write_text(json.dumps(_jsonable(stats), indent=2))
        (self.root / "meta/info.json").write_text(json.dumps(info, indent=4))

    def _features(self) -> dict:
        return {
            STATE_KEY: _feature("float32", (self.widths[STATE_KEY],), self.names[STATE_KEY]),
            ACTION_KEY: _feature("float32", (self.widths[ACTION_KEY],), self.names[ACTION_KEY]),
            **{
                key: {
                    **_feature("video", shape, ["height", "width", "channels"]),
                    "info": {
                        "video.height": shape[0],
                        "video.width": shape[1],
                        "video.codec": "h264",
                        "video.pix_fmt": "yuv420p",
                        "video.is_depth_map": False,
                        "video.fps": _number(self.fps),
                        "video.channels": 3,
                        "has_audio": False,
                    },
                }
                for key, shape in self.shapes.items()
            },
            "timestamp": _feature("float32", (1,), None),
            "frame_index": _feature("int64", (1,), None),
            "episode_index": _feature("int64", (1,), None),
            "index": _feature("int64", (1,), None),
            "task_index": _feature("int64", (1,), None),
        }

    def _write_v3(self, info: dict) -> None:
        info.update(
            {
                "data_files_size_in_mb": 100,
                "video_files_size_in_mb": VIDEO_FILE_MB,
                "data_path": V3_DATA_PATH,
                "video_path": V3_VIDEO_PATH if self.shapes else None,
            }
        )
        data = self.root / V3_DATA_PATH.format(chunk_index=0, file_index=0)
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(self.data_parts), data)
        rows = [
            row
            | {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
            | {f"stats/{key}/{name}": value.tolist() for key, st in stats.items() for name, value in st.items()}
            for row, stats in zip(self.episodes, self.episode_stats, strict=True)
        ]
        (self.root / V3_EPISODES_PATH).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), self.root / V3_EPISODES_PATH)
        _write_tasks_parquet(self.tasks, self.root / "meta/tasks.parquet")

    def _write_v21(self, info: dict) -> None:
        info.update(
            {
                "total_chunks": 1,
                "total_videos": len(self.episodes) * len(self.shapes),
                "data_path": V21_DATA_PATH,
                "video_path": V21_VIDEO_PATH if self.shapes else None,
            }
        )
        _jsonl(self.root / "meta/episodes.jsonl", self.episodes)
        _jsonl(
            self.root / "meta/episodes_stats.jsonl",
            [
                {"episode_index": row["episode_index"], "stats": _jsonable(stats)}
                for row, stats in zip(self.episodes, self.episode_stats, strict=True)
            ],
        )
        _jsonl(self.root / "meta/tasks.jsonl", [{"task_index": i, "task": t} for t, i in self.tasks.items()])


def _number(x: float) -> int | float:
    """An integral rate as an int, as LeRobot writes it: its merge compares features exactly."""
    return int(x) if float(x).is_integer() else x


def _feature(dtype: str, shape, names) -> dict:
    return {"dtype": dtype, "shape": list(shape), "names": names}


def _arrow(values: np.ndarray) -> pa.Array:
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])
    return pa.array(values)


# -- statistics, as LeRobot computes them (lerobot/datasets/compute_stats.py) ------------------
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


def _vector_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Per-column min, max, mean, std, count and quantiles q01..q99 of (N,) or (N, D) values."""
    a = np.asarray(values, np.float64).reshape(len(values), -1)
    stats = {"min": a.min(0), "max": a.max(0), "mean": a.mean(0), "std": a.std(0), "count": np.array([len(a)])}
    # LeRobot estimates from 5000-bin histograms the smallest value where the empirical CDF
    # reaches q (of 14 samples q10 is the 2nd smallest): the same definition, exactly.
    quantiles = np.quantile(a, QUANTILES, axis=0, method="inverted_cdf")
    for q, value in zip(QUANTILES, quantiles, strict=True):
        stats[f"q{round(q * 100):02d}"] = value
    return stats


def _image_stats(rgb: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of sampled (K, H, W, 3) uint8 frames in [0, 1], each (3, 1, 1);
    ``count`` is the number of frames sampled."""
    stats = _vector_stats(rgb.reshape(-1, 3))
    return {name: (value / 255.0).reshape(3, 1, 1) for name, value in stats.items() if name != "count"} | {
        "count": np.array([len(rgb)])
    }


def _sample_rows(n: int) -> np.ndarray:
    """The frames LeRobot samples for image statistics: ~n**0.75 evenly spaced, 100 to 10,000."""
    k = n if n < 100 else max(100, min(int(n**0.75), 10_000))
    return np.round(np.linspace(0, n - 1, k)).astype(int)


def _sampled_rgb(frames: Sequence | H264Clip, n: int) -> np.ndarray:
    """RGB of the sampled frames, subsampled as LeRobot does to about 150 pixels a side when large."""
    rows = _sample_rows(n)
    chosen = _decode_clip(frames, rows) if isinstance(frames, H264Clip) else [frames[i] for i in rows]
    rgb = [f if isinstance(f, np.ndarray) else decoded_to_rgb(f) for f in chosen]
    height, width = rgb[0].shape[:2]
    step = 1 if max(height, width) < 300 else int(max(height, width) / 150)
    return np.stack([f[::step, ::step] for f in rgb])


def _decode_clip(clip: H264Clip, rows: np.ndarray) -> list[av.VideoFrame]:
    wanted, decoder, out = set(rows.tolist()), StreamingH264Decoder(), []
    for i, unit in enumerate(clip.units[: int(rows.max()) + 1]):
        frames = decoder.feed(unit)
        if i in wanted:
            out.extend(frames)
    return out


def _aggregate_stats(per_episode: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """LeRobot's aggregation: count-weighted means (quantiles too), pooled variance, min of mins."""
    out = {}
    for key in dict.fromkeys(k for stats in per_episode for k in stats):
        parts = [stats[key] for stats in per_episode if key in stats]
        counts = np.array([p["count"][0] for p in parts], np.float64)
        total = counts.sum()
        weights = counts.reshape(-1, *([1] * np.ndim(parts[0]["mean"])))
        means = np.stack([p["mean"] for p in parts])
        mean = (means * weights).sum(0) / total
        variance = ((np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * weights).sum(0) / total
        agg = {
            "min": np.min([p["min"] for p in parts], 0),
            "max": np.max([p["max"] for p in parts], 0),
            "mean": mean,
            "std": np.sqrt(variance),
            "count": np.array([int(total)]),
        }
        for name in (n for n in parts[0] if n.startswith("q")):
            agg[name] = (np.stack([p[name] for p in parts]) * weights).sum(0) / total
        out[key] = agg
    return out


def _jsonable(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {key: {name: np.asarray(value).tolist() for name, value in st.items()} for key, st in stats.items()}


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_tasks_parquet(tasks: dict[str, int], path: Path) -> None:
    # LeRobot reads this with pandas and looks tasks up by the index: store "task" as the index.
    import pandas as pd

    df = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task"))
    df.to_parquet(path)


# -- export from MCAP episodes -----------------------------------------------------------------
def _episode_rows(episodes) -> list[dict]:
    """Distinct episodes (by MCAP ``uri``) of a manifest table, a list of rows, or a list of URIs."""
    if isinstance(episodes, pa.Table):
        cols = [c for c in ("uri", "episode_id", "task") if c in episodes.column_names]
        rows = episodes.select(cols).to_pylist()
    else:
        rows = [r if isinstance(r, dict) else {"uri": str(r)} for r in episodes]
    seen, out = set(), []
    for r in rows:
        if r["uri"] not in seen:
            seen.add(r["uri"])
            out.append(r)
    return out


def _nearest(src: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index into sorted ``src`` of the value nearest each ``query`` (ties: the earlier one)."""
    j = np.clip(np.searchsorted(src, query), 1, max(len(src) - 1, 1))
    before = src[j - 1]
    after = src[np.minimum(j, len(src) - 1)]
    return np.where(np.abs(query - before) <= np.abs(after - query), j - 1, j).clip(0, len(src) - 1)


def _camera_rows(uri: str, cam: str, ts: np.ndarray, units: list[bytes], clock: np.ndarray, remux: bool):
    """A camera's frames for the clock's rows: its access units as they are when ``remux`` and it
    has exactly one frame per row starting at a keyframe, else the decoded frame nearest each row."""
    pick = _nearest(ts, clock)
    one_per_row = len(ts) == len(clock) and np.array_equal(pick, np.arange(len(ts)))
    if remux and one_per_row and units and is_keyframe(units[0]):
        return H264Clip(units)
    if remux:
        log.warning(
            "%s: camera %s has %d frames for %d rows (not one per row): re-encoded", uri, cam, len(ts), len(clock)
        )
    decoder, frames = StreamingH264Decoder(), []
    for unit in units:
        out = decoder.feed(unit)
        if len(out) != 1:
            raise LeRobotFormatError(uri, f"decoder gave {len(out)} frames for one access unit", stream=cam)
        frames.append(out[0])
    return [frames[i] for i in pick]


def _mcap_episode(row: dict, index: int, remux: bool = True) -> LeRobotEpisode:
    import fsspec

    from .mcap_reader import EpisodeReader

    uri = row["uri"]
    with fsspec.open(uri, "rb") as f, EpisodeReader(f) as reader:
        cams = sorted(reader.cameras)
        if not cams:
            raise LeRobotFormatError(uri, "episode has no camera")
        video = {cam: list(reader.iter_video(cam)) for cam in cams}
        streams = reader.read_streams(["joint_states", "action"], reader.start_ns, reader.end_ns)
        meta = reader.metadata()
        task = row.get("task") or meta.get("task", "")
    clock = np.asarray([t for t, _ in video[cams[0]]], np.int64)
    frames = {
        cam: _camera_rows(uri, cam, np.asarray([t for t, _ in units], np.int64), [u for _, u in units], clock, remux)
        for cam, units in video.items()
    }
    state, action = streams["joint_states"], streams["action"]
    return LeRobotEpisode(
        index=index,
        task=task,
        fps=0.0,
        timestamps=(clock - clock[0]) / 1e9,
        states=np.asarray(state.fields["position"])[_nearest(state.timestamps_ns, clock)],
        actions=np.asarray(action.fields["command"])[_nearest(action.timestamps_ns, clock)],
        frames=frames,
        state_names=state.labels.get("position"),
        action_names=action.labels.get("command"),
        extra={
            "uri": uri,
            "episode_id": row.get("episode_id"),
            "robot_type": meta.get("robot_model", ""),
            "reencoded": sorted(c for c, f in frames.items() if not isinstance(f, H264Clip)),
        },
    )


def export_lerobot(
    episodes: pa.Table | Sequence,
    out_root: str | Path,
    *,
    fps: float | None = None,
    gop: int | None = None,
    crf: float = 12.0,
    robot_type: str | None = None,
) -> Path:
    """Write a manifest's distinct episodes (MCAP ``uri``) as a LeRobot v3.0 dataset.

    ``gop=None`` muxes the MCAP's H.264 as it is: no loss, but LeRobot's random access then
    decodes from the GOP's keyframe (the transcoder's GOPs are 150 frames: ~230 ms a frame at
    640x480 here, against ~10 ms with LeRobot's own 2). ``gop=2`` re-encodes every camera that
    way, at ``crf``. Cameras that are not one frame per row are re-encoded in either case (with
    a keyframe every ``gop or 2`` frames). ``fps`` defaults to the first episode's first camera's
    nominal rate, rounded; ``robot_type`` to the episodes' robot model when they all share one.
    """
    from .transcode import nominal_rate_hz

    rows = _episode_rows(episodes)
    if not rows:
        raise ValueError("no episodes to export")
    first = _mcap_episode(rows[0], 0, remux=gop is None)
    if fps is None:
        rate = nominal_rate_hz(np.round(first.timestamps * 1e9).astype(np.int64))
        fps = float(round(rate)) if rate else 30.0

    def all_episodes():
        yield first
        for k, row in enumerate(rows[1:], start=1):
            yield _mcap_episode(row, k, remux=gop is None)

    return write_lerobot(all_episodes(), out_root, fps=fps, version=V3, crf=crf, gop=gop or 2, robot_type=robot_type)
