"""Inventory and transcode a set of raw episodes: the engine behind the first assets.

Per-episode failures (bad input) are quarantined with their reason and the batch goes
on; anything else (disk full, a bug) propagates and fails the run. Episodes whose MCAP
already carries the same source hash and pipeline/schema versions are skipped, so a
re-run only redoes what is stale.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import versions
from .errors import EpisodeError, RawFormatError
from .mcap_reader import EpisodeReader
from .raw_format import RawEpisode, file_sha256
from .transcode import TranscodeSettings, transcode_episode

SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass
class InventoryItem:
    path: str
    bytes: int
    episode_id: str | None = None
    duration_s: float = 0.0
    cameras: list[str] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    error: dict | None = None  # EpisodeError.as_record() when the pre-transform gate failed


def inspect_raw(path: str | Path) -> InventoryItem:
    """Pre-transform gate: the file opens, has the required streams, monotonic timestamps, a safe id."""
    path = Path(path)
    item = InventoryItem(path=str(path), bytes=path.stat().st_size)
    try:
        with RawEpisode(path) as raw:
            if not SAFE_ID.match(raw.meta.episode_id):
                raise RawFormatError(str(path), f"episode_id {raw.meta.episode_id!r} is not a safe identifier "
                                     "([A-Za-z0-9._-], at most 128 characters)", stream="episode_id")
            item.episode_id = raw.meta.episode_id
            item.duration_s = raw.duration_s
            item.cameras = sorted(raw.cameras)
            item.streams = sorted(raw.streams)
            item.meta = raw.meta.as_dict()
    except EpisodeError as e:
        item.error = e.as_record()
    return item


def inventory(paths: list[Path]) -> list[InventoryItem]:
    return [inspect_raw(p) for p in sorted(paths)]


@dataclass
class BatchReport:
    transcoded: list[dict] = field(default_factory=list)  # TranscodeReport.as_dict() each
    up_to_date: list[str] = field(default_factory=list)  # episode ids skipped
    quarantined: list[dict] = field(default_factory=list)  # EpisodeError records

    @property
    def bytes_in(self) -> int:
        return sum(r["bytes_in"] for r in self.transcoded)

    @property
    def bytes_out(self) -> int:
        return sum(r["bytes_out"] for r in self.transcoded)

    @property
    def hours(self) -> float:
        return sum(r["duration_s"] for r in self.transcoded) / 3600

    def as_dict(self) -> dict:
        return asdict(self)


def is_up_to_date(mcap_path: Path, source_sha256: str) -> bool:
    if not mcap_path.exists():
        return False
    try:
        with EpisodeReader(mcap_path) as r:
            md = r.metadata()
    except EpisodeError:
        return False  # unreadable output: redo it
    return (md.get("source_sha256") == source_sha256
            and md.get("pipeline_version") == versions.PIPELINE_VERSION
            and md.get("schema_version") == versions.SCHEMA_VERSION)


def _transcode_one(src: str, dst: str, sha256: str, settings: TranscodeSettings) -> dict:
    try:
        return {"ok": transcode_episode(src, dst, settings, source_sha256=sha256).as_dict()}
    except EpisodeError as e:
        return {"error": e.as_record()}


def transcode_batch(items: list[InventoryItem], out_dir: Path, quarantine_dir: Path, *,
                    settings: TranscodeSettings | None = None, workers: int | None = None) -> BatchReport:
    settings = settings or TranscodeSettings()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = BatchReport()
    todo = []
    for item in items:
        if item.error:
            report.quarantined.append(item.error)
            continue
        dst = out_dir / f"{item.episode_id}.mcap"
        sha256 = file_sha256(item.path)
        if is_up_to_date(dst, sha256):
            report.up_to_date.append(item.episode_id)
        else:
            todo.append((item.path, str(dst), sha256))
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    # Largest first: with one worker per core, a long episode started last would idle the others.
    todo.sort(key=lambda t: -os.path.getsize(t[0]))
    if workers == 1:
        results = [_transcode_one(*t, settings) for t in todo]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_transcode_one, *zip(*todo), [settings] * len(todo)))
    for r in results:
        if "ok" in r:
            report.transcoded.append(r["ok"])
        else:
            report.quarantined.append(r["error"])
    quarantine(report.quarantined, quarantine_dir)
    return report


def quarantine(records: list[dict], quarantine_dir: Path) -> None:
    """One JSON record per rejected file; the raw file itself stays where it landed."""
    quarantine_dir.mkdir(parents=True, exist_ok=True)
    for rec in records:
        name = Path(rec["path"]).name
        (quarantine_dir / f"{name}.json").write_text(json.dumps(rec, indent=2, sort_keys=True))
