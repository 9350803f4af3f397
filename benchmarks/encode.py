"""Encoding at fleet rate: x264 presets, CRFs and options, by bytes, quality and CPU, and what each costs.

`python -m benchmarks encode [--quick | --tiny] [--dir DIR] [--core-hour-usd X] [--storage-gb-month-usd X]
[--retention-months N] [--copies N]`

Frames: GOPs of the sample fleet's renderer (different episodes, sites and cameras), each frame
stored as the legacy HDF5 stores it (JPEG q90, 4:2:0, ``raw_format.encode_jpeg``) and decoded as
the transcode decodes it (``codec.jpeg_to_yuv``: the JPEG's own YUV planes). Those planes are
encoded by ``codec.encode_gop`` exactly as the pipeline encodes a GOP (fresh encoder, bf=0, fixed
keyint, repeat-headers, tune psnr, one pinned thread); the sweep only changes preset, CRF and extra
x264 options (appended to the pipeline's ``x264-params``, so they override the preset's).

Per setting: bytes per frame; encoder CPU seconds per frame (``time.process_time`` around
``encode_gop``: one single-threaded encoder per process, input frames prepared before the clock
starts); and PSNR as the storage benchmark measures it, the mean per-frame PSNR against the
renderer's raw frames (before any JPEG) of the decoded frames converted to RGB the way the reader
converts them (``psnr_db``), plus luma-only PSNR against the raw frames' BT.601 Y (``psnr_y_db``) and
luma PSNR against the decoded JPEG the encoder was given (``psnr_y_vs_input_db``: what the transcode
itself loses). JPEG q90 gets the same figures on the same frames: the reference.

Sweep: (1) every preset over a CRF grid; (2) a few x264 options that matter without B-frames
(refs, subme, me, trellis, rc-lookahead; rc-lookahead=0 turns mbtree off) on top of presets, at the
two grid CRFs around where their preset crosses the quality floor; (3) for every (preset, options)
family, the CRF that crosses the floor (JPEG q90's PSNR - ``--max-psnr-loss-db``), interpolated from
its points and then measured, until one of its points sits within 0.04 dB above the floor, so the
families are compared at equal quality by measured points only (one CRF step is ~25 % of the
bytes: a grid alone is too coarse for that); (4) the Pareto front's settings encoded twice more,
each keeping its least CPU time (other processes on the cores inflate process CPU time too).

The cost model (``dyna_resources/episodes/encode_cost.py``) prices each point per episode-hour (3
cameras at 30 Hz): encode CPU once plus storage over the retention. Printed: the table, the Pareto
front (bytes vs CPU at acceptable quality), a PNG plot, and the cheapest setting that also encodes
at least ``--min-episode-hours-per-core-hour`` (the fleet rate; 0: no floor) and the cheapest without
that floor. Figures are per core on this machine (``--workers`` settings encode side by side).

Full: 3 GOPs x 150 frames at 640x480 (two sites; scene and wrist cameras), every preset but
veryslow, 11 option variants (~10-15 min on 2 cores); ``--quick``: 2 GOPs x 75 frames at 640x480, 5
presets, 3 variants; ``--tiny``: 1 GOP of 8 frames at 64x48, a handful of settings (figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import av
import numpy as np

from dyna_resources.episodes.codec import FULL_RANGE, VideoSettings, decoded_to_rgb, encode_gop, jpeg_to_yuv
from dyna_resources.episodes.encode_cost import (
    CostModel,
    EncodePoint,
    Pick,
    cheapest,
    cost_per_episode_hour,
    episode_hours_per_core_hour,
    pareto_front,
)
from dyna_resources.episodes.raw_format import decode_jpeg, encode_jpeg
from dyna_resources.episodes.sim import SimulatedEpisode, fleet_specs

from ._cli import add_size_flags, size_of

PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
JPEG_QUALITY = 90
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # BT.601 full range: JPEG's Y
# One CRF step is ~0.2 dB and ~25 % of the bytes here, so 0.04 dB above the floor is already ~5 % of the bytes.
TARGET_MARGIN_DB = 0.02  # refined CRFs aim this far above the floor, so interpolation error rarely lands under it
TOLERANCE_DB = 0.04  # a family is refined until one of its points sits in [floor, floor + this]
RETIMES = 2  # extra encodes of each Pareto-front setting: its CPU is the least of 1 + RETIMES timings
SIZE_RATIO_GOAL = 0.20
CHUNK_FRAMES = 16  # frames per vectorized PSNR step: bounds the float32 temporaries


def sweep_settings(preset: str, crf: float, options: str = "") -> VideoSettings:
    """The pipeline's settings with only preset, CRF and the extra x264 options changed (``options``
    replace the default's ``x264_options``: a plain point is the preset's own behaviour)."""
    return VideoSettings(preset=preset, crf=crf, x264_options=options)


@dataclass(frozen=True)
class Plan:
    """What one size of the benchmark runs."""

    width: int
    height: int
    gop_frames: int
    sources: tuple[tuple[int, str], ...]  # (fleet episode index, camera): one GOP each
    presets: tuple[str, ...]
    crfs: tuple[float, ...]
    variants: tuple[tuple[str, str], ...]  # (preset, x264 options)
    refine_steps: int


# Without B-frames what moves bytes at equal PSNR is mostly mbtree (rc-lookahead=0 turns it off) and
# trellis: on noisy sensor frames both spend bits on the JPEG's noise, not the scene. refs, subme and
# me trade CPU for a little.
VARIANTS_FULL = (
    ("veryfast", "rc-lookahead=0"),
    ("veryfast", "ref=2:rc-lookahead=0"),
    ("faster", "rc-lookahead=0"),
    ("faster", "trellis=0"),
    ("faster", "trellis=0:rc-lookahead=0"),
    ("faster", "me=umh:trellis=0:rc-lookahead=0"),
    ("faster", "subme=6:trellis=0:rc-lookahead=0"),
    ("fast", "trellis=0:rc-lookahead=0"),
    ("medium", "trellis=0:rc-lookahead=0"),
    ("slow", "trellis=0:rc-lookahead=0"),
    ("slower", "trellis=0:rc-lookahead=0"),
)
PLANS = {
    "full": Plan(
        640,
        480,
        150,
        ((0, "scene_left"), (1, "wrist"), (3, "scene_right")),
        PRESETS[:-1],
        (17.0, 19.0, 21.0),
        VARIANTS_FULL,
        3,
    ),
    "quick": Plan(
        640,
        480,
        75,
        ((0, "scene_left"), (1, "wrist")),
        ("veryfast", "faster", "medium", "slow", "slower"),
        (17.0, 19.0, 21.0),
        (
            ("veryfast", "rc-lookahead=0"),
            ("faster", "trellis=0:rc-lookahead=0"),
            ("medium", "trellis=0:rc-lookahead=0"),
        ),
        2,
    ),
    "tiny": Plan(
        64, 48, 8, ((0, "scene_left"),), ("veryfast", "medium"), (20.0, 24.0), (("veryfast", "rc-lookahead=0"),), 1
    ),
}


@dataclass(frozen=True)
class Measurement:
    """One setting on the whole corpus."""

    point: EncodePoint
    psnr_y_db: float
    psnr_y_vs_input_db: float
    stage: str  # "grid", "variant" or "refined"
    timings: int = 1  # encodes whose least CPU time is the point's (more for the Pareto front: see retime)

    @property
    def family(self) -> tuple[str, str]:
        return self.point.preset, self.point.options


@dataclass(frozen=True)
class JpegReference:
    bytes_per_frame: float
    psnr_db: float
    psnr_y_db: float
    frames: int


# ---- PSNR, vectorized over frames ------------------------------------------------------------------
def per_frame_psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PSNR (dB, 8-bit peak) of each frame of ``a`` against the same frame of ``b``; (n, ...) arrays."""
    out = np.empty(len(a))
    for s in range(0, len(a), CHUNK_FRAMES):
        d = np.subtract(a[s : s + CHUNK_FRAMES], b[s : s + CHUNK_FRAMES], dtype=np.float32).reshape(
            min(CHUNK_FRAMES, len(a) - s), -1
        )
        np.square(d, out=d)
        mse = d.sum(axis=1, dtype=np.float64) / d.shape[1]  # numpy's pairwise sum: float32 rows stay exact enough
        out[s : s + len(mse)] = 10 * np.log10(255.0**2 / np.maximum(mse, 1e-12))
    return out


