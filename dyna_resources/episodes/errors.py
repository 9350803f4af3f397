"""Typed errors for everything that can be wrong with an episode file.

Every error names the file, the stream (when one is at fault) and the reason, so
that a quarantine record or a log line is enough to find and fix the input.
"""

from __future__ import annotations


class EpisodeError(Exception):
    """Base class: an episode could not be read or written."""

    kind = "episode"

    def __init__(self, path: str, reason: str | None = None, stream: str | None = None):
        if reason is None:  # one message, as PyTorch's DataLoader rebuilds a worker's error in the main process
            path, reason = "", str(path)
        self.path = str(path)
        self.stream = stream
        self.reason = reason
        where = f"{self.path}" + (f" [{stream}]" if stream else "")
        super().__init__(f"{where}: {reason}" if where else reason)

    def __reduce__(self):  # pickled (a worker's result) as it was made, not from its message alone
        return _rebuild, (type(self), self.args, self.__dict__)

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

    def __init__(self, path: str, stream: str | None = None, frame_index: int = -1, reason: str | None = None):
        if reason is None:  # one message (DataLoader's rebuild)
            super().__init__(path)
        else:
            super().__init__(path, f"frame {frame_index}: {reason}", stream=stream)
        self.frame_index = frame_index


class McapFormatError(EpisodeError):
    """An MCAP episode is unreadable or lacks what the reader needs."""

    kind = "mcap_format"


class WindowError(EpisodeError):
    """A requested time window or frame is outside what the episode holds."""

    kind = "window"


def _rebuild(cls: type[EpisodeError], args: tuple, state: dict) -> EpisodeError:
    e = Exception.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e
