"""Random-access reads of MCAP episodes for training: frames at timestamps, proprio windows.

Only the chunks a request needs are fetched (found through the chunk index in the
summary), each at most once per request; video is decoded from the nearest keyframe
at or before each requested frame. Every range read is logged, so a caller can count
chunk fetches and bytes and price them with an object-store cost model.

The source is a local path or any seekable binary file object (fsspec files
included), read with explicit ranges.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

import av
import numpy as np
import zstandard
from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf.message import DecodeError
from mcap.data_stream import ReadDataStream
from mcap.exceptions import McapError
from mcap.records import AttachmentIndex, Channel, ChunkIndex, Footer, Metadata, MetadataIndex, Schema, Statistics
from mcap.stream_reader import CRCValidationError, StreamReader
from mcap.summary import Summary
from mcap.writer import MCAP0_MAGIC

from . import blocks
from .codec import H264Decoder, StreamingH264Decoder, decoded_to_rgb, is_keyframe
from .errors import McapFormatError, WindowError
from .raw_format import SampleStream
from .topics import (
    ARCHIVE_STREAM,
    CAMERA_PREFIX,
    DEPTH_ENCODING,
    DEPTH_PREFIX,
    EPISODE_METADATA,
    camera_topic,
    depth_topic,
    is_camera_topic,
    is_depth_topic,
    is_training_camera_topic,
    parse_training_camera_topic,
    stream_topic,
    training_camera_topic,
)

FOOTER_RECORD_SIZE = 1 + 8 + 8 + 8 + 4
TAIL_READ = 64 * 1024  # one request at open usually covers footer and summary


def _summary_of(section: bytes) -> Summary | None:
    """The records of an MCAP summary section held in memory, collected into a ``Summary`` (None when its
    footer says there is none). The library does this only privately (``mcap.reader.
    _read_summary_from_stream_reader``) or for a whole seekable file; we fetch the section ourselves."""
    summary = Summary()
    # The record classes are flat (each derives from McapRecord only): isinstance picks by exact type.
    for record in StreamReader(io.BytesIO(section), skip_magic=True).records:
        if isinstance(record, Schema):
            summary.schemas[record.id] = record
        elif isinstance(record, Channel):
            summary.channels[record.id] = record
        elif isinstance(record, AttachmentIndex):
            summary.attachment_indexes.append(record)
        elif isinstance(record, ChunkIndex):
            summary.chunk_indexes.append(record)
        elif isinstance(record, MetadataIndex):
            summary.metadata_indexes.append(record)
        elif isinstance(record, Statistics):
            summary.statistics = record
        elif isinstance(record, Footer):
            return summary if record.summary_start else None
    return summary


@dataclass
class Fetch:
    offset: int
    length: int
    kind: str  # "chunk" | "summary" | "metadata"


@dataclass
class FetchLog:
    fetches: list[Fetch] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.fetches)

    @property
    def bytes(self) -> int:
        return sum(f.length for f in self.fetches)

    @property
    def chunk_fetches(self) -> int:
        return sum(1 for f in self.fetches if f.kind == "chunk")

    @property
    def chunk_bytes(self) -> int:
        return sum(f.length for f in self.fetches if f.kind == "chunk")

    def clear(self) -> None:
        self.fetches.clear()


@dataclass
class Frames:
    """Decoded frames of one camera: the frames' own timestamps and (k, H, W, 3) uint8 RGB."""

    requested_ns: np.ndarray
    timestamps_ns: np.ndarray
    images: np.ndarray  # empty when read with decode=False
    # The encoded runs that were (or would be) decoded: keyframe .. last wanted frame, Annex B.
    runs: list[list[bytes]] = field(default_factory=list)


