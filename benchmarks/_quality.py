"""PSNR of decoded MCAP frames against the simulator's raw frames (before any JPEG), next to
the legacy JPEG's PSNR against the same frames: the quality bar of the storage, ingest and
encode figures (ours >= JPEG q90's - 1 dB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.sim import SimulatedEpisode


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def quality(g, mcap_path: Path, every: int, sources: dict | None = None) -> tuple[list[float], list[float]]:
    """PSNR against the raw frames of every ``every``-th frame of episode ``g`` (a
    ``GeneratedEpisode``): (ours, JPEG baseline). ``sources`` caches the rendered raw frames
    between calls on the same episode."""
    sim = SimulatedEpisode(g.spec)
    sources = {} if sources is None else sources
    ours, jpeg = [], []
    with RawEpisode(g.path) as raw, EpisodeReader(mcap_path) as r:
        for cam, stream in raw.cameras.items():
            idx = np.arange(every // 2, len(stream), every)
            got = r.read_frames([cam], stream.timestamps_ns[idx].tolist())[cam]
            for k, i in enumerate(idx):
                if (cam, i) not in sources:
                    raw_frame = sim.render_frame(cam, int(g.frame_indices[cam][i]))
                    sources[cam, i] = (raw_frame, psnr(stream.frame(int(i)), raw_frame))
                source, jpeg_psnr = sources[cam, i]
                ours.append(psnr(got.images[k], source))
                jpeg.append(jpeg_psnr)
    return ours, jpeg
