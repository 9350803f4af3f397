"""Curation specs: a declarative file per training set, compiled to ONE parameterized SQL query
over the warehouse that yields the manifest's rows (one per segment).

    name: pick-place-real
    where:                                # every condition must hold
      task: {in: [pick_place, fold_towel]}
      success: true                       # shorthand for {"=": true}
      duration_s: {">=": 4}
      camera_dead: {"!=": true}           # NULL-safe: an unknown flag is not "true"
      site: {like: "sfo-%"}
    segments: {length_s: 2.0, stride_s: 1.0}
    weights: {by: task, values: {pick_place: 2.0}, default: 1.0}
    steps:                                # optional: select by step ladder (warehouse episode_steps)
      where: {step: fold, outcome: success}
      scope: step                         # step: segments cut inside the matching steps only
                                          # episode: whole episodes that have a matching step

Column names are checked against the warehouse's columns and operators against a fixed
list; every value is a bound parameter, so nothing from a spec is ever spliced into SQL.
Values are checked against their column's type (text, number, boolean) and the segment
sizes against bounds, all before the query runs: any mistake is a :class:`CurationSpecError`
naming the field (``where.tsk``), and the value and what was expected where there is one.

Bounds (what cannot be a sensible training set, or would blow up the query):

* ``segments.length_s`` and ``segments.stride_s``: from ``MIN_SEGMENT_S`` (1 ms: one tick of a
  1 kHz control loop, finer than any robot records) to ``MAX_SEGMENT_S`` (one day);
* at most ``MAX_SEGMENTS_PER_EPISODE`` (1,000,000) segments per episode or step window, checked
  on the chosen episodes before the manifest query (a 1 h episode at a 10 ms stride is 360,000);
* weights: finite, from 0 to ``MAX_WEIGHT`` (1e6).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..keys import SAFE_KEY, is_safe_key
from .warehouse import STEP_COLUMNS, warehouse_columns

COLUMNS = dict(warehouse_columns())
STEP_FIELDS = {n: ty for n, ty in STEP_COLUMNS if n != "episode_id"}
OPERATORS = {
    "=": "IS NOT DISTINCT FROM",
    "!=": "IS DISTINCT FROM",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
    "in": "IN",
    "not_in": "NOT IN",
    "like": "LIKE",
    "is_null": "IS NULL",
}
SPEC_FIELDS = {"name", "description", "where", "segments", "weights", "steps"}
STEP_SCOPES = ("step", "episode")
NAME = SAFE_KEY  # a spec's name, like its file's stem, becomes a partition key and a file name
MIN_SEGMENT_S = 0.001
MAX_SEGMENT_S = 86_400.0
MAX_SEGMENTS_PER_EPISODE = 1_000_000
MAX_WEIGHT = 1e6
# What a value compared with a column of each warehouse type must be.
_NUMERIC = ("INTEGER", "BIGINT", "DOUBLE")
_EXPECTED = {
    "VARCHAR": "text",
    "BOOLEAN": "true or false",
    "INTEGER": "an integer",
    "BIGINT": "an integer",
    "DOUBLE": "a number",
}
# Manifest columns carried over from the warehouse as they are (after the computed ones:
# episode_id, uri, start_ns, end_ns, n_steps, weight).
PASSTHROUGH = [
    "task",
    "robot_id",
    "robot_model",
    "site",
    "success",
    "sim",
    "pipeline_version",
    "schema_version",
    "training_streams",  # what a read profile's runs check before training (trainer/launch.py)
    "source_format",  # hdf5 | ros2 | lerobot: what each episode was recorded as (lineage)
    "stream_layout",  # its cameras and stream widths: what a run checks before training (trainer/launch.py)
]
# Of those, the few-valued text columns leave DuckDB as ENUMs, i.e. Arrow dictionary arrays:
# one byte per row instead of a string, in the manifest and in every rank's mapped pages.
DICTIONARY = [
    "task",
    "robot_id",
    "robot_model",
    "site",
    "pipeline_version",
    "schema_version",
    "training_streams",
    "source_format",
    "stream_layout",
]


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.1 (PyYAML) reads an exponent without a dot, ``stride_s: 1e-9``, as a string; a spec
    reads it as the number it is, as YAML 1.2 does."""


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


