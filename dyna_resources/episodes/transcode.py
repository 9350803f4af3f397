"""Legacy HDF5 episode → MCAP: H.264 video, proprio/action blocks, topic-group chunks.

The episode is processed one GOP window at a time (all cameras' frames of the window,
then the proprio blocks that start in it), so memory stays at one window however
long the episode. A source's depth streams (a ROS 2 bag's) are written lossless, each frame a
``foxglove.RawImage`` of little-endian uint16 millimetres on ``/depth/<name>``, in their own
topic group. The output is written under a temporary name and renamed when
complete: a failure never leaves a partial MCAP behind.

A camera that arrives as H.264 (``sources.memory.H264Camera``) whose layout already meets the read profile
(``h264_layout.check_layout``) is copied access unit by access unit, nothing decoded but each GOP's first
two frames: on those the dark and frozen frames are counted, and scaled to the camera's frames (an
estimate, where an encoded camera's counts are exact). Any other layout is decoded and re-encoded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from mcap_protobuf.schema import build_file_descriptor_set

from .. import versions
from ..sources.content import content_bytes, content_sha256
from . import blocks
from .codec import H264Decoder, VideoSettings, encode_gop, is_keyframe
from .errors import CorruptFrameError, RawFormatError
from .h264_layout import Layout, check_layout
from .mcap_writer import GroupedChunkWriter
from .raw_format import CameraStream, RawEpisode, SampleStream
from .read_profile import TOPIC_GROUPS, ReadProfile, streams_column
from .topics import (
    DEPTH_ENCODING,
    DEPTH_SCHEMA,
    EPISODE_METADATA,
    STATS_METADATA,
    VIDEO_SCHEMA,
    camera_topic,
    depth_topic,
    stream_topic,
)
from .training_streams import TrainingStreamSpec, add_training_streams

if TYPE_CHECKING:
    from ..sources.memory import DepthStream, MemoryCamera, MemoryEpisode

    Camera = CameraStream | MemoryCamera  # a legacy HDF5 camera, or a source's read into memory

LIBRARY = f"dyna-pipeline/{versions.PIPELINE_VERSION}"


# Footage that lands already compressed is encoded at a lower CRF: datasets imported from LeRobot
# (site "lerobot") lose 1-4.4 dB PSNR against the imported frames in a second lossy generation at
# the fleet's CRF 21, at most 0.96 dB at CRF 12, for ~4x the bytes (tests/episodes/test_lerobot.py).
CRF_BY_SITE: tuple[tuple[str, float], ...] = (("lerobot", 12.0),)


@dataclass(frozen=True)
class TranscodeSettings:
    video: VideoSettings = field(default_factory=VideoSettings)
    profile: ReadProfile = TOPIC_GROUPS
    block_s: float = 1.0  # proprio/action samples per message: one block per block_s
    dark_level: float = 4.0  # mean 8-bit level below which a frame counts as dark (dead camera)
    # mean absolute 8-bit luma change from the previous frame below which a frame counts as frozen
    # (the same picture again); sensor noise alone moves a live camera's picture by >= 1.5
    frozen_level: float = 0.5
    crf_by_site: tuple[tuple[str, float], ...] = CRF_BY_SITE  # (site, crf): overrides video.crf for that site
    # CPU seconds one episode may take (transcode, post gates and scoring; 0: no limit). The batch
    # engine enforces it on each episode's worker process: a file that would hold a transcode slot
    # for hours is quarantined instead. Not part of the output, so not in as_dict().
    max_cpu_s: float = 0.0
    # seconds an episode's worker may go using no CPU at all before it is killed as stuck (a deadlock in
    # a native library, a read that never returns): a machine fault, tried again (0: never)
    stall_s: float = 300.0
    # copy H.264 cameras whose layout meets the read profile instead of re-encoding them (False: always
    # re-encode, the way a benchmark measures what copying saves); not in as_dict(): the output's layout
    # is the same either way
    copy_h264: bool = True

    @property
    def training_streams(self) -> tuple[TrainingStreamSpec, ...]:
        """Derived small video streams written at ingest (training_streams.py): the read profile's."""
        return self.profile.training_streams

    def for_site(self, site: str) -> TranscodeSettings:
        crf = dict(self.crf_by_site).get(site)
        return self if crf is None else replace(self, video=replace(self.video, crf=crf))

    def as_dict(self) -> dict:
        return {"video": self.video.as_dict(), "read_profile": self.profile.as_dict(), "block_s": self.block_s}


