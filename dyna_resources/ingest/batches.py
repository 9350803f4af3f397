"""Ingest one batch: the engine behind ``raw_episodes`` and ``mcap_episodes`` (no Dagster here).

Durable and replayable: every episode's outcome is committed to the registry the moment
it is known, and every MCAP is written under a temporary name and renamed, so a run
killed at any point and launched again redoes only the episodes that had not finished.
A bad episode is quarantined with its reason and the batch goes on, whatever it raises (not
only the reader's typed errors); each episode is transcoded in a process of its own. A fault of
the machine (its worker killed, a full disk, an I/O error, a store that does not answer) is never
a verdict (:mod:`.faults`): the episode is tried again in the same call, and when its attempts run
out it is left pending and the unit raises :class:`~.faults.InfrastructureFault` naming it, once the
other episodes are recorded; an unreachable landing store or registry raises and fails the run
(nothing is half-recorded).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, closing, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import versions
from ..catalog import schema
from ..catalog.leases import RunEnded, RunLease
from ..catalog.registry import ACCEPTED, PENDING, QUARANTINED, REJECTED, TRANSCODED, FieldValueError, Outcome, Registry
from ..episodes.transcode import TranscodeSettings
from ..sources import ros2
from ..sources.topic_map import DEFAULT, TopicMap
from ..storage.stores import Store, StoreUnavailableError
from .episode_io import McapSink, RawSource
from .episode_transcode import Quarantine, TranscodeJob, TranscodeOutcome, transcode_job, worker_died
from .faults import (
    INFRASTRUCTURE,
    INFRASTRUCTURE_ATTEMPTS,
    WORKER_DEATH_ATTEMPTS,
    InfrastructureFault,
    exception_class,
    reason_class,
)
from .gates import GateConfig, GateResult
from .items import item_root, split_member
from .landing import LandingZone
from .object_landing import ObjectLandingZone
from .outcomes import OutcomeBuffer
from .pre_gates import Inspection, inspect_item
from .workers import Stopped, WorkerFailure, run_each


@dataclass(frozen=True)
class IngestStores:
    """Where ingest reads and writes. Embedded: local folders. Production: a ``gs://``/``s3://``
    landing zone (:class:`ObjectLandingZone`) and ``mcap_store``; then ``mcap_dir`` and
    ``quarantine_dir`` are only local scratch (files being written, raw files being staged)."""

    registry: Registry
    landing: LandingZone | ObjectLandingZone
    mcap_dir: Path
    quarantine_dir: Path
    mcap_store: str | None = None  # gs://bucket/mcap, s3://bucket/mcap: MCAPs are published there
    endpoint_url: str | None = None  # an S3-compatible MCAP store
    topics: TopicMap = DEFAULT  # how ROS 2 bags' topics map to cameras and streams ($DYNA_HOME/ros2_topics.yaml)

    def check(self) -> None:
        """Critical dependencies: raise before any work if the store or the registry is unreachable."""
        self.landing.check()
        self.registry.ping()
        self.mcap_dir.mkdir(parents=True, exist_ok=True)
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        if self.mcap_store:  # one HEAD request, whatever the store holds: "no such key" is a reachable store
            with suppress(FileNotFoundError):
                Store.from_url(self.mcap_store, endpoint_url=self.endpoint_url).info("_reachable")

    def sink(self) -> McapSink:
        return McapSink(str(self.mcap_dir), str(self.quarantine_dir), self.mcap_store, self.endpoint_url)

    def raw(self) -> RawSource:
        return RawSource.of(self.landing, str(self.mcap_dir / STAGING))


STAGING = ".staging"  # below mcap_dir: raw files copied from an object landing zone while they are read
# A staged raw file lives while its episode is inventoried or transcoded (minutes); one older than this was
# left by a worker killed mid-episode and is swept by the next unit that runs on the node.
STAGING_MAX_AGE_S = 6 * 3600.0


# What a unit's engine tells as it goes: (episodes or files done, of the unit's total, their input bytes).
EpisodeProgress = Callable[[int, int, int], None]


def sweep_staging(mcap_dir: Path, *, max_age_s: float = STAGING_MAX_AGE_S, now: float | None = None) -> tuple[int, int]:
    """Remove staged raw files (and half-staged temporaries) not touched for ``max_age_s``: what killed
    workers left below ``mcap_dir/.staging``. Returns (files, bytes) removed."""
    now = time.time() if now is None else now
    files = size = 0
    for p in (mcap_dir / STAGING).rglob("*"):
        try:
            st = p.lstat()
            if p.is_file() and now - st.st_mtime > max_age_s:
                p.unlink()
                files, size = files + 1, size + st.st_size
        except FileNotFoundError:  # another unit on the node swept it, or its episode finished
            continue
    return files, size


@dataclass
class GateTally:
    evaluated: int = 0
    failed: int = 0
    failures: list[dict] = field(default_factory=list)  # {"path", "episode_id", "detail"}, first 20

    def add(self, r: GateResult, key: str, episode_id: str | None) -> None:
        self.evaluated += 1
        if not r.passed:
            self.failed += 1
            if len(self.failures) < 20:
                self.failures.append({"path": key, "episode_id": episode_id, "detail": r.detail})


@dataclass
class StageReport:
    batch_key: str
    stage: str  # "pre" | "post"
    files: int = 0
    processed: list[str] = field(default_factory=list)  # episode ids (or keys) this run worked on
    skipped: list[str] = field(default_factory=list)  # up to date: nothing to do
    quarantined: list[dict] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # episode ids a machine fault left to the next run
    gates: dict[str, GateTally] = field(default_factory=dict)
    cpu_s: float = 0.0  # CPU of the work itself (workers included)
    codec_cpu_s: float = 0.0  # of which JPEG decode + H.264 encode (the transcoder's own measure)
    worker_busy_s: dict[int, float] = field(default_factory=dict)  # worker slot -> seconds it worked
    staging_swept: tuple[int, int] = (0, 0)  # (files, bytes) of staged raw files killed workers left
    messages: list[str] = field(default_factory=list)  # what it logged, for a driver that ran it remotely

    def tally(self, key: str, episode_id: str | None, results: list[GateResult]) -> None:
        for r in results:
            self.gates.setdefault(r.gate, GateTally()).add(r, key, episode_id)

    @classmethod
    def combine(cls, key: str, stage: str, reports: Sequence[StageReport]) -> StageReport:
        """One report for an ingest partition out of its work units' reports."""
        out = cls(key, stage)
        for r in reports:
            out.files += r.files
            out.processed += r.processed
            out.skipped += r.skipped
            out.quarantined += r.quarantined
            out.pending += r.pending
            out.cpu_s += r.cpu_s
            out.staging_swept = (out.staging_swept[0] + r.staging_swept[0], out.staging_swept[1] + r.staging_swept[1])
            out.codec_cpu_s += r.codec_cpu_s
            for gate, tally in r.gates.items():
                total = out.gates.setdefault(gate, GateTally())
                total.evaluated += tally.evaluated
                total.failed += tally.failed
                total.failures += tally.failures[: max(0, 20 - len(total.failures))]
            for slot, busy in r.worker_busy_s.items():
                out.worker_busy_s[slot] = out.worker_busy_s.get(slot, 0.0) + busy
        return out


