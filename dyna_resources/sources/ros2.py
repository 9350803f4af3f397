"""ROS 2 bags (rosbag2, MCAP or SQLite 3 storage) as episodes, by a topic map (``topic_map``).

CDR is decoded by ``rosbags`` (chosen by measurement over ``mcap-ros2-support``: about 1.4x less CPU for a
full pass, numpy arrays instead of lists, the same API for SQLite 3 bags, which mcap-ros2-support cannot
read, and custom message types registered from the definitions the bag itself carries, in both storages).

Messages: ``sensor_msgs/msg/CompressedImage`` (JPEG, PNG: told by their bytes, not the ``format``
string), ``sensor_msgs/msg/Image`` (rgb8, bgr8, mono8), ``foxglove_msgs/msg/CompressedVideo`` (H.264,
Annex B, one access unit a message: copied into the MCAP when its layout meets the read profile, else
re-encoded; its ``timestamp`` is its header stamp), ``sensor_msgs/msg/JointState``,
``std_msgs/msg/Float64MultiArray`` and any message type the bag defines, by its numeric fields.

A depth topic is a ``sensor_msgs/msg/Image`` of ``16UC1`` or ``mono16`` (uint16 millimetres, REP 118's
convention; kept as they are) or ``32FC1`` (float metres: rounded to uint16 millimetres, 0 where the
value is NaN, infinite or outside 0..65.535 m, REP 118's "no reading"), in either byte order, rows
``step`` bytes apart. Its frames are uint16 (H, W) arrays; its times follow the cameras' rules. Times
are header stamps (or log times, by the map); each topic's must increase strictly, or the episode meets
the timestamp gate. A bag is one episode, or is cut into several by the map's split rule: a pause longer
than ``gap_s`` between two mapped messages, or a marker topic whose every message starts an episode.

Every failure names the bag and, where one is at fault, the topic: an unreadable or truncated bag, a
mapped topic of a type this cannot read or absent from the bag, a message whose CDR does not decode (its
index on its topic), a bag topic the map does not name (with ``unmapped: refuse``).

Numeric topics whose messages share one layout are decoded as columns (``cdr_columns``: one numpy view a
field, ~4.5x less CPU than rosbags' message-at-a-time decode); others message by message.

Every frame of an episode is held in memory, compressed, as the bag holds it (a 30 s episode of three
640x480 JPEG cameras: ~80 MB); depth frames raw (a 30 s 640x480 depth topic at 30 Hz: ~550 MB). A bag the
split rule cuts is planned first (:func:`plan_bag`: one pass keeping times, no frame), then each episode
is read from its own log-time window of the bag (:func:`read_member`), one episode in memory at a time;
a message index in a failure then counts from its episode's window.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..episodes.codec import is_keyframe
from ..episodes.errors import EpisodeError, MissingStreamError, RawFormatError
from ..episodes.raw_format import REQUIRED_STREAMS, SAMPLE_STREAMS, EpisodeMeta, SampleStream, _check_monotonic
from .cdr_columns import decode_columns
from .detect import BAG_METADATA
from .memory import PNG_MAGIC, DepthStream, H264Camera, MemoryCamera, MemoryEpisode
from .topic_map import DEFAULT, TopicMap, TopicRole

COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_VIDEO = "foxglove_msgs/msg/CompressedVideo"
CAMERA_TYPES = (COMPRESSED_IMAGE, IMAGE, COMPRESSED_VIDEO)
JOINT_STATE = "sensor_msgs/msg/JointState"
RAW_ENCODINGS = ("rgb8", "bgr8", "mono8")
DEPTH_ENCODINGS = ("16UC1", "mono16", "32FC1")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_META = ("robot_id", "robot_model", "robot_sw_version", "task", "site", "operator", "started_at")  # from custom_data


@dataclass
class _Series:
    """One mapped topic's messages as read: times, and frames or rows."""

    role: TopicRole
    msgtype: str
    times: list[int] = field(default_factory=list)
    frames: list[bytes | np.ndarray] = field(default_factory=list)
    depth: list[np.ndarray] = field(default_factory=list)  # uint16 millimetres
    logs: list[int] = field(default_factory=list)  # log times, as times
    keyframes: list[bool] = field(default_factory=list)  # an H.264 camera's, when read for a plan (frames left)
    rows: dict[str, list[np.ndarray] | np.ndarray] = field(default_factory=dict)  # an array: decoded as columns
    labels: dict[str, list[str]] = field(default_factory=dict)


