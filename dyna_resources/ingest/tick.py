"""One tick of the landing sensor, as plain Python: list what is new, register it, pack
batches, and pick the batches to launch. The Dagster sensor only turns the plan into
dynamic-partition requests and run requests, and stores the cursor.

The cursor is committed by Dagster together with the tick's requests, and batches are
numbered by a global sequence in the registry, so a tick that dies half-way is redone
by the next one without losing or repeating a batch.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from ..catalog.registry import Batch, Registry
from .landing import LandingZone
from .packing import pack


@dataclass
class LandingCursor:
    after: str | None = None  # last landing key listed
    last_seq: int = 0  # last batch handed to Dagster
    ticks: int = 0

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, s: str | None) -> LandingCursor:
        return cls(**json.loads(s)) if s else cls()


@dataclass(frozen=True)
class LandingSettings:
    """How the landing sensor batches arrivals. The defaults are a deployment's (a fleet uploading
    all day: full batches, a short one after an hour); :data:`EMBEDDED_LANDING` is one machine's."""

    target_batch_bytes: int = 2 << 30  # 2 GiB: ~100-200 episodes of 10-20 MB
    tolerance: float = 0.1
    max_wait_s: float = 3600.0  # release a short batch once its oldest file waited this long
    max_runs_per_tick: int = 4
    scan_limit: int = 50_000  # keys listed per tick at most; the rest next tick
    reconcile_every: int = 120  # every N ticks list the whole zone to catch out-of-order arrivals


# The embedded defaults (`make ui`, files dropped by hand): a file is registered by the first sensor tick
# after it lands and a short batch released by the tick 30 s later, so a drop becomes a run within a minute.
EMBEDDED_LANDING = LandingSettings(max_wait_s=30.0)


@dataclass
class TickPlan:
    cursor: LandingCursor
    new_files: int = 0
    listed: int = 0
    pending_files: int = 0
    created: list[Batch] = field(default_factory=list)
    launch: list[Batch] = field(default_factory=list)
    reconciled: bool = False


def landing_tick(cursor: LandingCursor, landing: LandingZone, registry: Registry, settings: LandingSettings,
                 *, now: float | None = None) -> TickPlan:
    now = time.time() if now is None else now
    reconcile = settings.reconcile_every > 0 and cursor.ticks % settings.reconcile_every == settings.reconcile_every - 1
    listed = landing.scan(None if reconcile else cursor.after, None if reconcile else settings.scan_limit)
    new = registry.register_files(listed, now=now)
    after = cursor.after
    if listed and not reconcile:
        after = listed[-1].path
    pending, oldest = registry.unbatched_files()
    flush = oldest is not None and now - oldest >= settings.max_wait_s
    packing = pack(pending, settings.target_batch_bytes, tolerance=settings.tolerance, flush=flush)
    created = registry.create_batches(packing.batches, target_bytes=settings.target_batch_bytes, now=now)
    launch = registry.batches_after(cursor.last_seq, limit=settings.max_runs_per_tick)
    next_cursor = LandingCursor(after=after, last_seq=launch[-1].seq if launch else cursor.last_seq,
                                ticks=cursor.ticks + 1)
    return TickPlan(cursor=next_cursor, new_files=new, listed=len(listed), pending_files=len(packing.pending),
                    created=created, launch=launch, reconciled=reconcile)
