"""Read profiles: how episodes are laid out for training, and what training reads of them.

Which streams a model reads together is a training hyperparameter, so the layout is
configuration. A profile names:

- the topic groups: which topics share chunks, how each group is chunked and compressed. A topic
  belongs to the first group whose pattern (fnmatch) matches it. Chunks of a group cover fixed
  time windows from the episode start, so a time window of a sample maps to a predictable, small
  set of chunks per group;
- the training streams transcode writes beside the archive video (``training_streams.py``);
- what a training run reads: which stream (a training stream's name, or the archive cameras), at
  what output size, and which topic groups (what prewarm warms).

A deployment chooses one profile by name (``read_profiles.py``); transcode, the training-stream
backfill, prewarm and the trainer all take it from there, so there is no second setting that must
agree with it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from .training_streams import TrainingStreamSpec

COMPRESSIONS = ("none", "zstd", "lz4")


@dataclass(frozen=True)
class TopicGroup:
    name: str
    patterns: tuple[str, ...]
    compression: str = "zstd"
    # Chunk window in seconds; None means "one GOP" (video groups).
    window_s: float | None = None
    # Whether a training sample reads this group when the profile names no read_groups: a group no
    # model reads yet (depth) is not warmed, and leaves the cache sets' versions as they were.
    read_by_default: bool = True

    def __post_init__(self):
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"group {self.name}: compression must be one of {COMPRESSIONS}")
        if self.window_s is not None and self.window_s <= 0:
            raise ValueError(f"group {self.name}: window_s must be positive")

    def matches(self, topic: str) -> bool:
        return any(fnmatch.fnmatchcase(topic, p) for p in self.patterns)


@dataclass(frozen=True)
class ReadProfile:
    name: str
    groups: tuple[TopicGroup, ...]
    # Written by transcode (and added to older episodes by the ``training_streams`` backfill).
    training_streams: tuple[TrainingStreamSpec, ...] = ()
    # The video training reads: a training stream's name, or None for the archive cameras.
    read_stream: str | None = None
    # (height, width) of the frames handed to the model; None: the trainer's default.
    output_size: tuple[int, int] | None = None
    # The topic groups a training sample reads (what prewarm warms); None: every group read by default.
    read_groups: tuple[str, ...] | None = None

    def __post_init__(self):
        names = [s.name for s in self.training_streams]
        if len(set(names)) != len(names):
            raise ValueError(f"read profile {self.name!r}: training stream names repeat: {names}")
        if self.read_stream is not None and self.read_stream not in names:
            raise ValueError(
                f"read profile {self.name!r}: read_stream {self.read_stream!r} is not one of its training "
                f"streams {names}"
            )
        if self.output_size is not None:
            h, w = self.output_size
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)):
                raise ValueError(f"read profile {self.name!r}: output_size must be two positive integers")
            object.__setattr__(self, "output_size", (h, w))
        unknown = set(self.read_groups or ()) - {g.name for g in self.groups}
        if unknown:
            raise ValueError(
                f"read profile {self.name!r}: read_groups names unknown groups {sorted(unknown)} "
                f"(it has {[g.name for g in self.groups]})"
            )

    def group_of(self, topic: str) -> TopicGroup:
        for g in self.groups:
            if g.matches(topic):
                return g
        raise KeyError(f"read profile {self.name!r}: no group for topic {topic}")

    @property
    def reads(self) -> tuple[str, ...]:
        """The topic groups a training sample reads."""
        if self.read_groups is not None:
            return self.read_groups
        return tuple(g.name for g in self.groups if g.read_by_default)

    def stream(self, name: str) -> TrainingStreamSpec:
        return next(s for s in self.training_streams if s.name == name)

    def stream_token(self) -> str | None:
        """What an episode must carry (registry and manifest column ``training_streams``) for a run
        of this profile to read it: the read stream's token, or None when training reads the archive."""
        return None if self.read_stream is None else stream_token(self.stream(self.read_stream))

    def as_dict(self) -> dict:
        d: dict = {
            "name": self.name,
            "groups": [_group_dict(g) for g in self.groups],
        }
        # only when set, so a layout-only profile reads as it always has (episode metadata, digests)
        if self.training_streams:
            d["training_streams"] = [s.as_dict() for s in self.training_streams]
        if self.read_stream is not None:
            d["read_stream"] = self.read_stream
        if self.output_size is not None:
            d["output_size"] = list(self.output_size)
        if self.read_groups is not None:
            d["read_groups"] = list(self.read_groups)
        return d

    @property
    def digest(self) -> str:
        """A short hash of everything the profile declares: what a run's lineage records."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: dict) -> ReadProfile:
        size = d.get("output_size")
        return cls(
            name=d["name"],
            groups=tuple(
                TopicGroup(
                    g["name"],
                    tuple(g["patterns"]),
                    g.get("compression", "zstd"),
                    g.get("window_s"),
                    g.get("read_by_default", True),
                )
                for g in d["groups"]
            ),
            training_streams=tuple(TrainingStreamSpec.from_dict(s) for s in d.get("training_streams", ())),
            read_stream=d.get("read_stream"),
            output_size=None if size is None else (size[0], size[1]),
            read_groups=None if d.get("read_groups") is None else tuple(d["read_groups"]),
        )


def _group_dict(g: TopicGroup) -> dict:
    d = {"name": g.name, "patterns": list(g.patterns), "compression": g.compression, "window_s": g.window_s}
    if not g.read_by_default:  # only when set, so the groups that predate it read as they always have
        d["read_by_default"] = False
    return d


def stream_token(spec: TrainingStreamSpec) -> str:
    """``name@digest``: a training stream with exactly this spec (another GOP or size is another token)."""
    digest = hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode()).hexdigest()[:8]
    return f"{spec.name}@{digest}"


def streams_column(specs: Iterable[TrainingStreamSpec]) -> str | None:
    """The registry's ``training_streams`` value for an episode carrying ``specs``: sorted tokens, comma
    separated; None when it carries none."""
    tokens = sorted(stream_token(s) for s in specs)
    return ",".join(tokens) if tokens else None


def carries(column: str | None, token: str) -> bool:
    """Whether a ``training_streams`` value holds ``token``."""
    return column is not None and token in column.split(",")


# Cameras in their own chunks (one GOP window each, uncompressed: zstd gains ~2% on
# H.264), depth in its own zstd chunks of DEPTH_WINDOW_S, everything else in zstd chunks of
# PROPRIO_WINDOW_S (the catch-all, so last). Depth is not chunked by the GOP: each of its frames stands
# alone (no keyframe to keep with it), and a 640x480 16-bit frame is 600 kB raw, so a GOP window (150
# frames at 30 Hz) would be a ~90 MB chunk fetched and inflated whole to read one frame; one second is
# ~18 MB raw, a few MB compressed.
PROPRIO_WINDOW_S = 20.0
DEPTH_WINDOW_S = 1.0
TOPIC_GROUPS = ReadProfile(
    name="topic-groups",
    groups=(
        TopicGroup("cameras", ("/camera/*",), compression="none", window_s=None),
        TopicGroup("depth", ("/depth/*",), compression="zstd", window_s=DEPTH_WINDOW_S, read_by_default=False),
        TopicGroup("proprio", ("*",), compression="zstd", window_s=PROPRIO_WINDOW_S),
    ),
)


def per_topic_profile(topics: Iterable[str], base: ReadProfile = TOPIC_GROUPS) -> ReadProfile:
    """One chunk stream per topic, each chunked and compressed like its group in ``base``.

    This is the baseline that topic groups are measured against: same windows, same
    codecs, only the grouping differs.
    """
    groups = []
    for topic in topics:
        g = base.group_of(topic)
        groups.append(TopicGroup(f"topic:{topic}", (topic,), g.compression, g.window_s))
    return ReadProfile(name="per-topic", groups=tuple(groups))
