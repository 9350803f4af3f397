"""The small fleets of transcoded episodes the cache and train benchmarks read, and the 2 s
training segments they cut from each (a manifest's rows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dyna_resources.episodes.sim import EpisodeSpec
    from dyna_resources.episodes.transcode import TranscodeSettings

SEGMENT_NS = 2_000_000_000  # a training segment: 2 s
STRIDE_NS = 1_000_000_000  # one starting every second


def transcoded_episode(
    tmp: Path,
    out: Path,
    i: int,
    *,
    episode_id: str,
    seed: int,
    duration_s: float,
    width: int,
    height: int,
    settings: TranscodeSettings | None = None,
) -> EpisodeSpec:
    """Episode ``i`` of a benchmark's fleet (a successful pick_place by one of three arms at site
    "bench"): generated as ``tmp``/ep{i}.h5, transcoded to ``out`` (``settings``: the pipeline's
    default when None), the HDF5 removed. Returns its spec."""
    from dyna_resources.episodes.sim import EpisodeSpec, write_episode
    from dyna_resources.episodes.transcode import transcode_episode

    spec = EpisodeSpec(
        episode_id=episode_id,
        seed=seed,
        task="pick_place",
        robot_id=f"arm-{i % 3}",
        robot_model="dyna-a1",
        robot_sw_version="4.2.1",
        site="bench",
        operator="op-1",
        success=True,
        started_at="2026-11-29T10:00:00Z",
        duration_s=duration_s,
        width=width,
        height=height,
    )
    raw = tmp / f"ep{i}.h5"
    write_episode(spec, raw)
    transcode_episode(raw, out, settings)
    raw.unlink()
    return spec


def segments(start_ns: int, end_ns: int) -> Iterator[tuple[int, int]]:
    """The (start_ns, end_ns) of every 2 s segment, one a second, that fits in [start_ns, end_ns]."""
    t = start_ns
    while t + SEGMENT_NS <= end_ns:
        yield t, t + SEGMENT_NS
        t += STRIDE_NS
