"""The GOP-aware loader: exactly once per epoch across workers and ranks, exact resume under another
worker count, frames across GOP edges, clips at the requested times, decodes per delivered frame
counted, and a damaged GOP failing only its own samples."""

from __future__ import annotations

import shutil
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from torch.utils.data import DataLoader

from dyna_resources.episodes.errors import WindowError
from dyna_resources.episodes.gop_decode import swscale_rgb
from dyna_resources.episodes.mcap_reader import EpisodeReader, FrameCache, parse_chunk
from trainer.dataset import ManifestDataset, SampleSpec, worker_init_threads
from trainer.gop_dataset import GopDataset
from trainer.sampling import plan_samples

SPARSE = SampleSpec(image_size=(32, 32))
DENSE = SampleSpec(image_size=(32, 32), anchors="every", anchor_every_s=0.1)


def loader(ds, workers):
    return DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        worker_init_fn=worker_init_threads if workers else None,
        multiprocessing_context="fork" if workers else None,
    )


def keys(batches) -> list[list[tuple[int, int]]]:
    return [list(zip(b["row"].tolist(), b["anchor_ns"].tolist(), strict=True)) for b in batches]


def flat(batches) -> list[tuple[int, int]]:
    return [k for b in keys(batches) for k in b]


@pytest.mark.parametrize("spec", [SPARSE, DENSE], ids=["sparse", "dense"])
def test_every_sample_once_per_epoch_across_workers_and_ranks(mcap_fleet, spec):
    _, manifest = mcap_fleet
    got = []
    for rank in range(2):
        ds = GopDataset(manifest, spec, batch_size=3, rank=rank, world=2, seed=5, lanes=2, unit_s=1.0)
        plan = ds.plan
        expected = {(ds.first_row + int(plan.row[i]), int(plan.anchor_ns[i])) for i in range(ds.rows)}
        mine = flat(loader(ds, 2))
        assert len(mine) == len(set(mine)) == ds.rows == ds.batches_per_epoch * 3
        assert set(mine) == expected
        got += mine
    assert len(got) == len(set(got))  # ranks are disjoint
    per_rank = len(got) // 2
    assert got[:per_rank] != sorted(got[:per_rank])  # shuffled


def test_dense_anchors_fill_each_segment_and_ranks_get_equal_counts(mcap_fleet):
    _, manifest = mcap_fleet
    ds = GopDataset(manifest, DENSE, batch_size=2, rank=0, world=2, lanes=2)
    other = GopDataset(manifest, DENSE, batch_size=2, rank=1, world=2, lanes=2)
    assert ds.rows == other.rows and ds.rows % (2 * 2) == 0
    # 2 s segments with an anchor every 0.1 s: 20 per segment, at start + k * 0.1 s
    start = manifest.column("start_ns").to_numpy()
    first = ds.plan.anchor_ns[ds.plan.row == 0]
    assert len(first) == 20 and first[0] == start[0] and np.all(np.diff(first) == 100_000_000)


def test_resume_mid_epoch_continues_the_exact_sequence_under_another_worker_count(mcap_fleet):
    _, manifest = mcap_fleet
    make = lambda: GopDataset(manifest, DENSE, batch_size=4, seed=3, lanes=4, unit_s=1.0)
    whole = keys(loader(make(), 0))
    assert keys(loader(make(), 2)) == whole  # the worker count does not change the sequence
    ds = make()
    ds.advance(5)  # a checkpoint five batches in, resumed with four workers
    assert keys(loader(ds, 4)) == whole[5:]
    with pytest.raises(ValueError, match="do not divide lanes"):
        next(iter(loader(make(), 3)))


def test_position_rolls_over_and_a_continuous_stream_crosses_epochs(mcap_fleet):
    _, manifest = mcap_fleet
    make = lambda **kw: GopDataset(manifest, SPARSE, batch_size=2, seed=4, lanes=2, **kw)
    ref = make()
    expected = []
    for epoch in range(2):
        ref.position.epoch = epoch
        expected += keys(loader(ref, 0))
    assert expected[: ref.batches_per_epoch] != expected[ref.batches_per_epoch :]  # a new order each epoch
    ds = make(continuous=True)
    ds.advance(3)
    it = iter(loader(ds, 2))
    assert [keys([next(it)])[0] for _ in range(len(expected) - 3)] == expected[3:]


