"""An MCAP writer with one open chunk per topic group and per-group compression.

What the mcap library's ``Writer`` lacked: it has a single chunk builder and one
compression for the whole file, so two groups written side by side would share
chunks, and its chunk builder is private (``mcap._chunk_builder``). This writer reuses the
library's public record classes; the bookkeeping of several open chunks, and the few lines of
one chunk's builder (:class:`_ChunkRecords`), are ours.

A group's chunk closes when a message arrives for a later time window of that group
(windows are fixed-length from ``t0_ns``), on ``close_group``, or at ``finish``. So at
most one window per group is ever in memory, however long the episode.
"""

from __future__ import annotations

import struct
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import IO

import zstandard
from mcap.data_stream import RecordBuilder
from mcap.opcode import Opcode
from mcap.records import (
    Channel,
    Chunk,
    ChunkIndex,
    DataEnd,
    Footer,
    Header,
    Message,
    MessageIndex,
    Metadata,
    MetadataIndex,
    Schema,
    Statistics,
    SummaryOffset,
)
from mcap.writer import MCAP0_MAGIC

try:
    import lz4.frame
except ImportError:  # lz4 is optional; zstd and none always work
    lz4 = None


class _ChunkRecords:
    """The records of one open chunk and its message index, per channel: (log time, offset in the chunk)."""

    def __init__(self) -> None:
        self.records = RecordBuilder()
        self.message_indices: dict[int, MessageIndex] = {}
        self.message_start_time = 0
        self.message_end_time = 0
        self.num_messages = 0

    def add_message(self, message: Message) -> None:
        t = message.log_time
        self.message_start_time = t if self.num_messages == 0 else min(self.message_start_time, t)
        self.message_end_time = max(self.message_end_time, t)
        index = self.message_indices.get(message.channel_id)
        if index is None:
            index = self.message_indices[message.channel_id] = MessageIndex(channel_id=message.channel_id, records=[])
        index.records.append((t, self.records.count))
        self.num_messages += 1
        message.write(self.records)

    def end(self) -> bytes:
        return self.records.end()

    def reset(self) -> None:
        self.records.end()
        self.message_indices = {}
        self.message_start_time = self.message_end_time = self.num_messages = 0


@dataclass
class _Group:
    name: str
    compression: str
    window_ns: int | None  # None: chunks close only when told
    builder: _ChunkRecords = field(default_factory=_ChunkRecords)
    window: int | None = None  # index of the window the open chunk belongs to


