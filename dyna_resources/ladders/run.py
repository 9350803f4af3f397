"""Step ladders for a work unit or an ingest partition's units: the engine behind the ``step_ladders`` asset.

Only episodes whose ladder is missing or was written by another segmenter/config version are
segmented (their proprio chunks only: no video is read), and each batch's results are stored
in one registry transaction. An episode that cannot be segmented keeps the reason instead (a
task without a procedure, a missing signal, an unreadable MCAP) and the batch goes on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import fsspec

from ..catalog.registry import Registry
from ..episodes.errors import EpisodeError
from ..episodes.mcap_reader import EpisodeReader
from .config import LadderConfig
from .segment import LadderError, Step, failed_step, segment, signals_of


@dataclass
class LadderReport:
    batch_key: str
    version: str
    segmented: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # episode_id -> reason
    failed_steps: Counter = field(default_factory=Counter)  # step name -> episodes failing there
    step_seconds: dict[str, float] = field(default_factory=dict)  # step name -> total seconds
    pictures: dict[str, bytes] = field(default_factory=dict)  # episode_id -> PNG
    units: list[str] = field(default_factory=list)  # the work units whose episodes it covers


def _streams_needed(config: LadderConfig) -> set[str]:
    return {s["stream"] for s in config.signals.values() if s}


def ladder_episode(uri: str, task: str, config: LadderConfig) -> tuple[list[Step], dict]:
    """The step ladder of one MCAP episode, and the streams it was read from."""
    with fsspec.open(uri, "rb") as f, EpisodeReader(f) as reader:
        names = [n for n in reader.streams if n in _streams_needed(config)]
        streams = reader.read_streams(names, reader.start_ns, reader.end_ns)
        start, end = reader.start_ns, reader.end_ns
    return segment(streams, start, end, task, config), streams


def ladder_batch(
    batch_key: str,
    registry: Registry,
    config: LadderConfig,
    *,
    pictures: int = 3,
    log: Callable[[str], None] | None = None,
    units: Sequence[str] | None = None,
) -> LadderReport:
    """Segment the stale episodes of work unit ``batch_key`` (or of ``units``, an ingest partition's,
    reported under ``batch_key``); draw the first ``pictures`` ladders, plus the first one with a
    failed step (the one a reviewer wants to see). When fewer were segmented (a batch already up to
    date), up-to-date episodes are drawn instead, so every run shows some."""
    rep = LadderReport(batch_key, config.version, units=list(units) if units is not None else [batch_key])
    rows = []
    for ep in registry.ladders_to_do(rep.units, config.version):
        eid = ep["episode_id"]
        try:
            steps, streams = ladder_episode(ep["mcap_uri"], ep["task"], config)
        except (LadderError, EpisodeError, OSError) as e:
            reason = f"{type(e).__name__}: {e}"
            rep.errors[eid] = reason
            rows.append({"episode_id": eid, "error": reason})
            if log:
                log(f"{eid}: no step ladder: {reason}")
            continue
        failed = failed_step(steps)
        if len(rep.pictures) < pictures or (failed is not None and not rep.failed_steps):
            rep.pictures[eid] = _picture(eid, ep["task"], steps, streams, config)
        if failed is not None:
            rep.failed_steps[failed.name] += 1
        for s in steps:
            rep.step_seconds[s.name] = rep.step_seconds.get(s.name, 0.0) + s.duration_s
        rows.append({"episode_id": eid, "steps": [s.as_dict() for s in steps]})
        rep.segmented.append(eid)
    registry.record_ladders(rows, config.version)
    _draw_current(rep, registry, config, pictures)
    return rep


def _draw_current(rep: LadderReport, registry: Registry, config: LadderConfig, pictures: int) -> None:
    """Fill the report's pictures from episodes whose ladder is current (failed ones first):
    re-segmenting costs milliseconds and gives exactly the stored ladder (same version)."""
    if len(rep.pictures) >= pictures:
        return
    current = [
        e
        for e in registry.episodes(rep.units)
        if e["ladder_version"] == config.version and e["step_ladder"] and e["episode_id"] not in rep.pictures
    ]
    current.sort(key=lambda e: e["failed_step"] is None)  # stable: failures first, then by id
    for e in current[: max(0, pictures - len(rep.pictures))]:
        try:
            steps, streams = ladder_episode(e["mcap_uri"], e["task"], config)
        except (LadderError, EpisodeError, OSError):
            continue  # its ladder is stored; only the picture is missing
        rep.pictures[e["episode_id"]] = _picture(e["episode_id"], e["task"], steps, streams, config)


def _picture(eid: str, task: str, steps: list[Step], streams: dict, config: LadderConfig) -> bytes:
    # matplotlib takes ~0.35 s to import: kept out of the Dagster definitions' load
    from .picture import ladder_png

    return ladder_png(steps, signals_of(streams, config), config, title=f"{eid}  ({task})")
