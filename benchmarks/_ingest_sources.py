"""`python -m benchmarks ingest --source ros2|lerobot|all`: the ingest of each source format side by side,
on the same episodes (a generated fleet, then the same frames and samples as ROS 2 bags and as a LeRobot
dataset: ``sources.samples``), each over its own codec floor.

For each source, not measured: the items are written into a fresh landing zone. Measured: the engines'
pipeline as a run's units execute it, in this process and its transcode workers (``landing_tick``, then
``ingest_partition`` pre and post: gates, transcode, post gates, registry), CPU of this process and every
child (getrusage SELF + CHILDREN). Dagster's own run machinery is not in these figures (``ingest --source
hdf5``, the default, measures it); it is the same for every source.

Codec floors, the bare codec work on the same frames in the transcoder's GOP windows, one process:
- hdf5 and ros2 (JPEG frames; a bag carries the episode's own JPEG bytes): JPEG -> YUV + H.264 encode
  (``ingest.codec_floor`` on the HDF5 originals);
- lerobot (H.264 MP4s, as LeRobot's writer keeps a keyframe every 2 frames): video decode + H.264 encode.

``lerobot_native_speedup_vs_hdf5_route``: episode-hours per core-hour of the native route over today's way
through HDF5 (``import_lerobot`` to HDF5, charged, then the HDF5 pipeline), with the mean PSNR of each
route's MCAP frames against the dataset's decoded frames.

``passthrough_speedup_ros2``: episode-hours per core-hour of bags whose cameras are already H.264
(``foxglove_msgs/msg/CompressedVideo``, GOPs of the read profile's length, no B-frames: what an on-robot
encoder set up for it writes, here the same frames encoded by ``codec.encode_gop``) over the same episodes
as JPEG bags; the H.264 is copied into the MCAP (``h264_copied``: cameras copied / cameras).

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ._floor import codec_floor, cpu_all, gop_windows

SOURCES = ("hdf5", "ros2", "lerobot")
TARGET_OVERHEAD = 1.2
TARGET_LEROBOT_SPEEDUP = 1.5
TARGET_PASSTHROUGH_SPEEDUP = 20.0


def _pipeline(home: Path, settings, workers: int) -> dict:
    """Land and ingest everything in ``home``'s landing zone; CPU and wall of it, and the episodes made."""
    from dyna_resources.catalog.registry import TRANSCODED
    from dyna_resources.ingest.gates import GateConfig
    from dyna_resources.ingest.partitions import UnitJob, ingest_partition
    from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
    from dyna_resources.resources import HomeResource, IngestResource

    ingest = IngestResource(home=HomeResource(root=str(home)), max_wait_s=0, settle_s=0)
    stores = ingest.stores()
    one_unit = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)
    c0, t0 = cpu_all(), time.perf_counter()
    plan = landing_tick(LandingCursor(), stores.landing, stores.registry, one_unit)  # type: ignore[arg-type]
    for p in plan.sealed:
        ingest_partition(p.key, UnitJob("pre", stores, GateConfig()))
        ingest_partition(p.key, UnitJob("post", stores, GateConfig(), settings=settings, workers=workers))
    cpu_s, wall_s = cpu_all() - c0, time.perf_counter() - t0
    episodes = [e for e in stores.registry.episodes() if e["status"] == TRANSCODED]
    stores.registry.close()
    return {
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "episodes": episodes,
        "hours": sum(e["duration_s"] for e in episodes) / 3600,
    }


def _video_floor(dataset: Path, video) -> float:
    """Video decode + H.264 encode of every frame of a LeRobot dataset, GOP window by window (process CPU s)."""
    from dyna_resources.episodes.codec import encode_gop
    from dyna_resources.sources.lerobot import read_lerobot_dataset

    cpu = 0.0
    for ep in read_lerobot_dataset(dataset):
        cameras, rate, windows = gop_windows(ep, video.gop_frames)
        for cam, spans in windows:
            frames = cam.iter_yuv()
            for lo, hi in spans:
                c = time.process_time()
                encode_gop([next(frames) for _ in range(lo, hi)], video, rate)
                cpu += time.process_time() - c
    return cpu


