"""arrow_reads' pieces that the CDC tests do not reach one by one: exact rebatching, and the read-ahead
thread's hand-over of batches, errors and early stops."""

import threading

import pyarrow as pa
import pytest

from dyna_resources.catalog.arrow_reads import read_ahead, rebatch

SCHEMA = pa.schema([("x", pa.int64())])


def batches(sizes, seen=None, fail_at=None):
    start = 0
    for i, n in enumerate(sizes):
        if i == fail_at:
            raise OSError("the store went away at batch 2")
        if seen is not None:
            seen.append(i)
        yield pa.RecordBatch.from_arrays([pa.array(range(start, start + n), pa.int64())], schema=SCHEMA)
        start += n


def test_rebatch_gives_batches_of_exactly_the_size_asked_whatever_the_driver_read():
    out = list(rebatch(batches([3, 10, 1, 0, 7, 2]), 4, SCHEMA))
    assert [b.num_rows for b in out] == [4, 4, 4, 4, 4, 3]
    assert pa.Table.from_batches(out).column("x").to_pylist() == list(range(23))


def test_read_ahead_hands_over_every_batch_in_order():
    with read_ahead(batches([5] * 20)) as ahead:
        got = [v for b in ahead for v in b.column("x").to_pylist()]
    assert got == list(range(100))


def test_read_ahead_raises_the_sources_error_in_the_consumer():
    with pytest.raises(OSError, match="went away at batch 2"), read_ahead(batches([5] * 5, fail_at=2)) as ahead:
        assert [b.num_rows for b in ahead] == [5, 5]


def test_a_consumer_that_stops_early_leaves_no_thread_reading_the_source():
    seen: list[int] = []
    with read_ahead(batches([1] * 1000, seen)) as ahead:
        next(ahead)
    assert not [t for t in threading.enumerate() if t.name == "arrow-read-ahead"]
    assert len(seen) <= 3  # one handed over, one queued, one the thread held when told to stop


def test_strings_from_buffers_equal_pyarrows_own():
    from dyna_resources.catalog.arrow_reads import strings

    values = ["syn-000000001", "", "épisode-ü", "x" * 300, "日本"]
    got = strings(values)
    assert got.type == pa.string()
    assert got.to_pylist() == values
    assert strings([]).to_pylist() == []