def test_frames_across_a_gop_edge_match_decoding_them_directly(mcap_fleet):
    paths, manifest = mcap_fleet
    # 1 s GOPs, 0.5 s units: samples whose frames (anchor -0.5 s .. +0.5 s) cross GOP edges
    ds = GopDataset(manifest, DENSE, batch_size=4, seed=1, lanes=1, unit_s=0.5)
    reader_of = {}
    starts, ends = manifest.column("start_ns").to_numpy(), manifest.column("end_ns").to_numpy()
    checked = crossing = 0
    for batch in loader(ds, 0):
        for b in range(len(batch["row"])):
            row, anchor = int(batch["row"][b]), int(batch["anchor_ns"][b])
            uri = manifest.column("uri")[row].as_py()
            r = reader_of.setdefault(uri, EpisodeReader(uri.removeprefix("file://")))
            mine = np.array([u == uri for u in manifest.column("uri").to_pylist()])
            ep_lo, ep_hi = starts[mine].min(), ends[mine].max()  # the episode's span: times are clamped to it
            times = np.clip(anchor + DENSE.all_frame_offsets_ns(), ep_lo, ep_hi)
            gop_ns = int(r.channels[r.topic_ids["/camera/wrist"]].metadata["gop_ns"])
            crossing += len({(t - r.start_ns) // gop_ns for t in times}) > 1
            direct = r.read_frames(r.cameras, times, cache=FrameCache(swscale_rgb(32, 32)))
            images = np.concatenate([batch["frames"][b].numpy(), batch["future"][b].numpy()[:, None]], axis=1)
            for c, cam in enumerate(r.cameras):
                assert np.array_equal(images[c], direct[cam].images), (row, anchor, cam)
            checked += 1
        if checked >= 40:
            break
    assert crossing >= 5


def test_decodes_per_delivered_frame_are_counted_and_dense_units_decode_each_frame_about_once(mcap_fleet):
    _, manifest = mcap_fleet
    # Non-overlapping 2 s segments, as the loader benchmark cuts them.
    starts = manifest.column("start_ns").to_numpy()
    keep = np.zeros(len(starts), bool)
    uris = manifest.column("uri").to_pylist()
    for u in set(uris):
        idx = [i for i, x in enumerate(uris) if x == u]
        keep[idx[::4]] = True  # stride 2 s of the fixture's 0.5 s
    segments = manifest.filter(keep)
    ds = GopDataset(segments, DENSE, batch_size=4, lanes=1, unit_s=2.0, mix_units=1)
    decoded = delivered = 0
    for batch in loader(ds, 0):
        decoded += int(batch["decoded_frames"])
        delivered += int(batch["delivered_frames"])
    assert delivered == ds.rows * 3 * 3  # 3 cameras, 2 frames + the future frame
    assert decoded / delivered <= 1.2
    # The same samples read at random, each from its keyframe: many more decodes per frame.
    rand = ManifestDataset(segments, DENSE, batch_size=4, frames_per_reader=16)
    rand_decoded = 0
    for i in range(ds.rows):
        _, cache, _ = rand._reader(rand.sample_uri(i), rand._readers)
        before = cache.decoded
        rand.sample(i, rand._readers)
        rand_decoded += cache.decoded - before
    assert rand_decoded > 2 * decoded


def test_clip_samples_return_the_requested_timestamps(mcap_fleet):
    paths, manifest = mcap_fleet
    spec = SampleSpec(
        image_size=(16, 16), anchors="every", anchor_every_s=0.5, clip_frames=8, clip_hz=10.0, future_frame_s=0.3
    )
    ds = GopDataset(manifest, spec, batch_size=2, lanes=1, unit_s=1.0)
    batch = next(iter(loader(ds, 0)))
    assert tuple(batch["frames"].shape) == (2, 3, 8, 3, 16, 16)
    offsets = spec.frame_offsets_ns()
    assert np.array_equal(offsets, -np.arange(7, -1, -1) * 100_000_000)
    i = int(ds.batch_samples(0, 0)[0])
    unit = ds.decode_unit(np.array([i]))
    lo, hi = unit.lo, unit.hi
    requested = np.clip(int(ds.plan.anchor_ns[i]) + spec.all_frame_offsets_ns(), lo, hi)
    for f in unit.frames:
        # every frame is the nearest recorded one: within half a frame period of what was asked (30 Hz)
        assert np.all(np.abs(f.timestamps_ns - requested) <= 1e9 / 30 / 2 + 1e6), f.camera


def test_a_damaged_gop_fails_only_its_own_samples_naming_episode_camera_and_time(mcap_fleet, tmp_path):
    paths, manifest = mcap_fleet
    src = paths[0]
    bad = tmp_path / "ep0-damaged.mcap"
    shutil.copy(src, bad)
    with EpisodeReader(src) as r:
        cid = r.topic_ids["/camera/wrist"]
        chunk = r.chunks_of("/camera/wrist")[2]  # the third GOP: 2 s .. 3 s
    # Garble the slice data of every wrist frame in that GOP, keeping the MCAP's own records (and their
    # CRC) intact: the file reads, the H.264 does not decode.
    data = bytearray(bad.read_bytes())
    with EpisodeReader(bad, validate_crcs=False) as r:
        buf = r._src.read(chunk.chunk_start_offset, chunk.chunk_length, "chunk")
    msgs = parse_chunk(buf, validate_crc=False)[cid]
    base = chunk.chunk_start_offset
    for m in msgs:
        at, n = base + buf.find(bytes(m.data)), len(m.data)  # the serialized CompressedVideo message
        # the middle of its H.264 bytes (field 3); the trailing format field ("h264") stays intact
        data[at + n // 3 : at + n - 8] = bytes(b ^ 0xA5 for b in data[at + n // 3 : at + n - 8])
    # the chunk's CRC no longer matches: recompute it so only the video is damaged
    op, rec_len, start, end, size, _crc = struct.unpack_from("<BQQQQI", data, base)
    records_at = base + struct.calcsize("<BQQQQI")
    (clen,) = struct.unpack_from("<I", data, records_at)
    rec_start = records_at + 4 + clen + 8
    struct.pack_into("<I", data, base + 1 + 8 + 8 + 8 + 8, zlib.crc32(bytes(data[rec_start : rec_start + size])))
    bad.write_bytes(bytes(data))

    uri = f"file://{bad}"
    rows = manifest.filter(np.array([u == f"file://{src}" for u in manifest.column("uri").to_pylist()]))
    rows = rows.set_column(rows.column_names.index("uri"), "uri", pa.array([uri] * rows.num_rows))
    spec = SampleSpec(
        image_size=(16, 16),
        anchors="every",
        anchor_every_s=0.1,
        frame_offsets_s=(0.0,),
        future_frame_s=0.0,
        cameras=("wrist",),
        proprio_steps=2,
        action_chunk=2,
    )
    skip = GopDataset(rows, spec, batch_size=2, lanes=1, unit_s=4.0, bad_samples="skip", mix_units=1)
    with EpisodeReader(src) as r:
        frame_times = np.array([t for t, _ in r.iter_video("wrist")])

    def in_bad_gop(anchors: np.ndarray) -> np.ndarray:  # the frame each anchor reads lies in the damaged GOP
        nearest = frame_times[np.abs(frame_times[None, :] - anchors[:, None]).argmin(axis=1)]
        return (nearest >= chunk.message_start_time) & (nearest <= chunk.message_end_time)

    got = flat(loader(skip, 0))
    assert len(got) > 0 and not in_bad_gop(np.array([a for _, a in got])).any()  # the damaged GOP's samples are out ...
    skipped = sum(int(b["skipped"]) for b in loader(skip, 0))
    assert skipped == int(in_bad_gop(skip.plan.anchor_ns[: skip.rows]).sum()) > 0  # ... exactly those, counted
    strict = GopDataset(rows, spec, batch_size=2, lanes=1, unit_s=4.0, mix_units=1)
    with pytest.raises(WindowError) as e:
        for _ in loader(strict, 0):
            pass
    msg = str(e.value)
    assert str(bad) in msg and "/camera/wrist" in msg and "decode failed in the GOP starting at" in msg
    with pytest.raises(WindowError) as e:  # from a DataLoader worker: the same type, its message kept
        for _ in loader(strict, 1):
            pass
    assert str(e.value).startswith("Caught WindowError in DataLoader worker process 0")
    assert str(bad) in str(e.value) and "decode failed in the GOP starting at" in str(e.value)


def test_sample_plan_clamps_to_the_episode_and_marks_padding(mcap_fleet):
    _, manifest = mcap_fleet
    ds = GopDataset(manifest, DENSE, batch_size=2, lanes=1)
    batch = next(iter(loader(ds, 0)))
    assert batch["proprio_is_pad"].dtype.is_floating_point is False
    plan = plan_samples(
        np.array([0, 10]), np.array([10, 20]), np.array([0, 0]), 1, anchors="every", every_ns=4, end_offset_ns=0
    )
    assert plan.anchor_ns.tolist() == [0, 4, 8, 10, 14, 18] and plan.lo_ns[0] == 0 and plan.hi_ns[0] == 20