def _psnr(mcap: Path, dataset: Path, episode_id: str) -> float:
    """Mean PSNR of an MCAP's frames (every 15th, first camera) against the dataset's decoded frames."""
    import av
    from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
    from mcap.reader import make_reader

    from dyna_resources.episodes.codec import decoded_to_rgb
    from dyna_resources.episodes.topics import camera_topic
    from dyna_resources.sources.lerobot import read_lerobot_dataset

    (ep,) = [e for e in read_lerobot_dataset(dataset) if e.meta.episode_id == episode_id]
    name = sorted(ep.cameras)[0]
    source = [decoded_to_rgb(f) for f in ep.cameras[name].iter_yuv()]
    decoder = av.CodecContext.create("h264", "r")
    got = []
    with open(mcap, "rb") as f:
        for _, _, message in make_reader(f).iter_messages(topics=[camera_topic(name)]):
            msg = CompressedVideo()
            msg.ParseFromString(message.data)
            got += [decoded_to_rgb(fr) for fr in decoder.decode(av.Packet(msg.data))]
    got += [decoded_to_rgb(fr) for fr in decoder.decode(None)]
    out = []
    for i in range(0, min(len(source), len(got)), 15):
        mse = float(np.mean((source[i].astype(np.float64) - got[i].astype(np.float64)) ** 2))
        out.append(99.0 if mse == 0 else 10 * np.log10(255**2 / mse))
    return float(np.mean(out)) if out else float("nan")


def _copied(episodes: list[dict]) -> list[int]:
    """[cameras copied, cameras] over the episodes' MCAPs (their stats metadata)."""
    from mcap.reader import make_reader

    from dyna_resources.episodes.topics import STATS_METADATA

    copied = total = 0
    for e in episodes:
        with open(e["mcap_path"], "rb") as f:
            for m in make_reader(f).iter_metadata():
                if m.name == STATS_METADATA:
                    cams = json.loads(m.metadata["cameras"]).values()
                    copied += sum(bool(c.get("copied")) for c in cams)
                    total += len(cams)
    return [copied, total]


def run(size: str, sources: list[str], seed: int = 23, workdir: str | None = None) -> dict:
    from dyna_resources.episodes.lerobot import import_lerobot
    from dyna_resources.episodes.read_profiles import EMBEDDED
    from dyna_resources.episodes.sim import generate_fleet
    from dyna_resources.home import DynaHome
    from dyna_resources.resources import TranscodeResource
    from dyna_resources.sources import samples

    n, w, h, dur = {"full": (6, 640, 480, 30.0), "quick": (4, 320, 240, 6.0), "tiny": (2, 64, 48, 1.5)}[size]
    transcode = TranscodeResource()
    settings = transcode.settings(EMBEDDED["archive"])
    workers = transcode.pool_size()
    out: dict = {"size": size, "episodes": n, "episode_s": dur, "resolution": f"{w}x{h}", "sources": {}}
    with tempfile.TemporaryDirectory(prefix="dyna-ingest-sources-", dir=workdir) as tmp:
        tmp_p = Path(tmp)
        gens = generate_fleet(tmp_p / "fleet", n, seed=seed, width=w, height=h, duration_s=dur, workers=workers)
        paths = [g.path for g in gens]
        jpeg_floor = codec_floor(paths, settings.video)["cpu_s"]

        def home_for(name: str) -> tuple[Path, Path]:
            home = tmp_p / name
            landing = DynaHome(home).ensure().landing / "drop"
            landing.mkdir(parents=True)
            return home, landing

        for source in sources:
            home, landing = home_for(source)
            if source == "hdf5":
                for p in paths:
                    shutil.copyfile(p, landing / p.name)
                floor = jpeg_floor
            elif source == "ros2":
                for p in paths:
                    samples.write_bag(p, landing / f"bag-{p.stem}")
                from dyna_resources.episodes.raw_format import RawEpisode

                with RawEpisode(paths[0]) as raw:
                    samples.write_topic_map(home, sorted(raw.cameras))
                floor = jpeg_floor
                h264_home, h264_landing = home_for("ros2-h264")
                for p in paths:
                    samples.write_bag(p, h264_landing / f"bag-{p.stem}", video=settings.video)
                with RawEpisode(paths[0]) as raw:
                    samples.write_topic_map(h264_home, sorted(raw.cameras))
            else:
                dataset = samples.write_dataset(paths, landing / "dataset")
                floor = _video_floor(dataset, settings.for_site("lerobot").video)
            r = _pipeline(home, settings, workers)
            row = {
                "episodes": len(r["episodes"]),
                "cpu_s": r["cpu_s"],
                "floor_cpu_s": floor,
                "overhead_ratio": r["cpu_s"] / floor if floor else None,
                "episode_hours_per_core_hour": r["hours"] / (r["cpu_s"] / 3600) if r["cpu_s"] else 0.0,
            }
            if source == "ros2":
                c = _pipeline(h264_home, settings, workers)
                eph = c["hours"] / (c["cpu_s"] / 3600) if c["cpu_s"] else 0.0
                row["h264_cpu_s"] = c["cpu_s"]
                row["h264_episode_hours_per_core_hour"] = eph
                row["h264_copied"] = _copied(c["episodes"])
                row["passthrough_speedup"] = eph / row["episode_hours_per_core_hour"] if eph else None
            if source == "lerobot":
                # today's way: the dataset imported to HDF5 (charged), then the HDF5 pipeline
                via, via_landing = home_for("lerobot-via-hdf5")
                c0 = cpu_all()
                import_lerobot(dataset, via_landing)
                import_cpu = cpu_all() - c0
                v = _pipeline(via, settings, workers)
                row["hdf5_route_cpu_s"] = import_cpu + v["cpu_s"]
                row["hdf5_route_import_cpu_s"] = import_cpu
                row["native_speedup_vs_hdf5_route"] = row["hdf5_route_cpu_s"] / r["cpu_s"] if r["cpu_s"] else None
                first = sorted(r["episodes"], key=lambda e: e["episode_id"])[0]
                second = [e for e in v["episodes"] if e["episode_id"] == first["episode_id"]]
                row["psnr_native_db"] = _psnr(Path(first["mcap_path"]), dataset, first["episode_id"])
                row["psnr_hdf5_route_db"] = (
                    _psnr(Path(second[0]["mcap_path"]), dataset, first["episode_id"]) if second else None
                )
            out["sources"][source] = row
    return out