def bag_metadata(path: Path) -> dict:
    """``metadata.yaml``'s ``rosbag2_bagfile_information``."""
    try:
        doc = yaml.safe_load((path / BAG_METADATA).read_text()) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise RawFormatError(str(path), f"{BAG_METADATA} does not parse: {e}") from None
    info = doc.get("rosbag2_bagfile_information") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        raise RawFormatError(str(path), f"{BAG_METADATA} has no rosbag2_bagfile_information")
    return info


def read_bag(path: str | Path, topics: TopicMap = DEFAULT) -> list[MemoryEpisode]:
    """The episodes of the bag directory ``path`` (one, unless the map's split rule cuts it). A split bag's
    episodes are all in memory at once: :class:`Bag` reads them one at a time."""
    with Bag(path, topics) as bag:
        return bag.episodes()


def plan_bag(path: str | Path, topics: TopicMap = DEFAULT) -> list[BagMember]:
    """The episodes the map's split rule cuts the bag ``path`` into (:meth:`Bag.plan`)."""
    with Bag(path, topics) as bag:
        return bag.plan()


def read_member(path: str | Path, topics: TopicMap, member: BagMember) -> MemoryEpisode:
    """The episode ``member`` of the bag ``path``, reading only its window (what a worker does)."""
    with Bag(path, topics) as bag:
        return bag.read(member)


@dataclass(frozen=True)
class BagMember:
    """One episode of a bag the map's split rule cuts: its id, its ``[lo, hi)`` range on the map's clock,
    the log-time window ``[log_lo, log_hi)`` that holds every message of it (and, for an H.264 camera cut
    inside a GOP, the units from the keyframe before: its preroll), and its camera frames (what its share of
    the bag's bytes is weighed by). The window is what a worker reads of the bag for it: a chunk (MCAP) or
    rows (SQLite 3) outside it is not read."""

    episode_id: str
    lo: int
    hi: int
    log_lo: int
    log_hi: int
    frames: int = 0

    def window(self) -> str:
        """The member as the registry keeps it (``episodes.source_window``)."""
        return json.dumps({"ns": [self.lo, self.hi], "log_ns": [self.log_lo, self.log_hi]})

    @classmethod
    def parse(cls, episode_id: str, window: str) -> BagMember:
        doc = json.loads(window)
        (lo, hi), (log_lo, log_hi) = doc["ns"], doc["log_ns"]
        return cls(episode_id, int(lo), int(hi), int(log_lo), int(log_hi))


