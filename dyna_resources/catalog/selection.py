"""What a curation spec selects in the warehouse right now, as a fingerprint: how manifests follow
the data. The warehouse sync records every spec's fingerprint; a manifest records the one it was
built from; when the two differ (a batch re-transcoded at a new pipeline version, a quarantine
released, a review verdict), the curation sensor rebuilds that manifest and no other.

The fingerprint is one aggregate query over the spec's chosen episodes (the first step of its
query, before segments are cut): their count and a sum of row hashes of every column the manifest
carries (the MCAP, its time range and steps, the weight, the passthrough columns), plus the step
ladders' rows when the spec selects by step. A manifest is a pure function of those rows and the
spec, so an unchanged fingerprint means an unchanged manifest; a column the manifest does not
carry changing costs nothing. Cost: one scan of the episodes the spec's filter keeps, no segments.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from ..keys import is_safe_key
from .curation import PASSTHROUGH, CurationSpec, CurationSpecError
from .warehouse import STEP_COLUMNS

# What each chosen episode contributes to the manifest, besides the spec itself.
_MANIFEST_INPUTS = ["episode_id", "mcap_uri", "start_ns", "end_ns", "n_steps", "weight", *PASSTHROUGH]


def spec_files(directory: Path) -> tuple[dict[str, Path], list[str]]:
    """The curation spec files of ``directory`` by name (the file stem becomes a partition key and a
    manifest file name, so it must be a safe key), and the names of files ignored for their name."""
    files, ignored = {}, []
    for p in sorted(directory.glob("*.yaml")):
        if is_safe_key(p.stem):
            files[p.stem] = p
        elif not p.name.startswith("."):
            ignored.append(p.name)
    return files, ignored


def spec_digest(path: str | Path) -> str:
    """A spec file's content hash (16 hex digits): the curation sensor's run key, the manifest's record."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Selection:
    spec: str  # the spec file's digest this selection was computed for
    digest: str  # the fingerprint of the chosen rows; "" when the spec is invalid
    episodes: int = 0
    stale_episodes: int = 0  # chosen episodes written by another pipeline or schema version
    error: str = ""  # the spec's CurationSpecError, when it has one

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Selection:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def selection_of(warehouse, spec: CurationSpec, *, spec_file_digest: str, schema: str, pipeline: str) -> Selection:
    """The spec's selection in ``warehouse`` (an open :class:`~.warehouse.Warehouse`)."""
    chosen, params = spec.chosen()
    used = {k: params[k] for k in re.findall(r"\$(\w+)", chosen)}
    steps = (
        f"(SELECT coalesce(sum(hash({', '.join(f's.{c}' for c, _ in STEP_COLUMNS)})::HUGEINT), 0) FROM episode_steps s "
        "WHERE s.episode_id IN (SELECT episode_id FROM picked))"
        if spec.step_where is not None
        else "0"
    )
    sql = f"""WITH picked AS ({chosen})
SELECT count(*), coalesce(sum(hash({", ".join(_MANIFEST_INPUTS)})::HUGEINT), 0),
       count(*) FILTER (WHERE pipeline_version IS DISTINCT FROM $cur_pipeline
                           OR schema_version IS DISTINCT FROM $cur_schema),
       {steps}
FROM picked WHERE weight > 0"""
    row = warehouse.con.execute(sql, {**used, "cur_pipeline": pipeline, "cur_schema": schema}).fetchone()
    assert row is not None, "an aggregate query returns one row"
    episodes, rows_hash, stale, steps_hash = row
    digest = hashlib.sha256(f"{episodes}:{rows_hash}:{steps_hash}".encode()).hexdigest()[:16]
    return Selection(spec=spec_file_digest, digest=digest, episodes=episodes, stale_episodes=stale)


def selections(warehouse, spec_files: dict[str, Path], *, schema: str, pipeline: str) -> dict[str, Selection]:
    """Every spec's selection (``spec_files``: name -> file); an invalid spec's carries its error."""
    out = {}
    for name, path in sorted(spec_files.items()):
        digest = spec_digest(path)
        try:
            spec = CurationSpec.load(path)
            out[name] = selection_of(warehouse, spec, spec_file_digest=digest, schema=schema, pipeline=pipeline)
        except CurationSpecError as e:
            out[name] = Selection(spec=digest, digest="", error=str(e))
        except duckdb.Error as e:  # never the sync's failure: its manifest is then rebuilt on spec edits only
            out[name] = Selection(spec=digest, digest="", error=f"selection query failed: {e}")
    return out
