"""Node page cache: one reader from the origin, through a cold cache, through a warm cache, and the
local disk's own read speed, side by side on the same objects and reads; then prewarm.

`python -m benchmarks cache [--quick | --tiny]`

The origin is ``benchmarks.object_server``: a loopback S3-compatible server (read through s3fs, as a
cluster reads an S3-compatible origin) modelled as a cloud object store: every request waits
``--latency-ms`` (default 10 ms) before its first byte, and every response body is sent at no more
than ``--bandwidth-MBps`` (default 200 MB/s, the published single-reader figure) per request. The
GCS emulator is not used: it re-reads whole objects per range request (~60 MB/s), slower than
what it would stand for.

Reads: every object read front to back in ``--read-mb`` ranges (16 MiB), one after another, by one
reader thread: the same list of reads in every mode.

- ``origin``: each range straight from the origin (``Origins.read``, one GET each);
- ``cold``: through an empty page cache (4 MiB pages; the missing pages of one read are fetched
  in parallel, 8 at a time, then stored with their checksums);
- ``warm``: the same reads again, every page verified (xxh3 per 64 KiB block) on the way;
- ``disk``: the same byte ranges with ``pread`` from plain local files holding the same bytes.

``warm`` and ``disk`` are measured from the device: before each pass the page files and the local
copies are dropped from the OS page cache (``posix_fadvise(DONTNEED)``), so both read the disk;
the same passes repeated with the OS cache hot are reported as ``*_hot`` (memory bandwidth).

Prewarm: a fresh cache is prewarmed with every page of the objects (16 pages in flight), then all
reads are repeated through it while the server counts the bytes it serves: ``origin_bytes_after_
prewarm`` must be 0. The same is done end to end from a manifest: transcoded MCAP episodes on the
origin, a manifest of segments covering the first quarter of each (40 s) episode, the plan from each file's chunk
index, prewarm, then every sample of the manifest read through the cache (``manifest_*``).

``--tiny``: 2 objects of 8 MiB in 2 MiB reads, one 8 s episode at 64x48.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from dyna_resources.storage.origins import Origins
from dyna_resources.storage.page_cache import CacheConfig, PageCache
from dyna_resources.storage.prewarm import FilePlan, Plan, prewarm, prewarm_manifest
from dyna_resources.storage.stores import Store

from ._cli import add_size_flags, size_of
from ._episodes import segments, transcoded_episode
from .object_server import ObjectServer

MiB = 1 << 20
BUCKET = "bench"


def main(argv: list[str]) -> int:
    # its flags and their defaults by size look like train.py's main() (declarations); each command line its own
    ap = argparse.ArgumentParser(prog="python -m benchmarks cache", description=__doc__.split("\n")[0])
    add_size_flags(ap, quick="fewer bytes and episodes (about a minute)")
    ap.add_argument("--objects", type=int, help="objects (default 24, quick 8, tiny 2)")
    ap.add_argument("--object-mb", type=int, help="MiB per object (default 64, tiny 8)")
    ap.add_argument("--read-mb", type=int, help="MiB per read (default 16, tiny 2)")
    ap.add_argument("--latency-ms", type=float, default=10.0)
    ap.add_argument("--bandwidth-MBps", type=float, default=200.0)
    ap.add_argument("--episodes", type=int, help="MCAP episodes for the manifest prewarm (default 6, quick 2, tiny 1)")
    ap.add_argument("--dir", help="where to put the files (default: a temp folder)")
    args = ap.parse_args(argv)
    run_size = size_of(args)
    tiny = run_size == "tiny"
    n_objects = args.objects or {"full": 24, "quick": 8, "tiny": 2}[run_size]
    args.object_mb = args.object_mb or (8 if tiny else 64)
    args.read_mb = args.read_mb or (2 if tiny else 16)
    n_episodes = args.episodes or {"full": 6, "quick": 2, "tiny": 1}[run_size]
    episode_s, episode_px = (8.0, (64, 48)) if tiny else (40.0, (320, 240))
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")  # the loopback server checks no signature
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

    with tempfile.TemporaryDirectory(prefix="dyna-bench-cache-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        served = tmp / "origin"
        local = served / BUCKET / "objects"  # the server's files double as the local-disk copies
        local.mkdir(parents=True)
        size = args.object_mb * MiB
        print(f"writing {n_objects} objects of {args.object_mb} MiB ...", flush=True)
        for i in range(n_objects):
            with open(local / f"obj-{i:03d}.bin", "wb") as f:
                f.writelines(os.urandom(min(16 * MiB, size)) for _ in range(0, size, 16 * MiB))
                os.fsync(f.fileno())
        total = n_objects * size
        results: dict = {}
        with ObjectServer(served, latency_s=args.latency_ms / 1e3, bandwidth_Bps=args.bandwidth_MBps * 1e6) as server:
            store = Store.from_url(f"s3://{BUCKET}", endpoint_url=server.endpoint_url)
            origins = Origins(stores={store.root: store})
            urls = [f"s3://{BUCKET}/objects/obj-{i:03d}.bin" for i in range(n_objects)]
            infos = {u: origins.info(u) for u in urls}  # also makes the server compute each ETag once
            step = args.read_mb * MiB
            reads = [(u, s, min(s + step, infos[u].size)) for u in urls for s in range(0, infos[u].size, step)]

            def timed(name, fn):
                t0 = time.perf_counter()
                n = fn()
                dt = time.perf_counter() - t0
                assert n == total, f"{name}: read {n} of {total} bytes"
                results[f"{name}_MBps"] = round(total / 1e6 / dt, 1)
                print(f"  {name:<10} {total / 1e6 / dt:9.1f} MB/s  ({dt:.2f} s)", flush=True)

            print(f"reading {total / MiB:.0f} MiB in {len(reads)} reads of {args.read_mb} MiB, one reader:", flush=True)
            timed("origin", lambda: sum(len(origins.read(u, s, e, infos[u].version)) for u, s, e in reads))
            cfg = CacheConfig(root=str(tmp / "cache"), capacity_bytes=2 * total)
            with PageCache(cfg, origins) as cache:

                def through(c=cache):
                    return sum(len(c.read(u, s, e, info=infos[u])) for u, s, e in reads)

                timed("cold", through)
                _drop_os_cache(tmp / "cache")
                timed("warm", through)
                timed("warm_hot", through)
                assert cache.stats.origin_bytes == total
            paths = {u: local / u.rsplit("/", 1)[1] for u in urls}

            def disk():
                fds = {u: os.open(p, os.O_RDONLY) for u, p in paths.items()}
                try:
                    return sum(len(os.pread(fds[u], e - s, s)) for u, s, e in reads)
                finally:
                    for fd in fds.values():
                        os.close(fd)

            _drop_os_cache(local)
            timed("disk", disk)
            timed("disk_hot", disk)

            print("prewarm of every page, then the same reads:", flush=True)
            plan = Plan(files=[FilePlan(u, infos[u], [(0, infos[u].size)]) for u in urls], segments=0)
            with PageCache(CacheConfig(root=str(tmp / "cache2"), capacity_bytes=2 * total), origins) as cache:
                report = prewarm(plan, cache, parallel=16)
                server.reset_counters()
                got = sum(len(cache.read(u, s, e, info=infos[u])) for u, s, e in reads)
                assert got == total
                after = server.counters.snapshot()["bytes_served"]
            results.update(
                prewarm_s=round(report.fetch_s, 2),
                prewarm_MBps=round(report.fetched_MBps, 1),
                prewarm_pages=report.pages,
                origin_bytes_after_prewarm=after,
            )
            print(
                f"  prewarm   {report.fetched_bytes / MiB:.0f} MiB, {report.pages} pages in {report.fetch_s:.2f} s "
                f"({report.fetched_MBps:.0f} MB/s); origin bytes served afterwards: {after}",
                flush=True,
            )

            results.update(_manifest_prewarm(tmp, served, server, origins, n_episodes, episode_s, episode_px))

    results["warm_vs_origin"] = round(results["warm_MBps"] / results["origin_MBps"], 2)
    results["warm_vs_disk"] = round(results["warm_MBps"] / results["disk_MBps"], 3)
    results["warm_hot_vs_disk_hot"] = round(results["warm_hot_MBps"] / results["disk_hot_MBps"], 3)
    results["cold_vs_origin"] = round(results["cold_MBps"] / results["origin_MBps"], 2)
    results.update(
        model={
            "latency_ms": args.latency_ms,
            "bandwidth_MBps": args.bandwidth_MBps,
            "read_MiB": args.read_mb,
            "page_MiB": 4,
        },
        objects=n_objects,
        bytes=total,
        cores=os.cpu_count(),
        size=run_size,
        quick=args.quick,
    )
    _table(results)
    print(json.dumps(results))
    return 0


def _manifest_prewarm(
    tmp: Path,
    served: Path,
    server: ObjectServer,
    origins: Origins,
    n_episodes: int,
    duration_s: float,
    size: tuple[int, int],
) -> dict:
    """Episodes on the origin, a manifest over the first quarter of each, prewarm from the chunk index, read all."""
    from dyna_resources.episodes.codec import VideoSettings
    from dyna_resources.episodes.mcap_reader import EpisodeReader
    from dyna_resources.episodes.transcode import TranscodeSettings
    from dyna_resources.storage.cache_fs import CachedFileSystem

    print(f"manifest prewarm: transcoding {n_episodes} episodes ...", flush=True)
    mcap_dir = served / BUCKET / "mcap"
    mcap_dir.mkdir(parents=True)
    rows: dict[str, list] = {"uri": [], "start_ns": [], "end_ns": []}
    file_bytes = 0
    settings = TranscodeSettings(video=VideoSettings(gop_frames=30, preset="veryfast"))
    for i in range(n_episodes):
        out = mcap_dir / f"ep{i:03d}.mcap"
        transcoded_episode(
            tmp,
            out,
            i,
            episode_id=f"ep-bench-{i:03d}",
            seed=500 + i,
            duration_s=duration_s,
            width=size[0],
            height=size[1],
            settings=settings,
        )
        file_bytes += out.stat().st_size
        with EpisodeReader(out) as r:
            for start, end in segments(r.start_ns, r.start_ns + int(duration_s * 1e9) // 4):
                rows["uri"].append(f"s3://{BUCKET}/mcap/{out.name}")
                rows["start_ns"].append(start)
                rows["end_ns"].append(end)
    manifest = pa.table(rows)
    with PageCache(CacheConfig(root=str(tmp / "cache3")), origins) as cache:
        server.reset_counters()
        report = prewarm_manifest(manifest, cache, dataset="bench", parallel=16)
        fetched = server.counters.snapshot()["bytes_served"]
        server.reset_counters()
        fs = CachedFileSystem(cache, dataset="bench")
        for row in manifest.to_pylist():
            with fs.open(row["uri"]) as f, EpisodeReader(f) as r:
                r.metadata()
                times = [row["start_ns"], (row["start_ns"] + row["end_ns"]) // 2, row["end_ns"]]
                r.read_window(row["start_ns"], row["end_ns"], frame_times_ns=times, decode=False)
        after = server.counters.snapshot()["bytes_served"]
    print(
        f"  {len(manifest)} segments of {n_episodes} files ({file_bytes / MiB:.1f} MiB): plan + prewarm "
        f"{report.seconds:.2f} s, working set {report.ranges_bytes / MiB:.1f} MiB in {report.pages} pages, "
        f"{fetched / MiB:.1f} MiB fetched; origin bytes while "
        f"reading every sample afterwards: {after}",
        flush=True,
    )
    return {
        "manifest_prewarm_s": round(report.seconds, 2),
        "manifest_segments": len(manifest),
        "manifest_files_bytes": file_bytes,
        "manifest_working_set_bytes": report.ranges_bytes,
        "manifest_fetched_bytes": fetched,
        "manifest_origin_bytes_after_prewarm": after,
        "manifest_errors": report.errors,
    }


def _drop_os_cache(folder: Path) -> None:
    """Evict the folder's files from the OS page cache, so the next read comes from the device."""
    for dirpath, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _table(r: dict) -> None:
    print()
    print(f"{'mode':<22}{'MB/s':>10}")
    for k in ("origin", "cold", "warm", "disk", "warm_hot", "disk_hot"):
        print(f"{k:<22}{r[f'{k}_MBps']:>10.1f}")
    print()
    print(f"warm / origin          {r['warm_vs_origin']:>8.2f}   (target >= 10)")
    print(f"warm / disk            {r['warm_vs_disk']:>8.3f}   (target >= 0.8; both read from the device)")
    print(f"warm / disk, OS-cached {r['warm_hot_vs_disk_hot']:>8.3f}")
    print(
        f"prewarm                {r['prewarm_s']:>8.2f} s, origin bytes after it: {r['origin_bytes_after_prewarm']} "
        f"(target 0)"
    )
    print(
        f"manifest prewarm       {r['manifest_prewarm_s']:>8.2f} s, {r['manifest_fetched_bytes'] / MiB:.1f} of "
        f"{r['manifest_files_bytes'] / MiB:.1f} MiB fetched, origin bytes after it: "
        f"{r['manifest_origin_bytes_after_prewarm']}"
    )
    print()


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
