"""Training streams: a small derived video stream per camera, for loaders that random-access frames.

The archive stream keeps every camera at full size with long GOPs (5 s by default): the cheapest
bytes to keep, the dearest to sample from, since one frame costs a chunk of full-size frames and a
decode from its keyframe. A training stream is the same footage resized to the model's input
(e.g. 128x128) and encoded with short GOPs (e.g. 30 frames), stored in its own chunk group: a frame
then costs a small chunk and at most ``gop_frames`` small decodes. It is an option per read
profile, never the default, and costs a few percent of the archive (see the report).

:func:`add_training_streams` rewrites an episode MCAP with its records kept byte-identical: every
source chunk is copied into a chunk of its own with the same messages in the same order and the
same compression (chunks are rebuilt through :class:`GroupedChunkWriter`, as ``rechunk`` does, so
the summary and indexes are ours and valid), plus one channel per (stream, camera) on
:func:`~.topics.training_camera_topic`. Frames are decoded from the archive, resized by
libswscale's area filter in full-range YUV 4:2:0 (the transcoder's colour conventions, see
``codec.py``) and encoded with :func:`~.codec.encode_gop`, one fresh encoder per GOP window (so
every GOP starts with IDR + SPS/PPS, no B-frames). Each training frame has the log time of the
archive frame it came from; GOP windows are fixed-length from the episode start, like the
archive's, so their boundaries sit at the same times for every camera.
"""

from __future__ import annotations

import heapq
import io
import json
import os
import re
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import av
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from mcap.data_stream import ReadDataStream
from mcap.reader import make_reader
from mcap.records import Chunk, Message
from mcap.stream_reader import breakup_chunk

from .codec import FULL_RANGE, VideoSettings, encode_gop
from .errors import McapFormatError
from .mcap_reader import EpisodeReader
from .mcap_writer import GroupedChunkWriter
from .topics import (
    ARCHIVE_STREAM,
    CAMERA_PREFIX,
    EPISODE_METADATA,
    camera_topic,
    is_camera_topic,
    parse_training_camera_topic,
    training_camera_topic,
)

METADATA_KEY = "training_streams"  # in the episode metadata record: JSON {name: spec}
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class TrainingStreamSpec:
    """One training stream: every camera of an episode at ``height`` x ``width``, ``gop_frames`` per GOP."""

    # Selects the stream (``EpisodeReader.read_frames(..., stream=name)``) and names its topics
    # ``/training/<name>/camera/<camera>``: letters, digits, ``_`` and ``-`` only; "archive" is taken.
    name: str
    height: int  # pixels, even (4:2:0); the aspect ratio is the caller's: 640x480 -> 128x128 squashes
    width: int  # pixels, even
    # Frames per GOP at the episode's nominal rate: the most frames a random access decodes.
    gop_frames: int = 30
    # x264 CRF. The input is the archive frame (already CRF 21) area-downscaled, which averages most
    # of its coding noise away, so this is a second generation at a small size: against the archive
    # frame resized the same way, CRF 18 keeps ~41 dB PSNR (worst sampled frame 37 dB) at 128x128 and
    # 224x224 on a 640x480 sim episode, far less loss than the archive's own, for ~1 KB per 128x128
    # frame (+6.7 % of the archive MCAP for t128, +15 % for t224). Each +2 saves ~20 % of the bytes
    # for ~1.5 dB; CRF 20 puts the worst frames near 35.5 dB, the tests' bar.
    crf: float = 18.0
    # As the archive's: a training stream is encoded once and read for many epochs. Against "medium":
    # ~8 % fewer bytes for ~1.7x the encode time (5 vs 3 ms per 128x128 frame, 13 vs 8 at 224x224, on
    # one busy core; the archive's own 640x480 encode is ~10x that).
    preset: str = "slower"
    # Chunk window of the stream's chunk group, seconds; None: the archive's GOP duration (channel
    # metadata ``gop_ns``), so a training chunk spans the same time as an archive camera chunk.
    chunk_window_s: float | None = None

    def __post_init__(self):
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"TrainingStreamSpec.{name}: {why}, got {getattr(self, name)!r}")

        if not isinstance(self.name, str) or not _SAFE_NAME.fullmatch(self.name):
            raise bad("name", "must be a non-empty identifier of letters, digits, '_' and '-'")
        if self.name == ARCHIVE_STREAM:
            raise bad("name", f"{ARCHIVE_STREAM!r} names the archive stream")
        for dim in ("height", "width"):
            v = getattr(self, dim)
            if not isinstance(v, int) or isinstance(v, bool) or v < 2 or v % 2:
                raise bad(dim, "must be an even integer of at least 2 (4:2:0 video)")
        if not isinstance(self.gop_frames, int) or isinstance(self.gop_frames, bool) or self.gop_frames < 1:
            raise bad("gop_frames", "must be a positive integer")
        if isinstance(self.crf, bool) or not isinstance(self.crf, (int, float)) or not 0 <= self.crf <= 51:
            raise bad("crf", "must be a number from 0 to 51")
        object.__setattr__(self, "crf", float(self.crf))
        if self.preset not in X264_PRESETS:
            raise bad("preset", f"must be one of {', '.join(X264_PRESETS)}")
        if self.chunk_window_s is not None:
            if (
                isinstance(self.chunk_window_s, bool)
                or not isinstance(self.chunk_window_s, (int, float))
                or not self.chunk_window_s > 0
            ):
                raise bad("chunk_window_s", "must be None or a positive number of seconds")
            object.__setattr__(self, "chunk_window_s", float(self.chunk_window_s))

    def video_settings(self) -> VideoSettings:
        return VideoSettings(gop_frames=self.gop_frames, crf=self.crf, preset=self.preset)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainingStreamSpec:
        return cls(**d)

    @classmethod
    def parse(cls, text: str) -> TrainingStreamSpec:
        """``NAME:HxW[:GOP]``, e.g. ``t128:128x128`` or ``t224:224x224:30`` (other fields: defaults)."""
        parts = text.split(":")
        size = parts[1].lower().split("x") if len(parts) in (2, 3) else []
        if (
            len(size) != 2
            or not all(s.strip().isdigit() for s in size)
            or (len(parts) == 3 and not parts[2].strip().isdigit())
        ):
            raise ValueError(f"training stream spec {text!r}: expected NAME:HxW[:GOP], e.g. t128:128x128:30")
        if len(parts) == 3:
            return cls(name=parts[0], height=int(size[0]), width=int(size[1]), gop_frames=int(parts[2]))
        return cls(name=parts[0], height=int(size[0]), width=int(size[1]))


