"""Sample recordings in the other source formats, made from legacy HDF5 episodes: a ROS 2 bag (rosbags'
own rosbag2 writer, MCAP or SQLite 3 storage) and a LeRobot dataset (``episodes.lerobot.write_lerobot``).
The same frames and samples in every format: what ``make demo`` lands beside its HDF5 drops, and what the
ingest benchmark compares the sources on.

A bag holds the episode as a robot's recorder would write it: every camera a
``sensor_msgs/msg/CompressedImage`` topic carrying the episode's own JPEG bytes, ``joint_states`` a
``sensor_msgs/msg/JointState`` topic, every other stream a ``std_msgs/msg/Float64MultiArray`` topic, header
stamps the episode's timestamps, the episode's metadata in ``metadata.yaml``'s ``custom_data``.
With ``depth=True``, the first camera (by name) also has a depth topic, a ``sensor_msgs/msg/Image``
``16UC1`` made from its frames' luma (:func:`synthetic_depth`) at its frames' times.
:func:`topic_map` is the map that reads such bags back.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import yaml

from ..episodes.codec import VideoSettings, encode_gop, jpeg_to_yuv
from ..episodes.lerobot import CAMERA_PREFIX, LeRobotEpisode, write_lerobot
from ..episodes.raw_format import RawEpisode, decode_jpeg
from ..episodes.transcode import nominal_rate_hz
from .ros2 import COMPRESSED_IMAGE, COMPRESSED_VIDEO, IMAGE, JOINT_STATE
from .topic_map import FILE_NAME

FLOAT64_ARRAY = "std_msgs/msg/Float64MultiArray"
DEPTH = "<depth>"  # write_bag's event name for the depth topic's frames (no camera's name)
# the episode model's streams as bag topics (a camera: /camera/<name>/image/compressed)
STREAM_TOPICS = {
    "joint_states": "/joint_states",
    "action": "/action",
    "ee_pose": "/ee_pose",
    "gripper": "/gripper",
    "wrench": "/wrench",
    "imu": "/imu",
}


def camera_topic(name: str) -> str:
    return f"/camera/{name}/image/compressed"


def depth_topic(camera: str) -> str:
    return f"/camera/{camera}/depth/image_raw"


def depth_name(camera: str) -> str:
    return f"{camera}_depth"


def synthetic_depth(rgb: np.ndarray) -> np.ndarray:
    """A depth frame (uint16 mm, 400..2950) from an RGB frame: nearer where brighter, by its luma."""
    luma = rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return np.rint(400.0 + 10.0 * luma).astype(np.uint16)


def topic_map(cameras: Sequence[str], depth: bool = False) -> dict:
    """The topic map (``ros2_topics.yaml``'s document) that reads the bags :func:`write_bag` writes
    (``depth``: with ``depth=True``)."""
    topics: dict[str, dict] = {camera_topic(c): {"camera": c} for c in cameras}
    if depth:
        first = sorted(cameras)[0]
        topics[depth_topic(first)] = {"depth": depth_name(first)}
    topics.update({topic: {"stream": name} for name, topic in STREAM_TOPICS.items()})
    return {"timestamps": "header", "unmapped": "ignore", "topics": topics}


def write_topic_map(home: str | Path, cameras: Sequence[str], depth: bool = False) -> Path:
    path = Path(home) / FILE_NAME
    path.write_text(yaml.safe_dump(topic_map(cameras, depth), sort_keys=False))
    return path


# foxglove_msgs/msg/CompressedVideo (ROS 2), as foxglove_msgs defines it: not in rosbags' standard stores
COMPRESSED_VIDEO_MSG = """builtin_interfaces/Time timestamp
string frame_id
uint8[] data
string format
"""


def write_bag(
    raw_path: str | Path | Sequence[str | Path],
    bag_dir: str | Path,
    *,
    storage: str = "mcap",
    video: VideoSettings | None = None,
    depth: bool = False,
    gap_s: float = 5.0,
) -> Path:
    """Write the legacy episode at ``raw_path`` as the ROS 2 bag directory ``bag_dir`` (which must not exist).

    ``raw_path`` a sequence: the episodes (all with the same cameras and streams) one after another in one
    long recording, each moved in time to start ``gap_s`` after the one before ends (what a topic map's
    ``split: {rule: gap}`` cuts back into them); the bag's metadata is the first episode's.
    ``video``: cameras as ``foxglove_msgs/msg/CompressedVideo`` H.264 instead of JPEG ``CompressedImage``,
    encoded as an on-robot encoder would, GOPs of ``video.gop_frames`` (the type's definition goes in the bag).
    ``depth``: with a depth topic for the first camera.
    """
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    if video is not None:
        ts.register(get_types_from_msg(COMPRESSED_VIDEO_MSG, COMPRESSED_VIDEO))
    bag_dir = Path(bag_dir)
    paths = [raw_path] if isinstance(raw_path, (str, Path)) else list(raw_path)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    raws = [RawEpisode(p) for p in paths]
    try:
        with Writer(bag_dir, version=9, storage_plugin=plugin) as w:
            first = raws[0]
            conns = {}
            for name in sorted(first.cameras):
                camera_type = COMPRESSED_IMAGE if video is None else COMPRESSED_VIDEO
                conns[name] = w.add_connection(camera_topic(name), camera_type, typestore=ts)
            depth_camera = sorted(first.cameras)[0] if depth else None
            if depth_camera is not None:
                conns[DEPTH] = w.add_connection(depth_topic(depth_camera), IMAGE, typestore=ts)
            for name in first.streams:
                msgtype = JOINT_STATE if name == "joint_states" else FLOAT64_ARRAY
                conns[name] = w.add_connection(STREAM_TOPICS[name], msgtype, typestore=ts)
            at = first.start_ns  # where the next episode starts
            for raw in raws:
                shift = at - raw.start_ns
                _write_episode(w, ts, conns, raw, shift, video, depth_camera)
                at = raw.end_ns + shift + int(gap_s * 1e9)
            meta = first.meta
    finally:
        for raw in raws:
            raw.close()
    doc = yaml.safe_load((bag_dir / "metadata.yaml").read_text())
    doc["rosbag2_bagfile_information"]["custom_data"] = {
        k: str(v) for k, v in meta.as_dict().items() if v not in (None, "") and k not in ("success", "sim")
    }
    (bag_dir / "metadata.yaml").write_text(yaml.safe_dump(doc))
    return bag_dir


def _write_episode(w, ts, conns: dict, raw: RawEpisode, shift: int, video, depth_camera: str | None) -> None:
    """One legacy episode's messages, its times moved by ``shift`` ns, in the order a recorder writes them."""
    m = ts.types
    header_t, time_t = m["std_msgs/msg/Header"], m["builtin_interfaces/msg/Time"]
    cimg, img, js, array = m[COMPRESSED_IMAGE], m[IMAGE], m[JOINT_STATE], m[FLOAT64_ARRAY]
    layout = m["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)

    def header(t: int):
        return header_t(stamp=time_t(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000), frame_id="base")

    events: list[tuple[int, int, str, int]] = []  # (time, order, what, index): the recorder's order
    for k, (name, cam) in enumerate(sorted(raw.cameras.items())):
        events += [(int(t) + shift, k, name, i) for i, t in enumerate(cam.timestamps_ns)]
    if depth_camera is not None:  # after its camera's frame of the same time
        events += [(int(t) + shift, 50, DEPTH, i) for i, t in enumerate(raw.cameras[depth_camera].timestamps_ns)]
    for k, (name, s) in enumerate(raw.streams.items()):
        events += [(int(t) + shift, 100 + k, name, i) for i, t in enumerate(s.timestamps_ns)]
    events.sort()
    jpegs = {name: cam.iter_jpeg() for name, cam in raw.cameras.items()}
    units = {name: _h264(cam, video) for name, cam in raw.cameras.items()} if video is not None else {}
    fields = {n: {f: np.asarray(col[:], np.float64) for f, col in s.fields.items()} for n, s in raw.streams.items()}
    for t, _, name, i in events:
        conn = conns[name]
        if name in raw.cameras and video is not None:
            data = np.frombuffer(units[name][i], np.uint8)
            msg = m[COMPRESSED_VIDEO](timestamp=header(t).stamp, frame_id=name, data=data, format="h264")
        elif name in raw.cameras:
            data = np.frombuffer(next(jpegs[name]), np.uint8)
            msg = cimg(header=header(t), format="jpeg", data=data)
        elif name == DEPTH:
            assert depth_camera is not None
            mm = synthetic_depth(decode_jpeg(raw.cameras[depth_camera].frame_bytes(i), "", depth_camera, i))
            height, width = mm.shape
            data = mm.astype("<u2").view(np.uint8).reshape(-1)
            msg = img(
                header=header(t),
                height=height,
                width=width,
                encoding="16UC1",
                is_bigendian=0,
                step=2 * width,
                data=data,
            )
        elif name == "joint_states":
            f = fields[name]
            labels = raw.streams[name].labels.get("position") or [f"joint_{j}" for j in range(f["position"].shape[1])]
            empty = np.zeros(0)
            msg = js(
                header=header(t),
                name=list(labels),
                position=f["position"][i],
                velocity=f["velocity"][i] if "velocity" in f else empty,
                effort=f["effort"][i] if "effort" in f else empty,
            )
        else:
            (values,) = fields[name].values()
            msg = array(layout=layout, data=values[i])
        w.write(conn, t, ts.serialize_cdr(msg, conn.msgtype))


def _h264(cam, video: VideoSettings) -> list[bytes]:
    """A camera's JPEG frames as H.264 access units, one closed GOP of ``video.gop_frames`` after another."""
    out: list[bytes] = []
    frames = (jpeg_to_yuv(j) for j in cam.iter_jpeg())
    while gop := list(itertools.islice(frames, video.gop_frames)):
        out += encode_gop(gop, video, nominal_rate_hz(cam.timestamps_ns) or 30.0)
    return out


class _JpegFrames(Sequence):
    """A camera's frames as RGB, decoded when asked for: a dataset is written without holding an episode's
    decoded frames in memory."""

    def __init__(self, raw: RawEpisode, name: str):
        self.cam, self.name = raw.cameras[name], name

    def __len__(self) -> int:
        return len(self.cam)

    def __getitem__(self, i):  # an int index only: what the writer asks
        return decode_jpeg(self.cam.frame_bytes(int(i)), "", self.name, int(i))

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]


def _nearest(src: np.ndarray, at: np.ndarray) -> np.ndarray:
    j = np.clip(np.searchsorted(src, at), 1, max(1, len(src) - 1))
    return np.where(np.abs(src[j - 1] - at) <= np.abs(src[np.minimum(j, len(src) - 1)] - at), j - 1, j)


def write_dataset(raw_paths: Sequence[str | Path], root: str | Path, *, version: str = "v3.0", **writer) -> Path:
    """Write legacy episodes (all with the same cameras at one rate) as one LeRobot dataset at ``root``:
    a row per frame of the first camera, joint positions and actions nearest in time, the task. ``writer``:
    :func:`write_lerobot`'s options (``crf``, ``gop``)."""
    opened = [RawEpisode(p) for p in raw_paths]
    try:

        def episodes() -> Iterator[LeRobotEpisode]:
            for k, raw in enumerate(opened):
                names = sorted(raw.cameras)
                clock = raw.cameras[names[0]].timestamps_ns
                js, act = raw.streams["joint_states"], raw.streams["action"]
                # positions interpolated at the frame times (the nearest 200 Hz sample jitters by up to half a
                # period, which the quality scorer rightly calls velocity spikes); actions, commands, nearest
                pos = np.asarray(js.fields["position"][:], np.float64)
                t = js.timestamps_ns - clock[0]
                states = np.stack([np.interp(clock - clock[0], t, pos[:, j]) for j in range(pos.shape[1])], 1)
                actions = np.asarray(act.fields["command"][:])[_nearest(act.timestamps_ns, clock)]
                yield LeRobotEpisode(
                    index=k,
                    task=raw.meta.task,
                    fps=round(1e9 / float(np.median(np.diff(clock)))),
                    timestamps=(clock - clock[0]) / 1e9,
                    states=states.astype(np.float32),
                    actions=actions.astype(np.float32),
                    frames={CAMERA_PREFIX + n: _JpegFrames(raw, n) for n in names},
                    state_names=js.labels.get("position"),
                    action_names=act.labels.get("command"),
                    extra={"robot_type": raw.meta.robot_model},
                )

        first = opened[0].cameras[sorted(opened[0].cameras)[0]].timestamps_ns
        fps = round(1e9 / float(np.median(np.diff(first))))
        return write_lerobot(episodes(), root, fps=fps, version=version, **writer)
    finally:
        for raw in opened:
            raw.close()


__all__ = [
    "STREAM_TOPICS",
    "camera_topic",
    "depth_name",
    "depth_topic",
    "synthetic_depth",
    "topic_map",
    "write_bag",
    "write_dataset",
    "write_topic_map",
]