@dataclass
class CameraReport:
    frames: int
    width: int
    height: int
    rate_hz: float
    dropped_frames: int  # frames missing according to gaps in the timestamps
    dark_frames: int
    frozen_frames: int  # not dark, and (almost) identical to the frame before
    keyframes: int
    video_bytes: int
    first_ns: int = -1
    last_ns: int = -1
    # the source's H.264 copied as it was (dark and frozen frames then estimated from each GOP's first two)
    copied: bool = False
    reencode_reason: str = ""  # an H.264 source re-encoded: why its layout could not be copied
    # a copied camera: blake2b-128 of its keyframes in order, each decoded here without error (strictly);
    # the decodable post gate need not decode again a keyframe it reads back as these bytes
    decoded_keyframes: str = ""


@dataclass
class TranscodeReport:
    episode_id: str
    source: str
    output: str
    source_sha256: str
    bytes_in: int
    bytes_out: int
    duration_s: float
    start_ns: int
    end_ns: int
    cameras: dict[str, CameraReport]
    streams: dict[str, int]  # samples per stream
    chunks: dict[str, int]  # chunks per group
    messages: int
    jpeg_decode_s: float
    video_encode_s: float
    total_s: float
    # CPU of this thread in the same calls (decode: HDF5 reads of the JPEG batches included): the
    # codec work, measured where and when the pipeline does it
    jpeg_decode_cpu_s: float
    video_encode_cpu_s: float
    meta: dict
    versions: dict
    # the training streams written (registry column ``training_streams``: read_profile.streams_column)
    training_streams: str | None = None
    depth: dict[str, int] = field(default_factory=dict)  # frames per depth stream

    def as_dict(self) -> dict:
        return asdict(self)


def nominal_rate_hz(ts: np.ndarray) -> float:
    if len(ts) < 2:
        return 0.0
    return 1e9 / float(np.median(np.diff(ts)))


def dropped_frames(ts: np.ndarray) -> int:
    """Frames missing from a regular stream: every gap longer than 1.5 periods."""
    if len(ts) < 3:
        return 0
    d = np.diff(ts)
    period = float(np.median(d))
    gaps = d[d > 1.5 * period]
    return int(np.sum(np.round(gaps / period) - 1))


class _Timer:
    """Wall seconds and this thread's CPU seconds spent inside ``with`` blocks."""

    def __init__(self):
        self.s = self.cpu_s = 0.0

    def __enter__(self):
        self._t, self._c = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc):
        self.s += time.perf_counter() - self._t
        self.cpu_s += time.thread_time() - self._c


