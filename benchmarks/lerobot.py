"""LeRobot round trip: PSNR lost between the imported frames and the exported ones.

`python -m benchmarks lerobot [--quick | --tiny]`

Source frames: (a) the unit tests' synthetic scene (64x96: gradients and a moving square) and
(b) the sample fleet's renderer (640x480, two cameras; --quick: 320x240; --tiny: 64x48), written as a LeRobot
v3.0 dataset with H.264 (yuv420p, full range) by our writer, then (c) the same rendered frames
re-encoded the way LeRobot 0.4 writes them (AV1, limited range, keyframe every 2 frames).
Each dataset goes import -> transcode -> export -> read, and per camera:

    loss = PSNR(source, imported frames) - PSNR(source, exported frames)

(the issue's bar: <= 1 dB). Two transcode settings side by side on the same imports: the
fleet's CRF 21 for every site, and the pipeline's default, which encodes site "lerobot" (what
imports land as) at ``CRF_BY_SITE``; with the H.264 bytes per frame each costs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import av
import numpy as np

from dyna_resources.episodes import lerobot as L
from dyna_resources.episodes.transcode import (
    CRF_BY_SITE,
    TranscodeSettings,
    transcode_episode,
)

from ._cli import add_size_flags, size_of
from ._quality import psnr

FPS = 30
AV1_ENCODER = "libsvtav1"  # what LeRobot 0.4 encodes with


def synthetic(n: int, seed: int, h: int = 64, w: int = 96) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        frame = np.stack([x * 2 + i * 2 + seed * 10, y * 3 + i, (x + y) // 2 + seed * 17], -1).astype(np.uint8)
        cx = 8 + (i * 4) % (w - 24)
        frame[20:36, cx : cx + 16] = (170, 150 + seed * 10, 140)
        out[i] = frame
    return out


def rendered(n_eps: int, seconds: float, w: int, h: int) -> list[dict[str, np.ndarray]]:
    from dyna_resources.episodes.sim.fleet import SimulatedEpisode, fleet_specs

    out = []
    for spec in fleet_specs(n_eps, width=w, height=h, duration_s=seconds):
        sim = SimulatedEpisode(spec)
        n = min(sim.n_frames(c) for c in ("scene_left", "wrist"))
        out.append(
            {
                f"{L.CAMERA_PREFIX}{c}": np.stack([sim.render_frame(c, i) for i in range(n)])
                for c in ("scene_left", "wrist")
            }
        )
    return out


def episodes(frames: list[dict[str, np.ndarray]]) -> list[L.LeRobotEpisode]:
    rng = np.random.default_rng(0)
    eps = []
    for k, cams in enumerate(frames):
        n = len(next(iter(cams.values())))
        eps.append(
            L.LeRobotEpisode(
                index=k,
                task=f"task {k}",
                fps=FPS,
                timestamps=np.arange(n) / FPS,
                states=rng.normal(size=(n, 6)).astype(np.float32),
                actions=rng.normal(size=(n, 7)).astype(np.float32),
                # a (T, H, W, 3) array is the Sequence of frames the field asks for; numpy's stubs don't say so
                frames=cast("dict[str, Sequence | L.H264Clip]", cams),
            )
        )
    return eps


def pixels(frames: Sequence | L.H264Clip) -> np.ndarray:
    """One camera's frames as one (T, H, W, 3) array (the sources here are arrays, read_lerobot's a list of them)."""
    assert not isinstance(frames, L.H264Clip)  # neither the sources here nor read_lerobot's frames are clips
    return np.asarray(frames)


def as_lerobot_av1(src: list[L.LeRobotEpisode], root: Path) -> None:
    """Rewrite each camera's MP4 as LeRobot 0.4 does: AV1 (SVT), yuv420p limited range from RGB, g=2."""
    for key in src[0].frames:
        path = next((root / "videos" / key).rglob("*.mp4"))
        h, w = pixels(src[0].frames[key]).shape[1:3]
        with av.open(str(path), "w") as c:
            s = c.add_stream(AV1_ENCODER, rate=FPS, options={"crf": "30", "g": "2", "preset": "8"})
            assert isinstance(s, av.VideoStream)  # a video encoder's stream (the name is no literal the stubs know)
            s.pix_fmt, s.width, s.height = "yuv420p", w, h
            for f in (f for e in src for f in pixels(e.frames[key])):
                c.mux(s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")))
            c.mux(s.encode(None))


def round_trip(src: list[L.LeRobotEpisode], tmp: Path, av1: bool) -> dict:
    L.write_lerobot(src, tmp / "in", fps=FPS)
    if av1:
        as_lerobot_av1(src, tmp / "in")
    imported = list(L.read_lerobot(tmp / "in"))
    paths = L.import_lerobot(tmp / "in", tmp / "landing")
    out = {}
    for label, settings in (
        ("crf 21 (fleet)", TranscodeSettings(crf_by_site=())),
        (f"crf {dict(CRF_BY_SITE)[L.LEROBOT_SITE]:g} (site rule)", TranscodeSettings()),
    ):
        d = tmp / label.split()[1]
        mcaps, bytes_, frames = [], 0, 0
        for p in paths:
            rep = transcode_episode(p, d / "mcap" / f"{p.stem}.mcap", settings)
            bytes_ += sum(c.video_bytes for c in rep.cameras.values())
            frames += sum(c.frames for c in rep.cameras.values())
            mcaps.append(d / "mcap" / f"{p.stem}.mcap")
        t = time.perf_counter()
        L.export_lerobot([{"uri": m.as_uri(), "episode_id": m.stem} for m in mcaps], d / "out")
        export_s = time.perf_counter() - t
        exported = list(L.read_lerobot(d / "out"))
        losses = [
            psnr(pixels(o.frames[k]), pixels(i.frames[k])) - psnr(pixels(o.frames[k]), pixels(e.frames[k]))
            for o, i, e in zip(src, imported, exported, strict=True)
            for k in o.frames
        ]
        psnr_in = [psnr(pixels(o.frames[k]), pixels(i.frames[k])) for o, i in zip(src, imported) for k in o.frames]
        out[label] = {
            "loss_db_max": round(max(losses), 3),
            "loss_db_min": round(min(losses), 3),
            "psnr_in_db": round(float(np.mean(psnr_in)), 2),
            "bytes_per_frame": round(bytes_ / frames),
            "export_s": round(export_s, 2),
        }
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks lerobot")
    add_size_flags(ap, quick="320x240 renders of 1 s")
    args = ap.parse_args(argv)
    size = size_of(args)
    w, h, secs = {"full": (640, 480, 3.0), "quick": (320, 240, 1.0), "tiny": (64, 48, 0.5)}[size]
    sim = rendered(2, secs, w, h)
    scenes = {
        "synthetic 64x96, H.264": (
            episodes(
                [
                    {f"{L.CAMERA_PREFIX}top": synthetic(20, 0), f"{L.CAMERA_PREFIX}wrist": synthetic(20, 2)},
                    {f"{L.CAMERA_PREFIX}top": synthetic(14, 1), f"{L.CAMERA_PREFIX}wrist": synthetic(14, 3)},
                ]
            ),
            False,
        ),
        f"rendered {w}x{h}, H.264": (episodes(sim), False),
    }
    skipped = {}
    if AV1_ENCODER in av.codecs_available:
        scenes[f"rendered {w}x{h}, AV1 (as LeRobot)"] = (episodes(sim), True)
    else:
        skipped[f"rendered {w}x{h}, AV1 (as LeRobot)"] = f"this PyAV build has no {AV1_ENCODER} encoder"
    results = {}
    for name, (src, av1) in scenes.items():
        with tempfile.TemporaryDirectory() as d:
            results[name] = round_trip(src, Path(d), av1)
    print("LeRobot round trip (import -> transcode -> export): PSNR loss per camera vs the imported frames\n")
    print(f"{'source':<36}{'transcode':<20}{'PSNR in':>9}{'loss max':>10}{'loss min':>10}{'B/frame':>10}")
    # this table and the skipped list print like catalog.py's end of main(): other tables, by chance alike
    for name, by in results.items():
        for label, r in by.items():
            print(
                f"{name:<36}{label:<20}{r['psnr_in_db']:>9.2f}{r['loss_db_max']:>10.2f}{r['loss_db_min']:>10.2f}"
                f"{r['bytes_per_frame']:>10}"
            )
    for name, why in skipped.items():
        print(f"{name:<36}skipped: {why}")
    site = next(k for k in next(iter(results.values())) if "site" in k)
    worst = max(r[site]["loss_db_max"] for r in results.values())
    print(f"\nworst loss with the pipeline's default settings: {worst:.2f} dB (bar <= 1 dB)")
    print(
        json.dumps(
            {
                "benchmark": "lerobot",
                "size": size,
                "worst_loss_db": worst,
                "bar_db": 1.0,
                "scenes": results,
                "skipped": skipped,
            }
        )
    )
    return 0
