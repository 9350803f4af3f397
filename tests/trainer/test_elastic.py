"""The elastic stream: one global order whatever the world size and worker count, an exact resume on
another world size, each decode unit still decoded once when ranks x workers divide the shards."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.elastic import ElasticStream, shard_count
from trainer.sampling import samples_per_row

from .test_gop_dataset import DENSE, SPARSE, keys, loader


def stream(manifest, world=1, rank=0, kind="gop", **kw):
    return ElasticStream(manifest, DENSE, loader=kind, batch_size=2, rank=rank, world=world, seed=7, shards=4, **kw)


def epoch_of(manifest, world, workers, kind="gop") -> list[list[tuple[int, int]]]:
    """The global sequence of one epoch as ``world`` ranks with ``workers`` workers each read it."""
    per_rank = [keys(loader(stream(manifest, world, r, kind), workers)) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1  # every rank the same number of steps
    return [per_rank[g % world][g // world] for g in range(sum(len(b) for b in per_rank))]


@pytest.mark.parametrize("kind", ["gop", "random"])
def test_one_global_order_for_any_world_size_and_worker_count(mcap_fleet, kind):
    _, manifest = mcap_fleet
    one = epoch_of(manifest, 1, 0, kind)
    ref = stream(manifest, kind=kind)
    assert ref.n_shards == 4 and len(one) == ref.batches_per_epoch == 4 * ref.shard_batches
    samples = [s for b in one for s in b]
    assert len(samples) == len(set(samples)) == ref.rows  # every sample of the epoch once
    for world, workers in ((2, 0), (2, 2), (4, 1)):
        assert epoch_of(manifest, world, workers, kind) == one, (world, workers)
    assert [s for b in epoch_of(manifest, 1, 0, kind) for s in b] != sorted(samples)  # shuffled


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (1, 4), (4, 2)])
def test_a_resume_on_another_world_size_continues_the_exact_stream(mcap_fleet, before, after):
    _, manifest = mcap_fleet
    whole = epoch_of(manifest, 1, 0)
    steps = 3
    seen = []
    first = [stream(manifest, before, r) for r in range(before)]
    its = [iter(loader(ds, 0)) for ds in first]
    for _ in range(steps):  # the ranks step together
        for r, it in enumerate(its):
            seen.append(keys([next(it)])[0])
            first[r].advance()
    state = first[0].state_dict()
    assert all(ds.state_dict() == state for ds in first)  # the same position on every rank
    assert state["batches"] == steps * before
    resumed = [stream(manifest, after, r) for r in range(after)]
    for ds in resumed:
        ds.load_state_dict(state)
    rest = [keys(loader(ds, 0)) for ds in resumed]
    left = whole[len(seen) :]
    # what the new ranks read, interleaved as their steps are, is the rest of the epoch, exactly
    assert [rest[g % after][g // after] for g in range(len(left))] == left
    assert sorted(s for b in seen + left for s in b) == sorted(s for b in whole for s in b)


def test_each_unit_is_decoded_once_when_ranks_times_workers_divide_the_shards(mcap_fleet):
    _, manifest = mcap_fleet

    def decoded(world, workers):
        return sum(int(b["decoded_frames"]) for r in range(world) for b in loader(stream(manifest, world, r), workers))

    single = decoded(1, 0)
    assert decoded(2, 2) == single  # 4 workers in all, 4 shards: each shard (its units) in one worker
    assert decoded(1, 3) > single  # 3 does not divide 4: shards shared, some units decoded twice, still exact


def test_a_position_of_another_run_is_refused(mcap_fleet):
    _, manifest = mcap_fleet
    state = stream(manifest).state_dict()
    other = ElasticStream(manifest, DENSE, batch_size=4, shards=4)
    with pytest.raises(ValueError, match="not the same run"):
        other.load_state_dict(state)


def test_a_small_manifest_runs_on_fewer_shards_the_same_for_every_world_size(mcap_fleet):
    _, manifest = mcap_fleet
    counts = samples_per_row(manifest.column("start_ns").to_numpy(), manifest.column("end_ns").to_numpy(), "end", 1)
    rows = manifest.num_rows  # one sparse sample a row: fewer than 2 shards of 8 batches of 2
    assert rows < 2 * 8 * 2
    n, slices = shard_count(counts, 64, 2)
    assert n == 1 and slices.tolist() == [rows]
    sparse = [ElasticStream(manifest, SPARSE, batch_size=2, shards=64, world=w) for w in (1, 2)]
    assert sparse[0].n_shards == sparse[1].n_shards == 1 and sparse[0].rows == rows // 2 * 2
    with pytest.raises(ValueError, match="too few samples"):
        shard_count(np.ones(3, np.int64), 4, 8)
