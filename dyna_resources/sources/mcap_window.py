"""The bytes of an MCAP file that a reader of one log-time window needs, found by ranged reads: so that a
worker staging one episode of a long bag from an object store copies that episode's chunks, not the bag.

What rosbags' MCAP reader reads for ``messages(start=, stop=)``: everything before the first chunk (the
magic, the header, schemas and channels written outside chunks), the chunks whose message times overlap
the window with their message indexes, and everything after the last chunk (the metadata records, the
summary with its chunk indexes, the footer). A copy holding those ranges at their offsets, zeros
elsewhere (a sparse file), reads the window's messages exactly as the whole file does.

The ``mcap`` library parses the footer and the summary; what it lacks is reading them from anything but
a seekable file, so :class:`_Ranged` adapts a function reading ``[start, end)``.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from mcap.exceptions import McapError
from mcap.reader import SeekingReader

ReadRange = Callable[[int, int], bytes]  # bytes [start, end) of the file


class _Ranged(io.RawIOBase):
    def __init__(self, read: ReadRange, size: int):
        self._read, self._size, self._pos = read, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        end = min(self._size, self._pos + len(buffer))
        if end <= self._pos:
            return 0
        data = self._read(self._pos, end)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def window_ranges(read: ReadRange, size: int, start_ns: int, stop_ns: int) -> list[tuple[int, int]] | None:
    """The ``[start, end)`` byte ranges of the MCAP file of ``size`` bytes that hold its messages logged in
    ``[start_ns, stop_ns)`` and what a reader needs to find them, in file order; ``None`` when the file has
    no chunk index (a reader must then scan it whole)."""
    stream = io.BufferedReader(_Ranged(read, size), buffer_size=1 << 16)
    try:
        summary = SeekingReader(stream).get_summary()
    except (McapError, ValueError, EOFError):
        return None
    if summary is None or not summary.chunk_indexes:
        return None
    chunks = sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset)
    first = chunks[0].chunk_start_offset
    last = max(c.chunk_start_offset + c.chunk_length + c.message_index_length for c in chunks)
    ranges = [(0, first)]
    for c in chunks:
        if c.message_start_time < stop_ns and c.message_end_time >= start_ns:
            ranges.append((c.chunk_start_offset, c.chunk_start_offset + c.chunk_length + c.message_index_length))
    ranges.append((last, size))
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        elif hi > lo:
            merged.append((lo, hi))
    return merged


__all__ = ["ReadRange", "window_ranges"]
