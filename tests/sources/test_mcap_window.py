"""The byte ranges of a bag's MCAP that one episode's window needs: a sparse copy holding only them reads
that episode exactly as the whole file does, and holds none of the chunks outside its window."""

from __future__ import annotations

import shutil

import pytest
from mcap.reader import SeekingReader

from dyna_resources.sources.mcap_window import window_ranges
from dyna_resources.sources.ros2 import plan_bag, read_member
from dyna_resources.sources.topic_map import parse

from .bags import BagSpec, topic_map_yaml, write_bag

SPEC = BagSpec(width=320, height=240, duration_s=24.0, pauses=(8.0, 16.0))  # ~10 MB: ~10 chunks of ~1 MB


def _reader_of(path):
    def read(lo: int, hi: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(lo)
            return f.read(hi - lo)

    return read


def sparse_copy(bag, dest, start, stop) -> list[tuple[int, int]]:
    (storage,) = bag.glob("*.mcap")
    size = storage.stat().st_size
    ranges = window_ranges(_reader_of(storage), size, start, stop)
    assert ranges is not None
    dest.mkdir()
    shutil.copy(bag / "metadata.yaml", dest)
    read = _reader_of(storage)
    with open(dest / storage.name, "wb") as f:
        f.truncate(size)
        for lo, hi in ranges:
            f.seek(lo)
            f.write(read(lo, hi))
    return ranges


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("window") / "bag"
    write_bag(path, SPEC)
    return path


def test_a_sparse_copy_of_a_window_reads_that_episode_as_the_whole_bag_does(bag, tmp_path):
    topics = parse(topic_map_yaml(SPEC, split={"rule": "gap", "gap_s": 2.0}), "t")
    members = plan_bag(bag, topics)
    (storage,) = bag.glob("*.mcap")
    with open(storage, "rb") as f:
        chunks = SeekingReader(f).get_summary().chunk_indexes
    assert len(chunks) >= 8
    for k, m in enumerate(members):
        ranges = sparse_copy(bag, tmp_path / f"m{k}", m.log_lo, m.log_hi)
        whole, part = read_member(bag, topics, m), read_member(tmp_path / f"m{k}", topics, m)
        for name, cam in whole.cameras.items():
            assert part.cameras[name].timestamps_ns.tolist() == cam.timestamps_ns.tolist()
            assert list(part.cameras[name].frames) == list(cam.frames)
        for name, s in whole.streams.items():
            assert part.streams[name].timestamps_ns.tolist() == s.timestamps_ns.tolist()
        fetched = [c for c in chunks if any(lo <= c.chunk_start_offset < hi for lo, hi in ranges)]
        assert all(c.message_start_time < m.log_hi and c.message_end_time >= m.log_lo for c in fetched)
        assert 0 < len(fetched) < len(chunks)  # its own chunks, and not the others'


def test_a_file_that_is_no_indexed_mcap_has_no_ranges(tmp_path):
    junk = tmp_path / "x.mcap"
    junk.write_bytes(b"\x89MCAP0\r\n" + b"\x00" * 100)
    assert window_ranges(_reader_of(junk), junk.stat().st_size, 0, 1) is None
