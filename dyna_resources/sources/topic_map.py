"""Which topic of a ROS 2 bag is which part of an episode: the topic map (configuration).

``<home>/ros2_topics.yaml`` (else the embedded default below)::

    timestamps: header        # header (the message's header stamp; log time when it has none) | log
    unmapped: ignore          # a bag topic the map does not name: ignore (listed in the report) | refuse
    split: {rule: bag}        # bag (one episode a bag) | gap (gap_s: 2.0) | marker (topic: /episode/start)
    meta: {robot_model: my-arm}   # episode metadata for every bag (a bag's own metadata.yaml custom_data wins)
    topics:
      /camera/wrist/image/compressed: {camera: wrist}        # CompressedImage (jpeg, png) or Image
      /camera/wrist/depth/image_raw: {depth: wrist_depth}     # Image 16UC1 / mono16 (mm) or 32FC1 (m)
      /joint_states: {stream: joint_states}                   # JointState: position, velocity, effort
      /arm/command: {stream: action}                          # Float64MultiArray: its data
      /gripper/cmd: {stream: gripper, fields: [position]}     # any message: numeric fields, in order

A stream is one of the episode model's (``raw_format.SAMPLE_STREAMS``: ``joint_states`` and ``action``
are required). ``fields`` name the message's numeric fields (dotted paths for nested ones, e.g.
``pose.position.x``) whose values are concatenated, in order, into the stream's one field; without
``fields``, a ``JointState`` gives position / velocity / effort (labelled by its joint names) and any other
message its ``data`` array.

A depth topic (``depth: NAME``) is optional: an episode is complete without it. Its name follows a
camera's rules and must not be a camera's name (the transcoder writes it to its own topic).

Plain Python, no Dagster import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from ..episodes.raw_format import SAMPLE_STREAMS, EpisodeMeta

Timestamps = Literal["header", "log"]
SplitRule = Literal["bag", "gap", "marker"]
_TOPIC = re.compile(r"^/[A-Za-z0-9_~{}/]*[A-Za-z0-9_]$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
META_KEYS = tuple(k for k in EpisodeMeta.__dataclass_fields__ if k not in ("episode_id", "success", "sim"))
FILE_NAME = "ros2_topics.yaml"
_ROLES = ("camera", "depth", "stream")


class TopicMapError(ValueError):
    """A topic map that does not parse, naming the file and the field."""


@dataclass(frozen=True)
class TopicRole:
    topic: str
    camera: str | None = None  # the camera's name, or
    stream: str | None = None  # the episode stream it feeds, or
    fields: tuple[str, ...] = ()  # the message's numeric fields, concatenated (empty: the message type's default)
    depth: str | None = None  # the depth stream's name (last: the positions before it stay as they were)


@dataclass(frozen=True)
class Split:
    rule: SplitRule = "bag"
    gap_s: float = 2.0  # rule "gap": a pause longer than this between two messages of a mapped topic
    topic: str = ""  # rule "marker": each message on this topic starts an episode


@dataclass(frozen=True)
class TopicMap:
    topics: dict[str, TopicRole] = field(default_factory=dict)
    timestamps: Timestamps = "header"
    unmapped: Literal["ignore", "refuse"] = "ignore"
    split: Split = field(default_factory=Split)
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def cameras(self) -> dict[str, TopicRole]:
        return {t: r for t, r in self.topics.items() if r.camera}

    @property
    def depth(self) -> dict[str, TopicRole]:
        return {t: r for t, r in self.topics.items() if r.depth}

    @property
    def streams(self) -> dict[str, TopicRole]:
        return {t: r for t, r in self.topics.items() if r.stream}


# The conventional topics of a single-arm robot with three cameras (what `make demo`'s bag records).
DEFAULT = TopicMap(
    topics={
        "/camera/scene_left/image/compressed": TopicRole("/camera/scene_left/image/compressed", camera="scene_left"),
        "/camera/scene_right/image/compressed": TopicRole("/camera/scene_right/image/compressed", camera="scene_right"),
        "/camera/wrist/image/compressed": TopicRole("/camera/wrist/image/compressed", camera="wrist"),
        "/joint_states": TopicRole("/joint_states", stream="joint_states"),
        "/action": TopicRole("/action", stream="action"),
    }
)


def parse(doc: object, where: str) -> TopicMap:
    """A topic map from its YAML document; ``where`` names the file in errors."""

    def fail(key: str, why: str) -> TopicMapError:
        return TopicMapError(f"{where}: {key}: {why}")

    if not isinstance(doc, dict):
        raise TopicMapError(f"{where}: expected a mapping (timestamps, unmapped, split, meta, topics)")
    unknown = set(doc) - {"timestamps", "unmapped", "split", "meta", "topics"}
    if unknown:
        raise fail(sorted(unknown)[0], "unknown key (expected timestamps, unmapped, split, meta, topics)")
    timestamps = doc.get("timestamps", "header")
    if timestamps not in ("header", "log"):
        raise fail("timestamps", f"{timestamps!r}: expected header or log")
    unmapped = doc.get("unmapped", "ignore")
    if unmapped not in ("ignore", "refuse"):
        raise fail("unmapped", f"{unmapped!r}: expected ignore or refuse")
    split_doc = doc.get("split") or {"rule": "bag"}
    if not isinstance(split_doc, dict) or split_doc.get("rule", "bag") not in ("bag", "gap", "marker"):
        raise fail(
            "split", f"{split_doc!r}: expected {{rule: bag}}, {{rule: gap, gap_s: S}} or {{rule: marker, topic: T}}"
        )
    rule = split_doc.get("rule", "bag")
    try:
        gap_s = float(split_doc.get("gap_s", 2.0))
    except (TypeError, ValueError):
        raise fail("split.gap_s", f"{split_doc.get('gap_s')!r} is not a number") from None
    if not gap_s > 0:
        raise fail("split.gap_s", "must be > 0")
    marker = str(split_doc.get("topic", ""))
    if rule == "marker" and not _TOPIC.match(marker):
        raise fail("split.topic", f"{marker!r} is not a ROS 2 topic name")
    meta = doc.get("meta") or {}
    if not isinstance(meta, dict) or any(k not in META_KEYS for k in meta):
        raise fail("meta", f"expected a mapping of {', '.join(META_KEYS)}")
    topics_doc = doc.get("topics")
    if not isinstance(topics_doc, dict) or not topics_doc:
        raise fail(
            "topics",
            "expected a mapping of topic names to {camera: NAME}, {depth: NAME} or {stream: NAME, fields: [...]}",
        )
    topics: dict[str, TopicRole] = {}
    for topic, role in topics_doc.items():
        topic = str(topic)
        if not _TOPIC.match(topic):
            raise fail(f"topics.{topic}", "not a ROS 2 topic name")
        if not isinstance(role, dict) or len(set(_ROLES) & set(role)) != 1:
            raise fail(f"topics.{topic}", "expected exactly one of camera, depth or stream")
        if set(role) - {*_ROLES, "fields"}:
            raise fail(f"topics.{topic}", f"unknown key {sorted(set(role) - {*_ROLES, 'fields'})[0]!r}")
        fields = role.get("fields") or []
        if not isinstance(fields, list) or not all(isinstance(f, str) and _FIELD.match(f) for f in fields):
            raise fail(f"topics.{topic}.fields", f"{fields!r}: expected a list of message field names")
        if "camera" in role:
            name = str(role["camera"])
            if not _NAME.match(name) or fields:
                raise fail(f"topics.{topic}.camera", f"{name!r}: a camera name ([A-Za-z0-9_.-]), no fields")
            topics[topic] = TopicRole(topic, camera=name)
        elif "depth" in role:
            name = str(role["depth"])
            if not _NAME.match(name) or fields:
                raise fail(f"topics.{topic}.depth", f"{name!r}: a depth stream name ([A-Za-z0-9_.-]), no fields")
            topics[topic] = TopicRole(topic, depth=name)
        else:
            name = str(role["stream"])
            if name not in SAMPLE_STREAMS:
                raise fail(f"topics.{topic}.stream", f"{name!r}: expected one of {', '.join(SAMPLE_STREAMS)}")
            topics[topic] = TopicRole(topic, stream=name, fields=tuple(fields))
    for kind in _ROLES:
        names = [getattr(r, kind) for r in topics.values() if getattr(r, kind)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise fail("topics", f"{kind} {twice[0]!r} is fed by more than one topic")
    both = sorted({r.depth for r in topics.values() if r.depth} & {r.camera for r in topics.values() if r.camera})
    if both:
        raise fail("topics", f"{both[0]!r} names both a camera and a depth stream")
    return TopicMap(
        topics=topics,
        timestamps=timestamps,
        unmapped=unmapped,
        split=Split(rule, gap_s, marker),
        meta={str(k): str(v) for k, v in meta.items()},
    )


def load(home: Path | None) -> TopicMap:
    """``<home>/ros2_topics.yaml`` when it exists, else :data:`DEFAULT`."""
    path = None if home is None else Path(home) / FILE_NAME
    if path is None or not path.is_file():
        return DEFAULT
    return load_file(path)


def load_file(path: Path) -> TopicMap:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TopicMapError(f"{path}: not YAML: {e}") from None
    return parse(doc, str(path))


__all__ = ["DEFAULT", "FILE_NAME", "Split", "TopicMap", "TopicMapError", "TopicRole", "load", "load_file", "parse"]
