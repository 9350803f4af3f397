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

Export writes v3.0 as LeRobot's own writer does: H.264 yuv420p MP4 (LeRobot's default is AV1
but its decoders read any FFmpeg codec), a keyframe every ``gop`` frames (LeRobot encodes with
g=2 so random access stays cheap), no B-frames, frame ``k`` of the file at pts ``k / fps``;
``timestamp = frame_index / fps`` because LeRobot checks timestamps against that grid. The MCAP
episode's first camera (sorted by name) is the clock: each of its frames is one row; other
cameras contribute their frame nearest in time, and ``observation.state`` (joint positions) and
``action`` take the sample nearest in time (no interpolation, so values survive exactly).
"""

from __future__ import annotations

import datetime as dt
import json
import os
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

from .codec import FULL_RANGE, decoded_to_rgb, to_yuv
from .errors import EpisodeError
from .raw_format import EpisodeMeta, SampleStream, encode_jpeg, write_raw_episode

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


class LeRobotFormatError(EpisodeError):
    """A LeRobot dataset is missing a file or field, or its files disagree."""

    kind = "lerobot_format"


@dataclass
class LeRobotEpisode:
    index: int
    task: str
    fps: float
    timestamps: np.ndarray  # (T,) float64 seconds from the episode's start
    states: np.ndarray  # (T, S) as stored (LeRobot: float32)
    actions: np.ndarray  # (T, A)
    frames: dict[str, Sequence]  # camera key -> T frames: RGB (H, W, 3) uint8 or av.VideoFrame
    state_names: list[str] | None = None
    action_names: list[str] | None = None
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.timestamps)


# -- reading ----------------------------------------------------------------------------------
def read_lerobot(root: str | Path) -> Iterator[LeRobotEpisode]:
    """Episodes of a LeRobot v2.x or v3.0 dataset in index order, frames decoded to RGB."""
    root = Path(root)
    info = _json(root / "meta/info.json")
    version = str(info.get("codebase_version", ""))
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise LeRobotFormatError(str(root / "meta/info.json"), f"no '{key}' field")
    if version.startswith("v2."):
        yield from _read_v2(root, info)
    elif version == V3:
        yield from _read_v3(root, info)
    else:
        raise LeRobotFormatError(str(root / "meta/info.json"),
                                 f"unsupported codebase_version {version!r} (expected v2.x or v3.0)")


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
            raise LeRobotFormatError(str(path), f"episode {index}: {len(fr)} frames in the video for {n} data rows",
                                     stream=key)
    if "frame_index" in rows.column_names:
        rows = rows.sort_by("frame_index")
    return LeRobotEpisode(
        index=index, task=task, fps=float(info["fps"]),
        timestamps=rows.column("timestamp").to_numpy().astype(np.float64),
        states=_matrix(rows.column(STATE_KEY)), actions=_matrix(rows.column(ACTION_KEY)),
        frames=frames, state_names=_names(info, STATE_KEY), action_names=_names(info, ACTION_KEY))


def _matrix(col: pa.ChunkedArray) -> np.ndarray:
    arr = col.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        width = arr.type.list_size if pa.types.is_fixed_size_list(arr.type) else (len(arr[0]) if len(arr) else 0)
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), width)
    return arr.to_numpy(zero_copy_only=False).reshape(len(arr), 1)


def _read_v2(root: Path, info: dict) -> Iterator[LeRobotEpisode]:
    episodes_path = root / "meta/episodes.jsonl"
    try:
        lines = episodes_path.read_text().splitlines()
    except FileNotFoundError:
        raise LeRobotFormatError(str(episodes_path), "missing") from None
    chunks = int(info.get("chunks_size", CHUNKS_SIZE))
    for line in filter(str.strip, lines):
        ep = json.loads(line)
        i = int(ep["episode_index"])
        data = root / info["data_path"].format(episode_chunk=i // chunks, episode_index=i)
        frames = {}
        for key in _video_keys(info):
            video = root / info["video_path"].format(episode_chunk=i // chunks, video_key=key, episode_index=i)
            frames[key] = _decode(video, key)
        yield _episode(info, i, (ep.get("tasks") or [""])[0], _parquet(data), data, frames)


def _read_v3(root: Path, info: dict) -> Iterator[LeRobotEpisode]:
    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise LeRobotFormatError(str(root / "meta/episodes"), "no chunk-*/file-*.parquet episode metadata")
    episodes = pa.concat_tables([_parquet(f) for f in files]).sort_by("episode_index").to_pylist()
    data_cache: dict[Path, pa.Table] = {}
    for ep in episodes:
        i = int(ep["episode_index"])
        data = root / info["data_path"].format(chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"])
        if data not in data_cache:
            data_cache.clear()
            data_cache[data] = _parquet(data)
        table = data_cache[data]
        rows = table.filter(pc.equal(table.column("episode_index"), i))
        frames = {}
        for key in _video_keys(info):
            video = root / info["video_path"].format(video_key=key, chunk_index=ep[f"videos/{key}/chunk_index"],
                                                     file_index=ep[f"videos/{key}/file_index"])
            frames[key] = _decode(video, key, ep[f"videos/{key}/from_timestamp"], ep[f"videos/{key}/to_timestamp"],
                                  fps=float(info["fps"]))
        yield _episode(info, i, (ep.get("tasks") or [""])[0], rows, data, frames)


def _decode(path: Path, key: str, start: float | None = None, end: float | None = None, *,
            fps: float = 30.0) -> list[np.ndarray]:
    """RGB frames of an MP4, or of its [start, end) seconds (seeking to the keyframe before start)."""
    if not path.exists():
        raise LeRobotFormatError(str(path), "missing", stream=key)
    half = 0.5 / fps
    out = []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "NONE"
            if start:
                container.seek(int(max(0.0, start - half) / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                t = frame.time
                if start is not None and t < start - half:
                    continue
                if end is not None and t >= end - half:
                    break
                out.append(decoded_to_rgb(frame))
    except (av.error.FFmpegError, ValueError) as e:
        raise LeRobotFormatError(str(path), f"cannot decode video: {e}", stream=key) from None
    return out


# -- landing as raw episodes -------------------------------------------------------------------
def import_lerobot(root: str | Path, landing_dir: str | Path, *, robot_id: str = "lerobot",
                   robot_model: str = "", site: str = "lerobot", start_time: dt.datetime | None = None,
                   dataset_name: str | None = None, jpeg_quality: int = 95) -> list[Path]:
    """Write every episode as a raw HDF5 episode ``<landing_dir>/<episode_id>.h5`` (atomically).

    The landing sensor then ingests them like any robot's files, through the same gates.
    Episodes start one after another from ``start_time`` (default: the Unix epoch + 1 day, so
    a re-import yields identical files), one second apart.
    """
    landing = Path(landing_dir)
    landing.mkdir(parents=True, exist_ok=True)
    name = dataset_name or Path(root).resolve().name
    t0 = start_time or dt.datetime(1970, 1, 2, tzinfo=dt.UTC)
    start_ns = int(t0.timestamp() * 1e6) * 1000
    written = []
    for ep in read_lerobot(root):
        episode_id = f"{name}-{ep.index:06d}"
        ts = start_ns + np.round(ep.timestamps * 1e9).astype(np.int64)
        started = dt.datetime.fromtimestamp(start_ns / 1e9, dt.UTC).isoformat().replace("+00:00", "Z")
        meta = EpisodeMeta(episode_id=episode_id, robot_id=robot_id, robot_model=robot_model, task=ep.task,
                           site=site, started_at=started)
        cameras = {key.removeprefix(CAMERA_PREFIX): (ts, (encode_jpeg(f, jpeg_quality) for f in frames))
                   for key, frames in ep.frames.items()}
        streams = {
            "joint_states": SampleStream("joint_states", ts, {"position": ep.states},
                                         {"position": ep.state_names} if ep.state_names else {}),
            "action": SampleStream("action", ts, {"command": ep.actions},
                                   {"command": ep.action_names} if ep.action_names else {}),
        }
        path = landing / f"{episode_id}.h5"
        tmp = landing / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            write_raw_episode(tmp, meta, cameras, streams)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(path)
        start_ns = int(ts[-1]) + 1_000_000_000 if len(ts) else start_ns + 1_000_000_000
    return written


# -- writing -----------------------------------------------------------------------------------
class _VideoFile:
    """One MP4 that episodes are appended to; frame k sits at pts k (time base 1/fps)."""

    def __init__(self, path: Path, fps: float, crf: float, gop: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.fps, self.crf, self.gop = path, fps, crf, gop
        self.container = av.open(str(path), "w")
        self.stream = None
        self.frames = 0

    def add(self, frame) -> None:
        frame = to_yuv(frame)
        if self.stream is None:
            rate = Fraction(self.fps).limit_denominator(1000)
            s = self.container.add_stream("libx264", rate=rate)
            s.width, s.height, s.pix_fmt = frame.width, frame.height, "yuv420p"
            s.time_base = 1 / rate
            s.codec_context.color_range = FULL_RANGE
            s.codec_context.thread_count = 1
            s.options = {"crf": f"{self.crf:g}", "preset": "medium", "g": str(self.gop), "bf": "0",
                         "x264-params": "threads=1:sliced-threads=0:scenecut=0:colormatrix=bt470bg:"
                                        "colorprim=bt470bg:transfer=bt470bg:range=pc"}
            self.stream = s
        if (frame.width, frame.height) != (self.stream.width, self.stream.height):
            raise ValueError(f"{self.path}: frame {self.frames} is {frame.width}x{frame.height}, "
                             f"the video is {self.stream.width}x{self.stream.height}")
        frame.pts = self.frames
        frame.pict_type = av.video.frame.PictureType.NONE
        self.container.mux(self.stream.encode(frame))
        self.frames += 1

    def close(self) -> None:
        if self.stream is not None:
            self.container.mux(self.stream.encode(None))
        self.container.close()


def _feature(dtype: str, shape, names) -> dict:
    return {"dtype": dtype, "shape": list(shape), "names": names}


def _stats(a: np.ndarray) -> dict:
    a = np.asarray(a, dtype=np.float64)
    return {"min": a.min(0).tolist(), "max": a.max(0).tolist(), "mean": a.mean(0).tolist(),
            "std": a.std(0).tolist(), "count": [len(a)]}


def write_lerobot(episodes: Iterable[LeRobotEpisode], out_root: str | Path, *, fps: float,
                  version: str = V3, crf: float = 12.0, gop: int = 2, robot_type: str = "") -> Path:
    """Write episodes (consumed one at a time) as a LeRobot dataset, v3.0 (default) or v2.1.

    Rows are stored as LeRobot stores them: float32 state/action, ``timestamp = frame_index / fps``.
    """
    if version not in (V3, "v2.1"):
        raise ValueError(f"cannot write LeRobot {version!r}; v3.0 or v2.1")
    root = Path(out_root)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    tasks: dict[str, int] = {}
    ep_rows, data_parts, videos, shapes = [], [], {}, {}
    all_states, all_actions = [], []
    names: dict[str, list[str] | None] = {}
    total = 0
    try:
        for ep in episodes:
            n = len(ep)
            states = np.asarray(ep.states, dtype=np.float32).reshape(n, -1)
            actions = np.asarray(ep.actions, dtype=np.float32).reshape(n, -1)
            task_index = tasks.setdefault(ep.task, len(tasks))
            k = len(ep_rows)
            frame_index = np.arange(n, dtype=np.int64)
            rows = pa.table({
                STATE_KEY: pa.FixedSizeListArray.from_arrays(pa.array(states.ravel()), states.shape[1]),
                ACTION_KEY: pa.FixedSizeListArray.from_arrays(pa.array(actions.ravel()), actions.shape[1]),
                "timestamp": pa.array((frame_index / fps).astype(np.float32)),
                "frame_index": pa.array(frame_index),
                "episode_index": pa.array(np.full(n, k, np.int64)),
                "index": pa.array(total + frame_index),
                "task_index": pa.array(np.full(n, task_index, np.int64)),
            })
            names.setdefault(STATE_KEY, ep.state_names)
            names.setdefault(ACTION_KEY, ep.action_names)
            all_states.append(states)
            all_actions.append(actions)
            row = {"episode_index": k, "tasks": [ep.task], "length": n}
            for key, frames in ep.frames.items():
                key = key if key.startswith(CAMERA_PREFIX) else CAMERA_PREFIX + key
                if version == V3:
                    video = videos.get(key) or videos.setdefault(
                        key, _VideoFile(root / V3_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0),
                                        fps, crf, gop))
                else:
                    video = _VideoFile(root / V21_VIDEO_PATH.format(episode_chunk=k // CHUNKS_SIZE, video_key=key,
                                                                    episode_index=k), fps, crf, gop)
                first = video.frames
                count = 0
                for f in frames:
                    video.add(f)
                    count += 1
                if count != n:
                    raise ValueError(f"episode {ep.index}, camera {key}: {count} frames for {n} rows")
                shapes[key] = (video.stream.height, video.stream.width, 3)
                row.update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                            f"videos/{key}/from_timestamp": first / fps,
                            f"videos/{key}/to_timestamp": (first + n) / fps})
                if version != V3:
                    video.close()
            if version == V3:
                data_parts.append(rows)
                row.update({"data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": total,
                            "dataset_to_index": total + n, "meta/episodes/chunk_index": 0,
                            "meta/episodes/file_index": 0})
            else:
                path = root / V21_DATA_PATH.format(episode_chunk=k // CHUNKS_SIZE, episode_index=k)
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(rows, path)
                row["stats"] = {STATE_KEY: _stats(states), ACTION_KEY: _stats(actions)}
            ep_rows.append(row)
            total += n
    finally:
        for v in videos.values():
            v.close()
    if not ep_rows:
        raise ValueError("no episodes to write")

    states, actions = np.concatenate(all_states), np.concatenate(all_actions)
    features = {
        STATE_KEY: _feature("float32", states.shape[1:], names[STATE_KEY]),
        ACTION_KEY: _feature("float32", actions.shape[1:], names[ACTION_KEY]),
        **{key: {**_feature("video", shape, ["height", "width", "channels"]),
                 "info": {"video.height": shape[0], "video.width": shape[1], "video.codec": "h264",
                          "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                          "video.channels": 3, "has_audio": False}}
           for key, shape in shapes.items()},
        "timestamp": _feature("float32", (1,), None),
        "frame_index": _feature("int64", (1,), None),
        "episode_index": _feature("int64", (1,), None),
        "index": _feature("int64", (1,), None),
        "task_index": _feature("int64", (1,), None),
    }
    info = {
        "codebase_version": version, "robot_type": robot_type or None, "total_episodes": len(ep_rows),
        "total_frames": total, "total_tasks": len(tasks), "chunks_size": CHUNKS_SIZE,
        "fps": int(fps) if float(fps).is_integer() else fps, "splits": {"train": f"0:{len(ep_rows)}"},
        "features": features,
    }
    stats = {STATE_KEY: _stats(states), ACTION_KEY: _stats(actions)}
    if version == V3:
        info.update({"data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
                     "data_path": V3_DATA_PATH, "video_path": V3_VIDEO_PATH if shapes else None})
        data = root / V3_DATA_PATH.format(chunk_index=0, file_index=0)
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(data_parts), data)
        (root / V3_EPISODES_PATH).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(ep_rows), root / V3_EPISODES_PATH)
        _write_tasks_parquet(tasks, root / "meta/tasks.parquet")
    else:
        info.update({"total_chunks": 1, "total_videos": len(ep_rows) * len(shapes), "data_path": V21_DATA_PATH,
                     "video_path": V21_VIDEO_PATH if shapes else None})
        _jsonl(root / "meta/episodes.jsonl", [{k: r[k] for k in ("episode_index", "tasks", "length")}
                                              for r in ep_rows])
        _jsonl(root / "meta/episodes_stats.jsonl", [{"episode_index": r["episode_index"], "stats": r["stats"]}
                                                    for r in ep_rows])
        _jsonl(root / "meta/tasks.jsonl", [{"task_index": i, "task": t} for t, i in tasks.items()])
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=2))
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return root


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


def _mcap_episode(row: dict, index: int) -> LeRobotEpisode:
    import fsspec

    from .codec import StreamingH264Decoder
    from .mcap_reader import EpisodeReader

    uri = row["uri"]
    with fsspec.open(uri, "rb") as f, EpisodeReader(f) as reader:
        cams = sorted(reader.cameras)
        if not cams:
            raise LeRobotFormatError(uri, "episode has no camera")
        decoded: dict[str, tuple[np.ndarray, list]] = {}
        for cam in cams:
            dec, ts, frames = StreamingH264Decoder(), [], []
            for t, au in reader.iter_video(cam):
                out = dec.feed(au)
                if len(out) != 1:
                    raise LeRobotFormatError(uri, f"decoder gave {len(out)} frames for one access unit",
                                             stream=cam)
                ts.append(t)
                frames.append(out[0])
            decoded[cam] = (np.asarray(ts, np.int64), frames)
        clock = decoded[cams[0]][0]
        streams = reader.read_streams(["joint_states", "action"], reader.start_ns, reader.end_ns)
        task = row.get("task") or reader.metadata().get("task", "")
    state, action = streams["joint_states"], streams["action"]
    frames = {}
    for cam, (ts, fr) in decoded.items():
        frames[cam] = fr if cam == cams[0] else [fr[i] for i in _nearest(ts, clock)]
    return LeRobotEpisode(
        index=index, task=task, fps=0.0, timestamps=(clock - clock[0]) / 1e9,
        states=np.asarray(state.fields["position"])[_nearest(state.timestamps_ns, clock)],
        actions=np.asarray(action.fields["command"])[_nearest(action.timestamps_ns, clock)],
        frames=frames, state_names=state.labels.get("position"), action_names=action.labels.get("command"),
        extra={"uri": uri, "episode_id": row.get("episode_id")})


def export_lerobot(episodes: pa.Table | Sequence, out_root: str | Path, *, fps: float | None = None,
                   crf: float = 12.0, gop: int = 2) -> Path:
    """Write a manifest's distinct episodes (MCAP ``uri``) as a LeRobot v3.0 dataset.

    ``fps`` defaults to the first episode's first camera's nominal rate, rounded.
    """
    from .transcode import nominal_rate_hz

    rows = _episode_rows(episodes)
    if not rows:
        raise ValueError("no episodes to export")
    first = _mcap_episode(rows[0], 0)
    if fps is None:
        rate = nominal_rate_hz(np.round(first.timestamps * 1e9).astype(np.int64))
        fps = float(round(rate)) if rate else 30.0

    def all_episodes():
        yield first
        for k, row in enumerate(rows[1:], start=1):
            yield _mcap_episode(row, k)

    return write_lerobot(all_episodes(), out_root, fps=fps, version=V3, crf=crf, gop=gop)