class FrameCache:
    """Decoded frames of one reader, kept after a transform (e.g. a resize to the model's input), plus
    the live decoder of recently read GOPs: a later frame of the same GOP continues that decode, an
    earlier one is already here. A training worker reads overlapping windows of the same episodes
    over and over, and decoding from the keyframe each time is what a long GOP makes expensive.
    Bounded by frame count and live decoders, least recently used first out."""

    def __init__(self, transform=None, *, max_frames: int = 2048, max_decoders: int = 6):
        self.transform = transform or decoded_to_rgb  # av.VideoFrame -> np.ndarray
        self.max_frames, self.max_decoders = max_frames, max_decoders
        self.frames: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.decoders: OrderedDict[tuple, tuple[StreamingH264Decoder, tuple[int, int]]] = OrderedDict()
        self.decoded = 0  # frames this cache decoded (hits cost none)

    def get(self, key: tuple) -> np.ndarray | None:
        frame = self.frames.get(key)
        if frame is not None:
            self.frames.move_to_end(key)
        return frame

    def put(self, key: tuple, frame: np.ndarray) -> None:
        self.frames[key] = frame
        self.frames.move_to_end(key)
        while len(self.frames) > self.max_frames:
            self.frames.popitem(last=False)

    def take_decoder(self, key: tuple, first_needed: tuple[int, int]):
        """The GOP's live decoder and its next position, if it has not passed ``first_needed``."""
        entry = self.decoders.pop(key, None)
        return entry if entry is not None and entry[1] <= first_needed else None

    def keep_decoder(self, key: tuple, decoder: StreamingH264Decoder, next_pos: tuple[int, int]) -> None:
        self.decoders[key] = (decoder, next_pos)
        while len(self.decoders) > self.max_decoders:
            self.decoders.popitem(last=False)


