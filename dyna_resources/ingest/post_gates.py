"""Post-transform gates: read the MCAP back and compare it with its source.

The MCAP is verified as a reader would see it, not as the writer believed it wrote it:
CRCs checked, every H.264 access unit decoded, frames and samples counted from the file.
"""

from __future__ import annotations

from pathlib import Path

import av

from ..episodes.errors import EpisodeError
from ..episodes.mcap_reader import EpisodeReader
from .gates import GateConfig, GateResult, size_ratio_ok


def decode_all(reader: EpisodeReader, camera: str) -> tuple[int, int, int]:
    """Decode every frame of a camera; returns (frames decoded, first ns, last ns). Raises on a bad stream."""
    ctx = av.CodecContext.create("h264", "r")
    ctx.thread_type = "NONE"
    ctx.options = {"err_detect": "explode"}
    n = 0
    first = last = -1
    for t, au in reader.iter_video(camera):
        first = t if first < 0 else first
        last = t
        n += len(ctx.decode(av.Packet(au)))
    n += len(ctx.decode(None))
    return n, first, last


def post_gates(mcap_path: Path, source: dict, gates: GateConfig) -> list[GateResult]:
    """``source``: the transcode report as a dict (cameras with frames and timestamps, streams, bytes)."""
    enabled = gates.enabled("post")
    if not enabled:
        return []
    results: list[GateResult] = []
    try:
        reader = EpisodeReader(mcap_path)
    except EpisodeError as e:
        return [GateResult(g, False, gates[g].action, f"MCAP unreadable: {e.reason}") for g in enabled
                if g != "size_sanity"] + _size(source, gates, enabled)
    with reader:
        decoded: dict[str, tuple[int, int, int]] = {}
        errors: dict[str, str] = {}
        for cam in source["cameras"]:
            try:
                if "decodable" in enabled:
                    decoded[cam] = decode_all(reader, cam)
                else:
                    ts = [t for t, _ in reader.iter_video(cam)]
                    decoded[cam] = (len(ts), ts[0] if ts else -1, ts[-1] if ts else -1)
            except (av.FFmpegError, EpisodeError, ValueError) as e:
                errors[cam] = str(getattr(e, "reason", e))
        if "decodable" in enabled:
            results.append(GateResult("decodable", not errors, gates["decodable"].action,
                                      "; ".join(f"{c}: {m}" for c, m in errors.items())))
        if "frame_counts" in enabled:
            bad = []
            for cam, info in source["cameras"].items():
                got = decoded.get(cam, (0, -1, -1))[0]
                if got != info["frames"]:
                    bad.append(f"{cam}: {got} frames, source has {info['frames']}")
            try:
                streams = reader.read_streams(list(source["streams"]), 0, 2**63 - 1)  # every sample
                for name, n in source["streams"].items():
                    if len(streams[name].timestamps_ns) != n:
                        bad.append(f"{name}: {len(streams[name].timestamps_ns)} samples, source has {n}")
            except EpisodeError as e:
                bad.append(f"streams unreadable: {e.reason}")
            results.append(GateResult("frame_counts", not bad, gates["frame_counts"].action, "; ".join(bad)))
        if "durations" in enabled:
            tol = int(float(gates.param("durations", "tolerance_s")) * 1e9)
            bad = []
            for cam, info in source["cameras"].items():
                _, first, last = decoded.get(cam, (0, -1, -1))
                if abs(first - info["first_ns"]) > tol or abs(last - info["last_ns"]) > tol:
                    bad.append(f"{cam}: spans {first}..{last} ns, source {info['first_ns']}..{info['last_ns']} ns")
            results.append(GateResult("durations", not bad, gates["durations"].action, "; ".join(bad)))
    return results + _size(source, gates, enabled)


def _size(source: dict, gates: GateConfig, enabled: list[str]) -> list[GateResult]:
    if "size_sanity" not in enabled:
        return []
    lo, hi = float(gates.param("size_sanity", "min_ratio")), float(gates.param("size_sanity", "max_ratio"))
    ok, r = size_ratio_ok(source["bytes_out"], source["bytes_in"], lo, hi)
    return [GateResult("size_sanity", ok, gates["size_sanity"].action,
                       "" if ok else f"MCAP/source bytes {r:.4f} outside [{lo}, {hi}]")]