class Bag:
    """A bag directory open for reading through one reader (opening one parses its metadata and every
    message definition: ~40 ms): its episodes whole, or planned and then read one at a time."""

    def __init__(self, path: str | Path, topics: TopicMap = DEFAULT):
        self.path, self.topics = Path(path), topics
        self.info = bag_metadata(self.path)
        self._reader = _open_reader(self.path)

    def __enter__(self) -> Bag:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._reader.close()

    def episodes(self) -> list[MemoryEpisode]:
        """Every episode (a bag the split rule cuts: all in memory at once; :meth:`plan` and :meth:`read`
        hold one at a time)."""
        if self.topics.split.rule != "bag":
            return [self.read(m) for m in self.plan()]
        series, ignored, _ = _read(self.path, self._reader, self.topics)
        ((lo, hi),) = _cuts(series, self.topics, [])
        eid = _episode_id(self.path, self.info)
        return [_episode(self.path, eid, _meta(self.info, self.topics), series, lo, hi, self.topics, ignored)]

    def plan(self) -> list[BagMember]:
        """The episodes the map's split rule cuts the bag into, from one pass over its messages that keeps
        their times and no frame (a 1 h bag of three JPEG cameras would be ~10 GB of them)."""
        series, _, markers = _read(self.path, self._reader, self.topics, frames=False)
        cuts = _cuts(series, self.topics, markers)
        base = _episode_id(self.path, self.info)
        arrays = [
            (s, np.asarray(s.times, np.int64), np.asarray(s.logs, np.int64), np.flatnonzero(s.keyframes))
            for s in series.values()
        ]
        members = []
        for k, (lo, hi) in enumerate(cuts):
            log_lo, log_hi, frames = 2**63 - 1, -1, 0
            for s, t, logs, keyframes in arrays:
                keep = np.flatnonzero((t >= lo) & (t < hi))
                if not len(keep):
                    continue
                log_lo, log_hi = min(log_lo, int(logs[keep].min())), max(log_hi, int(logs[keep].max()) + 1)
                frames += len(keep) if s.role.camera else 0
                if s.keyframes and not s.keyframes[keep[0]]:  # the preroll: back to the keyframe before
                    before = keyframes[: np.searchsorted(keyframes, keep[0])]
                    log_lo = min(log_lo, int(logs[before[-1]])) if len(before) else log_lo
            eid = base if len(cuts) == 1 else f"{base}-{k:03d}"
            members.append(BagMember(eid, lo, hi, log_lo, max(log_hi, log_lo + 1), max(1, frames)))
        return members

    def read(self, member: BagMember) -> MemoryEpisode:
        """The episode ``member`` (of :meth:`plan`), reading only its window: the same episode
        :meth:`episodes` makes of it."""
        window = (member.log_lo, member.log_hi)
        series, ignored, _ = _read(self.path, self._reader, self.topics, window=window)
        meta = _meta(self.info, self.topics)
        return _episode(self.path, member.episode_id, meta, series, member.lo, member.hi, self.topics, ignored)


def _meta(info: dict, topics: TopicMap) -> dict:
    return {**topics.meta, **{k: str(v) for k, v in (info.get("custom_data") or {}).items() if k in _META}}


def _episode_id(path: Path, info: dict) -> str:
    custom = info.get("custom_data") or {}
    eid = str(custom.get("episode_id") or path.name)
    return _UNSAFE.sub("_", eid)[:128]


def preload() -> None:
    """Import rosbags and build its ROS 2 type store in this process: what a worker forked from it would
    otherwise do for each bag it opens (~60 ms of CPU a worker)."""
    from rosbags.highlevel import AnyReader  # noqa: F401 (imported to be inherited by forks)
    from rosbags.typesys import Stores, get_typestore

    get_typestore(Stores.ROS2_HUMBLE)


def _open_reader(path: Path):
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    try:
        reader = AnyReader([path], default_typestore=get_typestore(Stores.ROS2_HUMBLE))
        reader.open()
    except Exception as e:  # rosbags raises its own errors, and OSError, for a damaged or cut bag
        raise RawFormatError(str(path), f"not a readable ROS 2 bag: {type(e).__name__}: {e}") from None
    return reader