# -- pre: inventory and gates ----------------------------------------------------------------


def inventory_batch(
    batch_key: str,
    stores: IngestStores,
    gates: GateConfig,
    log: Callable[[str], None] = lambda m: None,
    *,
    lease: RunLease | None = None,
    on_episode: EpisodeProgress | None = None,
) -> StageReport:
    """Inspect a work unit's files and run the pre gates; record the outcomes at the unit's end.
    ``lease``: the run's (see catalog/leases.py); once it is gone the unit stops and records nothing.
    ``on_episode``: hears (files inspected, of the unit's files, their bytes) before each file and at the end."""
    stores.check()
    files = stores.registry.batch_files(batch_key)
    registered = stores.registry.registered_at([f.path for f in files])
    rep = StageReport(batch_key, "pre", files=len(files), staging_swept=sweep_staging(stores.mcap_dir))
    t_cpu = time.process_time()
    raw = stores.raw()
    outcomes = OutcomeBuffer(stores.registry)  # the unit's inventory in one transaction, at its end
    pending: dict[str, str] = {}  # landing key -> the machine fault that left it uninspected
    inspected_bytes = 0
    for k, f in enumerate(files):
        if on_episode is not None:
            on_episode(k, len(files), inspected_bytes)
        inspected_bytes += f.bytes
        if lease is not None and not lease.alive():
            raise RunEnded(lease.key, batch_key, len(files) - k)
        try:
            with raw.local(f.path, f.bytes) as path:
                inspections = inspect_item(path, f.path, gates, stores.topics)
        except FileNotFoundError:
            stores.landing.check()  # the whole store gone is critical; one vanished file is not
            inspections = [_held(f.path, f.bytes, "file vanished from the landing zone")]
        except StoreUnavailableError:
            raise
        except Exception as e:
            stores.landing.check()
            if exception_class(e) == INFRASTRUCTURE:
                pending[f.path] = f"{type(e).__name__}: {e}"
                log(f"not inspected {f.path}: infrastructure fault, left pending: {pending[f.path]}")
                continue
            inspections = [_held(f.path, f.bytes, f"cannot inspect: {type(e).__name__}: {e}")]
        fault = next(
            (
                i.quarantine["reason"]
                for i in inspections
                if i.quarantine and reason_class(i.quarantine["gate"], i.quarantine["reason"]) == INFRASTRUCTURE
            ),
            None,
        )
        if fault is not None:
            pending[f.path] = fault  # e.g. h5py's "[Errno 5] Input/output error": the disk's
            log(f"not inspected {f.path}: infrastructure fault, left pending: {pending[f.path]}")
            continue
        uri = source_uri(stores.landing, f.path)
        for insp in inspections:
            if insp.episode is not None:
                insp.episode["source_uri"] = uri + insp.key[len(f.path) :]  # a member's "#<episode_id>"
            _record_inspection(batch_key, outcomes, rep, insp, registered.get(f.path), log)
        rep.processed.append(f.path)
    outcomes.flush()
    if on_episode is not None:
        on_episode(len(files), len(files), inspected_bytes)
    rep.cpu_s = time.process_time() - t_cpu
    if pending:
        raise InfrastructureFault(batch_key, pending)
    return rep


