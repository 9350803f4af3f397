"""One episode's transcode, as a worker process runs it (no Dagster here): stage the landed item,
open the episode (the legacy HDF5, or one of a bag's or a dataset's: ``sources.open``), transcode, post
gates, score, publish; and the typed outcome it sends back to the batch engine (:mod:`.batches`), which
records it."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..catalog.leases import RunLease
from ..episodes.errors import EpisodeError, RawFormatError
from ..episodes.raw_format import RawEpisode
from ..episodes.transcode import TranscodeReport, TranscodeSettings, transcode_episode
from ..sources.detect import detect
from ..sources.memory import MemoryEpisode
from ..sources.open import open_format
from ..sources.ros2 import BagMember, read_member
from ..sources.topic_map import DEFAULT, TopicMap
from ..storage.stores import StoreUnavailableError
from .episode_io import McapSink, PreconditionFailed, Published, RawSource
from .faults import INFRASTRUCTURE, exception_class
from .gates import GateConfig, GateResult
from .items import split_member
from .post_gates import post_gates
from .quality import score_episode
from .workers import WorkerFailure


@dataclass(frozen=True)
class Quarantine:
    """Why an episode is held back: the gate and stage that held it, and where its MCAP was put
    aside (``held_at``) when there is one."""

    gate: str
    stage: str  # "transcode" | "post"
    reason: str
    stream: str | None = None
    held_at: str | None = None

    def as_record(self) -> dict:
        return asdict(self)


@dataclass
class TranscodeOutcome:
    """What one episode's worker found. Exactly one of: transcoded and published (``mcap``), held
    back (``quarantine``), a machine fault to try again (``infrastructure``), the MCAP store not
    answering (``unavailable``), or the run gone before publishing (``run_ended``)."""

    gates: list[GateResult] = field(default_factory=list)
    report: TranscodeReport | None = None
    quality: dict | None = None  # the episode's quality columns (quality.py)
    mcap: Published | None = None
    quarantine: Quarantine | None = None
    infrastructure: str | None = None
    worker_died: bool = False  # the infrastructure fault was the worker's death
    unavailable: tuple[str, str] | None = None  # (url, reason)
    run_ended: bool = False
    wall_s: float = 0.0
    cpu_s: float = 0.0


@dataclass(frozen=True)
class TranscodeJob:
    """One episode to transcode, as the batch engine hands it to a worker process."""

    raw: RawSource
    key: str  # the raw file's key in the landing zone
    size: int
    sink: McapSink
    episode_id: str
    sha256: str
    expect_version: str | None  # the MCAP version it replaces (None: a first publish)
    settings: TranscodeSettings
    gates: GateConfig
    lease: RunLease | None = None
    topics: TopicMap = DEFAULT  # how a ROS 2 bag's topics are read
    window: str | None = None  # an episode of a split bag: what of the bag holds it (sources.ros2.BagMember)
    staged: str | None = None  # the item's folder, already staged by the unit for all its episodes (staged_once)


def quality_row(src: str | Path, cameras: dict, gates: GateConfig, episode: MemoryEpisode | None = None) -> dict:
    """The episode's quality columns. The raw file just transcoded cleanly, so scoring it only
    re-reads its small streams (an episode read into memory, ``episode``, is scored as it is); if that
    fails anyway, the episode goes to review with the reason instead of passing unscored."""
    try:
        with episode if episode is not None else RawEpisode(src) as raw:
            return score_episode(raw, cameras, gates.quality_config()).as_row()
    except EpisodeError as e:
        reason = {"check": "scoring", "detail": f"quality not scored: {e.reason}"}
        return {"quality_verdict": "review", "quality_reasons": json.dumps([reason])}


def transcode_job(job: TranscodeJob) -> TranscodeOutcome:
    """One episode, in a worker process: stage (object stores), transcode, post gates, publish (only
    while the run's lease is alive)."""
    t0, c0 = time.perf_counter(), time.process_time()
    dst = job.sink.work_path(job.episode_id)
    key, member = split_member(job.key)
    try:
        # a member's size is its share of the item's, not the item's: its staging checks no size
        window = None if job.window is None else BagMember.parse(job.episode_id, job.window)
        log_window = None if window is None else (window.log_lo, window.log_hi)
        local = (
            nullcontext(Path(job.staged))
            if job.staged
            else job.raw.local(key, None if member else job.size, log_window)
        )
        with local as src:
            out = _transcode_local(src, dst, job)
    except StoreUnavailableError as e:
        out = TranscodeOutcome(unavailable=(e.url, e.reason))
    except FileNotFoundError as e:
        out = TranscodeOutcome(
            quarantine=Quarantine("transcode", "transcode", f"raw file vanished from the landing zone: {e}")
        )
    except Exception as e:
        out = failed(e, f"cannot read the raw file: {type(e).__name__}: {e}", "transcode")
    dst.unlink(missing_ok=True)  # unpublished (a machine fault, the run gone): scratch, the next attempt writes it
    out.wall_s, out.cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return out


def worker_died(failure: WorkerFailure) -> TranscodeOutcome:
    """An episode whose process returned nothing. Over its CPU cap: the file's own work, a verdict. A
    result that could not be sent back: a fault of this code with this file, a verdict. Any other death
    (killed, out of memory, a crash): the machine's until it repeats (see batches.transcode_batch)."""
    code = failure.exitcode
    if code is not None and ((code < 0 and -code != signal.SIGXCPU) or code > 0):
        return TranscodeOutcome(infrastructure=failure.reason, worker_died=True)
    return TranscodeOutcome(quarantine=Quarantine("transcode", "transcode", failure.reason))


def failed(
    e: BaseException,
    reason: str,
    stage: str,
    held: Callable[[], str | None] | None = None,
    out: TranscodeOutcome | None = None,
) -> TranscodeOutcome:
    """The outcome after ``e``: a machine fault leaves the episode to be tried again; anything else holds
    the file back with ``reason`` (and its MCAP, by ``held``). ``out``: what was found before."""
    out = out or TranscodeOutcome()
    if exception_class(e) == INFRASTRUCTURE:
        out.infrastructure = reason
        return out
    out.quarantine = Quarantine("transcode", stage, reason, getattr(e, "stream", None), held() if held else None)
    return out


def _episode(src: Path, job: TranscodeJob) -> MemoryEpisode | None:
    """The job's episode when its item is not the legacy HDF5 (``None``: the transcoder opens that itself).
    :raises EpisodeError: the item no longer holds it."""
    fmt = detect(src)
    if fmt == "hdf5":
        return None
    if fmt == "ros2" and job.window is not None:  # its window of the bag alone, not the whole bag
        return read_member(src, job.topics, BagMember.parse(job.episode_id, job.window))
    episodes = open_format(src, fmt, job.topics)
    found = [ep for ep in episodes if ep.meta.episode_id == job.episode_id]
    if not found:
        raise RawFormatError(str(src), f"holds no episode {job.episode_id!r} any more")
    return found[0]


def _transcode_local(src: Path, dst: Path, job: TranscodeJob) -> TranscodeOutcome:
    sink, episode_id = job.sink, job.episode_id
    try:
        episode = _episode(src, job)
        report = transcode_episode(src, dst, job.settings, source_sha256=job.sha256, episode=episode)
    except EpisodeError as e:
        return failed(e, e.reason, "transcode")
    except Exception as e:
        return failed(e, f"{type(e).__name__}: {e}", "transcode")
    as_dict = report.as_dict()
    try:
        results = post_gates(dst, as_dict, job.gates)
        quality = quality_row(src, as_dict["cameras"], job.gates, episode)
    except Exception as e:
        return failed(
            e, f"checking the MCAP failed: {type(e).__name__}: {e}", "post", lambda: sink.hold(episode_id, dst)
        )
    out = TranscodeOutcome(gates=results, report=report, quality=quality)
    blocking = [r for r in results if not r.passed and r.action == "quarantine"]
    if blocking:
        out.quarantine = Quarantine(blocking[0].gate, "post", blocking[0].detail, None, sink.hold(episode_id, dst))
        return out
    if job.lease is not None and not job.lease.alive():  # the run ended while this episode was transcoded
        return TranscodeOutcome(run_ended=True)
    try:
        out.mcap = sink.publish(episode_id, dst, job.expect_version)
    except PreconditionFailed as e:
        out.mcap = sink.adopt(episode_id, dst)  # this very MCAP, published by a killed attempt: kept as it is
        if out.mcap is None:  # someone else's (newer) MCAP is at the key: kept, this one held back
            out.quarantine = Quarantine("transcode", "post", f"not published: {e}", None, sink.hold(episode_id, dst))
    return out


__all__ = ["Quarantine", "TranscodeJob", "TranscodeOutcome", "failed", "quality_row", "transcode_job", "worker_died"]
