"""Post-transform gates: read the MCAP back and compare it with its source.

The MCAP is verified as a reader would see it, not as the writer believed it wrote it:
CRCs checked, every access unit read, frames and samples counted from the file. The
``decodable`` gate decodes every GOP's keyframe and ``params.sample_gops`` whole GOPs per
episode (0: every GOP); of a camera copied from the source's H.264, the keyframes the transcoder
decoded are not decoded again when they read back as the same bytes (``check_video``).
Decoding every frame cost a quarter of the encode at the default preset (15 % of the
pipeline's CPU); a sample catches what the encoder or writer gets wrong
for a whole stream or GOP, and the CRCs and counts catch what storage gets wrong.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from ..episodes.codec import is_keyframe
from ..episodes.errors import EpisodeError
from ..episodes.mcap_reader import EpisodeReader
from .gates import GateConfig, GateResult
from .measures import size_ratio_ok


@dataclass(frozen=True)
class VideoCheck:
    """One camera as a reader sees it: access units, first and last time, and what was decoded."""

    frames: int
    first_ns: int
    last_ns: int
    gops: int
    decoded_frames: int
    decoded_gops: int
    vouched_keyframes: int = 0  # a copied camera's keyframes read back as the bytes the transcoder decoded


def gops_to_decode(episode: str, gops_per_camera: Mapping[str, int], sample_gops: int) -> dict[str, set[int]]:
    """Which GOPs are decoded in full: ``sample_gops`` of the episode's GOPs over all cameras,
    chosen from a hash of the episode's name (the same on every run); all of them when
    ``sample_gops`` is 0 or at least the episode's count."""
    slots = [(cam, g) for cam in sorted(gops_per_camera) for g in range(gops_per_camera[cam])]
    if sample_gops <= 0 or sample_gops >= len(slots):
        picked = slots
    else:
        seed = int.from_bytes(hashlib.blake2b(episode.encode(), digest_size=8).digest(), "little")
        picked = [slots[i] for i in np.random.default_rng(seed).choice(len(slots), sample_gops, replace=False)]
    out: dict[str, set[int]] = {cam: set() for cam in gops_per_camera}
    for cam, g in picked:
        out[cam].add(g)
    return out


def check_video(reader: EpisodeReader, camera: str, decode: set[int] | None, decoded_keyframes: str = "") -> VideoCheck:
    """Read every access unit of a camera; decode in full the GOPs whose index is in ``decode``
    (None: every GOP) and the keyframe of every other. Each GOP is a closed, independently encoded
    sequence (a fresh encoder per GOP), so a GOP decoded alone is decoded as a player would.
    Raises ValueError naming the unit on a bad stream: one that does not decode, a stream that
    does not open with a keyframe, or a GOP that decodes to other than one picture per unit.

    ``decoded_keyframes``: for a camera the transcoder copied, the digest of the keyframes it decoded
    (strictly, as here) from the source. Read back as those very bytes, they are not decoded a third
    time (the pre gates and the transcoder did); read back as anything else, every one is decoded."""
    frames = gops = decoded_frames = decoded_gops = 0
    first = last = -1
    gop: _GopDecoder | None = None
    digest, vouched = hashlib.blake2b(digest_size=16), []
    for t, au in reader.iter_video(camera):
        where = f"access unit {frames} (at {t} ns)"
        first = t if first < 0 else first
        last = t
        frames += 1
        try:
            if is_keyframe(au):
                if gop is not None:
                    decoded_frames += gop.finish()
                    gop = None
                gops += 1
                full = decode is None or gops - 1 in decode
                decoded_gops += full
                digest.update(au)
                if full:
                    gop = _GopDecoder(gops - 1)
                    gop.send(au)
                elif decoded_keyframes:
                    vouched.append((where, gops - 1, au))
                else:
                    decoded_frames += _decode_alone(gops - 1, au)
            elif gops == 0:
                raise ValueError("the stream does not open with a keyframe")
            elif gop is not None:
                gop.send(au)
        except (av.FFmpegError, ValueError) as e:
            raise ValueError(f"{where}, GOP {max(gops - 1, 0)}: {e}") from None
    if gop is not None:
        decoded_frames += gop.finish()
    matched = digest.hexdigest() == decoded_keyframes
    if vouched and not matched:
        for where, index, au in vouched:  # not the bytes the transcoder decoded: each decoded here
            try:
                decoded_frames += _decode_alone(index, au)
            except (av.FFmpegError, ValueError) as e:
                raise ValueError(f"{where}, GOP {index}: {e}") from None
    return VideoCheck(frames, first, last, gops, decoded_frames, decoded_gops, len(vouched) if matched else 0)


def _decode_alone(index: int, keyframe: bytes) -> int:
    """GOP ``index``'s keyframe decoded on its own: the one picture it gives."""
    gop = _GopDecoder(index)
    gop.send(keyframe)
    return gop.finish()