def _record_inspection(
    batch_key: str,
    outcomes: OutcomeBuffer,
    rep: StageReport,
    insp: Inspection,
    registered_at: float | None,
    log: Callable[[str], None],
) -> None:
    """Add one inspected episode's (or held-back item's) outcome to the unit's, and to its report."""
    episode, release = _episode_row(outcomes, insp, registered_at)
    try:
        outcomes.add(_pre_outcome(batch_key, insp.key, insp, episode, release))
    except FieldValueError as e:  # a value from the file the registry cannot hold
        insp = _held(
            insp.key,
            insp.bytes,
            f"attribute {e.column!r}: {e.problem}",
            stream=e.column,
            episode_id=(insp.episode or {}).get("episode_id"),
        )
        try:
            outcomes.add(_pre_outcome(batch_key, insp.key, insp, None, True))
        except FieldValueError as e2:  # not even the quarantine fits: the landing key itself
            log(f"cannot record {insp.key[:200]!r} at all, left out of the registry: {e2}")
            insp.quarantine = {**(insp.quarantine or {}), "reason": f"not recorded: {e2}"}
    rep.tally(insp.key, (insp.episode or {}).get("episode_id") or (insp.quarantine or {}).get("episode_id"), insp.gates)
    if insp.quarantine:
        rep.quarantined.append({"path": insp.key, **insp.quarantine})
        log(f"quarantined {insp.key}: {insp.quarantine['gate']}: {insp.quarantine['reason']}")


