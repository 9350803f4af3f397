"""A work unit's outcomes, committed to the registry in bulk.

One transaction per file made the registry the bottleneck of a large import (~100-170 outcomes a
second on SQLite: days of single-writer time per stage at 43M episodes). The buffer collects a
unit's outcomes and writes them with :meth:`Registry.record_outcomes`, one set-based transaction:

- the inventory (cheap to redo) commits once per unit, at its end: a killed unit is redone whole;
- the transcode (minutes of CPU per episode) group-commits: an outcome is committed at once if the
  last commit is ``min_interval_s`` old, else with the next outcome that finds it so (or once
  ``max_outcomes`` wait), and at the unit's end. Slow episodes are each durable the moment they
  finish; only quick ones, finishing within ``min_interval_s`` of each other, share a transaction,
  so a killed run redoes the unfinished episodes plus a few quick ones.

Values are checked when an outcome is added (``Registry.check_outcome``), so a value the
registry would refuse is reported for its own file, at once, and never fails a whole flush.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..catalog.registry import Outcome, Registry


@dataclass
class OutcomeBuffer:
    registry: Registry
    max_outcomes: int | None = None  # None (and no interval): only at flush()
    min_interval_s: float | None = None
    pending: list[Outcome] = field(default_factory=list)
    episodes: dict[str, dict] = field(default_factory=dict)  # episode id -> its whole row, not yet committed
    flushes: int = 0
    _last_flush: float = float("-inf")

    def add(self, outcome: Outcome) -> None:
        """Queue an outcome; raises FieldValueError (and queues nothing) for a value the registry refuses."""
        Registry.check_outcome(outcome)
        self.pending.append(outcome)
        if outcome.episode is not None and "source_bytes" in outcome.episode:
            self.episodes[outcome.episode["episode_id"]] = {**outcome.episode, "source_path": outcome.source_path}
        if self._due():
            self.flush()

    def episode(self, episode_id: str) -> dict | None:
        """The episode's row as this unit will have left it: queued here, else the registry's."""
        return self.episodes.get(episode_id) or self.registry.episode_by_id(episode_id)

    def flush(self) -> None:
        if self.pending:
            self.registry.record_outcomes(self.pending)
            self.flushes += 1
            self._last_flush = time.monotonic()
        self.pending, self.episodes = [], {}

    def _due(self) -> bool:
        return (self.max_outcomes is not None and len(self.pending) >= self.max_outcomes) or (
            self.min_interval_s is not None and time.monotonic() - self._last_flush >= self.min_interval_s
        )