def luma(rgb: np.ndarray) -> np.ndarray:
    """(n, H, W, 3) uint8 RGB -> (n, H, W) float32 full-range BT.601 Y, unrounded."""
    return np.concatenate(
        [rgb[s : s + CHUNK_FRAMES].astype(np.float32) @ LUMA for s in range(0, len(rgb), CHUNK_FRAMES)]
    )


# ---- the corpus: raw frames and the decoded JPEG planes the encoder gets ---------------------------------
def _render_gop(job: tuple) -> dict:
    spec, camera, n, folder = job
    sim = SimulatedEpisode(spec)
    first = (sim.n_frames(camera) - n) // 2  # the middle of the episode: the arm is moving
    raw = np.stack([sim.render_frame(camera, first + i) for i in range(n)])
    jpegs = [encode_jpeg(f, JPEG_QUALITY) for f in raw]
    planes = np.stack([jpeg_to_yuv(j).to_ndarray() for j in jpegs])  # (n, H*3/2, W) I420
    jpeg_rgb = np.stack([decode_jpeg(j, "<encode benchmark>", camera, i) for i, j in enumerate(jpegs)])
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "raw.npy", raw)
    np.save(folder / "planes.npy", planes)
    raw_y = luma(raw)
    np.save(folder / "luma.npy", raw_y)
    return {
        "bytes": [len(j) for j in jpegs],
        "psnr": per_frame_psnr(jpeg_rgb, raw).tolist(),
        "psnr_y": per_frame_psnr(planes[:, : spec.height], raw_y).tolist(),
    }