def source_uri(landing: LandingZone | ObjectLandingZone, key: str) -> str:
    """Where a landed item is, as a URL: the file, or a directory item's folder (with a trailing slash)."""
    root = item_root(key)
    if isinstance(landing, LandingZone):
        uri = landing.local_item(key).resolve().as_uri()
    else:
        uri = landing.resolve(root or key)
    return uri + "/" if root is not None else uri


def _held(key: str, size: int, reason: str, *, stream: str | None = None, episode_id: str | None = None) -> Inspection:
    """An inspection that holds the file back as unreadable, with the reason."""
    insp = Inspection(
        key=key,
        bytes=size,
        quarantine={"gate": "readable", "reason": reason, "stream": stream, "stage": "pre", "episode_id": episode_id},
    )
    insp.gates = [GateResult("readable", False, "quarantine", reason)]
    return insp


def _pre_outcome(batch_key: str, key: str, insp: Inspection, episode: dict | None, release: bool) -> Outcome:
    pv = versions.PIPELINE_VERSION
    return Outcome(key, batch_key, "pre", [g.as_record(pv) for g in insp.gates], episode, _q(insp.quarantine), release)


_STREAM_MAX = schema.string_limits(schema.quarantine)["stream"]
# Transcode outcomes finishing within this many seconds of the last commit share the next one.
TRANSCODE_COMMIT_INTERVAL_S = 2.0


def _q(q: Quarantine | dict | None) -> dict | None:
    """A quarantine record as the registry stores it (``q``: a transcode's, or a pre gate's record). Its
    stream may be a dataset name from the file (any length): clipped to the column, the reason
    (unbounded) keeps everything."""
    if q is None:
        return None
    if isinstance(q, Quarantine):
        q = q.as_record()
    out = {**q, "pipeline_version": versions.PIPELINE_VERSION, "reason": q["reason"].replace("\x00", "\\x00")}
    stream = q.get("stream")
    if stream is not None:
        stream = stream.replace("\x00", "\\x00")
        out["stream"] = stream if len(stream) <= _STREAM_MAX else stream[: _STREAM_MAX - 1] + "…"
    return out


def _episode_row(outcomes: OutcomeBuffer, insp: Inspection, registered_at: float | None) -> tuple[dict | None, bool]:
    """The episode row to upsert after an inspection, and whether to release an old quarantine."""
    ep = insp.episode
    if ep is None:
        return None, True
    existing = outcomes.episode(ep["episode_id"])  # an earlier file of this unit counts, committed or not
    if existing is not None and existing["source_path"] != insp.key:
        # Same id from another file: keep the first, hold this one back.
        insp.quarantine = {
            "gate": "readable",
            "stage": "pre",
            "stream": "episode_id",
            "reason": f"duplicate episode_id {ep['episode_id']!r}: already landed as {existing['source_path']}",
        }
        insp.gates = [GateResult("readable", False, "quarantine", insp.quarantine["reason"])]
        return None, True
    row = dict(ep)
    row["ingested_at"] = registered_at
    if insp.quarantine:
        row["status"] = REJECTED
        return row, True
    if (
        existing is not None
        and existing["source_sha256"] == ep["source_sha256"]
        and existing["status"] in (TRANSCODED, QUARANTINED)
    ):
        # Same bytes already went through the transcode: keep its output and state.
        row["quality_ok"] = bool(ep["quality_ok"]) and existing["status"] == TRANSCODED
        row["status"] = existing["status"]  # output columns are left out of the upsert: kept as they are
        return row, existing["status"] != QUARANTINED
    row.update(
        status=ACCEPTED, schema_version=None, pipeline_version=None, mcap_path=None, mcap_uri=None, mcap_bytes=None
    )
    return row, True


# -- transcode and post gates ----------------------------------------------------------------

_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