@dataclass
class TrainingStreamResult:
    """What happened to one requested stream."""

    name: str
    # added: new; replaced: the source had this name with another spec; kept: same spec, copied as is
    action: Literal["added", "replaced", "kept"]
    cameras: list[str]
    frames: int  # frames encoded (0 when kept)
    video_bytes: int  # Annex B bytes encoded (0 when kept)
    # Bytes of the stream's chunk records and message indexes in the output: what the stream adds to
    # an episode without it (plus ~100 bytes of channel and chunk-index records per camera/chunk).
    bytes: int
    encode_s: float  # resize + encode; the archive decode is shared by all streams (report.decode_s)


@dataclass
class TrainingStreamReport:
    source: str
    output: str
    bytes_before: int
    bytes_after: int
    streams: dict[str, TrainingStreamResult]
    frames_encoded: int
    decode_s: float  # decoding the archive streams
    seconds: float  # wall time of the whole rewrite

    def bytes_fraction(self, name: str) -> float:
        """The stream's bytes as a fraction of the source file."""
        return self.streams[name].bytes / self.bytes_before if self.bytes_before else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def add_training_streams(src: str | Path, dst: str | Path, specs: Sequence[TrainingStreamSpec]) -> TrainingStreamReport:
    """Copy the episode MCAP ``src`` to ``dst`` with a training stream per spec and camera.

    Every record of ``src`` is kept as it was; a training stream already in ``src`` under the name
    of a spec is kept as is when its spec is identical, replaced otherwise; training streams not
    named by ``specs`` are kept. ``dst`` is written under a temporary name and renamed when
    complete (``dst`` may be ``src``).

    :param src: an episode written by the transcoder (camera channels carry ``gop_ns``).
    :param dst: where the result goes.
    :param specs: the streams wanted, names unique.
    :raises McapFormatError: ``src`` is not such an episode or its video does not decode.
    :raises ValueError: two specs share a name.
    """
    specs = tuple(specs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"training stream names must be unique, got {names}")
    t_start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    bytes_before = src.stat().st_size
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(src, "rb") as fin, EpisodeReader(src) as video_in, open(tmp, "wb") as fout:
            results, decode_s = _rewrite(str(src), fin, video_in, fout, specs)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return TrainingStreamReport(
        source=str(src),
        output=str(dst),
        bytes_before=bytes_before,
        bytes_after=dst.stat().st_size,
        streams=results,
        frames_encoded=sum(r.frames for r in results.values()),
        decode_s=decode_s,
        seconds=time.perf_counter() - t_start,
    )