class GroupedChunkWriter:
    def __init__(self, stream: IO[bytes], *, t0_ns: int = 0, library: str = "dyna", profile: str = ""):
        self._stream = stream
        self._t0 = t0_ns
        self._rb = RecordBuilder()
        self._data_crc = 0
        self._groups: dict[str, _Group] = {}
        self._channel_group: dict[int, _Group] = {}
        self._schemas: dict[int, Schema] = {}
        self._channels: dict[int, Channel] = {}
        self._chunk_indexes: list[ChunkIndex] = []
        self._metadata_indexes: list[MetadataIndex] = []
        self._stats = Statistics(
            message_count=0,
            schema_count=0,
            channel_count=0,
            attachment_count=0,
            metadata_count=0,
            chunk_count=0,
            message_start_time=0,
            message_end_time=0,
            channel_message_counts=defaultdict(int),
        )
        self._write_raw(MCAP0_MAGIC)
        Header(profile=profile, library=library).write(self._rb)
        self._flush()

    # -- registration -------------------------------------------------------------
    def add_group(self, name: str, compression: str = "zstd", window_ns: int | None = None) -> None:
        if compression == "lz4" and lz4 is None:
            raise ValueError("lz4 compression requested but the lz4 package is not installed")
        self._groups[name] = _Group(name, compression, window_ns)

    def register_schema(self, name: str, encoding: str, data: bytes) -> int:
        schema = Schema(id=len(self._schemas) + 1, name=name, encoding=encoding, data=data)
        self._schemas[schema.id] = schema
        self._stats.schema_count += 1
        schema.write(self._rb)
        self._flush()
        return schema.id

    def register_channel(
        self, topic: str, message_encoding: str, schema_id: int, group: str, metadata: dict[str, str] | None = None
    ) -> int:
        channel = Channel(
            id=len(self._channels) + 1,
            topic=topic,
            message_encoding=message_encoding,
            schema_id=schema_id,
            metadata=dict(metadata or {}),
        )
        self._channels[channel.id] = channel
        self._channel_group[channel.id] = self._groups[group]
        self._stats.channel_count += 1
        channel.write(self._rb)
        self._flush()
        return channel.id

    # -- data ---------------------------------------------------------------------
    def add_message(
        self, channel_id: int, log_time: int, data: bytes, publish_time: int | None = None, sequence: int = 0
    ) -> None:
        g = self._channel_group[channel_id]
        if g.window_ns is not None:
            window = (log_time - self._t0) // g.window_ns
            if g.window is not None and window != g.window:
                self._finalize(g)
            g.window = window
        msg = Message(
            channel_id=channel_id,
            log_time=log_time,
            data=data,
            publish_time=log_time if publish_time is None else publish_time,
            sequence=sequence,
        )
        s = self._stats
        s.message_start_time = log_time if s.message_count == 0 else min(s.message_start_time, log_time)
        s.message_end_time = max(s.message_end_time, log_time)
        s.message_count += 1
        s.channel_message_counts[channel_id] += 1
        g.builder.add_message(msg)

    def close_group(self, group: str) -> None:
        """Close the open chunk of ``group`` (e.g. at a GOP boundary)."""
        self._finalize(self._groups[group])

    def add_metadata(self, name: str, data: dict[str, str]) -> None:
        offset = self._offset()
        Metadata(name=name, metadata=data).write(self._rb)
        self._metadata_indexes.append(MetadataIndex(offset=offset, length=self._rb.count, name=name))
        self._stats.metadata_count += 1
        self._flush()

    def _finalize(self, g: _Group) -> None:
        b = g.builder
        g.window = None
        if b.num_messages == 0:
            return
        raw = b.end()
        if g.compression == "zstd":
            payload, compression = zstandard.compress(raw), "zstd"
        elif g.compression == "lz4":
            payload, compression = lz4.frame.compress(raw), "lz4"
        else:
            payload, compression = raw, ""
        chunk = Chunk(
            message_start_time=b.message_start_time,
            message_end_time=b.message_end_time,
            uncompressed_size=len(raw),
            uncompressed_crc=zlib.crc32(raw),
            compression=compression,
            data=payload,
        )
        start = self._offset()
        chunk.write(self._rb)
        length = self._rb.count
        self._flush()
        index_start = self._offset()
        offsets = {}
        for cid, mi in sorted(b.message_indices.items()):
            offsets[cid] = index_start + self._rb.count
            mi.write(self._rb)
        index_length = self._rb.count
        self._flush()
        self._chunk_indexes.append(
            ChunkIndex(
                message_start_time=chunk.message_start_time,
                message_end_time=chunk.message_end_time,
                chunk_start_offset=start,
                chunk_length=length,
                message_index_offsets=offsets,
                message_index_length=index_length,
                compression=compression,
                compressed_size=len(payload),
                uncompressed_size=len(raw),
            )
        )
        self._stats.chunk_count += 1
        b.reset()

    # -- end ----------------------------------------------------------------------
    def finish(self) -> None:
        for g in self._groups.values():
            self._finalize(g)
        DataEnd(data_section_crc=self._data_crc).write(self._rb)
        self._flush()
        summary_start = self._offset()
        sb = RecordBuilder()
        offsets: list[SummaryOffset] = []

        def group(opcode: Opcode, records) -> None:
            begin = sb.count
            for r in records:
                r.write(sb)
            if sb.count > begin:
                offsets.append(
                    SummaryOffset(group_opcode=opcode, group_start=summary_start + begin, group_length=sb.count - begin)
                )

        group(Opcode.SCHEMA, self._schemas.values())
        group(Opcode.CHANNEL, self._channels.values())
        group(Opcode.STATISTICS, [self._stats])
        group(Opcode.CHUNK_INDEX, self._chunk_indexes)
        group(Opcode.METADATA_INDEX, self._metadata_indexes)
        summary_offset_start = summary_start + sb.count
        for o in offsets:
            o.write(sb)
        summary = sb.end()
        crc = zlib.crc32(summary)
        crc = zlib.crc32(struct.pack("<BQQQ", Opcode.FOOTER, 8 + 8 + 4, summary_start, summary_offset_start), crc)
        self._stream.write(summary)
        Footer(summary_start=summary_start, summary_offset_start=summary_offset_start, summary_crc=crc).write(self._rb)
        self._stream.write(self._rb.end())
        self._stream.write(MCAP0_MAGIC)
        self._stream.flush()

    @property
    def chunk_indexes(self) -> list[ChunkIndex]:
        return self._chunk_indexes

    # -- plumbing -----------------------------------------------------------------
    def _offset(self) -> int:
        return self._stream.tell() + self._rb.count

    def _flush(self) -> None:
        data = self._rb.end()
        self._write_raw(data)

    def _write_raw(self, data: bytes) -> None:
        self._data_crc = zlib.crc32(data, self._data_crc)
        self._stream.write(data)
