"""Typed errors for everything that can be wrong with an episode file.

Every error names the file, the stream (when one is at fault) and the reason, so
that a quarantine record or a log line is enough to find and fix the input.
"""

from __future__ import annotations


class EpisodeError(Exception):
    """Base class: an episode could not be read or written."""

    kind = "episode"

    def __init__(self, path: str, reason: str, stream: str | None = None):
        self.path = str(path)
        self.stream = stream
        self.reason = reason
        where = f"{self.path}" + (f" [{stream}]" if stream else "")
        super().__init__(f"{where}: {reason}")

    def as_record(self) -> dict:
        """A flat record for quarantine tables and asset metadata."""
        return {"kind": self.kind, "path": self.path, "stream": self.stream, "reason": self.reason}


class RawFormatError(EpisodeError):
    """The file is not a readable legacy episode: truncated, not HDF5, bad shapes."""

    kind = "raw_format"


class ExternalDataError(RawFormatError):
    """The file reaches outside itself: HDF5 external storage, an external link, a virtual
    dataset, or a soft link that does not resolve inside the file. Refused before any byte of
    what it points at is read; ``stream`` is the HDF5 path of the dataset or link at fault."""

    kind = "external_data"


class MissingStreamError(RawFormatError):
    """A stream the format requires is absent."""

    kind = "missing_stream"


class TimestampError(EpisodeError):
    """Timestamps of a stream are not strictly increasing (or do not match its data)."""

    kind = "timestamps"


class CorruptFrameError(EpisodeError):
    """A camera frame could not be decoded."""

    kind = "corrupt_frame"

    def __init__(self, path: str, stream: str, frame_index: int, reason: str):
        self.frame_index = frame_index
        super().__init__(path, f"frame {frame_index}: {reason}", stream=stream)


class McapFormatError(EpisodeError):
    """An MCAP episode is unreadable or lacks what the reader needs."""

    kind = "mcap_format"


class WindowError(EpisodeError):
    """A requested time window or frame is outside what the episode holds."""

    kind = "window"