# -- rewrite ------------------------------------------------------------------------------------------
@dataclass
class _Job:
    """One (stream, camera): frames of the open GOP window, resized, waiting for the window to end."""

    spec: TrainingStreamSpec
    camera: str
    channel_id: int
    gop_ns: int
    rate_hz: float
    result: TrainingStreamResult
    window: int | None = None
    frames: list[tuple[int, av.VideoFrame]] = field(default_factory=list)

    def flush(self) -> list[tuple[int, int, bytes]]:
        if not self.frames:
            return []
        t = time.perf_counter()
        units = encode_gop([f for _, f in self.frames], self.spec.video_settings(), self.rate_hz)
        if len(units) != len(self.frames):
            raise RuntimeError(f"encoder returned {len(units)} access units for {len(self.frames)} frames")
        out = []
        for (ts, _), au in zip(self.frames, units, strict=True):
            msg = CompressedVideo(frame_id=self.camera, data=au, format="h264")
            msg.timestamp.FromNanoseconds(ts)
            out.append((ts, self.channel_id, msg.SerializeToString()))
            self.result.video_bytes += len(au)
        self.result.frames += len(self.frames)
        self.result.encode_s += time.perf_counter() - t
        self.frames, self.window = [], None
        return out


def _rewrite(
    path: str, fin, video_in: EpisodeReader, fout, specs: tuple[TrainingStreamSpec, ...]
) -> tuple[dict[str, TrainingStreamResult], float]:
    reader = make_reader(fin)
    summary = reader.get_summary()
    if summary is None or not summary.chunk_indexes:
        raise McapFormatError(path, "no summary with a chunk index (not an indexed episode MCAP)")
    metadata = list(reader.iter_metadata())
    episode = next((m.metadata for m in metadata if m.name == EPISODE_METADATA), None)
    if episode is None:
        raise McapFormatError(path, f"no {EPISODE_METADATA!r} metadata record (not a transcoded episode)")
    archive = {c.topic[len(CAMERA_PREFIX) :]: c for c in summary.channels.values() if is_camera_topic(c.topic)}
    cameras = sorted(archive)
    if not cameras:
        raise McapFormatError(path, "no camera channels")
    first = archive[cameras[0]]
    try:
        archive_gop_ns, archive_gop_frames = int(first.metadata["gop_ns"]), int(first.metadata["gop_frames"])
    except (KeyError, ValueError):
        raise McapFormatError(path, "camera channels carry no gop_ns/gop_frames metadata", first.topic) from None
    rate_hz = archive_gop_frames * 1e9 / archive_gop_ns  # the rate the transcoder encoded at
    t0 = int(episode.get("start_ns", summary.statistics.message_start_time if summary.statistics else 0))

    # What the source holds: training streams by name, their channels and recorded specs.
    recorded = json.loads(episode.get(METADATA_KEY) or "{}")
    present: dict[str, dict[str, int]] = {}  # name -> camera -> channel id
    for cid, c in summary.channels.items():
        try:
            name, camera = parse_training_camera_topic(c.topic)
        except ValueError:
            continue
        present.setdefault(name, {})[camera] = cid
    results: dict[str, TrainingStreamResult] = {}
    for s in specs:
        same = s.name in present and sorted(present[s.name]) == cameras and _spec_or_none(recorded.get(s.name)) == s
        action: Literal["added", "replaced", "kept"] = "kept" if same else "replaced" if s.name in present else "added"
        results[s.name] = TrainingStreamResult(s.name, action, list(cameras), 0, 0, 0, 0.0)
    new = [s for s in specs if results[s.name].action != "kept"]
    dropped = {cid for s in new for cid in present.get(s.name, {}).values()}

    header = reader.get_header()
    w = GroupedChunkWriter(fout, t0_ns=t0, library=header.library, profile=header.profile)
    schema_ids = {
        sid: w.register_schema(summary.schemas[sid].name, summary.schemas[sid].encoding, summary.schemas[sid].data)
        for sid in sorted(summary.schemas)
    }

    # Copied channels go to a group by their chunks' compression; chunks are closed one source chunk
    # at a time, so every source chunk becomes one output chunk with the same records.
    compression_of: dict[int, str] = {}
    for ci in summary.chunk_indexes:
        for cid in ci.message_index_offsets:
            compression_of.setdefault(cid, ci.compression or "none")
    for comp in sorted(set(compression_of.values()) | {"none"}):
        w.add_group(f"copy:{comp}", comp, None)
    for s in new:
        window_ns = archive_gop_ns if s.chunk_window_s is None else int(round(s.chunk_window_s * 1e9))
        w.add_group(f"training:{s.name}", "none", window_ns)

    # Channels in the source's order (same ids when nothing is replaced, and when a stream is
    # replaced its new channels take the old ones' places); new streams last.
    channel_map: dict[int, int] = {}
    jobs: dict[str, list[_Job]] = {c: [] for c in cameras}
    placed: set[str] = set()

    def register_new(s: TrainingStreamSpec) -> None:
        placed.add(s.name)
        gop_ns = int(round(s.gop_frames / rate_hz * 1e9))
        for camera in cameras:
            src_channel = archive[camera]
            topic = training_camera_topic(s.name, camera)
            cid = w.register_channel(
                topic,
                src_channel.message_encoding,
                schema_ids.get(src_channel.schema_id, 0),
                f"training:{s.name}",
                {
                    "frame_id": src_channel.metadata.get("frame_id", camera),
                    "rate_hz": src_channel.metadata.get("rate_hz", f"{rate_hz:.3f}"),
                    "gop_frames": str(s.gop_frames),
                    "gop_ns": str(gop_ns),
                    "source_topic": src_channel.topic,
                    "training_stream": s.name,
                    "height": str(s.height),
                    "width": str(s.width),
                },
            )
            jobs[camera].append(_Job(s, camera, cid, gop_ns, rate_hz, results[s.name]))

    by_name = {s.name: s for s in new}
    for cid in sorted(summary.channels):
        c = summary.channels[cid]
        if cid in dropped:
            name = parse_training_camera_topic(c.topic)[0]
            if name not in placed:
                register_new(by_name[name])
            continue
        channel_map[cid] = w.register_channel(
            c.topic,
            c.message_encoding,
            schema_ids.get(c.schema_id, 0),
            f"copy:{compression_of.get(cid, 'none')}",
            c.metadata,
        )
    for s in new:
        if s.name not in placed:
            register_new(s)

    streams = {**recorded, **{s.name: s.as_dict() for s in specs}}
    streams = {n: v for n, v in streams.items() if n in present or n in results}
    episode_out = dict(episode)
    if streams or METADATA_KEY in episode_out:
        episode_out[METADATA_KEY] = json.dumps(streams, sort_keys=True)
    w.add_metadata(EPISODE_METADATA, episode_out)

    decode_t = [0.0]
    training = heapq.merge(*(_camera_messages(video_in, cam, jobs[cam], t0, decode_t) for cam in cameras if jobs[cam]))
    next_training = next(training, None)
    copied = 0
    for ci in sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset):
        # Training messages up to this chunk's end first: a training chunk lands next to the
        # archive chunks of its time.
        while next_training is not None and next_training[0] <= ci.message_end_time:
            w.add_message(next_training[1], next_training[0], next_training[2])
            next_training = next(training, None)
        touched = set()
        for record in _chunk_records(path, fin, ci):
            if not isinstance(record, Message):
                continue
            copied += 1
            if record.channel_id in dropped:
                continue
            cid = channel_map[record.channel_id]
            w.add_message(cid, record.log_time, record.data, record.publish_time, record.sequence)
            touched.add(f"copy:{compression_of.get(record.channel_id, 'none')}")
        for g in sorted(touched):
            w.close_group(g)
    while next_training is not None:
        w.add_message(next_training[1], next_training[0], next_training[2])
        next_training = next(training, None)
    for s in new:  # all chunks before the trailing metadata, as in a copy of this output
        w.close_group(f"training:{s.name}")
    if summary.statistics is not None and copied != summary.statistics.message_count:
        raise McapFormatError(
            path,
            f"{summary.statistics.message_count - copied} messages are outside the "
            "indexed chunks; refusing to drop them",
        )
    for m in metadata:
        if m.name != EPISODE_METADATA:
            w.add_metadata(m.name, m.metadata)
    w.finish()

    stream_of = {j.channel_id: j.spec.name for js in jobs.values() for j in js}
    for name, cids in present.items():
        if name in results and results[name].action == "kept":
            stream_of.update({channel_map[c]: name for c in cids.values()})
    for ci in w.chunk_indexes:
        owners = {stream_of.get(c) for c in ci.message_index_offsets}
        if len(owners) == 1 and (owner := owners.pop()) is not None and owner in results:
            results[owner].bytes += ci.chunk_length + ci.message_index_length
    return results, decode_t[0]