def transcode_episode(
    src: str | Path,
    dst: str | Path,
    settings: TranscodeSettings | None = None,
    *,
    source_sha256: str | None = None,
    episode: RawEpisode | MemoryEpisode | None = None,
) -> TranscodeReport:
    """Transcode one episode to ``dst`` atomically; raise a typed EpisodeError on bad input.

    ``src``: a legacy HDF5 episode, or the landed item (a ROS 2 bag directory) ``episode`` was read from
    (``sources.open.open_episodes``; the episode is closed when done). ``source_sha256`` spares hashing
    the source again when the caller already did.
    """
    settings = settings or TranscodeSettings()
    src, dst = Path(src), Path(dst)
    t_start = time.perf_counter()
    with episode if episode is not None else RawEpisode(src) as raw:
        settings = settings.for_site(raw.meta.site)
        source_sha = source_sha256 or content_sha256(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.parent / f".{dst.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                report = _write_episode(raw, f, settings, source_sha)
                f.flush()
                os.fsync(f.fileno())
            if settings.training_streams:
                add_training_streams(tmp, tmp, settings.training_streams)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    report.source, report.output = str(src), str(dst)
    report.bytes_in, report.bytes_out = content_bytes(src), dst.stat().st_size
    report.total_s = time.perf_counter() - t_start
    return report


def _write_episode(raw: RawEpisode | MemoryEpisode, f, settings: TranscodeSettings, source_sha: str) -> TranscodeReport:
    cameras = [raw.cameras[c] for c in sorted(raw.cameras)]
    streams = [raw.streams[s] for s in raw.streams]
    depth: list[DepthStream] = [d for _, d in sorted(getattr(raw, "depth", {}).items())]  # the legacy HDF5 has none
    t0 = raw.start_ns
    rate = max(nominal_rate_hz(c.timestamps_ns) for c in cameras) or 30.0
    gop_ns = int(round(settings.video.gop_frames / rate * 1e9))
    block_ns = int(round(settings.block_s * 1e9))

    w = GroupedChunkWriter(f, t0_ns=t0, library=LIBRARY)
    block_groups = {settings.profile.group_of(stream_topic(s.name)).name for s in streams}
    for g in settings.profile.groups:
        # a block must not straddle two chunks; other groups' messages are one sample each
        if g.name in block_groups and g.window_s is not None and round(g.window_s * 1e9) % block_ns:
            raise ValueError(f"group {g.name}: window_s {g.window_s} is not a multiple of block_s {settings.block_s}")
        w.add_group(g.name, g.compression, gop_ns if g.window_s is None else int(round(g.window_s * 1e9)))
    video_schema = w.register_schema(
        VIDEO_SCHEMA, "protobuf", build_file_descriptor_set(CompressedVideo).SerializeToString()
    )
    block_schema = w.register_schema(blocks.SCHEMA_NAME, "protobuf", blocks.file_descriptor_set_bytes())
    if depth:
        depth_schema = w.register_schema(
            DEPTH_SCHEMA, "protobuf", build_file_descriptor_set(RawImage).SerializeToString()
        )
    channels: dict[str, int] = {}
    for cam in cameras:
        t = camera_topic(cam.name)
        channels[t] = w.register_channel(
            t,
            "protobuf",
            video_schema,
            settings.profile.group_of(t).name,
            {
                "frame_id": cam.name,
                "rate_hz": f"{nominal_rate_hz(cam.timestamps_ns):.3f}",
                "gop_frames": str(settings.video.gop_frames),
                "gop_ns": str(gop_ns),
            },
        )
    for s in streams:
        t = stream_topic(s.name)
        md = {
            "fields": ",".join(s.fields),
            "block_ns": str(block_ns),
            "rate_hz": f"{nominal_rate_hz(s.timestamps_ns):.3f}",
        }
        md.update({f"labels.{k}": ",".join(v) for k, v in s.labels.items()})
        channels[t] = w.register_channel(t, "protobuf", block_schema, settings.profile.group_of(t).name, md)
    for d in depth:
        t = depth_topic(d.name)
        md = {
            "frame_id": d.name,
            "rate_hz": f"{nominal_rate_hz(d.timestamps_ns):.3f}",
            "encoding": DEPTH_ENCODING,
            "unit": "mm",
        }
        channels[t] = w.register_channel(t, "protobuf", depth_schema, settings.profile.group_of(t).name, md)

    meta = raw.meta.as_dict()
    stamp = {
        "schema_version": versions.SCHEMA_VERSION,
        "pipeline_version": versions.PIPELINE_VERSION,
        "robot_sw_version": raw.meta.robot_sw_version,
    }
    w.add_metadata(
        EPISODE_METADATA,
        {
            **{k: "" if v is None else str(v) for k, v in meta.items()},
            **stamp,
            "source_sha256": source_sha,
            "source_name": Path(raw.path).name,
            "source_format": getattr(raw, "source_format", "hdf5"),
            "start_ns": str(t0),
            "end_ns": str(raw.end_ns),
            "transcode_settings": json.dumps(settings.as_dict(), sort_keys=True),
        },
    )

    video = _VideoWindows(raw.path, cameras, settings, rate, channels)
    proprio = _BlockWindows(streams, t0, block_ns, channels)
    depth_frames = _DepthWindows(raw.path, depth, channels)
    n_messages = 0
    k = 0  # GOP window
    while True:
        window_end = t0 + (k + 1) * gop_ns
        pending = (
            video.messages_until(window_end)
            + depth_frames.messages_until(window_end)
            + proprio.messages_until(window_end)
        )
        pending.sort(key=lambda m: (m[0], m[1]))  # time-major inside each chunk
        for ts, cid, data in pending:
            w.add_message(cid, ts, data)
        n_messages += len(pending)
        # Next window holding a sample: windows with none are skipped, so the work follows the
        # samples, never the time span (a clock jump of years is not years of empty windows).
        nexts = (video.next_ns(), depth_frames.next_ns(), proprio.next_ns())
        nxt = min((t for t in nexts if t is not None), default=None)
        if nxt is None:
            break
        k = max(k + 1, (nxt - t0) // gop_ns)

    cam_reports = video.reports()
    stream_counts = {s.name: len(s) for s in streams}
    depth_counts = {d.name: len(d) for d in depth}
    w.add_metadata(
        STATS_METADATA,
        {
            "cameras": json.dumps({k: asdict(v) for k, v in cam_reports.items()}, sort_keys=True),
            "streams": json.dumps(stream_counts, sort_keys=True),
            "depth": json.dumps(depth_counts, sort_keys=True),
            "messages": str(n_messages),
        },
    )
    w.finish()
    topic_of = {c: t for t, c in channels.items()}
    chunks: dict[str, int] = {}
    for ci in w.chunk_indexes:
        name = settings.profile.group_of(topic_of[next(iter(ci.message_index_offsets))]).name
        chunks[name] = chunks.get(name, 0) + 1
    # a keyword-argument list like dyna_assets/dagster_private.py's PartitionBackfill call: alike in shape only
    return TranscodeReport(
        episode_id=raw.meta.episode_id,
        source=raw.path,
        output="",
        source_sha256=source_sha,
        bytes_in=0,
        bytes_out=0,
        duration_s=raw.duration_s,
        start_ns=t0,
        end_ns=raw.end_ns,
        cameras=cam_reports,
        streams=stream_counts,
        chunks=chunks,
        messages=n_messages,
        jpeg_decode_s=video.decode_t.s,
        video_encode_s=video.encode_t.s,
        total_s=0.0,
        jpeg_decode_cpu_s=video.decode_t.cpu_s,
        video_encode_cpu_s=video.encode_t.cpu_s,
        meta=meta,
        versions=stamp,
        training_streams=streams_column(settings.training_streams),
        depth=depth_counts,
    )


class _VideoWindows:
    """Encodes each camera one GOP window at a time (a fresh encoder per GOP)."""

    def __init__(
        self, path: str, cameras: list[Camera], settings: TranscodeSettings, rate: float, channels: dict[str, int]
    ):
        self.path, self.cameras, self.settings, self.rate, self.channels = path, cameras, settings, rate, channels
        self.decode_t, self.encode_t = _Timer(), _Timer()
        self.frames = {c.name: _frames(c, self.decode_t) for c in cameras}
        self.pos = {c.name: 0 for c in cameras}
        self.shape: dict[str, tuple[int, int]] = {}
        self.dark = dict.fromkeys(self.pos, 0)
        self.frozen = dict.fromkeys(self.pos, 0)
        self.last_luma: dict[str, np.ndarray] = {}
        self.keyframes = dict.fromkeys(self.pos, 0)
        self.video_bytes = dict.fromkeys(self.pos, 0)
        self.layouts: dict[str, Layout] = {
            c.name: check_layout(c.frames, settings.video.gop_frames)  # type: ignore[union-attr,arg-type]
            for c in cameras
            if getattr(c, "encoding", "") == "h264"
        }
        self.copied = {n for n, lay in self.layouts.items() if lay.copyable and settings.copy_h264}
        # a copied camera's frames inspected (each GOP's first two) and pairs of them compared
        self.samples = {name: [0, 0] for name in self.copied}
        self.keyframe_digest = {name: hashlib.blake2b(digest_size=16) for name in self.copied}

    def next_ns(self) -> int | None:
        """Time of the earliest frame not encoded yet (None: all done)."""
        return min(
            (int(c.timestamps_ns[self.pos[c.name]]) for c in self.cameras if self.pos[c.name] < len(c)), default=None
        )

    def messages_until(self, window_end: int) -> list[tuple[int, int, bytes]]:
        out = []
        for cam in self.cameras:
            hi = int(np.searchsorted(cam.timestamps_ns, window_end, side="left"))
            lo, self.pos[cam.name] = self.pos[cam.name], hi
            if hi > lo:
                out += self._copy(cam, lo, hi) if cam.name in self.copied else self._encode(cam, lo, hi)
        return out

    def _copy(self, cam: Camera, lo: int, hi: int) -> list[tuple[int, int, bytes]]:
        """The source's access units ``[lo, hi)`` as they are; each GOP's first two frames decoded and inspected."""
        units: list[bytes] = cam.frames  # type: ignore[union-attr,assignment]  # an H264Camera's access units
        for k in range(lo, hi):
            if is_keyframe(units[k]):
                self._inspect_gop_start(cam, units, k)
        return self._messages(cam, lo, hi, units[lo:hi])

    def _inspect_gop_start(self, cam: Camera, units: list[bytes], k: int) -> None:
        """Decode a copied GOP's first two frames: the first counts for dark frames, the pair for frozen."""
        pair = 2 if k + 1 < len(units) and not is_keyframe(units[k + 1]) else 1
        with self.decode_t:
            try:
                frames = H264Decoder(strict=True).decode_yuv(units[k : k + pair])
            except ValueError as e:
                raise CorruptFrameError(self.path, f"images/{cam.name}", k, f"H.264 decode failed: {e}") from None
        self.keyframes[cam.name] += 1
        self.keyframe_digest[cam.name].update(units[k])
        lumas = []
        for j, frame in enumerate(frames):
            self._check_shape(cam, k + j, frame)
            lumas.append(_luma_sample(frame))
        dark = [float(y.mean()) < self.settings.dark_level for y in lumas]
        self.dark[cam.name] += sum(dark)
        self.samples[cam.name][0] += len(lumas)
        if len(lumas) == 2:
            self.samples[cam.name][1] += 1
            if not dark[1] and np.abs(lumas[1] - lumas[0]).mean() < self.settings.frozen_level:
                self.frozen[cam.name] += 1

    def _check_shape(self, cam: Camera, i: int, frame) -> None:
        shape = self.shape.setdefault(cam.name, (frame.height, frame.width))
        if (frame.height, frame.width) != shape:
            raise RawFormatError(
                self.path,
                f"frame {i} is {frame.width}x{frame.height}, earlier frames {shape[1]}x{shape[0]}",
                f"images/{cam.name}",
            )

    def _encode(self, cam: Camera, lo: int, hi: int) -> list[tuple[int, int, bytes]]:
        frames = []
        for i in range(lo, hi):
            frame = next(self.frames[cam.name])
            self._check_shape(cam, i, frame)
            self._inspect(cam.name, _luma_sample(frame))
            frames.append(frame)
        with self.encode_t:
            units = encode_gop(frames, self.settings.video, self.rate)
        self.keyframes[cam.name] += 1
        return self._messages(cam, lo, hi, units)

    def _messages(self, cam: Camera, lo: int, hi: int, units: list[bytes]) -> list[tuple[int, int, bytes]]:
        cid = self.channels[camera_topic(cam.name)]
        out = []
        for i, au in zip(range(lo, hi), units, strict=True):
            ts = int(cam.timestamps_ns[i])
            msg = CompressedVideo(frame_id=cam.name, data=au, format="h264")
            msg.timestamp.FromNanoseconds(ts)
            self.video_bytes[cam.name] += len(au)
            out.append((ts, cid, msg.SerializeToString()))
        return out

    def _inspect(self, camera: str, luma: np.ndarray) -> None:
        """Count the frame as dark or frozen (a frozen dark frame is dark: one fault, one count)."""
        last = self.last_luma.get(camera)
        self.last_luma[camera] = luma
        if luma.mean() < self.settings.dark_level:
            self.dark[camera] += 1
        elif last is not None and np.abs(luma - last).mean() < self.settings.frozen_level:
            self.frozen[camera] += 1

    def _scaled(self, camera: str, count: int, frames: int, pairs: bool = False) -> int:
        """A copied camera's count over its inspected frames (``pairs``: over its compared pairs, of which a
        camera has one fewer than frames), scaled to all of them."""
        if camera not in self.copied:
            return count
        seen = self.samples[camera][1 if pairs else 0]
        return round(count / seen * (frames - pairs)) if seen else 0

    def _reencode_reason(self, camera: str) -> str:
        if camera not in self.layouts or camera in self.copied:
            return ""
        return self.layouts[camera].reason or "copying is off (TranscodeSettings.copy_h264)"

    def reports(self) -> dict[str, CameraReport]:
        return {
            c.name: CameraReport(
                frames=len(c),
                width=self.shape.get(c.name, (0, 0))[1],
                height=self.shape.get(c.name, (0, 0))[0],
                rate_hz=round(nominal_rate_hz(c.timestamps_ns), 3),
                dropped_frames=dropped_frames(c.timestamps_ns),
                dark_frames=self._scaled(c.name, self.dark[c.name], len(c)),
                frozen_frames=self._scaled(c.name, self.frozen[c.name], len(c), pairs=True),
                keyframes=self.keyframes[c.name],
                video_bytes=self.video_bytes[c.name],
                first_ns=int(c.timestamps_ns[0]) if len(c) else -1,
                last_ns=int(c.timestamps_ns[-1]) if len(c) else -1,
                copied=c.name in self.copied,
                reencode_reason=self._reencode_reason(c.name),
                decoded_keyframes=self.keyframe_digest[c.name].hexdigest() if c.name in self.copied else "",
            )
            for c in self.cameras
        }


class _DepthWindows:
    """Each depth stream's frames of a window as foxglove.RawImage messages: lossless, no codec."""

    def __init__(self, path: str, streams: list[DepthStream], channels: dict[str, int]):
        self.path, self.streams, self.channels = path, streams, channels
        self.pos = {d.name: 0 for d in streams}
        self.shape: dict[str, tuple[int, ...]] = {}

    def next_ns(self) -> int | None:
        """Time of the earliest frame not written yet (None: all done)."""
        return min(
            (int(d.timestamps_ns[self.pos[d.name]]) for d in self.streams if self.pos[d.name] < len(d)), default=None
        )

    def messages_until(self, window_end: int) -> list[tuple[int, int, bytes]]:
        out = []
        for d in self.streams:
            hi = int(np.searchsorted(d.timestamps_ns, window_end, side="left"))
            lo, self.pos[d.name] = self.pos[d.name], hi
            cid = self.channels[depth_topic(d.name)]
            for i in range(lo, hi):
                ts = int(d.timestamps_ns[i])
                out.append((ts, cid, self._raw_image(d, i, ts)))
        return out

    def _raw_image(self, d: DepthStream, i: int, ts: int) -> bytes:
        frame = d.frames[i]
        shape = self.shape.setdefault(d.name, frame.shape)
        if frame.dtype != np.uint16 or frame.ndim != 2 or frame.shape != shape:
            raise RawFormatError(
                self.path,
                f"frame {i} is {frame.dtype} {frame.shape}, expected uint16 (height, width) {shape} like the first",
                d.topic or f"depth/{d.name}",
            )
        h, w = shape
        data = frame.astype("<u2", copy=False).tobytes()
        msg = RawImage(frame_id=d.name, width=w, height=h, encoding=DEPTH_ENCODING, step=2 * w, data=data)
        msg.timestamp.FromNanoseconds(ts)
        return msg.SerializeToString()


class _BlockWindows:
    """Cuts numeric streams into blocks of block_ns, aligned to t0; one file read per field per window."""

    def __init__(self, streams: list[SampleStream], t0: int, block_ns: int, channels: dict[str, int]):
        self.streams, self.t0, self.block_ns, self.channels = streams, t0, block_ns, channels
        self.next_block = {s.name: 0 for s in streams}
        self.pos = {s.name: 0 for s in streams}  # first sample not in a block yet

    def next_ns(self) -> int | None:
        """Time of the earliest sample not in a block yet (None: all done)."""
        return min(
            (int(s.timestamps_ns[self.pos[s.name]]) for s in self.streams if self.pos[s.name] < len(s)), default=None
        )

    def messages_until(self, window_end: int) -> list[tuple[int, int, bytes]]:
        """The blocks starting before ``window_end``: every sample up to the block boundary at or after it."""
        out = []
        for s in self.streams:
            last = max(self.next_block[s.name], -(-(window_end - self.t0) // self.block_ns))
            self.next_block[s.name] = last
            lo = self.pos[s.name]
            hi = int(np.searchsorted(s.timestamps_ns, self.t0 + last * self.block_ns, side="left"))
            self.pos[s.name] = hi
            if hi == lo:
                continue
            ts = s.timestamps_ns[lo:hi]
            slab = {n: a[lo:hi] for n, a in s.fields.items()}
            block = (ts - self.t0) // self.block_ns
            cuts = [0, *(np.flatnonzero(np.diff(block)) + 1).tolist(), hi - lo]  # one block per block index
            cid = self.channels[stream_topic(s.name)]
            for a, b in itertools.pairwise(cuts):
                data = blocks.encode_block(ts[a:b], {n: v[a:b] for n, v in slab.items()})
                out.append((int(ts[a]), cid, data))
        return out


def _luma_sample(frame) -> np.ndarray:
    """~60 rows of the luma plane, every ``stride``-th pixel, as int16 (differences fit): cheap
    next to the decode, and single pixels keep the sensor noise that tells a live picture."""
    y = np.frombuffer(frame.planes[0], np.uint8).reshape(frame.height, frame.planes[0].line_size)
    stride = max(1, min(frame.height, frame.width) // 60)
    return y[::stride, : frame.width : stride].astype(np.int16)


def _frames(cam: Camera, timer: _Timer):
    it = cam.iter_yuv()
    while True:
        with timer:
            frame = next(it, None)
        if frame is None:
            return
        yield frame