def make_corpus(folder: Path, plan: Plan, workers: int) -> tuple[list[Path], JpegReference, list[str]]:
    """Render the plan's GOPs into ``folder`` (one sub-folder each); JPEG q90's figures on them."""
    duration = plan.gop_frames / 30.0 + 2.0
    specs = fleet_specs(
        max(k for k, _ in plan.sources) + 1, seed=17, width=plan.width, height=plan.height, duration_s=duration
    )
    gops = [folder / f"gop{g}" for g in range(len(plan.sources))]
    jobs = [(specs[k], cam, plan.gop_frames, gops[g]) for g, (k, cam) in enumerate(plan.sources)]
    with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
        stats = list(pool.map(_render_gop, jobs))
    names = [f"{specs[k].site}/{specs[k].task}/{cam}" for k, cam in plan.sources]
    every = {k: [v for s in stats for v in s[k]] for k in ("bytes", "psnr", "psnr_y")}
    ref = JpegReference(
        bytes_per_frame=float(np.mean(every["bytes"])),
        psnr_db=float(np.mean(every["psnr"])),
        psnr_y_db=float(np.mean(every["psnr_y"])),
        frames=len(every["bytes"]),
    )
    return gops, ref, names


# ---- measuring one setting (in a worker process) ---------------------------------------------------------
def _as_encoder_input(planes: np.ndarray) -> av.VideoFrame:
    frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
    frame.color_range = FULL_RANGE  # what jpeg_to_yuv hands the encoder: the same planes, full range
    return frame


def _decode(access_units: list[bytes]) -> list[av.VideoFrame]:
    ctx = av.CodecContext.create("h264", "r")
    ctx.thread_type = "NONE"
    frames = []
    for i, au in enumerate(access_units):
        packet = av.Packet(au)
        packet.pts = i
        frames.extend(ctx.decode(packet))
    frames.extend(ctx.decode(None))
    return frames


def _encode_timed(folder: Path, settings: VideoSettings) -> tuple[list[bytes], float]:
    """One GOP's access units and the encoder's CPU seconds (input frames built before the clock starts)."""
    frames = [_as_encoder_input(np.ascontiguousarray(p)) for p in np.load(folder / "planes.npy", mmap_mode="r")]
    t = time.process_time()
    units = encode_gop(frames, settings)
    return units, time.process_time() - t