def _spec_or_none(d) -> TrainingStreamSpec | None:
    try:
        return TrainingStreamSpec.from_dict(d)
    except (TypeError, ValueError):
        return None


def _chunk_records(path: str, fin, ci) -> list:
    fin.seek(ci.chunk_start_offset)
    buf = fin.read(ci.chunk_length)
    if len(buf) != ci.chunk_length:
        raise McapFormatError(path, f"chunk at offset {ci.chunk_start_offset} is truncated")
    try:
        return breakup_chunk(Chunk.read(ReadDataStream(io.BytesIO(buf[9:]))), validate_crc=True)
    except Exception as e:  # the mcap library raises several types for a damaged chunk
        raise McapFormatError(path, f"chunk at offset {ci.chunk_start_offset}: {e}") from None


def _camera_messages(
    video_in: EpisodeReader, camera: str, jobs: list[_Job], t0: int, decode_t: list[float]
) -> Iterator[tuple[int, int, bytes]]:
    """(log time, channel id, CompressedVideo bytes) of every training stream of one camera, in time order.

    The archive is decoded once for all streams; each stream holds at most one GOP window of small
    frames, and encoded messages wait only until no stream can still produce an earlier one.
    """
    ctx = av.CodecContext.create("h264", "r")
    ctx.thread_type = "NONE"  # one frame out per access unit in, in order (no B-frames)
    ctx.thread_count = 1
    pending_ts: deque[int] = deque()
    ready: list[tuple[int, int, bytes]] = []  # heap
    topic = camera_topic(camera)

    def decoded(packet) -> list[av.VideoFrame]:
        t = time.perf_counter()
        try:
            frames = list(ctx.decode(packet))
        except av.FFmpegError as e:
            raise McapFormatError(video_in.path, f"H.264 decode failed: {e}", topic) from None
        decode_t[0] += time.perf_counter() - t
        return frames

    def take(frames: list[av.VideoFrame]) -> None:
        for frame in frames:
            if not pending_ts:
                raise McapFormatError(video_in.path, "decoder returned more frames than access units", topic)
            ts = pending_ts.popleft()
            for job in jobs:
                window = (ts - t0) // job.gop_ns
                if job.window is not None and window != job.window:
                    for item in job.flush():
                        heapq.heappush(ready, item)
                job.window = window
                t = time.perf_counter()
                job.frames.append((ts, _resize(frame, job.spec.height, job.spec.width)))
                job.result.encode_s += time.perf_counter() - t

    n = 0
    for ts, au in video_in.iter_video(camera):
        packet = av.Packet(au)
        packet.pts = n
        n += 1
        pending_ts.append(ts)
        take(decoded(packet))
        # everything before the earliest frame still waiting in some stream's window is final
        bound = min((j.frames[0][0] for j in jobs if j.frames), default=None)
        while ready and (bound is None or ready[0][0] < bound):
            yield heapq.heappop(ready)
    take(decoded(None))
    if pending_ts:
        raise McapFormatError(
            video_in.path, f"decoder returned {n - len(pending_ts)} frames for {n} access units", topic
        )
    for job in jobs:
        for item in job.flush():
            heapq.heappush(ready, item)
    while ready:
        yield heapq.heappop(ready)


def _resize(frame: av.VideoFrame, height: int, width: int) -> av.VideoFrame:
    """``frame`` at height x width by libswscale's area filter, as full-range YUV 4:2:0.

    The archive decodes as full-range (``yuvj420p`` or range-flagged ``yuv420p``); asking for a
    full-range output keeps the levels as they are (a limited-range source would be expanded).
    """
    out = frame.reformat(
        width=width, height=height, format="yuv420p", interpolation="AREA", dst_color_range=FULL_RANGE, threads=1
    )
    out.color_range = FULL_RANGE
    return out