def report(out: dict) -> dict:
    s = out["sources"]
    print(
        f"ingest by source: {out['episodes']} episodes of {out['episode_s']:g} s at {out['resolution']} "
        f"({out['size']}), engines' pipeline CPU over the codec floor"
    )
    print(f"{'source':<10}{'episodes':>9}{'pipeline CPU s':>16}{'floor CPU s':>13}{'overhead':>10}{'ep-h/core-h':>13}")
    for name, r in s.items():
        ratio = f"{r['overhead_ratio']:.3f}" if r["overhead_ratio"] else "-"
        print(
            f"{name:<10}{r['episodes']:>9}{r['cpu_s']:>16.2f}{r['floor_cpu_s']:>13.2f}{ratio:>10}"
            f"{r['episode_hours_per_core_hour']:>13.2f}"
        )
    lr = s.get("lerobot", {})
    if "native_speedup_vs_hdf5_route" in lr:
        print(
            f"LeRobot native vs through HDF5: {lr['native_speedup_vs_hdf5_route']:.2f}x the episode-hours per "
            f"core-hour (target >= {TARGET_LEROBOT_SPEEDUP}); HDF5 route {lr['hdf5_route_cpu_s']:.2f} CPU s "
            f"(import {lr['hdf5_route_import_cpu_s']:.2f}); PSNR vs the dataset's frames: native "
            f"{lr['psnr_native_db']:.2f} dB, HDF5 route {lr['psnr_hdf5_route_db'] or float('nan'):.2f} dB"
        )
    ros2 = s.get("ros2", {})
    if "passthrough_speedup" in ros2:
        copied, cams = ros2["h264_copied"]
        print(
            f"ROS 2 bags with H.264 video, copied ({copied} of {cams} cameras): {ros2['h264_cpu_s']:.2f} CPU s, "
            f"{ros2['h264_episode_hours_per_core_hour']:.1f} ep-h/core-h, {ros2['passthrough_speedup'] or 0:.1f}x the "
            f"JPEG bags' (target >= {TARGET_PASSTHROUGH_SPEEDUP:g})"
        )
    figures = {
        "benchmark": "ingest_sources",
        "size": out["size"],
        **{f"overhead_ratio_{k}": v["overhead_ratio"] for k, v in s.items()},
        **{f"episode_hours_per_core_hour_{k}": v["episode_hours_per_core_hour"] for k, v in s.items()},
        "lerobot_native_speedup_vs_hdf5_route": lr.get("native_speedup_vs_hdf5_route"),
        "psnr_lerobot_native_db": lr.get("psnr_native_db"),
        "psnr_lerobot_hdf5_route_db": lr.get("psnr_hdf5_route_db"),
        "passthrough_speedup_ros2": ros2.get("passthrough_speedup"),
        "targets": {
            "overhead_ratio": TARGET_OVERHEAD,
            "lerobot_native_speedup": TARGET_LEROBOT_SPEEDUP,
            "passthrough_speedup": TARGET_PASSTHROUGH_SPEEDUP,
        },
        "detail": out,
    }
    for k in ("overhead_ratio_hdf5", "overhead_ratio_ros2", "overhead_ratio_lerobot"):
        figures.setdefault(k, None)
    return figures


def main(size: str, source: str, seed: int, workdir: str | None) -> int:
    sources = list(SOURCES) if source == "all" else [source]
    figures = report(run(size, sources, seed, workdir))
    print(json.dumps(figures, default=lambda o: None))
    return 0