def encode_cpu_s_per_frame(gops: list[Path], preset: str, crf: float, options: str) -> float:
    """Encoder CPU seconds per frame of one setting over every GOP, without the quality measurement."""
    settings = sweep_settings(preset, crf, options)
    timed = [_encode_timed(folder, settings) for folder in gops]
    return sum(cpu for _, cpu in timed) / sum(len(units) for units, _ in timed)


def measure(gops: list[Path], preset: str, crf: float, options: str, stage: str) -> Measurement:
    """Encode every GOP at one setting as the pipeline does; bytes, encoder CPU and PSNR."""
    settings = sweep_settings(preset, crf, options)
    n_bytes = n_frames = 0
    cpu_s = 0.0
    psnr, psnr_y, psnr_in = [], [], []
    for folder in gops:
        raw = np.load(folder / "raw.npy", mmap_mode="r")
        planes = np.load(folder / "planes.npy", mmap_mode="r")
        raw_y = np.load(folder / "luma.npy", mmap_mode="r")
        h = raw.shape[1]
        units, cpu = _encode_timed(folder, settings)
        cpu_s += cpu
        n_bytes += sum(len(u) for u in units)
        n_frames += len(planes)
        decoded = _decode(units)
        if len(decoded) != len(planes):
            raise RuntimeError(f"{folder}: {len(planes)} frames encoded, {len(decoded)} decoded")
        got_y = np.stack([f.to_ndarray()[:h] for f in decoded])
        psnr.append(per_frame_psnr(np.stack([decoded_to_rgb(f) for f in decoded]), raw))
        psnr_y.append(per_frame_psnr(got_y, raw_y))
        psnr_in.append(per_frame_psnr(got_y, planes[:, :h]))
    point = EncodePoint(
        preset=preset,
        crf=crf,
        options=options,
        bytes_per_frame=n_bytes / n_frames,
        psnr_db=float(np.mean(np.concatenate(psnr))),
        cpu_s_per_frame=cpu_s / n_frames,
    )
    return Measurement(point, float(np.mean(np.concatenate(psnr_y))), float(np.mean(np.concatenate(psnr_in))), stage)


def measure_all(
    pool: ProcessPoolExecutor, gops: list[Path], jobs: list[tuple[str, float, str, str]]
) -> list[Measurement]:
    # Slowest presets first, so that the last job left running on a core is a short one.
    order = sorted(jobs, key=lambda j: (-PRESETS.index(j[0]), j[1]))
    futures = [pool.submit(measure, gops, *j) for j in order]
    return [f.result() for f in futures]


# ---- the CRF at which a family crosses the quality floor ---------------------------------------------------
def crossing_crf(samples: list[tuple[float, float]], target_db: float) -> float | None:
    """The CRF at which PSNR reaches ``target_db``, linear between the measured (crf, psnr) nearest it
    on either side (extrapolated, at most 3 CRF beyond the measured range, when all are on one side)."""
    if len({c for c, _ in samples}) < 2:
        return None
    above = [s for s in samples if s[1] >= target_db]
    below = [s for s in samples if s[1] < target_db]
    if above and below:
        pair = [min(above, key=lambda s: s[1]), max(below, key=lambda s: s[1])]
    else:
        by_distance = sorted(samples, key=lambda s: abs(s[1] - target_db))
        pair = [by_distance[0], next(s for s in by_distance if s[0] != by_distance[0][0])]
    (c0, p0), (c1, p1) = pair
    if p0 == p1:
        return None
    crf = c0 + (p0 - target_db) * (c1 - c0) / (p0 - p1)
    crfs = [c for c, _ in samples]
    return round(float(np.clip(crf, max(0.0, min(crfs) - 3), min(51.0, max(crfs) + 3))), 2)


