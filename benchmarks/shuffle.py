"""Shuffle quality of the training orders: what the model sees batch after batch, without decoding.

`python -m benchmarks shuffle [--quick | --tiny]`

A GOP-aware loader buys its speed by reading each decode unit (one episode, ``unit_s`` seconds) once
and emitting every sample anchored in it from that decode, so its batches are less random than a
uniform shuffle's. This measures by how much, on the orders themselves (pure functions of seed and
epoch: nothing is read), for one rank's epoch as the training loop receives it:

- ``episodes_per_batch``: distinct episodes in a batch (a uniform shuffle: nearly ``batch``);
- ``units_per_batch``: distinct decode units in a batch (GOP-aware orders only);
- ``consecutive_jaccard``: the episode sets of batch t and t+1, |A ∩ B| / |A ∪ B|, averaged: how much
  one step's data repeats the last one's (a uniform shuffle: about 0);
- ``episode_run_batches``: an episode's stretch of consecutive batches, on average (1: never twice in
  a row).

Orders, as the trainer reads them (``ElasticStream``, 64 shards: batch g from shard g mod 64): the
GOP-aware loader at ``mix_units`` 1, 3 (the default), 8 and 32; the random-access loader (blocks of 16
segments permuted, a 64-place bounded shuffle); and a uniform permutation of the same samples as the
reference. Corpus: a manifest of episodes 30-120 s long (2 s segments back to
back), dense anchors (every 0.1 s), batches of 8 (the demo's) and 64.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pyarrow as pa

from ._cli import add_size_flags, size_of

EPISODES = {"full": 2000, "quick": 400, "tiny": 12}
MIX_UNITS = (1.0, 3.0, 8.0, 32.0)
BATCHES = (8, 64)
SEGMENT_NS = 2_000_000_000


def manifest(n_episodes: int, seed: int = 5) -> pa.Table:
    rng = np.random.default_rng(seed)
    durations = rng.uniform(30.0, 120.0, n_episodes)
    uri, start, end = [], [], []
    for i, d in enumerate(durations):
        n = int(d * 1e9) // SEGMENT_NS
        t = np.arange(n, dtype=np.int64) * SEGMENT_NS
        uri += [f"file:///corpus/ep-{i:06d}.mcap"] * n
        start.append(t)
        end.append(t + SEGMENT_NS)
    return pa.table({"uri": uri, "start_ns": np.concatenate(start), "end_ns": np.concatenate(end)})


def quality(episode_batches: list[np.ndarray], unit_batches: list[np.ndarray] | None) -> dict:
    """The metrics of the module doc over an epoch's batches (arrays of episode codes / unit ids)."""
    sets = [set(b.tolist()) for b in episode_batches]
    jaccard = [len(a & b) / len(a | b) for a, b in zip(sets, sets[1:], strict=False)]
    runs: list[int] = []
    open_runs: dict[int, int] = {}
    for s in sets:
        for e in list(open_runs):
            if e not in s:
                runs.append(open_runs.pop(e))
        for e in s:
            open_runs[e] = open_runs.get(e, 0) + 1
    runs += open_runs.values()
    out = {
        "episodes_per_batch": round(float(np.mean([len(s) for s in sets])), 3),
        "consecutive_jaccard": round(float(np.mean(jaccard)), 4) if jaccard else 0.0,
        "episode_run_batches": round(float(np.mean(runs)), 3),
    }
    if unit_batches is not None:
        out["units_per_batch"] = round(float(np.mean([len(np.unique(u)) for u in unit_batches])), 3)
    return out


def _batches(stream, gop: bool) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Epoch 0 as the training loop receives it, batch by batch: each sample's episode (its MCAP URI)
    and, GOP-aware, its decode unit (shard, unit), from the orders alone."""
    episodes, units = [], []
    for g in range(stream.batches_per_epoch):
        _, v, k = stream.locate(g)
        shard = stream.shard(v)
        if gop:
            samples = shard.batch_samples(0, k)
            units.append(v * (1 << 32) + shard._units[samples])
        else:
            samples = shard.order_cache(0)[k * stream.batch_size : (k + 1) * stream.batch_size]
        names = np.array(shard._uri_names, dtype=object)
        episodes.append(names[shard.plan.code[samples]])
    return episodes, (units if gop else None)


def measure(table: pa.Table, batch: int) -> dict:
    from benchmarks.loader import sample_spec
    from trainer.elastic import ElasticStream

    spec = sample_spec(dense=True)
    out: dict[str, dict] = {}
    for mix in MIX_UNITS:
        stream = ElasticStream(table, spec, loader="gop", batch_size=batch, options={"mix_units": mix})
        out[f"gop_mix{mix:g}"] = quality(*_batches(stream, True))
    rnd = ElasticStream(table, spec, loader="random", batch_size=batch)
    out["random_access"] = quality(*_batches(rnd, False))
    every = np.concatenate(_batches(rnd, False)[0])
    uniform = np.random.default_rng(0).permutation(every)
    n = len(uniform) // batch
    out["uniform"] = quality([uniform[j * batch : (j + 1) * batch] for j in range(n)], None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_size_flags(ap, quick=f"{EPISODES['quick']} episodes (seconds)")
    args = ap.parse_args(argv)
    size = size_of(args)
    t0 = time.perf_counter()
    table = manifest(EPISODES[size])
    results = {f"batch{b}": measure(table, b) for b in BATCHES}
    samples = int(
        sum(np.maximum(1, (table.column("end_ns").to_numpy() - table.column("start_ns").to_numpy()) // 100_000_000))
    )
    print(f"shuffle quality: {EPISODES[size]} episodes, {table.num_rows} segments, ~{samples} dense samples, one rank")
    for b, rows in results.items():
        print(
            f"\n{b}: {'order':<16} {'episodes/batch':>14} {'units/batch':>11} {'consec. Jaccard':>15} {'run (batches)':>13}"
        )
        for name, q in rows.items():
            units = f"{q['units_per_batch']:.2f}" if "units_per_batch" in q else "-"
            print(
                f"{'':8}{name:<16} {q['episodes_per_batch']:>14.2f} {units:>11} {q['consecutive_jaccard']:>15.3f} "
                f"{q['episode_run_batches']:>13.2f}"
            )
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    print(json.dumps({"benchmark": "shuffle", "size": size, "episodes": EPISODES[size], "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
