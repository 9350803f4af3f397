"""Training on the warm cache: is the loader ever the bottleneck, and do checkpoints stall the steps?

`python -m benchmarks train [--quick | --tiny]`

Data: a generated fleet like `make demo`'s (640x480, three cameras, H.264 with 5 s GOPs), transcoded
and put on a loopback S3-compatible origin (``benchmarks.object_server``, 10 ms + 200 MB/s per
request), a manifest of 2 s segments every 1 s (the demo's curation spec), prewarmed into the node
page cache. Then, in one invocation on the same data:

1. the loader alone (``DataLoader`` over ``ManifestDataset``, the demo's worker count, reads through
   the page cache): samples/s in its first epoch (every GOP decoded for the first time) and after
   it (the workers keep their open episodes and decoded frames, ``FrameCache``);
2. training with the demo config (``TrainConfig`` defaults: the small world-action model, batch 8,
   64x64 frames, Muon + AdamW, async checkpoints uploaded to the same object store): samples/s,
   the step's own rate (compute only), the fraction of step time spent waiting for data after the
   first epoch, and per checkpoint the time the step loop was blocked against the time the
   checkpoint took to be written locally and to be complete in the store.

``--tiny``: one 4 s episode at 64x48, 4 steps with a checkpoint every 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from ._cli import add_size_flags, size_of
from ._episodes import segments, transcoded_episode
from .object_server import ObjectServer

BUCKET = "bench"


def main(argv: list[str]) -> int:
    # its flags and their defaults by size look like cache.py's main() (declarations); each command line its own
    ap = argparse.ArgumentParser(prog="python -m benchmarks train", description=__doc__.split("\n")[0])
    add_size_flags(ap, quick="fewer episodes and steps")
    ap.add_argument("--episodes", type=int, help="episodes (default 6, quick 3, tiny 1)")
    ap.add_argument("--duration", type=float, help="seconds per episode (default 8, tiny 4)")
    ap.add_argument("--steps", type=int, help="training steps (default 120, quick 50, tiny 4)")
    ap.add_argument("--width", type=int, help="frame width (default 640, tiny 64)")
    ap.add_argument("--height", type=int, help="frame height (default 480, tiny 48)")
    ap.add_argument("--workers", type=int, default=1, help="DataLoader workers (the demo's: 1 on 2 cores)")
    ap.add_argument("--dir", help="where to put the files (default: a temp folder)")
    args = ap.parse_args(argv)
    size = size_of(args)
    tiny = size == "tiny"
    n_eps = args.episodes or {"full": 6, "quick": 3, "tiny": 1}[size]
    steps = args.steps or {"full": 120, "quick": 50, "tiny": 4}[size]
    duration = args.duration or (4.0 if tiny else 8.0)
    args.width, args.height = args.width or (64 if tiny else 640), args.height or (48 if tiny else 480)
    checkpoint_every = 2 if tiny else max(10, steps // 4)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

    with tempfile.TemporaryDirectory(prefix="dyna-bench-train-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        served = tmp / "origin"
        (served / BUCKET / "mcap").mkdir(parents=True)
        (served / BUCKET / "checkpoints").mkdir(parents=True)
        manifest = _fleet(tmp, served / BUCKET / "mcap", n_eps, duration, args.width, args.height)
        with ObjectServer(served, latency_s=0.01, bandwidth_Bps=200e6) as server:
            os.environ["DYNA_S3_ENDPOINT_URL"] = server.endpoint_url
            results = _run(tmp, manifest, server, steps, args.workers, checkpoint_every)
    results.update(
        episodes=n_eps,
        episode_s=duration,
        resolution=f"{args.width}x{args.height}",
        workers=args.workers,
        cores=os.cpu_count(),
        size=size,
        quick=args.quick,
    )
    _table(results)
    print(json.dumps(results))
    return 0


def _fleet(tmp: Path, out: Path, n: int, duration_s: float, width: int, height: int) -> pa.Table:
    from dyna_resources.episodes.mcap_reader import EpisodeReader

    print(f"generating and transcoding {n} episodes of {duration_s:g} s at {width}x{height} ...", flush=True)
    rows: dict[str, list] = {"episode_id": [], "uri": [], "start_ns": [], "end_ns": []}
    for i in range(n):
        path = out / f"ep{i:03d}.mcap"
        # the pipeline's own settings (5 s GOPs)
        spec = transcoded_episode(
            tmp,
            path,
            i,
            episode_id=f"ep-train-{i:03d}",
            seed=900 + i,
            duration_s=duration_s,
            width=width,
            height=height,
        )
        with EpisodeReader(path) as r:
            for start, end in segments(r.start_ns, r.end_ns):
                rows["episode_id"].append(spec.episode_id)
                rows["uri"].append(f"s3://{BUCKET}/mcap/{path.name}")
                rows["start_ns"].append(start)
                rows["end_ns"].append(end)
    return pa.table(rows)


def _run(tmp: Path, manifest: pa.Table, server: ObjectServer, steps: int, workers: int, checkpoint_every: int) -> dict:
    from torch.utils.data import DataLoader

    from dyna_resources.catalog.manifest import write_manifest
    from dyna_resources.storage.cache_fs import CachedFileSystem
    from dyna_resources.storage.origins import Origins
    from dyna_resources.storage.page_cache import CacheConfig, PageCache
    from dyna_resources.storage.prewarm import prewarm_manifest
    from trainer.dataset import ManifestDataset, worker_init_threads
    from trainer.train import LoaderConfig, TrainConfig, run

    files = write_manifest(manifest, tmp / "manifests", "bench")
    cache_dir = str(tmp / "page-cache")
    with PageCache(CacheConfig(root=cache_dir), Origins.from_env()) as cache:
        report = prewarm_manifest(manifest, cache, parallel=16)
    print(f"prewarmed {report.fetched_bytes / 2**20:.1f} MiB in {report.seconds:.2f} s", flush=True)

    # The warm figures: the random-access loader, whose workers keep decoded frames across epochs (this
    # dataset fits in them). The GOP-aware loader (the trainer's default) decodes every epoch anew, as a
    # corpus larger than any cache must: its cold figures are `python -m benchmarks loader`.
    cfg = TrainConfig(
        manifest=files.arrow,
        run_dir=str(tmp / "run"),
        steps=steps,
        workers=workers,
        cache_dir=cache_dir,
        checkpoint_every=checkpoint_every,
        log_every=10,
        checkpoint_store=f"s3://{BUCKET}/checkpoints",
        loader=LoaderConfig(kind="random"),
    )
    # 1. the loader alone
    with PageCache(CacheConfig(root=cache_dir), Origins.from_env()) as cache:
        ds = ManifestDataset(
            manifest, cfg.sample, batch_size=cfg.batch_size, seed=cfg.seed, open_file=CachedFileSystem(cache).open
        )
        loader = DataLoader(
            ds,
            batch_size=None,
            num_workers=workers,
            worker_init_fn=worker_init_threads,
            prefetch_factor=cfg.prefetch if workers else None,
            persistent_workers=workers > 0,
        )
        epochs = []
        for _ in range(3):
            t0, n = time.perf_counter(), 0
            for batch in loader:
                n += len(batch["row"])
            epochs.append(n / (time.perf_counter() - t0))
            print(f"  loader epoch {len(epochs)}: {epochs[-1]:.1f} samples/s", flush=True)
        del loader
    server.reset_counters()
    # 2. training
    summary = run(cfg)
    origin_reads = server.counters.snapshot()["bytes_by_object"]
    mcap_origin_bytes = sum(v for k, v in origin_reads.items() if "/mcap/" in k)
    warm = ds.batches_per_epoch  # the training run's own workers decode every GOP in their first epoch
    waits, computes = summary.step_wait_s[warm:], summary.step_compute_s[warm:]
    wait_after = sum(waits) / (sum(waits) + sum(computes))
    ck = summary.checkpoints
    blocking = summary.checkpoint_blocking_s
    write_s = [c["write_s"] for c in ck]
    total_s = [c["total_s"] for c in ck]
    step_rate = cfg.batch_size / statistics.median(summary.step_compute_s)
    assert summary.loss_first is not None and summary.loss_last is not None  # it ran steps
    return {
        "steps": summary.steps,
        "batch_size": cfg.batch_size,
        "samples_per_epoch": len(manifest),
        "samples_per_s": round(summary.samples_per_s, 2),
        "step_samples_per_s": round(step_rate, 2),
        "loader_samples_per_s": round(statistics.mean(epochs[1:]), 2),
        "loader_first_epoch_samples_per_s": round(epochs[0], 2),
        "loader_vs_step": round(statistics.mean(epochs[1:]) / step_rate, 2),
        "data_wait_fraction": round(wait_after, 4),
        "data_wait_fraction_all": round(summary.data_wait_fraction, 4),
        "checkpoint_blocking_s": round(statistics.median(blocking), 4),
        "checkpoint_blocking_max_s": round(max(blocking), 4),
        "checkpoint_write_s": round(statistics.median(write_s), 4),
        "checkpoint_total_s": round(statistics.median(total_s), 4),
        "blocking_vs_write": round(statistics.median(blocking) / statistics.median(write_s), 3),
        "blocking_vs_total": round(statistics.median(blocking) / statistics.median(total_s), 3),
        "checkpoints": len(ck),
        "loss_first": round(summary.loss_first, 4),
        "loss_last": round(summary.loss_last, 4),
        "origin_mcap_bytes_while_training": mcap_origin_bytes,
        "prewarm_s": round(report.seconds, 2),
    }


def _table(r: dict) -> None:
    print()
    print(f"{'figure':<46}{'value':>12}  target")
    rows = [
        ("training samples/s", r["samples_per_s"], ""),
        ("step alone (compute), samples/s", r["step_samples_per_s"], ""),
        ("loader alone after its first epoch, samples/s", r["loader_samples_per_s"], ""),
        ("loader alone, first epoch, samples/s", r["loader_first_epoch_samples_per_s"], ""),
        ("loader / step", r["loader_vs_step"], ">= 1.5"),
        ("data wait fraction after the first epoch", r["data_wait_fraction"], "<= 0.02"),
        ("data wait fraction, whole run", r["data_wait_fraction_all"], ""),
        ("checkpoint: step loop blocked (median), s", r["checkpoint_blocking_s"], ""),
        ("checkpoint: step loop blocked (max, 1st save), s", r["checkpoint_blocking_max_s"], ""),
        ("checkpoint: local write (median), s", r["checkpoint_write_s"], ""),
        ("checkpoint: complete in the store (median), s", r["checkpoint_total_s"], ""),
        ("blocked / complete in the store", r["blocking_vs_total"], "<= 0.05"),
        ("blocked / local write", r["blocking_vs_write"], ""),
        ("loss first -> last", f"{r['loss_first']} -> {r['loss_last']}", ""),
        ("MCAP bytes from the origin while training", r["origin_mcap_bytes_while_training"], "0 (warm)"),
    ]
    for name, value, target in rows:
        print(f"{name:<46}{value!s:>12}  {target}")
    print()


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
