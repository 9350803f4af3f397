"""Per-partition version summary: how many episodes of each ingest partition are in each
(status, pipeline, schema, ladder version), kept current by triggers on every write.

The drift sensor asks "which partitions hold an episode written by another version?" every
minute. Asked of ``episodes`` that is a scan of the corpus (43M rows at 1M hours). Asked of
this table it is a scan of (partitions x versions present), a few rows per partition, and a
partition is at most a few thousand rows: the cost follows the partitions and what is stale,
never the episodes.

Triggers, not application code, keep it: every path that writes an episode (inventory,
transcode outcomes, ladders, reviews, a hand-run SQL fix) moves the counts in the writer's own
transaction, so the summary is exactly as current as the rows. An episode counts under its
work unit's partition; a unit that joins a partition after its episodes were written (only
tests do that today) moves its counts with it. NULL versions are stored as '' (primary-key
columns cannot be NULL on PostgreSQL). A registry made before this table existed is
back-filled once, from ``episodes``, when the table is created.
"""

from __future__ import annotations

import orjson
from sqlalchemy import BigInteger, Column, Index, MetaData, String, Table, inspect, text
from sqlalchemy.engine import Engine

from . import bulk_marker

# Derived, not a table of record: outside schema.metadata, so registry.counts() and the
# additive migration leave it alone.
derived = MetaData()

partition_versions = Table(
    "partition_versions",
    derived,
    Column("partition_key", String(64), primary_key=True),  # '' while the unit is in no partition
    Column("status", String(16), primary_key=True),
    Column("pipeline_version", String(16), primary_key=True),
    Column("schema_version", String(16), primary_key=True),
    Column("ladder_version", String(64), primary_key=True),
    Column("episodes", BigInteger, nullable=False),
    Index("ix_partition_versions_pipeline", "pipeline_version", "schema_version", "status"),
    Index("ix_partition_versions_ladder", "ladder_version", "status"),
)

VERSIONED = ("status", "pipeline_version", "schema_version", "ladder_version")
_KEY = "partition_key, status, pipeline_version, schema_version, ladder_version"


def _unit_partition(row: str) -> str:
    return f"COALESCE((SELECT partition_key FROM ingest_batches WHERE batch_key = {row}.batch_key), '')"


def _values(row: str) -> str:
    return (
        f"{_unit_partition(row)}, {row}.status, COALESCE({row}.pipeline_version, ''), "
        f"COALESCE({row}.schema_version, ''), COALESCE({row}.ladder_version, '')"
    )


_BUMP = f"ON CONFLICT ({_KEY}) DO UPDATE SET episodes = partition_versions.episodes + excluded.episodes"


def _sqlite_ddl() -> list[str]:
    def bump(row: str, n: int) -> str:
        # "WHERE true": SQLite's parser needs it between INSERT ... SELECT and ON CONFLICT
        return f"INSERT INTO partition_versions ({_KEY}, episodes) SELECT {_values(row)}, {n} WHERE true {_BUMP};"

    drop_empty = "DELETE FROM partition_versions WHERE episodes = 0 AND partition_key = {pk};"
    changed = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in (*VERSIONED, "batch_key"))
    move = (
        f"INSERT INTO partition_versions ({_KEY}, episodes) "
        "SELECT {pk}, status, COALESCE(pipeline_version, ''), COALESCE(schema_version, ''), "
        "COALESCE(ladder_version, ''), {sign} count(*) FROM episodes WHERE batch_key = NEW.batch_key "
        f"GROUP BY 1, 2, 3, 4, 5 {_BUMP};"
    )
    old_pk, new_pk = "COALESCE(OLD.partition_key, '')", "COALESCE(NEW.partition_key, '')"
    return [
        # the episode triggers stand aside for the registry's bulk writes, which fold the summary
        # set-based themselves (bulk_marker.py)
        bulk_marker.DDL,
        f"""CREATE TRIGGER IF NOT EXISTS episodes_pv_insert AFTER INSERT ON episodes
            WHEN {bulk_marker.UNLESS_BULK} BEGIN
            {bump("NEW", 1)} END""",
        f"""CREATE TRIGGER IF NOT EXISTS episodes_pv_delete AFTER DELETE ON episodes
            WHEN {bulk_marker.UNLESS_BULK} BEGIN
            {bump("OLD", -1)} {drop_empty.format(pk=_unit_partition("OLD"))} END""",
        f"""CREATE TRIGGER IF NOT EXISTS episodes_pv_update AFTER UPDATE ON episodes
            WHEN ({changed}) AND {bulk_marker.UNLESS_BULK} BEGIN
            {bump("OLD", -1)} {bump("NEW", 1)} {drop_empty.format(pk=_unit_partition("OLD"))} END""",
        f"""CREATE TRIGGER IF NOT EXISTS units_pv_insert AFTER INSERT ON ingest_batches
            WHEN NEW.partition_key IS NOT NULL BEGIN
            {move.format(pk="''", sign="-")} {move.format(pk=new_pk, sign="")}
            {drop_empty.format(pk="''")} END""",
        f"""CREATE TRIGGER IF NOT EXISTS units_pv_update AFTER UPDATE OF partition_key ON ingest_batches
            WHEN OLD.partition_key IS NOT NEW.partition_key BEGIN
            {move.format(pk=old_pk, sign="-")} {move.format(pk=new_pk, sign="")}
            {drop_empty.format(pk=old_pk)} END""",
    ]


