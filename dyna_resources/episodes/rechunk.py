"""Rewrite an MCAP episode with another chunk layout, without re-encoding anything.

A read profile is a training hyperparameter; changing it should cost a copy, not a
transcode. Also produces the baselines the storage benchmark compares against: one
chunk stream per topic, and the mcap library's default interleaved chunks.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from mcap.reader import make_reader
from mcap.writer import CompressionType, Writer

from .mcap_writer import GroupedChunkWriter
from .read_profile import ReadProfile
from .topics import EPISODE_METADATA

INTERLEAVED = "interleaved"


def rechunk(src: str | Path, dst: str | Path, profile: ReadProfile | str) -> None:
    """Copy ``src`` to ``dst`` chunked by ``profile`` (or ``"interleaved"``: mcap defaults)."""
    dst = Path(dst)
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            reader = make_reader(fin)
            summary = reader.get_summary()
            metadata = list(reader.iter_metadata())
            if profile == INTERLEAVED:
                _write_interleaved(reader, summary, metadata, fout)
            else:
                assert isinstance(profile, ReadProfile)  # the one string taken is INTERLEAVED
                _write_grouped(reader, summary, metadata, fout, profile)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_grouped(reader, summary, metadata, fout, profile: ReadProfile) -> None:
    episode: dict[str, str] = next((m.metadata for m in metadata if m.name == EPISODE_METADATA), {})
    header = reader.get_header()
    w = GroupedChunkWriter(
        fout,
        t0_ns=int(episode.get("start_ns", summary.statistics.message_start_time)),
        library=header.library,
        profile=header.profile,
    )
    gop_ns = next((int(c.metadata["gop_ns"]) for c in summary.channels.values() if "gop_ns" in c.metadata), None)
    for g in profile.groups:
        w.add_group(g.name, g.compression, gop_ns if g.window_s is None else int(round(g.window_s * 1e9)))
    schema_ids = {sid: w.register_schema(s.name, s.encoding, s.data) for sid, s in summary.schemas.items()}
    channel_ids = {
        cid: w.register_channel(
            c.topic, c.message_encoding, schema_ids.get(c.schema_id, 0), profile.group_of(c.topic).name, c.metadata
        )
        for cid, c in summary.channels.items()
    }
    for m in metadata:
        if m.name == EPISODE_METADATA:
            w.add_metadata(m.name, m.metadata)
    for _, channel, msg in reader.iter_messages(log_time_order=True):
        w.add_message(channel_ids[channel.id], msg.log_time, msg.data, msg.publish_time, msg.sequence)
    for m in metadata:
        if m.name != EPISODE_METADATA:
            w.add_metadata(m.name, m.metadata)
    w.finish()


def _write_interleaved(reader, summary, metadata, fout) -> None:
    header = reader.get_header()
    w = Writer(fout, compression=CompressionType.ZSTD)  # library defaults: 1 MiB chunks, all topics
    w.start(profile=header.profile, library=header.library)
    schema_ids = {sid: w.register_schema(s.name, s.encoding, s.data) for sid, s in summary.schemas.items()}
    channel_ids = {
        cid: w.register_channel(c.topic, c.message_encoding, schema_ids.get(c.schema_id, 0), c.metadata)
        for cid, c in summary.channels.items()
    }
    for m in metadata:
        w.add_metadata(m.name, m.metadata)
    for _, channel, msg in reader.iter_messages(log_time_order=True):
        w.add_message(channel_ids[channel.id], msg.log_time, msg.data, msg.publish_time, msg.sequence)
    w.finish()
