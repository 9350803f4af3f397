"""ROS 2 bags written by the real library (rosbags' rosbag2 writer and its standard message store), in
MCAP or SQLite 3 storage: cameras as CompressedImage JPEG (or raw Image, or foxglove CompressedVideo H.264),
depth as Image (16UC1, mono16, 32FC1), JointState, and a custom action type whose definition the bag carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from dyna_resources.episodes.raw_format import encode_jpeg
from dyna_resources.sources.ros2 import COMPRESSED_VIDEO
from dyna_resources.sources.samples import COMPRESSED_VIDEO_MSG

ACTION_TYPE = "dyna_test_msgs/msg/ArmCommand"
ACTION_MSG = """std_msgs/Header header
float64[6] joints
float64 gripper
"""
T0 = 1_796_000_000_000_000_000  # 2026-11-30, ns
JOINTS = [f"joint_{i}" for i in range(6)]


@dataclass
class BagSpec:
    duration_s: float = 2.0
    fps: float = 10.0
    joint_hz: float = 50.0
    cameras: tuple[str, ...] = ("wrist", "scene_left")
    raw_camera: str | None = None  # this camera as sensor_msgs/Image rgb8 instead of CompressedImage
    h264_camera: str | None = None  # this camera as foxglove_msgs/CompressedVideo H.264 (libx264 via PyAV)
    h264_gop: int = 10  # its keyframe interval
    h264_bframes: int = 0  # its B-frames between references
    h264_format: str = "h264"  # the messages' format field
    width: int = 64
    height: int = 48
    storage: str = "mcap"
    stamp_offset_ns: int = -3_000_000  # header stamp = log time + this
    pauses: tuple[float, ...] = ()  # seconds into the bag where 5 s of silence is inserted (split by gap)
    markers: tuple[float, ...] = ()  # times (s) of /episode/start messages
    garble: tuple[str, int] | None = None  # (topic, message index) written as garbage bytes
    garble_after_stamp: bool = False  # the garbled message keeps its header stamp: cut short after it
    extra_topics: tuple[str, ...] = ()  # std_msgs/String topics the map may not name
    backwards_at: int | None = None  # /joint_states message index stamped 25 ms early: before the one ahead
    custom_data: dict = field(default_factory=dict)
    depth: tuple[tuple[str, str], ...] = ()  # (name, Image encoding): /depth_camera/<name>/image at fps
    depth_bigendian: bool = False
    depth_row_pad: int = 0  # bytes after each row of a depth image (its step beyond width * pixel size)


def typestore():
    ts = get_typestore(Stores.ROS2_HUMBLE)
    ts.register(get_types_from_msg(ACTION_MSG, ACTION_TYPE))
    ts.register(get_types_from_msg(COMPRESSED_VIDEO_MSG, COMPRESSED_VIDEO))
    return ts


def h264_units(frames: list[np.ndarray], gop: int, bframes: int = 0) -> list[bytes]:
    """Frames encoded by libx264 (a keyframe every ``gop``, SPS/PPS on each, ``bframes`` B-frames), decode order."""
    h, w = frames[0].shape[:2]
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = w, h, "yuv420p"
    enc.time_base, enc.framerate = Fraction(1, 30), Fraction(30)
    enc.options = {
        "preset": "veryfast",
        "bf": str(bframes),
        "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:b-adapt=0:repeat-headers=1:threads=1",
    }
    units = []
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p")
        vf.pts = i
        units += [bytes(p) for p in enc.encode(vf)]
    return units + [bytes(p) for p in enc.encode(None)]


def frame(i: int, cam: int, w: int, h: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([(xx * 3 + i * 5) % 256, (yy * 4 + cam * 40) % 256, (xx + yy + i) % 256], -1).astype(np.uint8)


def depth_mm(i: int, k: int, w: int, h: int) -> np.ndarray:
    """Depth frame ``i`` of depth topic ``k``: uint16 millimetres over the whole range (both bytes vary)."""
    yy, xx = np.mgrid[0:h, 0:w]
    return ((xx * 1031 + yy * 4099 + i * 257 + k * 7919) % 65536).astype(np.uint16)


# 32FC1 pixels (row 0) that are no reading: NaN, infinities, negative, beyond 65.535 m; and the largest valid
METRES_EDGES = [np.nan, np.inf, -np.inf, -0.5, 70.0, 65.535]
METRES_EDGES_MM = [0, 0, 0, 0, 0, 65535]


def depth_topic(name: str) -> str:
    return f"/depth_camera/{name}/image"


def _depth_image(spec: BagSpec, encoding: str, mm: np.ndarray, i: int, c: int) -> tuple[bytes, np.ndarray, int]:
    """(row bytes with any padding, what the reader should make of them, step) of one depth frame."""
    order = ">" if spec.depth_bigendian else "<"
    if encoding == "32FC1":
        metres = (mm.astype(np.float32) / np.float32(1000)).astype(order + "f4")
        metres[0, : len(METRES_EDGES)] = METRES_EDGES
        want = mm.copy()
        want[0, : len(METRES_EDGES)] = METRES_EDGES_MM
        rows = metres.view(np.uint8).reshape(spec.height, -1)
    elif encoding in ("16UC1", "mono16"):
        rows, want = mm.astype(order + "u2").view(np.uint8).reshape(spec.height, -1), mm
    else:  # a colour image mapped as depth
        rows, want = frame(i, c, spec.width, spec.height).reshape(spec.height, -1), mm
    pad = np.full((spec.height, spec.depth_row_pad), 0xAB, np.uint8)
    return np.concatenate([rows, pad], 1).tobytes(), want, rows.shape[1] + spec.depth_row_pad


def write_bag(path: Path, spec: BagSpec | None = None) -> dict:
    """Write the bag directory ``path``; returns what was written (times and values) to compare against."""
    spec = spec or BagSpec()
    ts = typestore()
    m = ts.types
    header_t, time_t = m["std_msgs/msg/Header"], m["builtin_interfaces/msg/Time"]
    cimg, img, js, action, text = (
        m["sensor_msgs/msg/CompressedImage"],
        m["sensor_msgs/msg/Image"],
        m["sensor_msgs/msg/JointState"],
        m[ACTION_TYPE],
        m["std_msgs/msg/String"],
    )

    def shift(t_s: float) -> int:  # seconds into the recording -> log time, after the inserted pauses
        return T0 + int(round((t_s + 5.0 * sum(p <= t_s for p in spec.pauses)) * 1e9))

    def hdr(t: int):
        t += spec.stamp_offset_ns
        return header_t(stamp=time_t(sec=t // 10**9, nanosec=t % 10**9), frame_id="base")

    events: list[tuple[int, str, int]] = []
    for c, _ in enumerate(spec.cameras):
        events += [(shift(i / spec.fps) + c * 1000, f"cam{c}", i) for i in range(int(spec.duration_s * spec.fps))]
    for k, _ in enumerate(spec.depth):
        events += [(shift(i / spec.fps) + 500 + k, f"depth{k}", i) for i in range(int(spec.duration_s * spec.fps))]
    n_joint = int(spec.duration_s * spec.joint_hz)
    events += [(shift(i / spec.joint_hz) + 10, "js", i) for i in range(n_joint)]
    events += [(shift(i / spec.joint_hz) + 20, "act", i) for i in range(n_joint)]
    events += [(shift(t) + 30, "marker", k) for k, t in enumerate(spec.markers)]
    events += [(shift(0.5) + 40, f"extra{k}", 0) for k in range(len(spec.extra_topics))]
    events.sort()
    rng = np.random.default_rng(7)
    written: dict = {
        "joint_t": [],
        "position": [],
        "action_t": [],
        "action": [],
        "frames": {c: [] for c in spec.cameras},
        "depth": {name: [] for name, _ in spec.depth},
    }
    video_units: list[bytes] = []
    if spec.h264_camera:
        c = spec.cameras.index(spec.h264_camera)
        pixels = [frame(i, c, spec.width, spec.height) for i in range(int(spec.duration_s * spec.fps))]
        video_units = h264_units(pixels, spec.h264_gop, spec.h264_bframes)
    plugin = StoragePlugin.MCAP if spec.storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as w:
        conns = {}
        for c, cam in enumerate(spec.cameras):
            raw = cam == spec.raw_camera
            topic = f"/camera/{cam}/image" + ("" if raw else "/compressed")
            msgtype = COMPRESSED_VIDEO if cam == spec.h264_camera else (img if raw else cimg).__msgtype__
            conns[f"cam{c}"] = w.add_connection(topic, msgtype, typestore=ts)
        for k, (name, _) in enumerate(spec.depth):
            conns[f"depth{k}"] = w.add_connection(depth_topic(name), img.__msgtype__, typestore=ts)
        conns["js"] = w.add_connection("/joint_states", js.__msgtype__, typestore=ts)
        conns["act"] = w.add_connection("/action", ACTION_TYPE, typestore=ts)
        if spec.markers:
            conns["marker"] = w.add_connection("/episode/start", text.__msgtype__, typestore=ts)
        for k, topic in enumerate(spec.extra_topics):
            conns[f"extra{k}"] = w.add_connection(topic, text.__msgtype__, typestore=ts)
        seen: dict[str, int] = {}
        for t, kind, i in events:
            conn = conns[kind]
            index = seen[conn.topic] = seen.get(conn.topic, -1) + 1
            if kind.startswith("cam"):
                c = int(kind[3:])
                cam = spec.cameras[c]
                pixels = frame(i, c, spec.width, spec.height)
                written["frames"][cam].append((t + spec.stamp_offset_ns, pixels))
                if cam == spec.h264_camera:  # decode order, each unit at the next frame's time
                    data = np.frombuffer(video_units[i], np.uint8)
                    msg = m[COMPRESSED_VIDEO](timestamp=hdr(t).stamp, frame_id=cam, data=data, format=spec.h264_format)
                elif cam == spec.raw_camera:
                    msg = img(
                        header=hdr(t), height=spec.height, width=spec.width, encoding="rgb8", is_bigendian=0,
                        step=spec.width * 3, data=pixels.reshape(-1),
                    )  # fmt: skip
                else:
                    data = np.frombuffer(encode_jpeg(pixels, 95), np.uint8)
                    msg = cimg(header=hdr(t), format="jpeg", data=data)
            elif kind.startswith("depth"):
                k = int(kind[5:])
                name, encoding = spec.depth[k]
                data, want, step = _depth_image(spec, encoding, depth_mm(i, k, spec.width, spec.height), i, k)
                written["depth"][name].append((t + spec.stamp_offset_ns, want))
                msg = img(
                    header=hdr(t), height=spec.height, width=spec.width, encoding=encoding,
                    is_bigendian=int(spec.depth_bigendian), step=step, data=np.frombuffer(data, np.uint8),
                )  # fmt: skip
            elif kind == "js":
                pos = rng.standard_normal(6)
                stamp = t - (25_000_000 if spec.backwards_at is not None and i == spec.backwards_at else 0)
                msg = js(header=hdr(stamp), name=JOINTS, position=pos, velocity=pos * 0.1, effort=np.zeros(0))
                written["joint_t"].append(stamp + spec.stamp_offset_ns)
                written["position"].append(pos)
            elif kind == "act":
                joints = rng.standard_normal(6)
                msg = action(header=hdr(t), joints=joints, gripper=float(i % 2))
                written["action_t"].append(t + spec.stamp_offset_ns)
                written["action"].append(np.concatenate([joints, [float(i % 2)]]))
            else:
                msg = text(data=f"{kind} {i}")
            blob = ts.serialize_cdr(msg, conn.msgtype)
            if spec.garble == (conn.topic, index):
                # a CDR header and three bytes (or the header stamp and three bytes): cut short
                blob = (bytes(blob[:12]) if spec.garble_after_stamp else b"\x00\x01\x00\x00") + b"\xff" * 3
            w.write(conn, t, blob)
    if spec.custom_data:
        import yaml

        meta = path / "metadata.yaml"
        doc = yaml.safe_load(meta.read_text())
        doc["rosbag2_bagfile_information"]["custom_data"] = spec.custom_data
        meta.write_text(yaml.safe_dump(doc))
    return written


def topic_map_yaml(spec: BagSpec, **extra) -> dict:
    topics = {
        (f"/camera/{c}/image" + ("" if c == spec.raw_camera else "/compressed")): {"camera": c} for c in spec.cameras
    }
    topics.update({depth_topic(name): {"depth": name} for name, _ in spec.depth})
    topics["/joint_states"] = {"stream": "joint_states"}
    topics["/action"] = {"stream": "action", "fields": ["joints", "gripper"]}
    return {"topics": topics, **extra}
