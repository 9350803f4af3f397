import numpy as np
import pytest

from dyna_resources.episodes import blocks


def _sample(n=200, seed=0):
    rng = np.random.default_rng(seed)
    ts = 1_700_000_000_000_000_000 + np.cumsum(rng.integers(4_900_000, 5_100_000, n))
    return ts, {
        "position": rng.normal(size=(n, 7)),
        "velocity": rng.normal(size=(n, 7)),
        "gripper": rng.normal(size=(n, 1)),
    }


def test_round_trip_is_exact():
    ts, fields = _sample()
    got_ts, got = blocks.decode_block(blocks.encode_block(ts, fields))
    assert got_ts.dtype == np.int64 and np.array_equal(got_ts, ts)
    assert list(got) == list(fields)
    for k in fields:
        assert np.array_equal(got[k], fields[k])


def test_bytes_are_standard_protobuf_both_ways():
    ts, fields = _sample(50, seed=1)
    cls = blocks.protobuf_class()
    parsed = cls.FromString(blocks.encode_block(ts, fields))
    assert list(parsed.timestamp_ns) == ts.tolist()
    assert [f.name for f in parsed.fields] == list(fields)
    assert np.array_equal(np.array(parsed.fields[0].values).reshape(-1, parsed.fields[0].width), fields["position"])
    # what the protobuf runtime writes, our decoder reads
    msg = cls(timestamp_ns=ts.tolist())
    for name, a in fields.items():
        msg.fields.add(name=name, width=a.shape[1], values=a.ravel().tolist())
    got_ts, got = blocks.decode_block(msg.SerializeToString())
    assert np.array_equal(got_ts, ts) and all(np.array_equal(got[k], fields[k]) for k in fields)


def test_empty_block_and_schema_descriptor():
    got_ts, got = blocks.decode_block(blocks.encode_block(np.empty(0, np.int64), {"x": np.empty((0, 3))}))
    assert len(got_ts) == 0 and got["x"].shape == (0, 3)
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString(blocks.file_descriptor_set_bytes())
    assert [m.name for m in fds.file[0].message_type] == ["Field", "SampleBlock"]


def test_row_count_mismatch_is_rejected():
    with pytest.raises(ValueError, match="rows"):
        blocks.encode_block(np.arange(3), {"x": np.zeros((4, 2))})