def remove_orphan_temps(folder: Path) -> list[Path]:
    """Temporary outputs left by a killed writer (its process is gone): safe to delete."""
    removed = []
    for p in folder.glob(".*.tmp"):
        m = _TMP.match(p.name)
        if m and not _alive(int(m["pid"])):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def episodes_to_transcode(batch_key: str, stores: IngestStores, *, force: bool = False) -> tuple[list[dict], list[str]]:
    """(episodes to (re)do, ids already up to date). Stale = never written, written or failed by
    other versions, or written but the file is gone."""
    reg, sink = stores.registry, stores.sink()
    if force:
        rows = [r for r in reg.episodes(batch_key) if r["status"] != REJECTED]
        return rows, []
    stale = reg.stale_episodes(
        batch_key, schema_version=versions.SCHEMA_VERSION, pipeline_version=versions.PIPELINE_VERSION
    )
    ids = {r["episode_id"] for r in stale}
    done = []
    for r in reg.episodes(batch_key):
        if r["episode_id"] in ids or r["status"] in (REJECTED, QUARANTINED):
            continue
        if r["status"] == TRANSCODED and not sink.exists(r["mcap_path"]):
            stale.append(r)
        else:
            done.append(r["episode_id"])
    return stale, done


def transcode_batch(
    batch_key: str,
    stores: IngestStores,
    gates: GateConfig,
    *,
    settings: TranscodeSettings | None = None,
    workers: int | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda m: None,
    mp_context: str | None = None,
    lease: RunLease | None = None,
    on_episode: EpisodeProgress | None = None,
) -> StageReport:
    """Transcode a work unit's stale episodes, each in a process of its own, and record each outcome
    as it finishes. An episode that meets a machine fault is tried again (:mod:`.faults`); one still
    failing for the machine's sake is left pending and, once every other episode is recorded, the
    call raises :class:`InfrastructureFault` naming it. ``lease``: the run's (catalog/leases.py);
    once it is gone, the episodes in flight are killed or stop before publishing, and the call raises
    :class:`RunEnded` with what finished recorded. ``on_episode``: hears (episodes done, up-to-date ones
    included, of the unit's, the source bytes transcoded) at the start and as each comes to its outcome."""
    stores.check()
    settings = settings or TranscodeSettings()
    remove_orphan_temps(stores.mcap_dir)
    todo, done = episodes_to_transcode(batch_key, stores, force=force)
    rep = StageReport(
        batch_key, "post", files=len(todo) + len(done), skipped=done, staging_swept=sweep_staging(stores.mcap_dir)
    )
    # Largest first onto a shared queue (LPT list scheduling): each worker takes the next
    # episode when it finishes one, so the batch splits into byte-balanced shares and no
    # worker idles behind a long episode started last.
    todo.sort(key=lambda r: (-r["source_bytes"], r["episode_id"]))
    raw, sink = stores.raw(), stores.sink()
    jobs = [
        TranscodeJob(
            raw,
            r["source_path"],
            r["source_bytes"],
            sink,
            r["episode_id"],
            r["source_sha256"],
            r.get("mcap_version"),
            settings,
            gates,
            lease,
            stores.topics,
            r.get("source_window"),
        )
        for r in todo
    ]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    if any(r.get("source_format") == "ros2" for r in todo):
        ros2.preload()  # once here, inherited by every forked worker, instead of once in each
    own0, episodes_cpu = time.process_time(), 0.0
    # Each episode in a process of its own, recorded as it finishes (group commits, see outcomes.py).
    outcomes = OutcomeBuffer(stores.registry, max_outcomes=256, min_interval_s=TRANSCODE_COMMIT_INTERVAL_S)
    faults: dict[int, list[tuple[str, bool]]] = {}  # job -> its machine faults so far: (reason, a worker death)
    exhausted: list[int] = []
    finished = 0  # episodes that came to an outcome of their own (transcoded or a verdict)
    finished_bytes = 0

    def progress() -> None:
        if on_episode is not None:
            on_episode(len(done) + finished, len(done) + len(todo), finished_bytes)

    progress()
    shared = ExitStack()  # items the unit stages once for all their episodes' workers (RawSource.staged_once)
    staged = shared.enter_context(raw.staged_once(_items_read_by_several(todo)))
    jobs = [replace(j, staged=str(staged[item])) if (item := split_member(j.key)[0]) in staged else j for j in jobs]
    attempt = list(range(len(jobs)))
    try:
        while attempt:  # a first pass, then rounds of the episodes a machine fault interrupted
            again: list[int] = []
            with closing(
                run_each(
                    transcode_job,
                    [(jobs[i],) for i in attempt],
                    workers,
                    cpu_limit_s=settings.max_cpu_s,
                    stall_s=settings.stall_s,
                    context=mp_context,
                    should_stop=None if lease is None else lambda: not lease.alive(),
                )
            ) as results:
                for k, slot, out in results:
                    i = attempt[k]
                    if isinstance(out, WorkerFailure):
                        remove_orphan_temps(stores.mcap_dir)  # what the dead worker was writing
                        out = worker_died(out)
                    elif out.run_ended:  # it found the run gone before publishing
                        raise Stopped([i])
                    elif out.unavailable:  # the MCAP store did not answer: critical, the unit fails (and is retried)
                        raise StoreUnavailableError(*out.unavailable)
                    episodes_cpu += out.cpu_s
                    machine = out.infrastructure
                    if machine is None:
                        finished += 1
                        finished_bytes += todo[i]["source_bytes"]
                        _record(outcomes, stores, rep, todo[i], out, slot, log)
                        progress()
                        continue
                    tries = faults.setdefault(i, [])
                    tries.append((machine, out.worker_died))
                    limit = WORKER_DEATH_ATTEMPTS if all(d for _, d in tries) else INFRASTRUCTURE_ATTEMPTS
                    log(
                        f"{todo[i]['episode_id']}: attempt {len(tries)} of {limit} met an infrastructure fault: "
                        f"{machine}"
                    )
                    (again if len(tries) < limit else exhausted).append(i)
            attempt = again
        pending = {}
        for i in exhausted:
            tries = faults[i]
            if all(died for _, died in tries) and finished:
                # the worker died on every attempt at this file while the unit's other files finished on the same
                # workers: it follows the file, so it is the file's verdict
                why = "; ".join(why for why, _ in tries)
                out = TranscodeOutcome(
                    quarantine=Quarantine(
                        "transcode",
                        "transcode",
                        f"the worker process died on each of {len(tries)} attempts ({why}) while {finished} "
                        "other episode(s) of its unit finished on the same workers",
                    )
                )
                _record(outcomes, stores, rep, todo[i], out, 0, log)
            else:
                pending[todo[i]["episode_id"]] = f"{tries[-1][0]} (after {len(tries)} attempts)"
                _leave_pending(outcomes, rep, todo[i])
    except BaseException as e:
        try:  # keep what finished before the failure; the original error is what the unit reports
            outcomes.flush()
        except Exception as e2:
            log(f"could not record {len(outcomes.pending)} finished episodes of {batch_key}: {e2}")
        remove_orphan_temps(stores.mcap_dir)  # what killed episode processes were writing
        if isinstance(e, Stopped) and lease is not None:
            raise RunEnded(lease.key, batch_key, len(todo) - finished) from None
        raise
    finally:
        shared.close()
    outcomes.flush()
    # this process, plus what each episode's process measured of itself: a fork server's children are
    # not this process's children, so getrusage(RUSAGE_CHILDREN) would miss them
    rep.cpu_s = time.process_time() - own0 + episodes_cpu
    if pending:
        raise InfrastructureFault(batch_key, pending)
    return rep


