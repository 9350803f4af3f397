"""One tick of the landing sensor, as plain Python: list what is new, register it, pack
byte-balanced work units, group them into ingest partitions, and pick the sealed partitions to
launch. The Dagster sensor only turns the plan into dynamic-partition requests and run
requests, and stores the cursor.

The cursor is committed by Dagster together with the tick's requests, and units and
partitions are numbered by global sequences in the registry, so a tick that dies half-way is
redone by the next one without losing or repeating a unit or a partition.

Reconciliation (files that land behind the cursor, e.g. an uploader that retried for an hour)
never lists the whole zone: every ``reconcile_every`` ticks the cursor's position is marked,
and a sweep re-lists, a page a tick, the keys between the oldest of the last
``reconcile_window`` marks and the cursor. A file that lands further behind than that is
found only by a sweep an operator starts (``LandingCursor.sweep_after``/``sweep_until``).

Settling: on a zone whose listing can show a file still being written (local disks, NFS), a new file
is registered only once its size and mtime are the same in two listings at least ``settle_s`` apart,
or at once when its uploader wrote the completion marker (``landing.COMPLETION_MARKER``). Files
still settling ride in the cursor and are looked at again (one stat each) every tick. Object stores
list only whole objects: no settling there.

New versions: every tick also looks again at up to ``relook_per_tick`` files the pre gates held back
(a truncated upload, say), in turn; one whose size or mtime (an object's generation time) changed
settles like a new file and then lands again as a new item, in a new work unit.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields

from ..catalog.registry import Batch, IngestPartition, LandedFile, Registry
from .landing import LandingZone
from .packing import pack


@dataclass
class LandingCursor:
    after: str | None = None  # last landing key listed
    last_partition: int = 0  # last ingest partition handed to Dagster (its seq)
    ticks: int = 0
    # Reconciliation: the cursor as it stood at the last few reconciliation points, and the sweep in
    # progress (re-listing the keys between the oldest mark and the cursor of its start, a page a tick).
    marks: list[str] = field(default_factory=list)
    sweep_after: str | None = None
    sweep_until: str | None = None
    # Files listed but not yet settled: key -> [bytes, mtime_ns, when first seen at that size and mtime]
    settling: dict[str, list] = field(default_factory=dict)
    relook_after: str | None = None  # the last held-back file looked at again (they are taken in turn)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, s: str | None) -> LandingCursor:
        if not s:
            return cls()
        known = {f.name for f in fields(cls)}
        # a cursor from before ingest partitions ("last_seq": a batch sequence) starts the hand-off afresh;
        # the sensor skips partitions Dagster already has
        return cls(**{k: v for k, v in json.loads(s).items() if k in known})


@dataclass(frozen=True)
class LandingSettings:
    """How the landing sensor batches arrivals. The defaults are a deployment's (a fleet uploading
    all day: full work units and partitions, a short one after an hour); :data:`EMBEDDED_LANDING`
    is one machine's.

    Sizes, for a legacy corpus of 1M episode-hours (~8.5 MB per episode-second, ~30.6 PB): a work
    unit of 8 GiB holds ~11 episodes of 84 s (~4M units: registry rows, never Dagster partitions); a
    partition of 8 TiB holds ~1,000 units (~3,500 partitions per 1M hours, ~80,000 for a year of a
    fleet recording 440,000 hours a week: under Dagster's advised 100,000 per asset). At 16 runs
    per 30 s tick the sensor hands a year of that fleet's partitions to Dagster in ~1.7 days.
    """

    target_batch_bytes: int = 8 << 30  # one work unit: what one worker (a Ray task) transcodes
    tolerance: float = 0.1
    max_wait_s: float = 3600.0  # release a short unit and seal a short partition once it waited this long
    max_runs_per_tick: int = 16  # sealed partitions handed to Dagster per tick; the run queue staggers them
    scan_limit: int = 50_000  # keys listed per tick at most (incremental listing and sweep each); the rest next tick
    reconcile_every: int = 120  # every N ticks a reconciliation sweep starts, to catch out-of-order arrivals
    partition_bytes: int = 8 << 40  # an ingest partition (one Dagster partition) is sealed at this size
    reconcile_window: int = 2  # a sweep re-lists the keys landed since this many reconciliation points ago
    # A file on a local/NFS zone lands once its size and mtime stood still across two listings this many
    # seconds apart (or at once with its completion marker); 0: land whatever is listed.
    settle_s: float = 60.0
    relook_per_tick: int = 100  # held-back files looked at again per tick for a new version


# The embedded defaults (`make ui`, files dropped by hand): a file is registered by the first sensor tick
# after it lands and a short unit released (and its partition sealed) by the tick 30 s later, so a drop
# becomes a run within a minute. Units of 2 GiB and partitions of 64 GiB: a laptop's drops are small.
EMBEDDED_LANDING = LandingSettings(
    target_batch_bytes=2 << 30, max_wait_s=30.0, max_runs_per_tick=4, partition_bytes=64 << 30, settle_s=5.0
)


@dataclass
class TickPlan:
    cursor: LandingCursor
    new_files: int = 0
    listed: int = 0
    swept: int = 0  # keys the reconciliation sweep listed this tick
    pending_files: int = 0
    created: list[Batch] = field(default_factory=list)  # work units packed this tick
    sealed: list[IngestPartition] = field(default_factory=list)  # partitions sealed this tick
    launch: list[IngestPartition] = field(default_factory=list)  # partitions to hand to Dagster
    reconciled: bool = False  # a sweep listed keys this tick
    settling: int = 0  # files listed but still being written (or not yet seen twice)
    relanded: list[str] = field(default_factory=list)  # held-back files whose new version landed this tick

    @property
    def sweeping(self) -> bool:
        return self.cursor.sweep_until is not None


def landing_tick(
    cursor: LandingCursor,
    landing: LandingZone,
    registry: Registry,
    settings: LandingSettings,
    *,
    now: float | None = None,
) -> TickPlan:
    """List what landed after the cursor (and a page of the reconciliation sweep), register it, pack
    work units, put them into partitions and pick the sealed partitions to launch. Every step costs
    what is new (at most two listings of ``scan_limit`` keys), never the size of the zone."""
    now = time.time() if now is None else now
    listed = landing.scan(cursor.after, settings.scan_limit)
    after = listed[-1].path if listed else cursor.after
    marks, sweep_after, sweep_until = list(cursor.marks), cursor.sweep_after, cursor.sweep_until
    if settings.reconcile_every > 0 and cursor.ticks % settings.reconcile_every == settings.reconcile_every - 1:
        if marks and sweep_until is None:  # a sweep from the oldest mark up to where the cursor stood then
            sweep_after, sweep_until = marks[0], cursor.after
        if cursor.after is not None:
            marks = (marks + [cursor.after])[-max(1, settings.reconcile_window) :]
    swept: list[LandedFile] = []
    if sweep_until is not None:
        page = landing.scan(sweep_after, settings.scan_limit)
        swept = [f for f in page if f.path <= sweep_until]
        if len(swept) < len(page) or len(page) < settings.scan_limit or page[-1].path == sweep_until:
            sweep_after = sweep_until = None  # reached the point it set out for
        else:
            sweep_after = page[-1].path
    candidates = listed + swept
    relook = registry.held_back_files(cursor.relook_after, settings.relook_per_tick) if settings.relook_per_tick else []
    changed = _changed(landing, registry, relook)
    settling = dict(cursor.settling)
    if settings.settle_s > 0 and getattr(landing, "settles", False):
        candidates, changed, settling = _settled(
            landing, registry, candidates, changed, settling, now, settings.settle_s
        )
    relanded = registry.reland(changed, now=now)
    new = registry.register_files(candidates, now=now)
    pending, oldest = registry.unbatched_files()
    flush = oldest is not None and now - oldest >= settings.max_wait_s
    packing = pack(pending, settings.target_batch_bytes, tolerance=settings.tolerance, flush=flush)
    created = registry.create_batches(packing.batches, target_bytes=settings.target_batch_bytes, now=now)
    sealed = registry.assign_partitions(
        target_bytes=settings.partition_bytes, max_wait_s=settings.max_wait_s, seal_open=flush, now=now
    )
    launch = registry.sealed_partitions_after(cursor.last_partition, limit=settings.max_runs_per_tick)
    next_cursor = LandingCursor(
        after=after,
        last_partition=launch[-1].seq if launch else cursor.last_partition,
        ticks=cursor.ticks + 1,
        marks=marks,
        sweep_after=sweep_after,
        sweep_until=sweep_until,
        settling=settling,
        relook_after=relook[-1] if len(relook) >= settings.relook_per_tick else None,
    )
    return TickPlan(
        cursor=next_cursor,
        new_files=new,
        listed=len(listed),
        swept=len(swept),
        pending_files=len(packing.pending),
        created=created,
        sealed=sealed,
        launch=launch,
        reconciled=bool(swept) or cursor.sweep_until is not None,
        settling=len(settling),
        relanded=relanded,
    )


def _changed(landing: LandingZone, registry: Registry, keys: list[str]) -> list[LandedFile]:
    """Of these registered files, those whose size or mtime is not what was registered (a new version)."""
    if not keys:
        return []
    known = registry.landed(keys)
    out = []
    for key in keys:
        now_there = landing.stat(key)
        was = known.get(key)
        if (
            now_there is not None
            and was is not None
            and (now_there.bytes, now_there.mtime_ns) != (was.bytes, was.mtime_ns)
        ):
            out.append(now_there)
    return out


def _settled(
    landing: LandingZone,
    registry: Registry,
    listed: list[LandedFile],
    changed: list[LandedFile],
    settling: dict[str, list],
    now: float,
    settle_s: float,
) -> tuple[list[LandedFile], list[LandedFile], dict[str, list]]:
    """(new files that settled, new versions that settled, what is still settling). A file settles when
    two listings ``settle_s`` apart saw the same size and mtime, or when its completion marker is there."""
    known = registry.landed([f.path for f in listed]) if listed else {}
    fresh = [f for f in listed if f.path not in known]
    new_keys = {f.path for f in fresh}
    version_keys = {f.path for f in changed}
    seen = {f.path: f for f in fresh + changed}
    for key in list(settling):  # the cursor has passed these: each is looked at again
        if key not in seen:
            f = landing.stat(key)
            if f is None:
                del settling[key]  # gone (an uploader that gave up, a temporary name): nothing to land
                continue
            seen[key] = f
            (version_keys if key in version_keys or settling[key][3:] == ["version"] else new_keys).add(key)
    settled_new: list[LandedFile] = []
    settled_versions: list[LandedFile] = []
    for key, f in seen.items():
        prev = settling.get(key)
        if landing.complete(key) or (
            prev is not None and (prev[0], prev[1]) == (f.bytes, f.mtime_ns) and now - prev[2] >= settle_s
        ):
            settling.pop(key, None)
            (settled_versions if key in version_keys else settled_new).append(f)
        elif prev is None or (prev[0], prev[1]) != (f.bytes, f.mtime_ns):
            settling[key] = [f.bytes, f.mtime_ns, now] + (["version"] if key in version_keys else [])
    return sorted(settled_new, key=lambda f: f.path), settled_versions, settling
