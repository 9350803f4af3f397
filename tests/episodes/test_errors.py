"""Episode errors keep their type and fields across processes: pickled (a worker's result) and rebuilt
from their message alone, as PyTorch's DataLoader re-raises a worker's error in the main process."""

from __future__ import annotations

import pickle

import pytest

from dyna_resources.episodes.errors import CorruptFrameError, EpisodeError, McapFormatError, WindowError
from dyna_resources.sources.detect import UnknownFormatError

ERRORS = [
    EpisodeError("ep.h5", "truncated", "/observations/images/wrist"),
    CorruptFrameError("ep.h5", "/observations/images/wrist", 7, "not a JPEG"),
    McapFormatError("s3://b/ep.mcap", "no footer"),
    WindowError("", "every sample of batch 3 failed"),
    UnknownFormatError("drop/x.bin", "none of the formats"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_pickled_episode_error_comes_back_the_same(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.__dict__ == error.__dict__
    assert back.as_record() == error.as_record()


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_episode_error_is_rebuilt_from_its_message_alone(error):
    message = f"Caught {type(error).__name__} in DataLoader worker process 0.\nOriginal Traceback: {error}"
    rebuilt = type(error)(message)
    assert type(rebuilt) is type(error) and str(rebuilt) == message
    assert rebuilt.reason == message and rebuilt.path == ""


def test_messages_name_the_file_stream_and_frame():
    assert str(ERRORS[1]) == "ep.h5 [/observations/images/wrist]: frame 7: not a JPEG"
    assert ERRORS[1].frame_index == 7 and ERRORS[1].stream == "/observations/images/wrist"
    assert str(ERRORS[3]) == "every sample of batch 3 failed"  # no file: no empty name before the reason
