"""The codec floor both ingest benchmarks measure against, and CPU accounting (process and reaped children):
the bare JPEG decode and H.264 encode of an episode's frames, in the transcoder's GOP windows."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dyna_resources.episodes.raw_format import CameraStream


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def cpu_all() -> float:
    """CPU seconds of this process and of every child it has reaped."""
    return _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN)


def gop_windows(
    raw, gop_frames: int
) -> tuple[list[CameraStream], float, list[tuple[CameraStream, list[tuple[int, int]]]]]:
    """The transcoder's GOP windows (dyna_resources/episodes/transcode.py), per camera:
    [(camera, [(lo, hi), ...])] in the transcoder's camera order, plus the rate it encodes at."""
    from dyna_resources.episodes.transcode import nominal_rate_hz

    cameras = [raw.cameras[c] for c in sorted(raw.cameras)]
    t0 = raw.start_ns
    rate = max(nominal_rate_hz(c.timestamps_ns) for c in cameras) or 30.0
    gop_ns = int(round(gop_frames / rate * 1e9))
    n_windows = (raw.end_ns - t0) // gop_ns + 1
    out = []
    for cam in cameras:
        edges = [0] + [
            int(np.searchsorted(cam.timestamps_ns, t0 + (k + 1) * gop_ns, side="left")) for k in range(n_windows)
        ]
        out.append((cam, [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]))
    return cameras, rate, out


def codec_floor(paths: list[Path], video) -> dict:
    """JPEG decode + H.264 encode of every camera frame, GOP by GOP as the transcoder does, in
    this process. JPEG bytes are read from HDF5 before the clock starts on each window."""
    from dyna_resources.episodes.codec import encode_gop, jpeg_to_yuv
    from dyna_resources.episodes.raw_format import RawEpisode

    decode_s = encode_s = read_s = 0.0
    frames = gops = jpeg_bytes = h264_bytes = 0
    t_wall = time.perf_counter()
    for path in paths:
        with RawEpisode(path) as raw:
            cameras, rate, windows = gop_windows(raw, video.gop_frames)
            per_cam = {cam.name: (cam, spans) for cam, spans in windows}
            n_windows = max(len(s) for _, s in windows)
            its = {name: cam.iter_jpeg() for name, (cam, _) in per_cam.items()}
            for k in range(n_windows):  # window-major, cameras in order: the transcoder's order
                for cam in cameras:
                    spans = per_cam[cam.name][1]
                    if k >= len(spans):
                        continue
                    lo, hi = spans[k]
                    c = time.process_time()
                    jpegs = [next(its[cam.name]) for _ in range(lo, hi)]
                    c1 = time.process_time()
                    yuv = [jpeg_to_yuv(j) for j in jpegs]
                    c2 = time.process_time()
                    units = encode_gop(yuv, video, rate)
                    c3 = time.process_time()
                    h264_bytes += sum(len(u) for u in units)
                    read_s += c1 - c
                    jpeg_bytes += sum(len(j) for j in jpegs)
                    decode_s += c2 - c1
                    encode_s += c3 - c2
                    frames += hi - lo
                    gops += 1
    return {
        "cpu_s": decode_s + encode_s,
        "decode_cpu_s": decode_s,
        "encode_cpu_s": encode_s,
        "jpeg_read_cpu_s": read_s,
        "frames": frames,
        "gops": gops,
        "jpeg_bytes": jpeg_bytes,
        "h264_bytes": h264_bytes,
        "wall_s": time.perf_counter() - t_wall,
    }