def refine(pool, gops, rows: list[Measurement], floor_db: float, steps: int) -> list[Measurement]:
    """Measure, per family, the CRF that crosses the floor, until a point of it sits just above the floor."""
    for _ in range(steps):
        jobs = []
        for family in dict.fromkeys(r.family for r in rows):
            mine = [r.point for r in rows if r.family == family]
            if any(floor_db <= p.psnr_db <= floor_db + TOLERANCE_DB for p in mine):
                continue
            crf = crossing_crf([(p.crf, p.psnr_db) for p in mine], floor_db + TARGET_MARGIN_DB)
            if crf is not None and all(abs(crf - p.crf) > 0.005 for p in mine):
                jobs.append((family[0], crf, family[1], "refined"))
        if not jobs:
            break
        rows = rows + measure_all(pool, gops, jobs)
    return rows


def retime(pool, gops, rows: list[Measurement], floor_db: float) -> list[Measurement]:
    """The Pareto front's settings encoded RETIMES more times, each keeping its least CPU time.

    Process CPU time still grows when other processes share the cores (caches, memory bandwidth); the
    least of a few timings is the steadiest figure, and the front is where the pick comes from.
    """
    on_front = {id(p) for p in pareto_front([r.point for r in rows], floor_db)}
    chosen = [r for r in rows if id(r.point) in on_front]
    futures = {
        id(r): [
            pool.submit(encode_cpu_s_per_frame, gops, r.point.preset, r.point.crf, r.point.options)
            for _ in range(RETIMES)
        ]
        for r in chosen
    }
    out = []
    for r in rows:
        if id(r) in futures:
            cpu = min([r.point.cpu_s_per_frame] + [f.result() for f in futures[id(r)]])
            r = replace(r, point=replace(r.point, cpu_s_per_frame=cpu), timings=1 + RETIMES)
        out.append(r)
    return out


def variant_jobs(plan: Plan, grid: list[Measurement], floor_db: float) -> list[tuple[str, float, str, str]]:
    """Each variant at the two grid CRFs around where its preset crosses the floor."""
    jobs = []
    for preset, options in plan.variants:
        samples = [(r.point.crf, r.point.psnr_db) for r in grid if r.point.preset == preset]
        crf = crossing_crf(samples, floor_db) if samples else None
        if crf is None:
            crf = float(np.median(plan.crfs))
        near = sorted(plan.crfs, key=lambda c: (abs(c - crf), c))[:2]
        jobs += [(preset, c, options, "variant") for c in sorted(near)]
    return jobs