class _GopDecoder:
    """A fresh decoder for one GOP, counting what goes in and what comes out."""

    def __init__(self, index: int):
        self.index, self.units, self.pictures = index, 0, 0
        self.ctx = av.CodecContext.create("h264", "r")
        self.ctx.thread_type = "NONE"
        self.ctx.options = {"err_detect": "explode"}

    def send(self, au: bytes) -> None:
        self.units += 1
        self.pictures += len(self.ctx.decode(av.Packet(au)))

    def finish(self) -> int:
        self.pictures += len(self.ctx.decode(None))
        if self.pictures != self.units:
            raise ValueError(f"GOP {self.index} decodes to {self.pictures} pictures from {self.units} access units")
        return self.pictures


def post_gates(mcap_path: Path, source: dict, gates: GateConfig) -> list[GateResult]:
    """``source``: the transcode report as a dict (cameras with frames and timestamps, streams, bytes)."""
    enabled = gates.enabled("post")
    if not enabled:
        return []
    results: list[GateResult] = []
    try:
        reader = EpisodeReader(mcap_path)
    except EpisodeError as e:
        return [
            GateResult(g, False, gates[g].action, f"MCAP unreadable: {e.reason}") for g in enabled if g != "size_sanity"
        ] + _size(source, gates, enabled)
    with reader:
        read: dict[str, VideoCheck] = {}
        errors: dict[str, str] = {}
        sample = int(gates.param("decodable", "sample_gops"))
        plan = (
            gops_to_decode(
                mcap_path.stem, {c: int(i.get("keyframes", 1)) for c, i in source["cameras"].items()}, sample
            )
            if "decodable" in enabled and sample > 0
            else {}
        )
        for cam in source["cameras"]:
            try:
                if "decodable" in enabled:
                    vouched = source["cameras"][cam].get("decoded_keyframes", "")
                    read[cam] = check_video(reader, cam, plan.get(cam) if sample > 0 else None, vouched)
                else:
                    ts = [t for t, _ in reader.iter_video(cam)]
                    read[cam] = VideoCheck(len(ts), ts[0] if ts else -1, ts[-1] if ts else -1, 0, 0, 0)
            except (av.FFmpegError, EpisodeError, ValueError) as e:
                errors[cam] = str(getattr(e, "reason", e))
        if "decodable" in enabled:
            results.append(
                GateResult(
                    "decodable",
                    not errors,
                    gates["decodable"].action,
                    "; ".join(f"{c}: {m}" for c, m in errors.items()),
                )
            )
        if "frame_counts" in enabled:
            bad = []
            for cam, info in source["cameras"].items():
                got = read[cam].frames if cam in read else 0
                if got != info["frames"]:
                    bad.append(f"{cam}: {got} frames, source has {info['frames']}")
            try:
                streams = reader.read_streams(list(source["streams"]), 0, 2**63 - 1)  # every sample
                for name, n in source["streams"].items():
                    if len(streams[name].timestamps_ns) != n:
                        bad.append(f"{name}: {len(streams[name].timestamps_ns)} samples, source has {n}")
            except EpisodeError as e:
                bad.append(f"streams unreadable: {e.reason}")
            bad += _depth_counts(reader, source.get("depth", {}))
            results.append(GateResult("frame_counts", not bad, gates["frame_counts"].action, "; ".join(bad)))
        if "durations" in enabled:
            tol = int(float(gates.param("durations", "tolerance_s")) * 1e9)
            bad = []
            for cam, info in source["cameras"].items():
                first, last = (read[cam].first_ns, read[cam].last_ns) if cam in read else (-1, -1)
                if abs(first - info["first_ns"]) > tol or abs(last - info["last_ns"]) > tol:
                    bad.append(f"{cam}: spans {first}..{last} ns, source {info['first_ns']}..{info['last_ns']} ns")
            results.append(GateResult("durations", not bad, gates["durations"].action, "; ".join(bad)))
    return results + _size(source, gates, enabled)


def _depth_counts(reader: EpisodeReader, depth: Mapping[str, int]) -> list[str]:
    """What differs between each depth stream as read back and the source's frame count; its first
    frame is parsed (16-bit, the size its bytes say), the rest counted."""
    bad = []
    for name, n in depth.items():
        try:
            got = len(reader.depth_times(name))
            if got:
                next(reader.iter_depth(name))
        except EpisodeError as e:
            bad.append(f"depth {name}: {e.reason}")
            continue
        if got != n:
            bad.append(f"depth {name}: {got} frames, source has {n}")
    return bad


def _size(source: dict, gates: GateConfig, enabled: list[str]) -> list[GateResult]:
    if "size_sanity" not in enabled:
        return []
    lo, hi = float(gates.param("size_sanity", "min_ratio")), float(gates.param("size_sanity", "max_ratio"))
    ok, r = size_ratio_ok(source["bytes_out"], source["bytes_in"], lo, hi)
    return [
        GateResult(
            "size_sanity",
            ok,
            gates["size_sanity"].action,
            "" if ok else f"MCAP/source bytes {r:.4f} outside [{lo}, {hi}]",
        )
    ]
