"""Storage and read cost: HDF5 with per-frame JPEG vs our MCAP, and three chunk layouts.

`python -m benchmarks storage [--quick | --tiny]`

On the same generated episodes (scenes built from real photographs, moved and lit like
a camera sees them, with sensor noise):

* bytes as HDF5 with per-frame JPEG (quality 90) vs our MCAP (H.264, topic-group chunks);
* quality: mean PSNR against the generator's raw frames (before any JPEG) of our decoded
  frames and of the JPEG baseline, on the same sampled frames;
* a sample workload: random windows, 2 frames per camera (the window's last frame and
  the one 0.5 s before it) + 10 s of every proprio/action stream, read from
  (a) topic-group chunks, (b) one chunk stream per topic (same windows and codecs, only
  the grouping differs), (c) the mcap library's default interleaved chunks (1 MiB, zstd).
  Per sample: chunk fetches, bytes, and wall time of the read (fetch + de-chunk, up to
  the encoded frames and the decoded proprio arrays); video decoding is identical for
  every layout and is reported once, separately.

Object-store cost model (documented, applied to the logged range requests): every range
request costs 20 ms to first byte plus its bytes at 200 MB/s, requests issued one after
another, as a single reader does; remote time = local read time + modeled request time.
Opening a file (one tail request for footer + summary) is the same for every layout and
is reported separately.

``--quick``: 2 episodes x 24 s at 320x240, no CRF trade-off; ``--tiny``: 1 episode x 11 s at
64x48 (a sample window is 10 s), 6 samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.read_profile import per_topic_profile
from dyna_resources.episodes.rechunk import INTERLEAVED, rechunk
from dyna_resources.episodes.sim import generate_fleet
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode

from ._cli import add_size_flags, size_of
from ._quality import quality

FIRST_BYTE_S = 0.020
BANDWIDTH_BPS = 200e6
WINDOW_S = 10.0
FRAME_OFFSETS_S = (-0.5, 0.0)


def remote_cost(fetches) -> float:
    return sum(FIRST_BYTE_S + f.length / BANDWIDTH_BPS for f in fetches)


def crf_frontier(tmp: Path, g, settings: TranscodeSettings, workers: int) -> list[dict]:
    """Size and quality of one episode at several CRFs around the default: the trade-off."""
    from concurrent.futures import ProcessPoolExecutor

    crfs = [settings.video.crf + d for d in (-1, 0, 1)]
    variants = [dataclasses.replace(settings, video=dataclasses.replace(settings.video, crf=c)) for c in crfs]
    outs = [tmp / "frontier" / f"crf{c:g}.mcap" for c in crfs]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(transcode_episode, [g.path] * len(crfs), outs, variants))
    h5 = g.path.stat().st_size
    rows: list[dict] = []
    sources: dict = {}  # quality()'s cache of the raw frames, shared by the CRFs
    for c, out in zip(crfs, outs):
        o, j = quality(g, out, 10, sources)
        rows.append(
            {
                "crf": c,
                "size_ratio": out.stat().st_size / h5,
                "psnr_db": float(np.mean(o)),
                "psnr_jpeg_db": float(np.mean(j)),
            }
        )
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks storage")
    add_size_flags(ap, quick="2 episodes x 24 s at 320x240, no CRF trade-off")
    ap.add_argument("--workdir", default="")
    args = ap.parse_args(argv)
    size = size_of(args)
    n_eps, dur, w, h, n_samples, every = {
        "full": (4, 40.0, 640, 480, 200, 10),
        "quick": (2, 24.0, 320, 240, 60, 15),
        "tiny": (1, WINDOW_S + 1, 64, 48, 6, 30),
    }[size]
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(dir=args.workdir or None) as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        gens = generate_fleet(tmp / "h5", n_eps, seed=11, width=w, height=h, duration_s=dur, workers=workers)
        gen_s = time.perf_counter() - t
        settings = TranscodeSettings()
        layouts: dict[str, list[Path]] = {"grouped": [], "per_topic": [], "interleaved": []}
        t = time.perf_counter()
        from concurrent.futures import ProcessPoolExecutor

        outs = [tmp / "mcap" / f"{g.spec.episode_id}.mcap" for g in gens]
        with ProcessPoolExecutor(workers) as pool:
            reports = list(pool.map(transcode_episode, [g.path for g in gens], outs, [settings] * len(gens)))
        transcode_s = time.perf_counter() - t
        for _g, out in zip(gens, outs):
            with EpisodeReader(out) as r:
                topics = list(r.topic_ids)
            pt, il = tmp / "per_topic" / out.name, tmp / "interleaved" / out.name
            pt.parent.mkdir(exist_ok=True)
            il.parent.mkdir(exist_ok=True)
            rechunk(out, pt, per_topic_profile(topics))
            rechunk(out, il, INTERLEAVED)
            layouts["grouped"].append(out)
            layouts["per_topic"].append(pt)
            layouts["interleaved"].append(il)

        h5_bytes = sum(g.path.stat().st_size for g in gens)
        sizes = {k: sum(p.stat().st_size for p in v) for k, v in layouts.items()}
        frames_total = sum(sum(r.cameras[c].frames for c in r.cameras) for r in reports)

        # -- quality ----------------------------------------------------------------------
        ours, jpeg = [], []
        for g, out in zip(gens, layouts["grouped"]):
            o, j = quality(g, out, every)
            ours += o
            jpeg += j
        frontier = crf_frontier(tmp, gens[0], settings, workers) if size == "full" else []

        # -- sample workload ----------------------------------------------------------------
        rng = random.Random(5)
        readers = {k: [EpisodeReader(p) for p in v] for k, v in layouts.items()}
        open_requests = {k: np.mean([r.open_log.requests for r in v]) for k, v in readers.items()}
        samples = []
        for _ in range(n_samples):
            e = rng.randrange(n_eps)
            r0 = readers["grouped"][e]
            end = rng.randint(r0.start_ns + int(WINDOW_S * 1e9), r0.end_ns)
            samples.append((e, end - int(WINDOW_S * 1e9), end))
        stats: dict[str, dict[str, list[float]]] = {
            k: {"fetches": [], "bytes": [], "local": [], "remote": []} for k in layouts
        }
        order = list(layouts)
        for i, (e, start, end) in enumerate(samples):
            frame_times = [end + int(o * 1e9) for o in FRAME_OFFSETS_S]
            for k in order[i % 3 :] + order[: i % 3]:  # rotate which layout goes first
                r = readers[k][e]
                r.log.clear()
                t = time.perf_counter()
                r.read_window(start, end, frame_times_ns=frame_times, decode=False)
                local = time.perf_counter() - t
                s = stats[k]
                s["fetches"].append(r.log.chunk_fetches)
                s["bytes"].append(r.log.bytes)
                s["local"].append(local)
                s["remote"].append(local + remote_cost(r.log.fetches))
        decode_s = []
        for e, _start, end in samples[: max(10, n_samples // 5)]:
            t = time.perf_counter()
            readers["grouped"][e].read_frames(None, [end + int(o * 1e9) for o in FRAME_OFFSETS_S])
            decode_s.append(time.perf_counter() - t)
        for v in readers.values():
            for r in v:
                r.close()

    mean = {k: {m: float(np.mean(v)) for m, v in s.items()} for k, s in stats.items()}
    grouped, per_topic = mean["grouped"], mean["per_topic"]
    result: dict[str, Any] = {
        "size": size,
        "episodes": n_eps,
        "seconds_per_episode": dur,
        "resolution": f"{w}x{h}",
        "cameras": 3,
        "samples": n_samples,
        "h5_bytes": h5_bytes,
        "mcap_bytes": sizes["grouped"],
        "size_ratio": sizes["grouped"] / h5_bytes,
        "mcap_bytes_per_topic": sizes["per_topic"],
        "mcap_bytes_interleaved": sizes["interleaved"],
        "psnr_db": float(np.mean(ours)),
        "psnr_jpeg_db": float(np.mean(jpeg)),
        "psnr_frames": len(ours),
        "fetches_grouped": grouped["fetches"],
        "fetches_per_topic": per_topic["fetches"],
        "fetches_interleaved": mean["interleaved"]["fetches"],
        "fetch_ratio": per_topic["fetches"] / grouped["fetches"],
        "bytes_grouped": grouped["bytes"],
        "bytes_per_topic": per_topic["bytes"],
        "bytes_interleaved": mean["interleaved"]["bytes"],
        "read_s_grouped": grouped["local"],
        "read_s_per_topic": per_topic["local"],
        "read_s_interleaved": mean["interleaved"]["local"],
        "remote_s_grouped": grouped["remote"],
        "remote_s_per_topic": per_topic["remote"],
        "remote_s_interleaved": mean["interleaved"]["remote"],
        "remote_speedup": per_topic["remote"] / grouped["remote"],
        "remote_speedup_vs_interleaved": mean["interleaved"]["remote"] / grouped["remote"],
        "decode_s_per_sample": float(np.mean(decode_s)),
        "open_requests": open_requests["grouped"],
        "generate_s": gen_s,
        "transcode_s": transcode_s,
        "transcode_fps": frames_total / transcode_s,
        "crf": settings.video.crf,
        "gop_frames": settings.video.gop_frames,
        "preset": settings.video.preset,
        "crf_frontier": frontier,
        "workers": workers,
        "cost_model": {"first_byte_s": FIRST_BYTE_S, "bandwidth_Bps": BANDWIDTH_BPS},
    }
    print(
        f"storage benchmark: {n_eps} episodes x {dur:.0f} s, {w}x{h}, 3 cameras @30 Hz, 6 proprio/action streams; "
        f"libx264 crf {settings.video.crf:g} preset {settings.video.preset} GOP {settings.video.gop_frames}"
    )
    print(f"  bytes  HDF5+JPEG(q90) {h5_bytes / 1e6:9.1f} MB")
    for k in layouts:
        print(f"         MCAP {k:<12} {sizes[k] / 1e6:9.1f} MB   ratio {sizes[k] / h5_bytes:.3f}")
    print(
        f"  PSNR vs raw frames ({len(ours)} frames): ours {result['psnr_db']:.2f} dB, JPEG q90 {result['psnr_jpeg_db']:.2f} dB"
    )
    if frontier:
        print(f"  size/quality trade-off on {gens[0].spec.episode_id} (default crf {settings.video.crf:g}):")
        for row in frontier:
            print(
                f"    crf {row['crf']:>4g}: ratio {row['size_ratio']:.3f}  PSNR {row['psnr_db']:.2f} dB "
                f"(JPEG {row['psnr_jpeg_db']:.2f}, {row['psnr_db'] - row['psnr_jpeg_db']:+.2f})"
            )
    print(
        f"  transcode: {frames_total} frames in {transcode_s:.1f} s on {workers} workers ({result['transcode_fps']:.0f} frames/s)"
    )
    print(
        f"\n  sample = {WINDOW_S:.0f} s of every stream + 2 frames per camera; {n_samples} samples, same for every layout"
    )
    print(f"  {'layout':<12}{'fetches':>9}{'KB':>10}{'local ms':>10}{'remote ms':>11}")
    for k in layouts:
        m = mean[k]
        print(
            f"  {k:<12}{m['fetches']:>9.2f}{m['bytes'] / 1e3:>10.0f}{m['local'] * 1e3:>10.2f}{m['remote'] * 1e3:>11.1f}"
        )
    print(
        f"  fetch ratio per-topic/grouped {result['fetch_ratio']:.2f}x, remote speedup {result['remote_speedup']:.2f}x "
        f"(vs interleaved {result['remote_speedup_vs_interleaved']:.2f}x)"
    )
    print(f"  video decode per sample (all layouts alike): {result['decode_s_per_sample'] * 1e3:.0f} ms")
    print(json.dumps(result))
    return 0