def _items_read_by_several(todo: Sequence[dict]) -> list[str]:
    """The directory items (their keys) of which ``todo`` holds two or more episodes: a long bag cut
    into episodes, each transcoded by its own worker."""
    counts: dict[str, int] = {}
    for r in todo:
        item, member = split_member(r["source_path"])
        if member is not None:
            counts[item] = counts.get(item, 0) + 1
    return sorted(k for k, n in counts.items() if n > 1)


def _leave_pending(outcomes: OutcomeBuffer, rep: StageReport, row: dict) -> None:
    """An episode a machine fault kept from its outcome: never transcoded, it is marked pending (the
    next run of its partition, and the drift sensor, take it up); one with an MCAP of other versions
    keeps it and stays stale."""
    rep.pending.append(row["episode_id"])
    if row["status"] in (ACCEPTED, QUARANTINED, PENDING):
        outcomes.add(
            Outcome(
                row["source_path"],
                rep.batch_key,
                "post",
                [],
                {
                    "episode_id": row["episode_id"],
                    "status": PENDING,
                    "schema_version": None,
                    "pipeline_version": None,
                    "mcap_path": None,
                    "mcap_uri": None,
                    "mcap_bytes": None,
                    "mcap_version": None,
                    "training_streams": None,
                },
            )
        )