# ---- output ---------------------------------------------------------------------------------------------
def plot(
    path: Path,
    rows: list[Measurement],
    front: list[EncodePoint],
    picks: dict[str, Pick | None],
    floor_db: float,
    model: CostModel,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 6))
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.95, len(PRESETS)))
    for k, preset in enumerate(PRESETS):
        mine = [r.point for r in rows if r.point.preset == preset]
        ok = [p for p in mine if p.psnr_db >= floor_db]
        low = [p for p in mine if p.psnr_db < floor_db]
        if ok:
            ax.scatter(
                [p.cpu_s_per_frame * 1e3 for p in ok],
                [p.bytes_per_frame / 1e3 for p in ok],
                color=colors[k],
                label=preset,
                s=28,
            )
        if low:
            ax.scatter(
                [p.cpu_s_per_frame * 1e3 for p in low],
                [p.bytes_per_frame / 1e3 for p in low],
                facecolors="none",
                edgecolors=colors[k],
                s=28,
                label=None if ok else f"{preset} (under floor)",
            )
    ax.plot(
        [p.cpu_s_per_frame * 1e3 for p in front],
        [p.bytes_per_frame / 1e3 for p in front],
        "k--",
        lw=1,
        label="Pareto front (PSNR >= floor)",
    )
    for name, pick in picks.items():
        if pick is not None:
            ax.scatter(
                [pick.point.cpu_s_per_frame * 1e3],
                [pick.point.bytes_per_frame / 1e3],
                marker="*",
                s=260,
                color="red" if name == "pick" else "orange",
                zorder=5,
                label=f"{name}: {pick.point.label}",
            )
    budget_ms = 3600.0 / model.frames_per_episode_hour * 1e3
    ax.axvline(budget_ms, color="gray", lw=1, ls=":", label="1 episode-hour per core-hour")
    ax.set_xscale("log")
    ax.set_xlabel("encoder CPU ms per frame (one core)")
    ax.set_ylabel("KB per frame")
    ax.set_title(f"x264 settings, bf=0; filled: PSNR >= {floor_db:.2f} dB (JPEG q90 - loss)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the points fill the axes
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def row_dict(r: Measurement, ref: JpegReference, model: CostModel) -> dict:
    p = r.point
    cost = cost_per_episode_hour(p, model)
    return {
        **asdict(p),
        "label": p.label,
        "stage": r.stage,
        "timings": r.timings,
        "psnr_y_db": r.psnr_y_db,
        "psnr_y_vs_input_db": r.psnr_y_vs_input_db,
        "size_ratio_vs_jpeg": p.bytes_per_frame / ref.bytes_per_frame,
        "psnr_vs_jpeg_db": p.psnr_db - ref.psnr_db,
        "episode_hours_per_core_hour": episode_hours_per_core_hour(p, model),
        "compute_usd_per_episode_hour": cost.compute_usd,
        "storage_usd_per_episode_hour": cost.storage_usd,
        "usd_per_episode_hour": cost.total_usd,
    }


def pick_dict(pick: Pick | None, ref: JpegReference) -> dict | None:
    if pick is None:
        return None
    p = pick.point
    return {
        "preset": p.preset,
        "crf": p.crf,
        "options": p.options,
        "label": p.label,
        "bytes_per_frame": p.bytes_per_frame,
        "size_ratio_vs_jpeg": p.bytes_per_frame / ref.bytes_per_frame,
        "psnr_db": p.psnr_db,
        "psnr_vs_jpeg_db": p.psnr_db - ref.psnr_db,
        "cpu_s_per_frame": p.cpu_s_per_frame,
        "encode_episode_hours_per_core_hour": pick.episode_hours_per_core_hour,
        "compute_usd_per_episode_hour": pick.cost.compute_usd,
        "storage_usd_per_episode_hour": pick.cost.storage_usd,
        "usd_per_episode_hour": pick.cost.total_usd,
    }


def print_table(
    rows: list[Measurement],
    ref: JpegReference,
    model: CostModel,
    floor_db: float,
    front: list[EncodePoint],
    picks: dict[str, Pick | None],
) -> None:
    on_front = {id(p) for p in front}
    picked = {id(pk.point): name for name, pk in picks.items() if pk is not None}
    print(
        f"  {'preset':<10}{'crf':>6} {'options':<20}{'KB/fr':>7}{'xJPEG':>7}{'PSNR':>7}{'dJPEG':>7}{'PSNR-Y':>7}"
        f"{'Y-in':>7}{'ms/fr':>7}{'eph/ch':>7}{'$/eph':>7}  note"
    )
    order = sorted(rows, key=lambda r: (PRESETS.index(r.point.preset), r.point.options, r.point.crf))
    for r in order:
        p = r.point
        marks = [m for m, on in (("front", id(p) in on_front), ("under floor", p.psnr_db < floor_db)) if on]
        marks += [picked[id(p)].upper()] if id(p) in picked else []
        marks += [r.stage] if r.stage != "grid" else []
        marks += [f"least of {r.timings} timings"] if r.timings > 1 else []
        cost = cost_per_episode_hour(p, model)
        print(
            f"  {p.preset:<10}{p.crf:>6g} {p.options or '-':<20}{p.bytes_per_frame / 1e3:>7.2f}"
            f"{p.bytes_per_frame / ref.bytes_per_frame:>7.3f}{p.psnr_db:>7.2f}{p.psnr_db - ref.psnr_db:>+7.2f}"
            f"{r.psnr_y_db:>7.2f}{r.psnr_y_vs_input_db:>7.2f}{p.cpu_s_per_frame * 1e3:>7.2f}"
            f"{episode_hours_per_core_hour(p, model):>7.2f}{cost.total_usd:>7.3f}  {', '.join(marks)}"
        )


def main(argv: list[str]) -> int:
    # its flags look like object_server.py's main() (argparse declarations); each command line its own
    ap = argparse.ArgumentParser(prog="python -m benchmarks encode", description=__doc__.split("\n")[0])
    add_size_flags(ap, quick="2 GOPs x 75 frames at 640x480, 5 presets, 3 CRFs, 3 option variants (minutes)")
    ap.add_argument("--dir", help="where the plot goes and the work files live while it runs (default: a temp folder)")
    ap.add_argument(
        "--plot", help="PNG path of the bytes-vs-CPU plot (default: DIR or the temp folder, encode-SIZE.png)"
    )
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="settings encoded side by side")
    defaults = CostModel()
    ap.add_argument("--core-hour-usd", type=float, default=defaults.core_hour_usd)
    ap.add_argument("--storage-gb-month-usd", type=float, default=defaults.storage_gb_month_usd)
    ap.add_argument("--retention-months", type=float, default=defaults.retention_months)
    ap.add_argument("--copies", type=int, default=defaults.copies)
    ap.add_argument("--max-psnr-loss-db", type=float, default=1.0, help="quality floor: JPEG q90's PSNR minus this")
    ap.add_argument(
        "--min-episode-hours-per-core-hour",
        type=float,
        default=1.0,
        help="the fleet rate the pick must encode at (0: none)",
    )
    args = ap.parse_args(argv)
    size = size_of(args)
    plan = PLANS[size]
    try:
        model = CostModel(
            core_hour_usd=args.core_hour_usd,
            storage_gb_month_usd=args.storage_gb_month_usd,
            retention_months=args.retention_months,
            copies=args.copies,
        )
    except ValueError as e:
        ap.error(str(e))
    t_start = time.perf_counter()
    default = VideoSettings()
    plot_path = Path(args.plot) if args.plot else Path(args.dir or tempfile.gettempdir()) / f"encode-{size}.png"
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dyna-bench-encode-", dir=args.dir) as tmp:
        gops, ref, names = make_corpus(Path(tmp), plan, args.workers)
        floor_db = ref.psnr_db - args.max_psnr_loss_db
        print(
            f"encode benchmark: {len(gops)} GOPs x {plan.gop_frames} frames, {plan.width}x{plan.height} "
            f"({', '.join(names)}); libx264 bf=0, tune {default.tune}, 1 thread, {args.workers} settings side by side"
        )
        print(
            f"  JPEG q90: {ref.bytes_per_frame / 1e3:.2f} KB/frame, PSNR vs raw {ref.psnr_db:.2f} dB "
            f"(Y {ref.psnr_y_db:.2f}); quality floor {floor_db:.2f} dB",
            flush=True,
        )
        grid = [(p, c, "", "grid") for p in plan.presets for c in plan.crfs]
        if (default.preset, default.crf, default.x264_options, "grid") not in grid:
            grid.append((default.preset, default.crf, default.x264_options, "grid"))
        with ProcessPoolExecutor(args.workers) as pool:
            rows = measure_all(pool, gops, grid)
            rows += measure_all(pool, gops, variant_jobs(plan, rows, floor_db))
            rows = refine(pool, gops, rows, floor_db, plan.refine_steps)
            rows = retime(pool, gops, rows, floor_db)
    points = [r.point for r in rows]
    front = pareto_front(points, floor_db)
    rate = args.min_episode_hours_per_core_hour
    picks = {
        "pick": cheapest(points, model, floor_db, min_episode_hours_per_core_hour=rate),
        "cost only": cheapest(points, model, floor_db),
    }
    goal = [
        r
        for r in rows
        if r.point.psnr_db >= floor_db
        and r.point.bytes_per_frame / ref.bytes_per_frame <= SIZE_RATIO_GOAL
        and episode_hours_per_core_hour(r.point, model) >= 1.0
    ]
    current = next(
        (
            r
            for r in rows
            if (r.point.preset, r.point.crf, r.point.options) == (default.preset, default.crf, default.x264_options)
        ),
        None,
    )
    plot(plot_path, rows, front, picks, floor_db, model)

    print(
        f"  cost model: ${model.core_hour_usd:g}/core-hour, ${model.storage_gb_month_usd:g}/GB-month x "
        f"{model.retention_months:g} months x {model.copies} copies; 1 episode-hour = "
        f"{model.frames_per_episode_hour:,} frames (3 cameras x 30 Hz)"
    )
    print(
        "  columns: xJPEG = bytes / JPEG q90's; dJPEG = PSNR - JPEG q90's; Y-in = luma PSNR vs the decoded JPEG "
        "(the encoder's input); eph/ch = episode-hours per core-hour; $/eph = USD per episode-hour"
    )
    print_table(rows, ref, model, floor_db, front, picks)
    print(f"\n  Pareto front (PSNR >= {floor_db:.2f} dB), fastest first:")
    for p in front:
        c = cost_per_episode_hour(p, model)
        print(
            f"    {p.label:<36} {p.bytes_per_frame / ref.bytes_per_frame:.3f} x JPEG  {p.cpu_s_per_frame * 1e3:6.2f} ms/frame"
            f"  {episode_hours_per_core_hour(p, model):5.2f} eph/ch  ${c.compute_usd:.3f} + ${c.storage_usd:.3f}"
            f" = ${c.total_usd:.3f}/episode-hour"
        )
    for name, pk in picks.items():
        floor_txt = f">= {rate:g} episode-hours/core-hour, " if name == "pick" and rate else ""
        if pk is None:
            print(f"  {name}: no setting reaches {floor_txt}PSNR >= {floor_db:.2f} dB")
            continue
        p = pk.point
        print(
            f"  {name} ({floor_txt}PSNR >= {floor_db:.2f} dB, cheapest): {p.label}: "
            f"{p.bytes_per_frame / ref.bytes_per_frame:.3f} x JPEG bytes, PSNR {p.psnr_db:.2f} dB "
            f"({p.psnr_db - ref.psnr_db:+.2f} vs JPEG q90), {pk.episode_hours_per_core_hour:.2f} episode-hours/core-hour, "
            f"${pk.cost.total_usd:.3f}/episode-hour"
        )
    if current is not None:
        cur = current.point
        print(
            f"  current default {cur.label}: {cur.bytes_per_frame / ref.bytes_per_frame:.3f} x JPEG, "
            f"PSNR {cur.psnr_db:.2f} dB, {episode_hours_per_core_hour(cur, model):.2f} episode-hours/core-hour, "
            f"${cost_per_episode_hour(cur, model).total_usd:.3f}/episode-hour"
        )
    print(
        f"  settings with ratio <= {SIZE_RATIO_GOAL}, PSNR >= floor and >= 1 episode-hour/core-hour: "
        f"{', '.join(r.point.label for r in goal) or 'none'}"
    )
    print(f"  plot: {plot_path}")

    pick = picks["pick"]
    result = {
        "size": size,
        "resolution": f"{plan.width}x{plan.height}",
        "gops": len(gops),
        "frames_per_gop": plan.gop_frames,
        "frames": ref.frames,
        "sources": names,
        "workers": args.workers,
        "tune": default.tune,
        "jpeg_q90_bytes_per_frame": ref.bytes_per_frame,
        "jpeg_q90_psnr_db": ref.psnr_db,
        "jpeg_q90_psnr_y_db": ref.psnr_y_db,
        "psnr_floor_db": floor_db,
        "max_psnr_loss_db": args.max_psnr_loss_db,
        "min_episode_hours_per_core_hour": rate,
        "cost_model": asdict(model),
        "pick": pick_dict(pick, ref),
        "size_ratio_vs_jpeg": None if pick is None else pick.point.bytes_per_frame / ref.bytes_per_frame,
        "psnr_db": None if pick is None else pick.point.psnr_db,
        "psnr_vs_jpeg_db": None if pick is None else pick.point.psnr_db - ref.psnr_db,
        "encode_episode_hours_per_core_hour": None if pick is None else pick.episode_hours_per_core_hour,
        "pick_cost_only": pick_dict(picks["cost only"], ref),
        "current_default": None if current is None else row_dict(current, ref, model),
        "meets_goal": [r.point.label for r in goal],
        "size_ratio_goal": SIZE_RATIO_GOAL,
        "front": [p.label for p in front],
        "rows": [row_dict(r, ref, model) for r in rows],
        "plot": str(plot_path),
        "elapsed_s": time.perf_counter() - t_start,
    }
    print(json.dumps(result))
    return 0