class _RangeSource:
    def __init__(self, source: str | Path | IO[bytes], log: FetchLog):
        self._log = log
        if isinstance(source, (str, Path)):
            self.name = str(source)
            self._fd: int | None = os.open(self.name, os.O_RDONLY)
            self._file = None
            self.size = os.fstat(self._fd).st_size
        else:
            self.name = getattr(source, "path", None) or getattr(source, "name", None) or repr(source)
            self._fd, self._file = None, source
            self._lock = threading.Lock()
            self.size = source.seek(0, io.SEEK_END)

    def read(self, offset: int, length: int, kind: str) -> bytes:
        self._log.fetches.append(Fetch(offset, length, kind))
        if self._fd is not None:
            data = os.pread(self._fd, length, offset)
        else:
            assert self._file is not None  # no descriptor: the source is a file object
            with self._lock:  # seek + read: the GOP-aware loader decodes cameras on threads
                self._file.seek(offset)
                data = self._file.read(length)
        if len(data) != length:
            raise McapFormatError(self.name, f"short read at offset {offset}: {len(data)} of {length} bytes")
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class EpisodeReader:
    def __init__(self, source: str | Path | IO[bytes], *, validate_crcs: bool = True):
        self.log = FetchLog()
        self._src = _RangeSource(source, self.log)
        self.path = self._src.name
        self._validate = validate_crcs
        try:
            self._open()
        except (McapError, CRCValidationError, struct.error, ValueError, KeyError) as e:
            self.close()
            raise McapFormatError(self.path, f"unreadable MCAP summary: {e}") from None
        except BaseException:
            self.close()
            raise
        self.open_log = FetchLog(list(self.log.fetches))
        self.log.clear()
        self._metadata_cache: dict[str, dict[str, str]] = {}

    def __enter__(self) -> EpisodeReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._src.close()

    # -- summary --------------------------------------------------------------------
    def _open(self) -> None:
        size = self._src.size
        if size < 2 * len(MCAP0_MAGIC) + FOOTER_RECORD_SIZE:
            raise McapFormatError(self.path, f"file too small for MCAP ({size} bytes)")
        tail_start = max(0, size - TAIL_READ)
        tail = self._src.read(tail_start, size - tail_start, "summary")
        if tail[-8:] != MCAP0_MAGIC:
            raise McapFormatError(self.path, "missing trailing magic (truncated or not MCAP)")
        footer_at = len(tail) - 8 - FOOTER_RECORD_SIZE
        opcode, _, summary_start, _, summary_crc = struct.unpack_from("<BQQQI", tail, footer_at)
        if opcode != 0x02 or summary_start == 0:
            raise McapFormatError(self.path, "no footer with a summary section (not an indexed MCAP)")
        if summary_start < tail_start:
            tail = self._src.read(summary_start, size - summary_start, "summary")
            footer_at = len(tail) - 8 - FOOTER_RECORD_SIZE
            tail_start = summary_start
        section = tail[summary_start - tail_start :]
        if self._validate and summary_crc:
            crc = zlib.crc32(section[: footer_at - (summary_start - tail_start) + 1 + 8 + 8 + 8])
            if crc != summary_crc:
                raise McapFormatError(self.path, f"summary CRC mismatch ({crc:#x} != {summary_crc:#x})")
        summary = _summary_of(section)
        if summary is None or not summary.chunk_indexes:
            raise McapFormatError(self.path, "summary has no chunk index")
        self.summary = summary
        self.channels = summary.channels
        self.topic_ids = {c.topic: cid for cid, c in summary.channels.items()}
        self._chunks_of: dict[int, list[ChunkIndex]] = {cid: [] for cid in summary.channels}
        for ci in summary.chunk_indexes:
            # a writer that skipped message indexes leaves chunk membership unknown: any channel
            for cid in ci.message_index_offsets or summary.channels:
                self._chunks_of[cid].append(ci)
        for lst in self._chunks_of.values():
            lst.sort(key=lambda c: (c.message_start_time, c.chunk_start_offset))
        self._starts = {cid: [c.message_start_time for c in lst] for cid, lst in self._chunks_of.items()}

    def chunks_of(self, topic: str) -> list[ChunkIndex]:
        """The chunk index entries holding ``topic``'s messages, in time order (read nothing)."""
        return list(self._chunks_of[self._channel(topic, "")])

    @property
    def cameras(self) -> list[str]:
        return sorted(t[len(CAMERA_PREFIX) :] for t in self.topic_ids if is_camera_topic(t))

    @property
    def streams(self) -> list[str]:
        return sorted(
            t.lstrip("/")
            for t in self.topic_ids
            if not is_camera_topic(t) and not is_training_camera_topic(t) and not is_depth_topic(t)
        )

    @property
    def depth(self) -> list[str]:
        """The depth streams (lossless 16-bit frames, millimetres)."""
        return sorted(t[len(DEPTH_PREFIX) :] for t in self.topic_ids if is_depth_topic(t))

    @property
    def training_streams(self) -> dict[str, list[str]]:
        """Training streams (derived small videos, see training_streams.py): name -> its cameras."""
        out: dict[str, list[str]] = {}
        for t in self.topic_ids:
            if is_training_camera_topic(t):
                name, camera = parse_training_camera_topic(t)
                out.setdefault(name, []).append(camera)
        return {name: sorted(cams) for name, cams in sorted(out.items())}

    def video_topic(self, camera: str, stream: str | None = None) -> str:
        """The topic of ``camera``'s video in ``stream`` (None or "archive": the archive stream).

        Raises :class:`WindowError` naming the camera and the streams it has when it lacks ``stream``.
        """
        if stream is None or stream == ARCHIVE_STREAM:
            return camera_topic(camera)
        topic = training_camera_topic(stream, camera)
        if topic not in self.topic_ids:
            has = [ARCHIVE_STREAM] if camera in self.cameras else []
            has += [n for n, cams in self.training_streams.items() if camera in cams]
            raise WindowError(
                self.path,
                f"camera {camera!r} has no video stream {stream!r} (its streams: "
                f"{', '.join(has) or 'none'}; cameras: {', '.join(self.cameras)})",
                topic,
            )
        return topic

    @property
    def start_ns(self) -> int:
        assert self.summary.statistics is not None  # MCAP writers (ours, the mcap library's) write Statistics
        return self.summary.statistics.message_start_time

    @property
    def end_ns(self) -> int:
        assert self.summary.statistics is not None  # as in start_ns
        return self.summary.statistics.message_end_time

    def metadata(self, name: str = EPISODE_METADATA) -> dict[str, str]:
        if name not in self._metadata_cache:
            idx = next((m for m in self.summary.metadata_indexes if m.name == name), None)
            if idx is None:
                raise McapFormatError(self.path, f"no metadata record {name!r}")
            buf = self._src.read(idx.offset, idx.length, "metadata")
            self._metadata_cache[name] = Metadata.read(ReadDataStream(io.BytesIO(buf[9:]))).metadata
        return self._metadata_cache[name]

    def transcode_settings(self) -> dict:
        return json.loads(self.metadata().get("transcode_settings", "{}"))

    # -- chunks -----------------------------------------------------------------------
    def _load_chunk(self, ci: ChunkIndex, memo: dict) -> dict[int, list[ChunkMessage]]:
        got = memo.get(ci.chunk_start_offset)
        if got is None:
            buf = self._src.read(ci.chunk_start_offset, ci.chunk_length, "chunk")
            try:
                got = parse_chunk(buf, validate_crc=self._validate)
            except (McapError, ValueError, struct.error, zstandard.ZstdError) as e:
                raise McapFormatError(self.path, f"chunk at offset {ci.chunk_start_offset}: {e}") from None
            memo[ci.chunk_start_offset] = got
        return got

    def _chunk_range(self, cid: int, lo_ns: int, hi_ns: int) -> range:
        """Positions in this channel's chunk list whose time span meets [lo_ns, hi_ns]."""
        lst, starts = self._chunks_of[cid], self._starts[cid]
        end = bisect.bisect_right(starts, hi_ns)
        begin = end
        while begin > 0 and lst[begin - 1].message_end_time >= lo_ns:
            begin -= 1
        return range(begin, end)

    def _channel(self, topic: str, what: str) -> int:
        cid = self.topic_ids.get(topic)
        if cid is None:
            raise WindowError(self.path, f"no {what} topic {topic} (has {sorted(self.topic_ids)})", topic)
        return cid

    # -- video --------------------------------------------------------------------------
    def read_frames(
        self,
        cameras: Iterable[str] | None,
        timestamps_ns: Sequence[int],
        *,
        tolerance_ns: int | None = None,
        decode: bool = True,
        memo: dict | None = None,
        cache: FrameCache | None = None,
        stream: str | None = None,
    ) -> dict[str, Frames]:
        """For each camera, the frame nearest each requested timestamp, decoded to RGB.

        ``tolerance_ns`` (default: one frame period of the camera) bounds how far the
        nearest frame may be; a dropped or dead stretch raises :class:`WindowError`
        naming the camera and timestamp instead of silently returning a distant frame.

        ``cache``: keep decoded (transformed) frames and live GOP decoders between calls; the
        images are then the transformed frames.

        ``stream``: read a training stream (see :attr:`training_streams`) instead of the archive.
        """
        memo = {} if memo is None else memo
        cameras = self.cameras if cameras is None else list(cameras)
        targets = np.asarray(timestamps_ns, dtype=np.int64)
        return {cam: self._read_camera(cam, targets, tolerance_ns, decode, memo, cache, stream) for cam in cameras}

    def _read_camera(
        self,
        camera: str,
        targets: np.ndarray,
        tolerance_ns: int | None,
        decode: bool,
        memo: dict,
        cache: FrameCache | None = None,
        stream: str | None = None,
    ) -> Frames:
        topic = self.video_topic(camera, stream)
        cid = self._channel(topic, "camera")
        chunks = self._chunks_of[cid]
        if tolerance_ns is None:
            rate = float(self.channels[cid].metadata.get("rate_hz", 0) or 0)
            tolerance_ns = int(1e9 / rate) if rate > 0 else 0
        picks = []  # (chunk position, message index) of the chosen frame per target
        for t in targets.tolist():
            best = None
            for j in self._chunk_range(cid, t - tolerance_ns, t + tolerance_ns):
                msgs = self._load_chunk(chunks[j], memo).get(cid, [])
                times = [m.log_time for m in msgs]
                i = bisect.bisect_left(times, t)
                for k in (i - 1, i):
                    if 0 <= k < len(msgs):
                        d = abs(times[k] - t)
                        if best is None or d < best[0]:
                            best = (d, j, k)
            if best is None or best[0] > tolerance_ns:
                near = "" if best is None else f"; nearest frame is {best[0] / 1e6:.1f} ms away"
                raise WindowError(self.path, f"no frame within {tolerance_ns / 1e6:.1f} ms of {t}{near}", topic)
            picks.append((best[1], best[2]))
        if cache is not None and decode:
            return self._cached_frames(cid, picks, targets, memo, cache)

        # Decode each GOP once, from its keyframe up to the last frame wanted in it.
        runs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for pos in picks:
            runs.setdefault(self._keyframe_before(cid, pos, memo), []).append(pos)
        decoded: dict[tuple[int, int], np.ndarray] = {}
        stamps: dict[tuple[int, int], int] = {}
        encoded: list[list[bytes]] = []
        for key, wanted in runs.items():
            last = max(wanted)
            units, positions = [], []
            j, k = key
            while (j, k) <= last:
                msgs = self._load_chunk(chunks[j], memo).get(cid, [])
                if k >= len(msgs):
                    j, k = j + 1, 0
                    continue
                units.append(_video_payload(msgs[k].data))
                positions.append((j, k))
                stamps[(j, k)] = msgs[k].log_time
                k += 1
            encoded.append(units)
            if not decode:
                continue
            index = {p: i for i, p in enumerate(positions)}
            try:
                frames = H264Decoder().decode(units, [index[p] for p in wanted])
            except (av.FFmpegError, ValueError) as e:
                raise McapFormatError(self.path, f"H.264 decode failed: {e}", topic) from None
            for p in wanted:
                decoded[p] = frames[index[p]]
        images = np.stack([decoded[p] for p in picks]) if picks and decode else np.empty((0, 0, 0, 3), np.uint8)
        return Frames(
            requested_ns=targets,
            timestamps_ns=np.array([stamps[p] for p in picks], dtype=np.int64),
            images=images,
            runs=encoded,
        )

    def _cached_frames(
        self, cid: int, picks: list[tuple[int, int]], targets: np.ndarray, memo: dict, cache: FrameCache
    ) -> Frames:
        chunks = self._chunks_of[cid]
        topic = self.channels[cid].topic
        stamps = [self._load_chunk(chunks[j], memo)[cid][k].log_time for j, k in picks]
        missing = sorted({p for p in picks if cache.get((cid, p)) is None})
        runs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for pos in missing:
            runs.setdefault(self._keyframe_before(cid, pos, memo), []).append(pos)
        wanted_now = set(missing)
        got: dict[tuple[int, int], np.ndarray] = {}
        for key, wanted in runs.items():
            live = cache.take_decoder((cid, key), min(wanted))
            decoder, (j, k) = live if live is not None else (StreamingH264Decoder(), key)
            last = max(wanted)
            try:
                while (j, k) <= last:
                    msgs = self._load_chunk(chunks[j], memo).get(cid, [])
                    if k >= len(msgs):
                        j, k = j + 1, 0
                        continue
                    for frame in decoder.feed(_video_payload(msgs[k].data)):
                        cache.decoded += 1
                        image = cache.transform(frame)
                        cache.put((cid, (j, k)), image)
                        if (j, k) in wanted_now:  # kept here too: a small cache may evict it before the end
                            got[(j, k)] = image
                    k += 1
            except (av.FFmpegError, ValueError) as e:
                raise McapFormatError(self.path, f"H.264 decode failed: {e}", topic) from None
            cache.keep_decoder((cid, key), decoder, (j, k))
        images = [got[p] if p in got else cache.get((cid, p)) for p in picks]
        present = [im for im in images if im is not None]
        if len(present) != len(images):
            raise McapFormatError(self.path, "decoder produced fewer frames than access units", topic)
        return Frames(requested_ns=targets, timestamps_ns=np.array(stamps, dtype=np.int64), images=np.stack(present))

    def _keyframe_before(self, cid: int, pos: tuple[int, int], memo: dict) -> tuple[int, int]:
        chunks = self._chunks_of[cid]
        j, k = pos
        while j >= 0:
            msgs = self._load_chunk(chunks[j], memo).get(cid, [])
            for i in range(min(k, len(msgs) - 1), -1, -1):
                if is_keyframe(_video_payload(msgs[i].data)):
                    return j, i
            j, k = j - 1, 1 << 62
        raise McapFormatError(self.path, "no keyframe before the requested frame", self.channels[cid].topic)

    def iter_video(self, camera: str, stream: str | None = None) -> Iterator[tuple[int, bytes]]:
        """Every access unit of a camera in time order, as (log time ns, Annex B bytes)."""
        cid = self._channel(self.video_topic(camera, stream), "camera")
        for ci in self._chunks_of[cid]:
            for m in self._load_chunk(ci, {}).get(cid, []):
                yield m.log_time, _video_payload(m.data)

    def iter_depth(self, name: str) -> Iterator[tuple[int, np.ndarray]]:
        """Every frame of a depth stream in time order, as (log time ns, uint16 (H, W) millimetres)."""
        topic = depth_topic(name)
        cid = self._channel(topic, "depth")
        for ci in self._chunks_of[cid]:
            for m in self._load_chunk(ci, {}).get(cid, []):
                yield m.log_time, self._depth_image(m.data, topic)

    def depth_times(self, name: str) -> np.ndarray:
        """The log time of every frame of a depth stream, each chunk read and its CRC checked, the
        frames not parsed (what a count needs, without copying ~0.6 MB a frame)."""
        cid = self._channel(depth_topic(name), "depth")
        times = [m.log_time for ci in self._chunks_of[cid] for m in self._load_chunk(ci, {}).get(cid, [])]
        return np.asarray(times, dtype=np.int64)

    def _depth_image(self, data: memoryview, topic: str) -> np.ndarray:
        try:
            img = RawImage.FromString(bytes(data))
        except DecodeError as e:
            raise McapFormatError(self.path, f"depth image does not parse: {e}", topic) from None
        h, w = img.height, img.width
        if img.encoding != DEPTH_ENCODING or img.step != 2 * w or len(img.data) != h * img.step:
            raise McapFormatError(
                self.path, f"depth image {img.encoding} {w}x{h} step {img.step} with {len(img.data)} bytes", topic
            )
        return np.frombuffer(img.data, "<u2").astype(np.uint16).reshape(h, w)

    # -- proprio / actions -------------------------------------------------------------
    def read_streams(
        self, streams: Iterable[str] | None, start_ns: int, end_ns: int, *, memo: dict | None = None
    ) -> dict[str, SampleStream]:
        """Samples of each stream with start_ns <= t <= end_ns, exactly as recorded."""
        memo = {} if memo is None else memo
        names = self.streams if streams is None else list(streams)
        return {n: self._read_stream(n, start_ns, end_ns, memo) for n in names}

    def _read_stream(self, name: str, start_ns: int, end_ns: int, memo: dict) -> SampleStream:
        topic = stream_topic(name)
        cid = self._channel(topic, "stream")
        md = self.channels[cid].metadata
        block_ns = int(md.get("block_ns", 0))
        ts_parts: list[np.ndarray] = []
        field_parts: dict[str, list[np.ndarray]] = {}
        for j in self._chunk_range(cid, start_ns - block_ns, end_ns):
            for m in self._load_chunk(self._chunks_of[cid][j], memo).get(cid, []):
                if m.log_time < start_ns - block_ns or m.log_time > end_ns:
                    continue
                ts, fields = blocks.decode_block(m.data)
                ts_parts.append(ts)
                for f, a in fields.items():
                    field_parts.setdefault(f, []).append(a)
        names = [f for f in md.get("fields", "").split(",") if f] or list(field_parts)
        if not ts_parts:
            return SampleStream(name, np.empty(0, np.int64), {f: np.empty((0, 0)) for f in names}, {})
        ts = np.concatenate(ts_parts)
        order = np.argsort(ts, kind="stable")
        ts = ts[order]
        keep = (ts >= start_ns) & (ts <= end_ns)
        labels = {k[len("labels.") :]: v.split(",") for k, v in md.items() if k.startswith("labels.")}
        return SampleStream(name, ts[keep], {f: np.concatenate(field_parts[f])[order][keep] for f in names}, labels)

    def read_window(
        self,
        start_ns: int,
        end_ns: int,
        *,
        cameras: Iterable[str] | None = None,
        frame_times_ns: Sequence[int] = (),
        streams: Iterable[str] | None = None,
        tolerance_ns: int | None = None,
        decode: bool = True,
    ) -> tuple[dict[str, Frames], dict[str, SampleStream]]:
        """One training sample: frames at ``frame_times_ns`` plus every stream in the window."""
        if end_ns < start_ns:
            raise WindowError(self.path, f"window end {end_ns} before start {start_ns}")
        memo: dict = {}
        frames = (
            self.read_frames(cameras, frame_times_ns, tolerance_ns=tolerance_ns, decode=decode, memo=memo)
            if len(frame_times_ns)
            else {}
        )
        return frames, self.read_streams(streams, start_ns, end_ns, memo=memo)


