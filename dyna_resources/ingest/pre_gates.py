"""Pre-transform gates: inspect one landed item and judge its episodes before any transcoding.

Cheap by design (the transcode is the expensive step): the reader's own validation
(layout, required streams, monotonic timestamps), timestamps for frame drops, a few
frames per camera decoded at 1/8 scale for dead cameras, and the source hash.

An item is read by its format (``sources.detect``, by content): the legacy HDF5 is one episode, a ROS 2
bag or a LeRobot dataset one or several (``sources.open``), each inspected under its own source path
(``items.member_path`` when the item holds several). An item that cannot be read at all, or that is no
format the platform ingests, is one inspection held back naming the item and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simplejpeg

from ..episodes.errors import CorruptFrameError, EpisodeError, MissingStreamError, TimestampError
from ..episodes.layout import episode_layout
from ..episodes.raw_format import RawEpisode, file_sha256
from ..sources.content import content_bytes, content_sha256
from ..sources.detect import detect
from ..sources.memory import MemoryEpisode
from ..sources.open import open_format
from ..sources.ros2 import Bag
from ..sources.topic_map import DEFAULT, TopicMap
from .gates import GateConfig, GateResult
from .items import member_path
from .measures import drop_fraction, flat_frames, non_finite

Episode = RawEpisode | MemoryEpisode
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# Which gate an error raised while opening a file belongs to.
_GATE_OF_ERROR = (
    (MissingStreamError, "required_streams"),
    (TimestampError, "timestamps_monotonic"),
    (EpisodeError, "readable"),
)


@dataclass
class Inspection:
    key: str  # landing key of the file
    bytes: int
    episode: dict | None = None  # registry fields, when the file could be read
    gates: list[GateResult] = field(default_factory=list)
    quarantine: dict | None = None  # {"gate", "reason", "stream", "stage"} when held back

    @property
    def flags(self) -> dict:
        return (
            {
                k: self.episode[k]
                for k in ("timestamps_ok", "camera_dropped", "camera_dead", "frame_drop_fraction", "quality_ok")
            }
            if self.episode
            else {}
        )


def inspect_item(path: Path, key: str, gates: GateConfig, topics: TopicMap = DEFAULT) -> list[Inspection]:
    """The inspections of the item at ``path`` (landed as ``key``): one an episode it holds, or one
    holding the whole item back when it cannot be read."""
    size = content_bytes(path)
    try:
        fmt = detect(path)
        if fmt == "hdf5":
            return [inspect_file(path, key, gates)]
        if fmt == "ros2" and topics.split.rule != "bag":
            return _inspect_split_bag(path, key, size, gates, topics)
        episodes = open_format(path, fmt, topics)
    except EpisodeError as e:
        return [_unreadable(key, size, gates, e)]
    sha = content_sha256(path)
    shares = _shares(size, [sum(len(c) for c in ep.cameras.values()) for ep in episodes])
    out = []
    for ep, share in zip(episodes, shares, strict=True):
        source = key if len(episodes) == 1 else member_path(key, ep.meta.episode_id)
        out.append(_inspect(ep, Inspection(key=source, bytes=share), gates, sha))
    return out


def _inspect_split_bag(path: Path, key: str, size: int, gates: GateConfig, topics: TopicMap) -> list[Inspection]:
    """A bag the map's split rule cuts: planned in one pass that keeps no frame, then each episode read
    (its window of the bag alone) and inspected in turn, so one episode's frames are in memory at a time.
    An episode that does not read is held back alone; the window goes to the registry for the transcode."""
    with Bag(path, topics) as bag:
        members = bag.plan()
        sha = content_sha256(path)
        out = []
        for m, share in zip(members, _shares(size, [m.frames for m in members]), strict=True):
            source = key if len(members) == 1 else member_path(key, m.episode_id)
            try:
                episode = bag.read(m)
            except EpisodeError as e:
                out.append(_unreadable(source, share, gates, e))
                continue
            insp = _inspect(episode, Inspection(key=source, bytes=share), gates, sha)
            if insp.episode is not None:
                insp.episode["source_window"] = m.window()
            out.append(insp)
    return out


def _shares(size: int, frames: list[int]) -> list[int]:
    """The item's bytes shared by its episodes' frames: what a worker's transcode of each weighs."""
    frames = [max(1, n) for n in frames]
    shares = [size * n // sum(frames) for n in frames]
    shares[-1] += size - sum(shares)
    return shares


def _unreadable(key: str, size: int, gates: GateConfig, e: EpisodeError) -> Inspection:
    insp = Inspection(key=key, bytes=size)
    _fail_unreadable(insp, gates, next(g for cls, g in _GATE_OF_ERROR if isinstance(e, cls)), e)
    return insp


def inspect_file(path: Path, key: str, gates: GateConfig) -> Inspection:
    """The inspection of a legacy HDF5 episode."""
    insp = Inspection(key=key, bytes=path.stat().st_size)
    try:
        raw = RawEpisode(path)
    except EpisodeError as e:
        gate = next(g for cls, g in _GATE_OF_ERROR if isinstance(e, cls))
        _fail_unreadable(insp, gates, gate, e)
        return insp
    return _inspect(raw, insp, gates, lambda: file_sha256(path))


def _inspect(raw: Episode, insp: Inspection, gates: GateConfig, sha256) -> Inspection:
    """Run the gates on an open episode (closed when done); ``sha256``: its source's hash, or what makes it."""
    with raw:
        meta = raw.meta
        if not SAFE_ID.match(meta.episode_id):
            reason = f"episode_id {meta.episode_id!r} is not a safe identifier ([A-Za-z0-9._-], at most 128 characters)"
            _fail_unreadable(insp, gates, "readable", None, reason=reason, stream="episode_id")
            return insp
        results: list[GateResult] = []
        if gates["readable"].enabled:
            results.append(GateResult("readable", True, gates["readable"].action))
        if gates["timestamps_monotonic"].enabled:
            results.append(GateResult("timestamps_monotonic", True, gates["timestamps_monotonic"].action))
        if gates["required_streams"].enabled:
            have = set(raw.streams) | {f"images/{c}" for c in raw.cameras}
            missing = sorted(set(gates.param("required_streams", "streams") or []) - have)
            results.append(
                GateResult(
                    "required_streams",
                    not missing,
                    gates["required_streams"].action,
                    f"missing {', '.join(missing)}" if missing else "",
                )
            )
        if gates["max_duration"].enabled:
            max_s = float(gates.param("max_duration", "max_s"))
            ok = raw.duration_s <= max_s
            results.append(
                GateResult(
                    "max_duration",
                    ok,
                    gates["max_duration"].action,
                    "" if ok else f"timestamps span {raw.duration_s:.6g} s > {max_s:g} s; {_largest_step(raw)}",
                )
            )
        if gates["min_frames"].enabled:
            least = int(gates.param("min_frames", "min_frames"))
            counts = {c: len(cam) for c, cam in raw.cameras.items()}
            short = {c: n for c, n in sorted(counts.items()) if n < least}
            results.append(
                GateResult(
                    "min_frames",
                    not short,
                    gates["min_frames"].action,
                    f"frames per camera {short} < {least}" if short else "",
                )
            )
        if gates["finite_values"].enabled:
            bad_values = _non_finite_fields(raw)
            results.append(
                GateResult("finite_values", not bad_values, gates["finite_values"].action, "; ".join(bad_values))
            )
        drops = {c: drop_fraction(cam.timestamps_ns) for c, cam in raw.cameras.items()}
        worst = max(drops.values(), default=0.0)
        max_drop = float(gates.param("frame_drops", "max_drop_fraction"))
        if gates["frame_drops"].enabled:
            bad = {c: round(f, 4) for c, f in drops.items() if f > max_drop}
            results.append(
                GateResult(
                    "frame_drops",
                    not bad,
                    gates["frame_drops"].action,
                    f"dropped fraction {bad} > {max_drop}" if bad else "",
                )
            )
        dead: dict[str, list[int]] = {}
        if gates["dead_camera"].enabled:
            try:
                dead = _dead_cameras(
                    raw, int(gates.param("dead_camera", "samples")), float(gates.param("dead_camera", "flat_std"))
                )
            except CorruptFrameError as e:
                _fail_unreadable(insp, gates, "readable", e)
                return insp
            results.append(
                GateResult(
                    "dead_camera", not dead, gates["dead_camera"].action, f"flat frames at {dead}" if dead else ""
                )
            )
        if gates["min_duration"].enabled:
            min_s = float(gates.param("min_duration", "min_s"))
            results.append(
                GateResult(
                    "min_duration",
                    raw.duration_s >= min_s,
                    gates["min_duration"].action,
                    "" if raw.duration_s >= min_s else f"{raw.duration_s:.3f} s < {min_s} s",
                )
            )
        insp.gates = results
        insp.episode = {
            "episode_id": meta.episode_id,
            "source_bytes": insp.bytes,
            "source_sha256": sha256 if isinstance(sha256, str) else sha256(),
            "source_format": getattr(raw, "source_format", "hdf5"),
            "duration_s": raw.duration_s,
            "robot_id": meta.robot_id,
            "robot_model": meta.robot_model,
            "robot_sw_version": meta.robot_sw_version,
            "task": meta.task,
            "site": meta.site,
            "operator": meta.operator,
            "success": meta.success,
            "sim": meta.sim,
            "started_at": meta.started_at,
            "cameras": sorted(raw.cameras),
            "stream_layout": episode_layout(raw),
            "timestamps_ok": True,
            "camera_dropped": worst > max_drop,
            "frame_drop_fraction": round(worst, 6),
            "camera_dead": bool(dead) if gates["dead_camera"].enabled else None,
            "quality_ok": all(r.passed for r in results),
        }
        failed = [r for r in results if not r.passed and r.action == "quarantine"]
        if failed:
            insp.quarantine = {"gate": failed[0].gate, "reason": failed[0].detail, "stream": None, "stage": "pre"}
    return insp


def _fail_unreadable(
    insp: Inspection,
    gates: GateConfig,
    gate: str,
    err: EpisodeError | None,
    *,
    reason: str | None = None,
    stream: str | None = None,
) -> None:
    """A file the reader refuses cannot go on whatever the gates say: with its gate off it is
    quarantined as a transcode failure (the transcoder uses the same reader), not as a gate."""
    if err is not None:
        reason, stream = err.reason if reason is None else reason, err.stream
    reason = reason or "unreadable"
    if gates[gate].enabled:
        insp.gates = [GateResult(gate, False, "quarantine", reason)]
        insp.quarantine = {"gate": gate, "reason": reason, "stream": stream, "stage": "pre"}
    else:
        insp.quarantine = {"gate": "transcode", "reason": reason, "stream": stream, "stage": "transcode"}


def _largest_step(raw: Episode) -> str:
    """Where the span comes from: the largest step between two timestamps of one stream."""
    series = [(name, s.timestamps_ns) for name, s in raw.streams.items()]
    series += [(f"images/{c}", cam.timestamps_ns) for c, cam in raw.cameras.items()]
    steps = [(int(np.diff(ts).max()), name, int(np.diff(ts).argmax()) + 1) for name, ts in series if len(ts) > 1]
    if not steps:
        return "no stream has two samples"
    step, name, i = max(steps)
    return f"largest step {step / 1e9:.6g} s in {name} at index {i}"


_ROWS = 1 << 16  # rows read per HDF5 call: a long stream is never loaded whole


def _non_finite_fields(raw: Episode) -> list[str]:
    """One line per numeric field holding NaN or infinite values, with counts and the first row."""
    out = []
    for s in raw.streams.values():
        for fname, col in s.fields.items():
            n, k = col.shape
            nan = pos = neg = 0
            first = -1
            for lo in range(0, n, _ROWS):
                a, b, c, at = non_finite(np.asarray(col[lo : lo + _ROWS]))
                nan, pos, neg = nan + a, pos + b, neg + c
                if first < 0 and at >= 0:
                    first = lo + at
            if nan + pos + neg:
                counts = ", ".join(f"{v} {label}" for v, label in ((nan, "NaN"), (pos, "+inf"), (neg, "-inf")) if v)
                total = "all" if nan + pos + neg == n * k else f"of {n * k}"
                out.append(f"{s.name}.{fname}: {counts} ({total} values, first at row {first})")
    return out


def _dead_cameras(raw: Episode, samples: int, flat_std: float) -> dict[str, list[int]]:
    """Cameras with two or more flat frames among ``samples`` evenly spaced ones."""
    out = {}
    for name, cam in raw.cameras.items():
        n = len(cam)
        if n == 0:
            continue
        idx = np.unique(np.linspace(0, n - 1, min(samples, n)).round().astype(int))
        if hasattr(cam, "keyframe_before"):  # H.264: the keyframes at or before, each decoded alone
            idx = np.unique([cam.keyframe_before(int(i)) for i in idx])
        lumas = [_luma_small(cam, int(i)) for i in idx]
        flat = flat_frames(lumas, flat_std)
        if len(flat) >= 2:
            out[name] = [int(idx[i]) for i in flat]
    return out


def _luma_small(cam, i: int) -> np.ndarray:
    if cam.encoding == "h264":
        return cam.luma(i)
    if cam.encoding == "rgb":
        return cam.frame(i)[::8, ::8].mean(axis=2)
    data = cam.frame_bytes(i)
    try:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        return simplejpeg.decode_jpeg(
            data, colorspace="GRAY", min_height=max(1, h // 8), min_width=max(1, w // 8), strict=True
        )
    except ValueError as e:
        raise CorruptFrameError(cam._path, f"images/{cam.name}", i, f"JPEG decode failed: {e}") from None