class CurationSpecError(ValueError):
    def __init__(self, field: str, reason: str, source: str = "curation spec"):
        super().__init__(f"{source}: {field}: {reason}")
        self.field, self.reason = field, reason


@dataclass(frozen=True)
class CurationSpec:
    name: str
    where: Mapping = field(default_factory=dict)
    length_s: float = 2.0
    stride_s: float = 1.0
    weight_by: str | None = None
    weights: Mapping = field(default_factory=dict)
    default_weight: float = 1.0
    step_where: Mapping | None = None  # conditions on episode_steps; None: no step selection
    step_scope: str = "step"
    source: str = field(default="curation spec", compare=False)  # the file, for errors found later

    @classmethod
    def load(cls, path: str | Path) -> CurationSpec:
        try:
            data = yaml.load(Path(path).read_text(), Loader=_SpecLoader)  # a SafeLoader
        except yaml.YAMLError as e:
            raise CurationSpecError("(file)", f"not valid YAML: {e}", str(path)) from None
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data, *, source: str = "curation spec") -> CurationSpec:
        err = lambda f, r: CurationSpecError(f, r, source)
        if not isinstance(data, Mapping):
            raise err("(file)", "expected a mapping")
        for k in data:
            if k not in SPEC_FIELDS:
                raise err(str(k), f"unknown field; known: {', '.join(sorted(SPEC_FIELDS))}")
        name = data.get("name")
        if not is_safe_key(name):
            raise err("name", f"required; letters, digits, '.', '_', '-' (at most 128, no '..'), got {name!r}")
        where = data.get("where") or {}
        if not isinstance(where, Mapping):
            raise err("where", "expected a mapping of column: condition")
        for col, cond in where.items():
            _check_condition(err, str(col), cond, COLUMNS, "where")
        steps = data.get("steps")
        step_where, scope = None, "step"
        if steps is not None:
            if not isinstance(steps, Mapping) or set(steps) - {"where", "scope"}:
                raise err("steps", "expected {where, scope}")
            step_where = steps.get("where") or {}
            if not isinstance(step_where, Mapping):
                raise err("steps.where", "expected a mapping of column: condition")
            for col, cond in step_where.items():
                _check_condition(err, str(col), cond, STEP_FIELDS, "steps.where")
            scope = steps.get("scope", "step")
            if scope not in STEP_SCOPES:
                raise err("steps.scope", f"one of {', '.join(STEP_SCOPES)}, got {scope!r}")
        seg = data.get("segments") or {}
        if not isinstance(seg, Mapping) or set(seg) - {"length_s", "stride_s"}:
            raise err("segments", "expected {length_s, stride_s}")
        length_s, stride_s = seg.get("length_s", 2.0), seg.get("stride_s", seg.get("length_s", 2.0))
        for f, v in (("segments.length_s", length_s), ("segments.stride_s", stride_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise err(f, f"must be a positive number, got {v!r}")
            if not MIN_SEGMENT_S <= v <= MAX_SEGMENT_S:
                raise err(f, f"{v!r} s is out of bounds: from {MIN_SEGMENT_S} s (1 ms) to {MAX_SEGMENT_S:g} s (a day)")
        w = data.get("weights") or {}
        if not isinstance(w, Mapping) or set(w) - {"by", "values", "default"}:
            raise err("weights", "expected {by, values, default}")
        by = w.get("by")
        if by is not None and by not in COLUMNS:
            raise err("weights.by", f"unknown column {by!r}")
        values = w.get("values") or {}
        if not isinstance(values, Mapping):
            raise err("weights.values", "expected a mapping of value: weight")
        weights = [(f"weights.values.{k}", v) for k, v in values.items()] + [("weights.default", w.get("default", 1.0))]
        for f, v in weights:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_WEIGHT:
                raise err(f, f"must be a number from 0 to {MAX_WEIGHT:g}, got {v!r}")
        if by is not None:
            for k in values:
                _check_value(err, f"weights.values.{k}", k, by, COLUMNS[by], "a key")
        if values and by is None:
            raise err("weights.by", "required when weights.values is given")
        return cls(
            name=name,
            where=dict(where),
            length_s=float(length_s),
            stride_s=float(stride_s),
            weight_by=by,
            weights=dict(values),
            default_weight=float(w.get("default", 1.0)),
            step_where=None if step_where is None else dict(step_where),
            step_scope=scope,
            source=source,
        )

    def chosen(self) -> tuple[str, dict]:
        """The episodes the spec selects, with their weight: the query's first step."""
        params: dict = {"length_ns": int(round(self.length_s * 1e9)), "stride_ns": int(round(self.stride_s * 1e9))}
        conds = [
            "status = 'transcoded'",
            "mcap_uri IS NOT NULL",
            "start_ns IS NOT NULL",
            "end_ns - start_ns >= $length_ns",
        ]
        conds += _conditions(self.where, "w", params)
        if self.step_where is not None and self.step_scope == "episode":
            conds.append(
                f"EXISTS (SELECT 1 FROM episode_steps s WHERE s.episode_id = episodes.episode_id AND "
                f"{' AND '.join(_conditions(self.step_where, 's', params, 's.') or ['TRUE'])})"
            )
        if self.weight_by:
            cases = []
            for j, (k, v) in enumerate(sorted(self.weights.items(), key=lambda kv: str(kv[0]))):
                params[f"wk{j}"], params[f"wv{j}"] = k, float(v)
                cases.append(f"WHEN {self.weight_by} = $wk{j} THEN $wv{j}")
            params["wdefault"] = self.default_weight
            weight = f"CASE {' '.join(cases)} ELSE $wdefault END" if cases else "$wdefault"
        else:
            params["wdefault"] = self.default_weight
            weight = "$wdefault"
        return f"SELECT *, {weight} AS weight FROM episodes WHERE {' AND '.join(conds)}", params

    def missing(self) -> tuple[str, dict]:
        """The query of the episodes this spec would select but whose MCAP is marked missing (ingest/presence.py):
        excluded from the manifest, and named. Columns: episode_id, mcap_uri."""
        chosen, params = self.chosen()
        sql = chosen.replace("status = 'transcoded'", "status = 'missing'", 1)
        sql = f"SELECT episode_id, mcap_uri FROM ({sql}) WHERE weight > 0 ORDER BY episode_id"
        return sql, {k: params[k] for k in re.findall(r"\$(\w+)", sql)}

    def dictionaries(self) -> list[tuple[str, dict]]:
        """Statements making one temporary ENUM type per dictionary column, of the values the
        chosen episodes hold (so the manifest's bytes, hence its hash, depend on its rows only).
        One scan collects every column's values; each type then reads that small table."""
        chosen, params = self.chosen()
        used = {k: params[k] for k in re.findall(r"\$(\w+)", chosen)}  # DuckDB refuses unused parameters
        values = "manifest_dictionary_values"
        return [
            (
                f"CREATE OR REPLACE TEMP TABLE {values} AS SELECT DISTINCT {', '.join(DICTIONARY)} "
                f"FROM ({chosen}) WHERE weight > 0",
                used,
            )
        ] + [
            (
                f"CREATE OR REPLACE TEMP TYPE {_enum(col)} AS ENUM (SELECT DISTINCT {col} FROM {values} "
                f"WHERE {col} IS NOT NULL ORDER BY ALL)",
                {},
            )
            for col in DICTIONARY
        ]

    def _windows(self) -> tuple[str, dict, bool]:
        """The ``chosen`` and ``windows`` CTEs (the time ranges segments are cut in), their
        parameters, and whether windows are steps."""
        chosen, params = self.chosen()
        if self.step_where is not None and self.step_scope == "step":
            step_conds = " AND ".join(
                ["s.end_ns - s.start_ns >= $length_ns", *_conditions(self.step_where, "s", params, "s.")]
            )
            windows = (
                "SELECT c.*, s.step, s.step_index, s.start_ns AS w_start, s.end_ns AS w_end\n"
                "    FROM chosen c JOIN episode_steps s ON s.episode_id = c.episode_id\n"
                f"    WHERE {step_conds}"
            )
        else:
            windows = "SELECT *, start_ns AS w_start, end_ns AS w_end FROM chosen"
        ctes = f"""
WITH chosen AS (
    {chosen}
), windows AS (
    {windows}
)"""
        return ctes, params, self.step_where is not None and self.step_scope == "step"

    def segment_count_query(self) -> tuple[str, dict]:
        """The window with the most segments (``episode_id``, count), or no row: what
        :func:`curate` checks against ``MAX_SEGMENTS_PER_EPISODE`` before the manifest query."""
        ctes, params, _ = self._windows()
        sql = (
            f"{ctes}\nSELECT episode_id, {_SEGMENTS} AS n FROM windows WHERE weight > 0 "
            f"ORDER BY n DESC, episode_id LIMIT 1"
        )
        return sql.strip(), {k: params[k] for k in re.findall(r"\$(\w+)", sql)}

    def compile(self) -> tuple[str, dict]:
        """The one query, and its parameters (DuckDB ``$name`` placeholders). Segments are cut
        inside windows: each chosen episode's whole time range, or with ``steps`` (scope step) the
        matching steps' windows, each row then naming its step. An episode's sample count scales
        with its own rate either way."""
        ctes, params, by_step = self._windows()
        step_column, order = (", step", "episode_id, step_index, k") if by_step else ("", "episode_id, k")
        sql = f"""{ctes}, segments AS (
    SELECT *, unnest(range(0, {_SEGMENTS})) AS k
    FROM windows
)
SELECT episode_id, mcap_uri AS uri,
       w_start + k * $stride_ns AS start_ns,
       w_start + k * $stride_ns + $length_ns AS end_ns,
       CAST(round(CAST(n_steps AS DOUBLE) * $length_ns / (end_ns - start_ns)) AS INTEGER) AS n_steps,
       weight, {", ".join(_passthrough(c) for c in PASSTHROUGH)}{step_column}
FROM segments
WHERE weight > 0
ORDER BY {order}"""
        return sql.strip(), params


# Segments in a window of ``w_start``..``w_end`` (at least one: shorter windows are not chosen).
_SEGMENTS = "CAST(floor((w_end - w_start - $length_ns) / $stride_ns) AS BIGINT) + 1"


def _conditions(where: Mapping, prefix: str, params: dict, qualifier: str = "") -> list[str]:
    """SQL conditions for ``where`` (checked column names), every value a bound parameter."""
    conds = []
    for i, (col, cond) in enumerate(sorted(where.items())):
        op, value = _normalize(cond)
        col = f"{qualifier}{col}"
        if op == "is_null":
            conds.append(f"{col} IS NULL" if value else f"{col} IS NOT NULL")
        elif op in ("in", "not_in"):
            names = []
            for j, v in enumerate(value):
                params[f"{prefix}{i}_{j}"] = v
                names.append(f"${prefix}{i}_{j}")
            conds.append(
                f"{col} {OPERATORS[op]} ({', '.join(names)})" if names else ("FALSE" if op == "in" else "TRUE")
            )
        else:
            params[f"{prefix}{i}"] = value
            conds.append(f"{col} {OPERATORS[op]} ${prefix}{i}")
    return conds


def _normalize(cond) -> tuple[str, Any]:  # the value as the query gives it
    if isinstance(cond, Mapping):
        ((op, value),) = cond.items()
        return str(op), value
    if isinstance(cond, list):
        return "in", cond
    return "=", cond


def _check_condition(err, col: str, cond, columns: Mapping = COLUMNS, section: str = "where") -> None:
    if col not in columns:
        raise err(f"{section}.{col}", f"unknown column; known: {', '.join(sorted(columns))}")
    if isinstance(cond, Mapping) and len(cond) != 1:
        raise err(f"{section}.{col}", "one operator per column, e.g. {'>=': 4}")
    op, value = _normalize(cond)
    if op not in OPERATORS:
        raise err(f"{section}.{col}", f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    if op in ("in", "not_in"):
        if not isinstance(value, list) or any(isinstance(v, (list, dict)) for v in value):
            raise err(f"{section}.{col}", f"{op} needs a list of plain values")
    elif op == "is_null":
        if not isinstance(value, bool):
            raise err(f"{section}.{col}", "is_null takes true or false")
    elif isinstance(value, (list, dict)) or value is None:
        raise err(f"{section}.{col}", f"{op} needs one plain value (use is_null for NULL)")
    if op == "like" and not isinstance(value, str):
        raise err(f"{section}.{col}", "like needs a string pattern")
    if op == "like" and columns[col] != "VARCHAR":
        raise err(f"{section}.{col}", f"like applies to text columns; {col} is {columns[col]}")
    if op in ("in", "not_in"):
        for i, v in enumerate(value if isinstance(value, list) else []):
            _check_value(err, f"{section}.{col}", v, col, columns[col], f"{op} item {i}")
    elif op != "is_null":
        _check_value(err, f"{section}.{col}", value, col, columns[col], op)


def _check_value(err, field: str, value, col: str, duck_type: str, what: str) -> None:
    """``value`` must be what DuckDB can compare with ``col`` as it is, never a cast that fails in the
    query (where the error would name a parameter, ``$w0``, instead of the field)."""
    if duck_type == "VARCHAR":
        ok = isinstance(value, str)
    elif duck_type == "BOOLEAN":
        ok = isinstance(value, bool)
    elif duck_type in _NUMERIC:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    else:  # a column type this module does not know: let DuckDB decide
        return
    if not ok:
        shown = str(value).lower() if isinstance(value, bool) else value
        hint = f" (quote it in YAML: '{shown}')" if duck_type == "VARCHAR" else ""
        raise err(
            field,
            f"{what}: expected {_EXPECTED[duck_type]} ({col} is {duck_type}), "
            f"got {value!r} ({type(value).__name__}){hint}",
        )


def _passthrough(col: str) -> str:
    return f"CAST({col} AS {_enum(col)}) AS {col}" if col in DICTIONARY else col


def _enum(col: str) -> str:
    return f"manifest_{col}_enum"


def prepare(con, spec: CurationSpec) -> None:
    """Session set-up the query relies on: its dictionary types (temporary, connection-local,
    so a read-only connection can make them) and 64-bit string offsets in the Arrow output."""
    con.execute("SET arrow_large_buffer_size = true")
    for sql, params in spec.dictionaries():
        con.execute(sql, params)


def check_segment_count(con, spec: CurationSpec) -> None:
    """:class:`CurationSpecError` on ``segments.stride_s`` if some chosen window would be cut into more
    than ``MAX_SEGMENTS_PER_EPISODE`` segments (one small query over the chosen episodes)."""
    sql, params = spec.segment_count_query()
    worst = con.execute(sql, params).fetchone()
    if worst is not None and worst[1] > MAX_SEGMENTS_PER_EPISODE:
        episode, n = worst
        raise CurationSpecError(
            "segments.stride_s",
            f"episode {episode} would give {n:,} segments of {spec.length_s:g} s every "
            f"{spec.stride_s:g} s, more than the {MAX_SEGMENTS_PER_EPISODE:,} per episode allowed: raise stride_s "
            "(or exclude the episode, e.g. where: {duration_s: {'<=': ...}})",
            spec.source,
        )


def missing_episodes(warehouse, spec: CurationSpec, *, limit: int = 1000) -> list[tuple[str, str]]:
    """(episode_id, mcap_uri) of episodes the spec would select whose MCAP is marked missing: left out of
    its manifest (the query selects transcoded episodes only), named here so the manifest says so."""
    sql, params = spec.missing()
    return [tuple(r) for r in warehouse.con.sql(sql, params=params).limit(limit).fetchall()]


def curate(warehouse, spec: CurationSpec, *, batch_rows: int = 64 * 1024):
    """Run the spec's query on the warehouse; the manifest rows as a stream of Arrow batches
    (``.read_all()`` for a table). First checks the segment count bound (``check_segment_count``)."""
    sql, params = spec.compile()
    check_segment_count(warehouse.con, spec)
    prepare(warehouse.con, spec)
    return warehouse.con.sql(sql, params=params).to_arrow_reader(batch_rows)