def _read(
    path: Path, reader, topics: TopicMap, *, window: tuple[int, int] | None = None, frames: bool = True
) -> tuple[dict[str, _Series], list[str], list[int]]:
    """The mapped topics' messages (``window``: only those logged in ``[start, stop)``; ``frames=False``:
    the cameras' and depth topics' times only), the bag's topics the map ignores, the split markers' times."""
    by_topic = {c.topic: c for c in reader.connections}
    ignored = sorted(t for t in by_topic if t not in topics.topics and t != topics.split.topic)
    if ignored and topics.unmapped == "refuse":
        raise RawFormatError(
            str(path), f"topic(s) the topic map does not name: {', '.join(ignored)}", stream=ignored[0]
        )
    missing = [t for t, r in topics.topics.items() if t not in by_topic and (r.camera or r.stream in REQUIRED_STREAMS)]
    if missing:
        raise MissingStreamError(str(path), f"mapped topic {missing[0]} is not in the bag", stream=missing[0])
    series: dict[str, _Series] = {}
    for topic, role in topics.topics.items():
        conn = by_topic.get(topic)
        if conn is None:
            continue
        _check_type(path, role, conn.msgtype)
        series[topic] = _Series(role, conn.msgtype)
    wanted = [by_topic[t] for t in series]
    marker = by_topic.get(topics.split.topic) if topics.split.rule == "marker" else None
    if topics.split.rule == "marker" and marker is None:
        raise MissingStreamError(str(path), f"split marker topic {topics.split.topic} is not in the bag")
    markers: list[int] = []
    counts: dict[str, int] = {}
    # a plan keeps times only: a numeric topic's too, and a header stamp read from the CDR bytes where the
    # message starts with it (an H.264 topic is still decoded: its plan needs each unit's keyframe flag)
    numeric: dict[str, tuple[list[int], list[bytes]]] = {
        t: ([], []) for t, s in series.items() if s.role.stream and frames
    }
    stamped = {c.topic: _stamp_source(reader.typestore, c.msgtype) for c in wanted + ([marker] if marker else [])}
    try:
        start, stop = window or (None, None)
        chosen = wanted + ([marker] if marker else [])
        for conn, log_ns, raw in reader.messages(connections=chosen, start=start, stop=stop):
            if conn.topic in numeric:  # decoded as columns once all are read
                numeric[conn.topic][0].append(int(log_ns))
                numeric[conn.topic][1].append(raw)
                continue
            i = counts[conn.topic] = counts.get(conn.topic, -1) + 1
            s = series.get(conn.topic)
            if not frames and conn.msgtype != COMPRESSED_VIDEO:
                # its time is its log time, or the stamp its bytes begin with: not decoded here (its
                # episode's read decodes it, and a message that does not decode costs that episode only)
                how = "log" if topics.timestamps == "log" else stamped[conn.topic]
                stamp = log_ns if how == "log" else _leading_stamp(raw) if how == "lead" else None
                if stamp is not None:
                    if s is None:
                        markers.append(stamp)
                    else:
                        _add_time(s, b"", stamp, log_ns)
                    continue
            msg = _deserialize(path, reader, raw, conn.msgtype, conn.topic, i, log_ns)
            stamp = _stamp(msg, log_ns) if topics.timestamps == "header" else log_ns
            if marker is not None and conn.topic == marker.topic:
                markers.append(stamp)
                continue
            if not frames:
                _add_time(series[conn.topic], getattr(msg, "data", b""), stamp, log_ns)
                continue
            _add(path, series[conn.topic], msg, stamp, i, log_ns)
    except EpisodeError:
        raise
    except Exception as e:  # a chunk or page the storage cannot read (a cut MCAP, a damaged database)
        raise RawFormatError(str(path), f"bag storage unreadable: {type(e).__name__}: {e}") from None
    for topic, (logs, raws) in numeric.items():
        if not _add_columns(path, reader, series[topic], logs, raws, topics.timestamps):
            for i, (log_ns, raw) in enumerate(zip(logs, raws, strict=True)):
                msg = _deserialize(path, reader, raw, series[topic].msgtype, topic, i, log_ns)
                stamp = _stamp(msg, log_ns) if topics.timestamps == "header" else log_ns
                _add(path, series[topic], msg, stamp, i, log_ns)
    return series, ignored, markers


