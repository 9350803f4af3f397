"""The training dataset: exactly-once per epoch across workers and ranks, exact resume, explicit
tolerances, reads through the page cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dyna_resources.episodes.errors import WindowError
from dyna_resources.episodes.raw_format import SampleStream
from dyna_resources.storage.cache_fs import CachedFileSystem
from dyna_resources.storage.page_cache import CacheConfig, PageCache
from trainer.dataset import ManifestDataset, SampleSpec, _on_grid, worker_init_threads

SPEC = SampleSpec(image_size=(32, 32))


def loader(ds, workers):
    return DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        worker_init_fn=worker_init_threads if workers else None,
        multiprocessing_context="fork" if workers else None,
    )


def rows_of(batches):
    return [b["row"].tolist() for b in batches]


def test_every_segment_once_per_epoch_across_workers_and_ranks(mcap_fleet):
    _, manifest = mcap_fleet
    seen = []
    for rank in range(2):
        ds = ManifestDataset(manifest, SPEC, batch_size=3, rank=rank, world=2, seed=5, block=4, shuffle_buffer=5)
        got = [r for batch in rows_of(loader(ds, 2)) for r in batch]
        assert sorted(got) == list(range(ds.first_row, ds.first_row + ds.rows))  # exactly once
        assert got != sorted(got)  # and shuffled
        seen += got
    per_rank = manifest.num_rows // 2
    assert sorted(seen) == list(range(2 * per_rank))


def test_order_is_deterministic_per_epoch_and_worker_count_does_not_change_it(mcap_fleet):
    _, manifest = mcap_fleet
    ds = ManifestDataset(manifest, SPEC, batch_size=4, seed=1, block=4, shuffle_buffer=6)
    one = rows_of(loader(ds, 0))
    assert rows_of(loader(ds, 2)) == one
    ds.position.epoch = 1
    assert rows_of(loader(ds, 2)) != one


def test_resume_mid_epoch_continues_the_exact_sequence(mcap_fleet):
    _, manifest = mcap_fleet
    make = lambda: ManifestDataset(manifest, SPEC, batch_size=2, seed=3, block=4, shuffle_buffer=4)
    full = list(loader(make(), 2))
    ds = make()
    it = iter(loader(ds, 2))
    for _ in range(3):
        next(it)
        ds.advance()
    state = ds.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(loader(resumed, 2))
    assert rows_of(rest) == rows_of(full[3:])
    for a, b in zip(rest, full[3:], strict=True):
        assert torch.equal(a["frames"], b["frames"]) and torch.equal(a["actions"], b["actions"])


def test_position_rolls_over_to_the_next_epoch(mcap_fleet):
    _, manifest = mcap_fleet
    ds = ManifestDataset(manifest, SPEC, batch_size=4)
    ds.advance(ds.batches_per_epoch)
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["batches"] == 0
    with pytest.raises(ValueError, match="not the same run"):
        ManifestDataset(manifest, SPEC, batch_size=5).load_state_dict(ds.state_dict())


def test_sample_shapes_and_alignment(mcap_fleet):
    _, manifest = mcap_fleet
    ds = ManifestDataset(manifest, SPEC, batch_size=2)
    s = ds.sample(0)
    assert s["frames"].shape == (3, 2, 3, 32, 32) and s["frames"].dtype == torch.uint8  # 3 cameras, 2 offsets
    assert s["future"].shape == (3, 3, 32, 32)
    assert s["proprio"].shape == (40, 7 + 7 + 1) and s["actions"].shape == (25, 8)
    assert torch.isfinite(s["proprio"]).all() and s["proprio"].dtype == torch.float32


def test_grid_lookup_has_an_explicit_tolerance():
    ts = np.array([0, 20_000_000, 40_000_000, 100_000_000], dtype=np.int64)
    stream = SampleStream("joint_states", ts, {"position": np.arange(4.0)[:, None]}, {})
    got = _on_grid(stream, "position", np.array([1_000_000, 39_000_000]), 0.005, "ep.mcap")
    assert got[:, 0].tolist() == [0.0, 2.0]
    with pytest.raises(WindowError, match=r"joint_states.position: no sample within 5 ms of 70000000") as e:
        _on_grid(stream, "position", np.array([40_000_000, 70_000_000]), 0.005, "ep.mcap")
    assert "ep.mcap" in str(e.value)
    with pytest.raises(WindowError, match="no field 'effort'"):
        _on_grid(stream, "effort", np.array([0]), 0.005, "ep.mcap")


def test_too_tight_tolerance_fails_the_sample_naming_the_stream(mcap_fleet):
    _, manifest = mcap_fleet
    ds = ManifestDataset(manifest, SampleSpec(image_size=(32, 32), proprio_hz=1000.0, tolerance_s=0.0001), batch_size=2)
    with pytest.raises(WindowError, match="joint_states"):
        ds.sample(0)


def test_reads_go_through_the_page_cache(mcap_fleet, tmp_path):
    _, manifest = mcap_fleet
    with PageCache(CacheConfig(root=str(tmp_path / "c"), page_size=256 * 1024)) as cache:
        fs = CachedFileSystem(cache)
        ds = ManifestDataset(manifest, SPEC, batch_size=4, open_file=fs.open)
        first = rows_of(loader(ds, 0))
        fetched = cache.stats.origin_bytes
        assert fetched > 0
        assert rows_of(loader(ds, 0)) == first
        assert cache.stats.origin_bytes == fetched and cache.stats.hit_pages > 0


def test_bad_manifest_is_refused():
    import pyarrow as pa

    with pytest.raises(ValueError, match="lacks column"):
        ManifestDataset(pa.table({"uri": ["x"]}))
    with pytest.raises(ValueError, match="cannot feed 4 ranks"):
        ManifestDataset(pa.table({"uri": ["x"], "start_ns": [0], "end_ns": [1]}), world=4)


def test_persistent_workers_follow_the_epochs(mcap_fleet):
    _, manifest = mcap_fleet
    make = lambda: ManifestDataset(manifest, SPEC, batch_size=3, seed=2, block=4, shuffle_buffer=4)
    reference = make()
    expected = []
    for epoch in range(3):
        reference.position.epoch = epoch
        expected += rows_of(loader(reference, 0))
    ds = make()
    ds.advance(2)  # resumed two batches into epoch 0
    dl = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    got = []
    for _ in range(3):
        got += rows_of(dl)
    assert got == expected[2:]


def test_continuous_stream_runs_through_the_epochs_in_order(mcap_fleet):
    _, manifest = mcap_fleet
    make = lambda **kw: ManifestDataset(manifest, SPEC, batch_size=3, seed=4, block=4, shuffle_buffer=4, **kw)
    reference = make()
    expected = []
    for epoch in range(2):
        reference.position.epoch = epoch
        expected += rows_of(loader(reference, 0))
    ds = make(continuous=True)
    ds.advance(1)
    it = iter(loader(ds, 2))
    got = [next(it)["row"].tolist() for _ in range(len(expected) - 1)]
    assert got == expected[1:]


@pytest.mark.parametrize("dictionary", [True, False])
def test_epoch_order_keeps_blocks_of_one_episode_and_moves_rows_a_bounded_distance(dictionary):
    import pyarrow as pa

    n, per_episode, block, buffer = 10_007, 50, 16, 32
    uris = pa.array([f"file:///ep-{e:05d}.mcap" for e in np.arange(n) // per_episode][::-1])  # not in manifest order
    manifest = pa.table(
        {
            "uri": uris.dictionary_encode() if dictionary else uris,
            "start_ns": np.arange(n, dtype=np.int64),
            "end_ns": np.arange(n, dtype=np.int64) + 1,
        }
    )
    ds = ManifestDataset(manifest, SPEC, batch_size=8, seed=3, block=block, shuffle_buffer=buffer)
    order = ds.order(0)
    assert sorted(order.tolist()) == list(range(n)) and order.tolist() == ds.order(0).tolist()
    assert order.tolist() != ds.order(1).tolist()
    unshuffled = ManifestDataset(manifest, SPEC, batch_size=8, seed=3, block=block, shuffle_buffer=1).order(0)
    where = np.empty(n, np.int64)
    where[order] = np.arange(n)
    assert np.abs(where[unshuffled] - np.arange(n)).max() < buffer  # bounded displacement
    episode = np.array([ds._uri_names[c] for c in ds._uri_codes])
    same = episode[unshuffled[1:]] == episode[unshuffled[:-1]]
    assert same.mean() > 1 - 1 / block - 1 / per_episode - 0.01  # blocks read one file: only their edges switch
    assert (np.diff(unshuffled)[same] == 1).mean() > 0.95  # in time order within a block
    assert ds.sample_uri(int(order[0])) == str(uris[int(order[0])])
