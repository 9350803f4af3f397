"""Whether an H.264 stream already has the read profile's layout, told from its bitstream alone (no decode):
what lets the transcoder copy a source's video (a ROS 2 bag's ``foxglove_msgs/msg/CompressedVideo`` topic)
instead of decoding and re-encoding it.

The layout the MCAP episodes promise their readers (``codec.VideoSettings``, ``post_gates.check_video``):
Annex B access units, one picture each; the stream opens with an IDR picture; every IDR access unit
carries its SPS and PPS (a GOP read alone decodes, as Foxglove and the random-access reader read it);
no B slices (Foxglove refuses them, and decode order is display order); no GOP longer than the profile's
``gop_frames`` (a random read decodes at most that many frames) and, but for the last, none shorter than
half of it (a shorter GOP spends the archive's bytes on keyframes: LeRobot's keyframe every 2 frames is
several times the bytes); 8-bit 4:2:0 (what ``decoded_to_rgb`` and the training streams expect).

PyAV exposes no slice or SPS parser short of decoding, so the few header fields needed (the slice type,
the SPS's profile, chroma format and bit depths) are read here: each is an Exp-Golomb code within the first
bytes of its NAL unit, after emulation prevention bytes are removed.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .codec import NAL_IDR, NAL_NON_IDR, NAL_PPS, NAL_SPS

_START_CODE = re.compile(b"\x00\x00\x01")
_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}  # SPS carries chroma format, depth
B_SLICE = 1  # slice_type % 5: 0 P, 1 B, 2 I, 3 SP, 4 SI
_HEADER_BYTES = 24  # more than any slice or SPS header field read here needs


@dataclass(frozen=True)
class Layout:
    """What :func:`check_layout` found: ``reason`` is None when the stream can be copied as it is."""

    reason: str | None
    gops: int = 0
    longest_gop: int = 0

    @property
    def copyable(self) -> bool:
        return self.reason is None


class _Bits:
    """Big-endian bit reader over an RBSP (emulation prevention removed)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def bit(self) -> int:
        if self.pos >= 8 * len(self.data):
            raise ValueError("header cut short")
        b = (self.data[self.pos >> 3] >> (7 - (self.pos & 7))) & 1
        self.pos += 1
        return b

    def bits(self, n: int) -> int:
        v = 0
        for _ in range(n):
            v = (v << 1) | self.bit()
        return v

    def ue(self) -> int:
        zeros = 0
        while self.bit() == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("Exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.bits(zeros)


def _rbsp(nal: bytes) -> bytes:
    """The NAL unit's payload (after its one-byte header) without emulation prevention bytes (00 00 03)."""
    return nal[1:].replace(b"\x00\x00\x03", b"\x00\x00")


def nal_units(access_unit: bytes) -> list[bytes]:
    """The NAL units of an Annex B access unit (trailing zero bytes of a 4-byte start code dropped)."""
    starts = [m.end() for m in _START_CODE.finditer(access_unit)]
    out = []
    for a, b in zip(starts, [*starts[1:], len(access_unit) + 3], strict=True):
        nal = access_unit[a : b - 3].rstrip(b"\x00")
        if nal:
            out.append(nal)
    return out


def slice_type(nal: bytes) -> int:
    """A coded slice's ``slice_type % 5`` (0 P, 1 B, 2 I)."""
    r = _Bits(_rbsp(nal[: _HEADER_BYTES + 1]))
    r.ue()  # first_mb_in_slice
    return r.ue() % 5


def sps_format(nal: bytes) -> tuple[int, int, int]:
    """An SPS's ``(profile_idc, chroma_format_idc, bit_depth)``: 4:2:0 at 8 bits for the profiles without
    the fields (Baseline, Main, Extended)."""
    r = _Bits(_rbsp(nal[: _HEADER_BYTES + 1]))
    profile = r.bits(8)
    r.bits(16)  # constraint flags, level_idc
    r.ue()  # seq_parameter_set_id
    if profile not in _HIGH_PROFILES:
        return profile, 1, 8
    chroma = r.ue()
    if chroma == 3:
        r.bit()  # separate_colour_plane_flag
    luma_depth, chroma_depth = r.ue() + 8, r.ue() + 8
    return profile, chroma, max(luma_depth, chroma_depth)


def check_layout(units: Sequence[bytes], gop_frames: int) -> Layout:
    """Whether ``units`` (one Annex B access unit per frame) meet the read profile (module docstring)."""
    gops = longest = run = 0
    shortest = None  # of the GOPs before the last
    for i, au in enumerate(units):
        nals = nal_units(au)
        types = [n[0] & 0x1F for n in nals]
        vcl = [n for n, t in zip(nals, types, strict=True) if t in (NAL_NON_IDR, NAL_IDR)]
        if not vcl:
            return Layout(f"access unit {i} holds no coded picture (not Annex B H.264?)", gops, longest)
        try:
            if NAL_IDR in types:
                if NAL_SPS not in types or NAL_PPS not in types:
                    return Layout(f"IDR access unit {i} without its SPS and PPS in front", gops, longest)
                for sps in (n for n, t in zip(nals, types, strict=True) if t == NAL_SPS):
                    profile, chroma, depth = sps_format(sps)
                    if (chroma, depth) != (1, 8):
                        return Layout(f"access unit {i}: chroma format {chroma}, {depth}-bit (not 8-bit 4:2:0)")
                if gops:
                    shortest = run if shortest is None else min(shortest, run)
                gops, longest, run = gops + 1, max(longest, run), 0
            elif i == 0:
                return Layout("the stream does not open with an IDR picture")
            if any(slice_type(n) == B_SLICE for n in vcl):
                return Layout(f"access unit {i} has B slices", gops, longest)
        except ValueError as e:
            return Layout(f"access unit {i}: unreadable header: {e}", gops, longest)
        run += 1
    longest = max(longest, run)
    if longest > gop_frames:
        return Layout(f"a GOP of {longest} frames (the read profile's is at most {gop_frames})", gops, longest)
    if shortest is not None and 2 * shortest < gop_frames:
        return Layout(f"a GOP of {shortest} frames (at least {-(-gop_frames // 2)}: half the profile's)", gops, longest)
    if not units:
        return Layout("no access units")
    return Layout(None, gops, longest)


__all__ = ["B_SLICE", "Layout", "check_layout", "nal_units", "slice_type", "sps_format"]