class ChunkMessage(NamedTuple):
    log_time: int
    data: memoryview


_CHUNK_HEAD = struct.Struct("<BQQQQI")  # opcode, record length, start, end, uncompressed size, crc
_MESSAGE_HEAD = struct.Struct("<BQHIQQ")  # opcode, record length, channel, sequence, log, publish
_OP_CHUNK, _OP_MESSAGE = 0x06, 0x05


def parse_chunk(buf: bytes, validate_crc: bool = True) -> dict[int, list[ChunkMessage]]:
    """Messages of one Chunk record, by channel, sorted by log time; payloads are zero-copy views.

    Why not the mcap library's ``Chunk.read`` + ``breakup_chunk``: they copy every record
    into new objects, which for a multi-MB video chunk costs more than reading it.
    """
    op, _, _, _, size, crc = _CHUNK_HEAD.unpack_from(buf, 0)
    if op != _OP_CHUNK:
        raise ValueError(f"expected a chunk record, found opcode {op:#x}")
    pos = _CHUNK_HEAD.size
    (clen,) = struct.unpack_from("<I", buf, pos)
    compression = bytes(buf[pos + 4 : pos + 4 + clen]).decode()
    pos += 4 + clen
    (rlen,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    view = memoryview(buf)[pos : pos + rlen]
    if compression == "zstd":
        view = memoryview(zstandard.ZstdDecompressor().decompress(view, max_output_size=size))
    elif compression == "lz4":
        import lz4.frame

        view = memoryview(lz4.frame.decompress(view))
    elif compression:
        raise ValueError(f"unsupported chunk compression {compression!r}")
    if len(view) != size:
        raise ValueError(f"chunk records are {len(view)} bytes, index says {size}")
    if validate_crc and crc and zlib.crc32(view) != crc:
        raise ValueError(f"chunk CRC mismatch ({zlib.crc32(view):#x} != {crc:#x})")
    out: dict[int, list[ChunkMessage]] = {}
    pos, end = 0, len(view)
    while pos < end:
        op, length = view[pos], int.from_bytes(view[pos + 1 : pos + 9], "little")
        if op == _OP_MESSAGE:
            _, _, cid, _, log_time, _ = _MESSAGE_HEAD.unpack_from(view, pos)
            out.setdefault(cid, []).append(ChunkMessage(log_time, view[pos + _MESSAGE_HEAD.size : pos + 9 + length]))
        pos += 9 + length
    if pos != end:
        raise ValueError("chunk records overrun the chunk")
    for msgs in out.values():
        if any(a.log_time > b.log_time for a, b in zip(msgs, msgs[1:])):
            msgs.sort(key=lambda m: m.log_time)
    return out


def _video_payload(message_data: memoryview) -> bytes:
    """The Annex B bytes (field 3) of a serialized foxglove.CompressedVideo, found on the wire.

    Every field of CompressedVideo is length-delimited, so walking the tags is cheap; the
    protobuf runtime would copy and materialise the whole message first.
    """
    pos, end = 0, len(message_data)
    while pos < end:
        key, pos = blocks.read_varint(message_data, pos)
        if key & 7 != 2:
            return CompressedVideo.FromString(bytes(message_data)).data
        length, pos = blocks.read_varint(message_data, pos)
        if key >> 3 == 3:
            return bytes(message_data[pos : pos + length])
        pos += length
    return b""