_PG_EPISODE_TRIGGERS = (
    ("episodes_pv_insert", "INSERT", "NEW TABLE AS new_rows"),
    ("episodes_pv_update", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
    ("episodes_pv_delete", "DELETE", "OLD TABLE AS old_rows"),
)
_PG_TRIGGERS = (*(name for name, _, _ in _PG_EPISODE_TRIGGERS), "units_pv")


def _delta(rows: str, sign: int) -> str:
    """(partition, versions, +-1) of every row of a transition table."""
    return (
        f"SELECT COALESCE(b.partition_key, '') AS pk, r.status AS st, COALESCE(r.pipeline_version, '') AS pv, "
        f"COALESCE(r.schema_version, '') AS sv, COALESCE(r.ladder_version, '') AS lv, {sign} AS n "
        f"FROM {rows} r LEFT JOIN ingest_batches b ON b.batch_key = r.batch_key"
    )


# A statement's upserts lock their summary rows in key order: two writers' statements that bump the
# same rows then wait for each other instead of deadlocking (the registry runs again a transaction
# that deadlocks anyway, across its statements).
_ORDERED = "ORDER BY 1, 2, 3, 4, 5"
_PG_EPISODE_FUNCTIONS = ", ".join(f"'dyna_{name}'" for name, _, _ in _PG_EPISODE_TRIGGERS)


def _apply(delta: str, drop_empty: bool = False) -> str:
    """Add the delta's net count to each key it names; then drop the keys it emptied (found by the
    upsert's RETURNING, not by a third pass over the transition table)."""
    upsert = (
        f"INSERT INTO partition_versions AS partition_versions ({_KEY}, episodes) "
        f"SELECT pk, st, pv, sv, lv, sum(n) FROM ({delta}) d GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0 "
        f"{_ORDERED} {_BUMP}"
    )
    if not drop_empty:
        return upsert + ";"
    return (
        f"WITH up AS ({upsert} RETURNING partition_key, episodes) "
        "SELECT array_agg(DISTINCT partition_key) INTO emptied FROM up WHERE episodes = 0; "
        "IF emptied IS NOT NULL THEN "
        "DELETE FROM partition_versions WHERE partition_key = ANY(emptied) AND episodes = 0; END IF;"
    )


def _postgres_ddl() -> list[str]:
    move = (
        f"INSERT INTO partition_versions AS partition_versions ({_KEY}, episodes) "
        "SELECT {pk}, status, COALESCE(pipeline_version, ''), COALESCE(schema_version, ''), "
        "COALESCE(ladder_version, ''), {sign} count(*) FROM episodes WHERE batch_key = NEW.batch_key "
        f"GROUP BY 1, 2, 3, 4, 5 {_ORDERED} {_BUMP};"
    )
    return [
        # Episodes: statement-level triggers over the statement's transition tables, one upsert a
        # (partition, versions) key per statement. A row-level trigger bumps the same summary row
        # once per episode, and in one transaction every bump adds a row version the next must
        # walk past: a 3,000-episode commit cost ~O(n^2), most of a bulk write's time on PostgreSQL.
        # (Transition tables are allowed on single-event triggers only: one function per event.)
        f"""CREATE OR REPLACE FUNCTION dyna_episodes_pv_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
              {_apply(_delta("new_rows", 1))}
              RETURN NULL;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION dyna_episodes_pv_update() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE emptied text[]; BEGIN
              {_apply(_delta("old_rows", -1) + " UNION ALL " + _delta("new_rows", 1), drop_empty=True)}
              RETURN NULL;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION dyna_episodes_pv_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE emptied text[]; BEGIN
              {_apply(_delta("old_rows", -1), drop_empty=True)}
              RETURN NULL;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION dyna_units_pv() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE old_pk text := ''; new_pk text := COALESCE(NEW.partition_key, ''); BEGIN
              IF TG_OP = 'UPDATE' THEN old_pk := COALESCE(OLD.partition_key, ''); END IF;
              IF old_pk = new_pk THEN RETURN NULL; END IF;
              {move.format(pk="old_pk", sign="-")}
              {move.format(pk="new_pk", sign="")}
              DELETE FROM partition_versions WHERE partition_key = old_pk AND episodes = 0;
              RETURN NULL;
            END $$""",
        "DROP TRIGGER IF EXISTS episodes_pv ON episodes",  # the row-level trigger of older registries
        "DROP FUNCTION IF EXISTS dyna_episodes_pv()",
        "DROP FUNCTION IF EXISTS dyna_pv_bump(text, text, text, text, text, bigint)",
        *(f"DROP TRIGGER IF EXISTS {name} ON episodes" for name, _, _ in _PG_EPISODE_TRIGGERS),
        *(
            f"""CREATE TRIGGER {name} AFTER {event} ON episodes REFERENCING {tables}
              FOR EACH STATEMENT EXECUTE FUNCTION dyna_{name}()"""
            for name, event, tables in _PG_EPISODE_TRIGGERS
        ),
        "DROP TRIGGER IF EXISTS units_pv ON ingest_batches",
        """CREATE TRIGGER units_pv AFTER INSERT OR UPDATE OF partition_key ON ingest_batches
            FOR EACH ROW EXECUTE FUNCTION dyna_units_pv()""",
    ]


_BACKFILL = (
    f"INSERT INTO partition_versions ({_KEY}, episodes) "
    "SELECT COALESCE(b.partition_key, ''), e.status, COALESCE(e.pipeline_version, ''), "
    "COALESCE(e.schema_version, ''), COALESCE(e.ladder_version, ''), count(*) "
    "FROM episodes e LEFT JOIN ingest_batches b ON b.batch_key = e.batch_key GROUP BY 1, 2, 3, 4, 5"
)


_FOLD = (
    f"INSERT INTO partition_versions ({_KEY}, episodes) "
    "SELECT COALESCE(b.partition_key, ''), e.status, COALESCE(e.pipeline_version, ''), "
    "COALESCE(e.schema_version, ''), COALESCE(e.ladder_version, ''), ? * count(*) "
    "FROM episodes e LEFT JOIN ingest_batches b ON b.batch_key = e.batch_key "
    f"WHERE e.episode_id IN (SELECT value FROM json_each(?)) GROUP BY 1, 2, 3, 4, 5 {_BUMP} "
    "RETURNING partition_key"
)


def fold(conn, episode_ids_json: str, sign: int) -> set[str]:
    """SQLite, within a bulk write (``bulk_marker.py``): add (+1) or take away (-1) the current
    rows of these episodes (a JSON array of ids) to or from the summary, in one statement.
    Returns the partitions it touched."""
    return {r[0] for r in conn.exec_driver_sql(_FOLD, (sign, episode_ids_json))}


def drop_empty(conn, partition_keys: set[str]) -> None:
    """Drop the summary rows of these partitions that a fold left at zero."""
    if partition_keys:
        conn.exec_driver_sql(
            "DELETE FROM partition_versions WHERE partition_key IN (SELECT value FROM json_each(?)) AND episodes = 0",
            (orjson.dumps(sorted(partition_keys)).decode(),),
        )


def install(engine: Engine) -> None:
    """Create the summary and its triggers when missing; back-fill it when it is new. One
    transaction, so the back-fill and the triggers start from the same rows. A registry that has
    them is not touched: creating a trigger locks its table against every writer."""
    if inspect(engine).has_table(partition_versions.name) and _has_triggers(engine):
        return
    with engine.begin() as c:
        if c.dialect.name == "postgresql":  # one installer at a time; the others find it done
            c.execute(text("SELECT pg_advisory_xact_lock(4215161)"))
            if _pg_current(c):
                return
        new = not inspect(c).has_table(partition_versions.name)
        derived.create_all(c)
        if c.dialect.name == "sqlite":  # triggers of older registries (no WHEN for bulk writes): made again
            for name in _SQLITE_TRIGGERS:
                c.execute(text(f"DROP TRIGGER IF EXISTS {name}"))
        for stmt in _postgres_ddl() if c.dialect.name == "postgresql" else _sqlite_ddl():
            c.execute(text(stmt))
        if new:
            c.execute(text(_BACKFILL))


def _has_triggers(engine: Engine) -> bool:
    with engine.connect() as c:
        if c.dialect.name == "postgresql":
            return _pg_current(c)
        units = [n for n in _SQLITE_TRIGGERS if n.startswith("units_")]
        listed = ", ".join(f"'{n}'" for n in units)
        have_units = c.execute(
            text(f"SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name IN ({listed})")
        ).scalar_one() == len(units)
        return have_units and bulk_marker.triggers_current(
            c, [n for n in _SQLITE_TRIGGERS if n.startswith("episodes_")]
        )


_SQLITE_TRIGGERS = (
    "episodes_pv_insert",
    "episodes_pv_delete",
    "episodes_pv_update",
    "units_pv_insert",
    "units_pv_update",
)


def _pg_current(c) -> bool:
    """Every trigger there, with this version's functions (older ones are replaced: an update
    function that made a third pass over its rows to find emptied keys, and upserts in no order)."""
    current = c.execute(
        text(f"SELECT count(*) FROM pg_proc WHERE proname IN ({_PG_EPISODE_FUNCTIONS}) AND prosrc LIKE '%{_ORDERED}%'")
    ).scalar_one()
    emptied = c.execute(
        text("SELECT count(*) FROM pg_proc WHERE proname = 'dyna_episodes_pv_update' AND prosrc LIKE '%emptied%'")
    ).scalar_one()
    return current == len(_PG_EPISODE_TRIGGERS) and emptied == 1 and _pg_trigger_count(c) == len(_PG_TRIGGERS)


def _pg_trigger_count(c) -> int:
    names = ", ".join(f"'{n}'" for n in _PG_TRIGGERS)
    return c.execute(text(f"SELECT count(*) FROM pg_trigger WHERE tgname IN ({names})")).scalar_one()