def _deserialize(path: Path, reader, raw: bytes, msgtype: str, topic: str, i: int, log_ns: int):
    """``raw`` decoded; a failure names the message by its index on its topic (in a window: counted from
    the window's start) and by its log time, which finds it in the bag whatever was read."""
    try:
        return reader.deserialize(raw, msgtype)
    except Exception as e:
        raise RawFormatError(
            str(path),
            f"message {i} ({msgtype}) does not decode (logged at {int(log_ns)} ns): {type(e).__name__}: {e}",
            stream=topic,
        ) from None


def _add_columns(path: Path, reader, s: _Series, logs: list[int], raws: list[bytes], timestamps: str) -> bool:
    """A numeric topic's messages added all at once (``cdr_columns``) when they share one layout; False when
    they do not (or a field is not numeric), and nothing was added: the caller adds them one by one.

    The first, middle and last message are also decoded by rosbags, and must agree with the columns."""
    if not raws:
        return True
    cols = decode_columns(reader.typestore.fielddefs, s.msgtype, raws)
    if cols is None:
        return False
    role = s.role
    if role.fields:
        parts = [cols.get(f) for f in role.fields]
        if any(p is None or p.dtype.kind not in "iufb" for p in parts):
            return False
        fields = {next(iter(SAMPLE_STREAMS[role.stream or ""][1])): np.hstack([_matrix(p) for p in parts])}  # type: ignore[arg-type]
    elif s.msgtype == JOINT_STATE:
        fields = {k: cols[k] for k in ("position", "velocity", "effort") if cols[k].shape[1]}
    elif "data" in cols and cols["data"].dtype.kind in "iufb":
        fields = {next(iter(SAMPLE_STREAMS[role.stream or ""][1])): _matrix(cols["data"])}
    else:
        return False
    stamp = next((f"{h}.{{}}" for h in ("header.stamp", "timestamp") if f"{h}.sec" in cols), None)
    if timestamps == "header" and stamp is not None:
        times = cols[stamp.format("sec")].astype(np.int64) * 1_000_000_000 + cols[stamp.format("nanosec")]
    else:
        times = np.asarray(logs, np.int64)
    fields = {k: np.asarray(v, np.float64) for k, v in fields.items()}
    for i in sorted({0, len(raws) // 2, len(raws) - 1}):  # rosbags' own decode, on a few: the columns agree
        one = _Series(role, s.msgtype)
        msg = _deserialize(path, reader, raws[i], s.msgtype, role.topic, i, logs[i])
        _add(path, one, msg, _stamp(msg, logs[i]) if timestamps == "header" else logs[i], i, logs[i])
        if one.times[0] != times[i] or set(one.rows) != set(fields):
            return False
        if any(not np.array_equal(one.rows[k][0], fields[k][i]) for k in fields):
            return False
        if i == 0:
            s.labels = one.labels
    s.times, s.logs = times.tolist(), list(logs)
    s.rows = dict(fields)
    return True


def _matrix(a: np.ndarray) -> np.ndarray:
    return a.reshape(len(a), -1)


def _check_type(path: Path, role: TopicRole, msgtype: str) -> None:
    if role.camera and msgtype not in CAMERA_TYPES:
        raise RawFormatError(
            str(path),
            f"mapped as camera {role.camera!r} but its type is {msgtype} (expected {', '.join(CAMERA_TYPES)})",
            stream=role.topic,
        )
    if role.depth and msgtype != IMAGE:
        raise RawFormatError(
            str(path),
            f"mapped as depth {role.depth!r} but its type is {msgtype} (expected {IMAGE})",
            stream=role.topic,
        )


_TIME = "builtin_interfaces/msg/Time"


def _stamp_source(typestore, msgtype: str) -> str:
    """Where a plan finds a ``msgtype`` message's stamp (what :func:`_stamp` takes) without decoding it:
    ``"log"``, a type with neither a ``header`` nor a ``timestamp`` field (its log time); ``"lead"``, a
    type whose first field is the stamp (a ``std_msgs/msg/Header header`` that starts with it, or a
    ``builtin_interfaces/msg/Time timestamp``), so its CDR bytes start with it after the 4-byte
    encapsulation header; ``"decode"``, any other."""
    defs = typestore.fielddefs
    fields = defs[msgtype][1] if msgtype in defs else []
    names = [f for f, _ in fields]
    if fields and "header" not in names and "timestamp" not in names:
        return "log"
    if not fields or _TIME not in defs or [f for f, _ in defs[_TIME][1]] != ["sec", "nanosec"]:
        return "decode"
    name, (_, kind) = fields[0]
    if name == "timestamp":
        return "lead" if kind == _TIME else "decode"
    if name != "header" or kind != "std_msgs/msg/Header" or kind not in defs:
        return "decode"
    first, (_, first_kind) = defs[kind][1][0]
    return "lead" if first == "stamp" and first_kind == _TIME else "decode"


def _leading_stamp(raw) -> int | None:
    """The stamp a message's CDR bytes begin with (int32 sec, uint32 nanosec after the encapsulation
    header, in its byte order); None when they are too short or not plain CDR: the caller decodes it."""
    if len(raw) < 12 or raw[0] != 0 or raw[1] > 1:
        return None
    sec, nanosec = struct.unpack_from("<iI" if raw[1] else ">iI", raw, 4)
    return sec * 1_000_000_000 + nanosec


def _stamp(msg, log_ns: int) -> int:
    header = getattr(msg, "header", None)
    stamp = header.stamp if header is not None else getattr(msg, "timestamp", None)  # CompressedVideo: no header
    if stamp is None or not hasattr(stamp, "nanosec"):
        return int(log_ns)
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _add_time(s: _Series, data, stamp: int, log_ns: int) -> None:
    """A camera's or depth topic's message, for a plan: its times (and whether an H.264 unit is a keyframe)."""
    s.times.append(stamp)
    s.logs.append(int(log_ns))
    if s.msgtype == COMPRESSED_VIDEO:
        s.keyframes.append(is_keyframe(bytes(data)))


def _add(path: Path, s: _Series, msg, stamp: int, i: int, log_ns: int) -> None:
    role = s.role
    s.times.append(stamp)
    s.logs.append(int(log_ns))
    if role.camera:
        s.frames.append(_frame(path, s, msg, i))
        return
    if role.depth:
        s.depth.append(_depth_frame(path, s, msg, i))
        return
    if role.fields:
        values = [_field(path, role, msg, f, i) for f in role.fields]
        fields = {next(iter(SAMPLE_STREAMS[role.stream or ""][1])): np.concatenate(values)}
    elif s.msgtype == JOINT_STATE:
        fields = {k: np.asarray(getattr(msg, k), np.float64) for k in ("position", "velocity", "effort")}
        fields = {k: v for k, v in fields.items() if len(v)}
        if not s.labels and len(msg.name):
            s.labels = {k: [str(n) for n in msg.name] for k in fields}
    elif hasattr(msg, "data"):
        fields = {next(iter(SAMPLE_STREAMS[role.stream or ""][1])): np.asarray(msg.data, np.float64).ravel()}
    else:
        raise RawFormatError(
            str(path), f"{s.msgtype} has no data array: name its numeric fields in the topic map", stream=role.topic
        )
    for k, v in fields.items():
        rows = s.rows.setdefault(k, [])
        assert isinstance(rows, list)  # an array only once all messages are in (_add_columns)
        if rows and len(v) != len(rows[0]):
            raise RawFormatError(
                str(path), f"message {i}: {k} has {len(v)} values, earlier messages {len(rows[0])}", stream=role.topic
            )
        rows.append(v)


def _field(path: Path, role: TopicRole, msg, name: str, i: int) -> np.ndarray:
    value = msg
    for part in name.split("."):
        if not hasattr(value, part):
            raise RawFormatError(str(path), f"message {i} has no field {name!r}", stream=role.topic)
        value = getattr(value, part)
    try:
        return np.asarray(value, np.float64).ravel()
    except (TypeError, ValueError):
        raise RawFormatError(str(path), f"field {name!r} is not numeric", stream=role.topic) from None


def _frame(path: Path, s: _Series, msg, i: int) -> bytes | np.ndarray:
    if s.msgtype == COMPRESSED_VIDEO:
        if str(msg.format).lower() != "h264":
            raise RawFormatError(
                str(path), f"frame {i}: video format {msg.format!r} (only h264 is read)", stream=s.role.topic
            )
        return bytes(msg.data)
    if s.msgtype == COMPRESSED_IMAGE:
        data = bytes(msg.data)  # a copy: rosbags hands out a view of the message buffer
        if not (data[:2] == b"\xff\xd8" or data[:8] == PNG_MAGIC):
            raise RawFormatError(
                str(path), f"frame {i} is neither JPEG nor PNG (format {msg.format!r})", stream=s.role.topic
            )
        return data
    enc = str(msg.encoding)
    if enc not in RAW_ENCODINGS:
        raise RawFormatError(
            str(path),
            f"frame {i}: image encoding {enc!r} is not one of {', '.join(RAW_ENCODINGS)}",
            stream=s.role.topic,
        )
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    ch = 1 if enc == "mono8" else 3
    buf = np.asarray(msg.data, np.uint8)
    if step < w * ch or len(buf) < h * step:
        raise RawFormatError(str(path), f"frame {i}: {len(buf)} bytes for {w}x{h} {enc}", stream=s.role.topic)
    img = buf[: h * step].reshape(h, step)[:, : w * ch].reshape(h, w, ch)
    if enc == "bgr8":
        img = img[:, :, ::-1]
    elif enc == "mono8":
        img = np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img)


def _preroll(units: list[bytes], first: int) -> list[bytes]:
    """The access units from the keyframe before ``first`` up to it: what decoding an episode cut inside a
    GOP needs first (nothing when ``first`` is a keyframe, or when no keyframe precedes it)."""
    if is_keyframe(units[first]):
        return []
    for k in range(first - 1, -1, -1):
        if is_keyframe(units[k]):
            return units[k:first]
    return []


def _depth_frame(path: Path, s: _Series, msg, i: int) -> np.ndarray:
    enc = str(msg.encoding)
    if enc not in DEPTH_ENCODINGS:
        raise RawFormatError(
            str(path),
            f"frame {i}: depth image encoding {enc!r} is not one of {', '.join(DEPTH_ENCODINGS)}",
            stream=s.role.topic,
        )
    in_metres = enc == "32FC1"
    size = 4 if in_metres else 2
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    buf = np.asarray(msg.data, np.uint8)
    if step < w * size or len(buf) < h * step:
        raise RawFormatError(
            str(path), f"frame {i}: {len(buf)} bytes for {w}x{h} {enc} (step {step})", stream=s.role.topic
        )
    rows = np.ascontiguousarray(buf[: h * step].reshape(h, step)[:, : w * size])
    values = rows.view((">" if msg.is_bigendian else "<") + ("f4" if in_metres else "u2"))
    return _millimetres(values) if in_metres else values.astype(np.uint16)


def _millimetres(metres: np.ndarray) -> np.ndarray:
    """Float metres as uint16 millimetres; 0 (no reading) where NaN, infinite or out of range."""
    with np.errstate(invalid="ignore"):
        mm = np.rint(metres.astype(np.float64) * 1000.0)
        valid = np.isfinite(mm) & (mm >= 0) & (mm <= np.iinfo(np.uint16).max)
    return np.where(valid, mm, 0).astype(np.uint16)


def _cuts(series: dict[str, _Series], topics: TopicMap, markers: list[int]) -> list[tuple[int, int]]:
    """[lo, hi) time ranges of the episodes."""
    times = np.sort(np.concatenate([np.asarray(s.times, np.int64) for s in series.values()] or [np.zeros(0, np.int64)]))
    if not len(times):
        return [(0, 1)]
    end = int(times[-1]) + 1
    if topics.split.rule == "gap":
        gaps = np.flatnonzero(np.diff(times) > int(topics.split.gap_s * 1e9)) + 1
        starts = [int(times[0]), *(int(times[g]) for g in gaps)]
    elif topics.split.rule == "marker":
        starts = sorted(set(markers)) or [int(times[0])]
        starts = [min(int(times[0]), starts[0]), *starts[1:]] if starts[0] > times[0] else starts
    else:
        starts = [int(times[0])]
    return [(a, b) for a, b in zip(starts, [*starts[1:], end], strict=True) if b > a]


def _episode(
    path: Path, eid: str, meta: dict, series: dict[str, _Series], lo: int, hi: int, topics: TopicMap, ignored: list[str]
) -> MemoryEpisode:
    streams: dict[str, SampleStream] = {}
    cameras: dict[str, MemoryCamera] = {}
    depth: dict[str, DepthStream] = {}
    for topic, s in series.items():
        t = np.asarray(s.times, np.int64)
        keep = np.flatnonzero((t >= lo) & (t < hi))
        name = s.role.camera or s.role.depth or s.role.stream or ""
        _check_monotonic(str(path), topic, t[keep])
        if s.role.camera and s.msgtype == COMPRESSED_VIDEO:
            units = [s.frames[i] for i in keep.tolist()]
            preroll = _preroll(s.frames, int(keep[0])) if len(keep) else []  # type: ignore[arg-type]
            cameras[name] = H264Camera(name, t[keep], units, str(path), topic, preroll)  # type: ignore[arg-type]
        elif s.role.camera:
            frames = [s.frames[i] for i in keep.tolist()]
            encoding = "jpeg" if all(isinstance(f, bytes) and f[:2] == b"\xff\xd8" for f in frames) else "rgb"
            cameras[name] = MemoryCamera(name, t[keep], encoding, frames, str(path), topic)
        elif s.role.depth:
            depth[name] = DepthStream(name, t[keep], [s.depth[i] for i in keep.tolist()], topic)
        else:
            arrays: dict = {
                k: np.asarray(v if isinstance(v, np.ndarray) else np.stack(v))[keep]
                for k, v in s.rows.items()
                if len(v)
            }
            streams[name] = SampleStream(name, t[keep], arrays, dict(s.labels))
    for name in REQUIRED_STREAMS:
        if name not in streams or not len(streams[name]):
            raise MissingStreamError(str(path), f"no {name} in episode {eid} (map a topic to it)", stream=name)
    if not cameras:
        raise MissingStreamError(str(path), f"no camera in episode {eid} (map a topic to one)", stream="images")
    first = min(int(c.timestamps_ns[0]) for c in cameras.values() if len(c)) if any(map(len, cameras.values())) else lo
    started = meta.get("started_at") or dt.datetime.fromtimestamp(first / 1e9, dt.timezone.utc).isoformat().replace(
        "+00:00", "Z"
    )
    texts = {k: v for k, v in meta.items() if k in _META and k != "started_at"}
    episode_meta = EpisodeMeta(episode_id=eid, started_at=started, **texts)
    report = {
        "topics": sorted(series),
        "ignored_topics": ignored,
        "timestamps": topics.timestamps,
        "split": topics.split.rule,
    }
    return MemoryEpisode(str(path), episode_meta, streams, cameras, "ros2", report, depth)


__all__ = ["Bag", "BagMember", "bag_metadata", "plan_bag", "preload", "read_bag", "read_member"]