def _record(
    outcomes: OutcomeBuffer,
    stores: IngestStores,
    rep: StageReport,
    row: dict,
    out: TranscodeOutcome,
    slot: int,
    log: Callable[[str], None],
) -> None:
    pv = versions.PIPELINE_VERSION
    rep.worker_busy_s[slot] = rep.worker_busy_s.get(slot, 0.0) + out.wall_s
    if out.report is not None:
        rep.codec_cpu_s += out.report.jpeg_decode_cpu_s + out.report.video_encode_cpu_s
    episode = _post_row(row, out)
    gate_records = [g.as_record(pv) for g in out.gates]
    try:
        outcomes.add(Outcome(row["source_path"], rep.batch_key, "post", gate_records, episode, _q(out.quarantine)))
    except FieldValueError as e:  # e.g. an output path longer than its column: held back, said why
        held = stores.sink().hold(row["episode_id"]) if episode.get("mcap_path") else None
        reason = f"the registry cannot store the outcome: {e}"
        out = replace(out, mcap=None, quarantine=Quarantine("transcode", "post", reason, e.column, held))
        episode = _post_row(row, out)
        outcomes.add(Outcome(row["source_path"], rep.batch_key, "post", gate_records, episode, _q(out.quarantine)))
    rep.tally(row["source_path"], row["episode_id"], out.gates)
    q = out.quarantine
    if q:
        rep.quarantined.append({"path": row["source_path"], "episode_id": row["episode_id"], **q.as_record()})
        log(f"quarantined {row['episode_id']} ({row['source_path']}): {q.gate}: {q.reason}")
    else:
        rep.processed.append(row["episode_id"])


def _post_row(row: dict, out: TranscodeOutcome) -> dict:
    """The episode's registry update after its transcode."""
    episode = {
        "episode_id": row["episode_id"],
        "schema_version": versions.SCHEMA_VERSION,
        "pipeline_version": versions.PIPELINE_VERSION,
    }
    if out.quarantine:
        episode.update(
            status=QUARANTINED,
            mcap_path=None,
            mcap_uri=None,
            mcap_bytes=None,
            mcap_version=None,
            training_streams=None,
            quality_ok=False,
        )
        return episode
    r, mcap = out.report, out.mcap
    assert r is not None and mcap is not None  # not held back: transcoded and published
    cams = r.cameras.values()
    episode.update(
        status=TRANSCODED,
        mcap_path=mcap.path,
        mcap_uri=mcap.uri,
        mcap_version=mcap.version,
        mcap_bytes=r.bytes_out,
        training_streams=r.training_streams,
        quality_ok=bool(row.get("quality_ok", True)) and all(g.passed for g in out.gates),
        start_ns=r.start_ns,
        end_ns=r.end_ns,
        n_steps=r.streams.get("joint_states", 0),
        n_frames=sum(c.frames for c in cams),
        dropped_cameras=json.dumps(sorted(name for name, c in r.cameras.items() if c.dropped_frames)),
        dark_frame_fraction=round(max((c.dark_frames / c.frames for c in cams if c.frames), default=0.0), 6),
        frozen_frame_fraction=round(max((c.frozen_frames / c.frames for c in cams if c.frames), default=0.0), 6),
    )
    # The pre gate samples frames; the transcode saw every one: a camera that went dark
    # between two samples is flagged here (the pre gate's flag is never cleared).
    if any(c.dark_frames >= max(2, 0.01 * c.frames) for c in cams):
        episode.update(camera_dead=True, quality_ok=False)
    episode.update(out.quality or {})
    return episode
