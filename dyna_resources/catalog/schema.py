"""Tables of the catalog database, the system of record (SQLAlchemy Core: one definition for SQLite and
PostgreSQL), and its engine: the registry (``registry.py``) and the dataset versions (``datasets.py``) share
one schema, one engine set-up and one additive migration.

Times are UTC epoch seconds (float) so both backends store and compare them the same way.
Paths of landed files are relative to the landing root (``site-a/2026/ep-000001.h5``).
Bounded text columns (``String(n)``) are VARCHAR(n) on PostgreSQL and unbounded on SQLite, so
the registry checks every value against :func:`string_limits` itself: one limit on both.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError

metadata = MetaData()

# Every raw file the landing sensor has seen; batch_key is set once it is packed into a batch.
landed_files = Table(
    "landed_files",
    metadata,
    Column("path", String(1024), primary_key=True),
    Column("bytes", BigInteger, nullable=False),
    Column("mtime_ns", BigInteger, nullable=False),
    Column("registered_at", Float, nullable=False),
    Column("batch_key", String(64), nullable=True),
    Index("ix_landed_files_batch", "batch_key"),
)

# A byte-balanced work unit: what one worker transcodes. Units are grouped into ingest partitions.
ingest_batches = Table(
    "ingest_batches",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("batch_key", String(64), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("target_bytes", BigInteger, nullable=False),
    Column("partition_key", String(64), nullable=True),  # set once, when the unit joins a partition
    Index("ix_ingest_batches_partition", "partition_key", "seq"),
)

# One Dagster partition of the ingest assets: consecutive work units up to a byte size (a few TiB in
# production), so a 1M-hour corpus is thousands of partitions, not millions. A partition is open while
# units join it, then sealed for good (full, or its oldest unit waited long enough): only sealed
# partitions are handed to Dagster, so a partition's units never change after its first run.
ingest_partitions = Table(
    "ingest_partitions",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("partition_key", String(64), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    Column("sealed_at", Float, nullable=True),
    Column("units", Integer, nullable=False),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("target_bytes", BigInteger, nullable=False),
    Index("ix_ingest_partitions_sealed", "sealed_at"),
)

# One row per episode that passed the pre-transform gates (status 'accepted'), then
# 'transcoded' once its MCAP is written and its post gates passed. Versions say which
# pipeline wrote the MCAP: a row with an older pipeline_version is stale.
episodes = Table(
    "episodes",
    metadata,
    Column("episode_id", String(128), primary_key=True),
    Column("source_path", String(1024), nullable=False, unique=True),
    Column("batch_key", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("source_sha256", String(64), nullable=True),  # of the landed item (a directory's: sources/content.py)
    Column("source_bytes", BigInteger, nullable=False),
    # lineage: the landed item's format ('hdf5' | 'ros2' | 'lerobot', sources/detect.py; NULL: registered before
    # it was recorded, all HDF5) and where it is, as a URL (a directory item's folder), '#<episode_id>' after
    # it when the item holds several episodes (ingest/items.py)
    Column("source_format", String(16), nullable=True),
    Column("source_uri", String(2048), nullable=True),
    # an episode of a bag the topic map's split rule cuts: its time range and the log-time window of the bag
    # that holds it, JSON (sources/ros2.py, BagMember): what its transcode reads of the bag; NULL otherwise
    Column("source_window", String(128), nullable=True),
    Column("duration_s", Float, nullable=False),
    Column("robot_id", String(128), nullable=False, default=""),
    Column("robot_model", String(128), nullable=False, default=""),
    Column("robot_sw_version", String(128), nullable=False, default=""),
    Column("task", String(256), nullable=False, default=""),
    Column("site", String(128), nullable=False, default=""),
    Column("operator", String(128), nullable=False, default=""),
    Column("success", Boolean, nullable=True),
    Column("sim", Boolean, nullable=True),  # recorded in simulation (curation weights sim vs real)
    Column("started_at", String(40), nullable=False, default=""),
    Column("cameras", Text, nullable=False, default="[]"),  # JSON list
    # its cameras and each stream field's width, canonical JSON (episodes/layout.py): what a training run
    # checks its manifest's episodes against before it starts; NULL: registered before it was recorded
    Column("stream_layout", Text, nullable=True),
    Column("ingested_at", Float, nullable=True),  # when its file was registered from the landing zone
    # quality flags, for curation queries
    Column("timestamps_ok", Boolean, nullable=True),
    Column("camera_dropped", Boolean, nullable=True),
    Column("camera_dead", Boolean, nullable=True),
    Column("frame_drop_fraction", Float, nullable=True),
    Column("quality_ok", Boolean, nullable=True),  # every enabled gate passed
    # quality scores: gates run and failed (latest result of each gate, both stages; flagged
    # failures keep an episode, so they show here), 1 - failed/checked, dark frames found by the transcode
    Column("gates_checked", Integer, nullable=True),
    Column("gates_failed", Integer, nullable=True),
    Column("quality_score", Float, nullable=True),
    Column("dark_frame_fraction", Float, nullable=True),  # worst camera: dark frames / frames
    Column("frozen_frame_fraction", Float, nullable=True),  # worst camera: frames repeating the one before / frames
    # quality scores computed at ingest (ingest/quality.py), and a reviewer's verdict on the 'review' ones
    Column("smoothness_score", Float, nullable=True),
    Column("sensor_health_score", Float, nullable=True),
    Column("task_score", Float, nullable=True),
    Column("quality_verdict", String(8), nullable=True),  # 'pass' | 'review' | 'fail'
    Column("quality_reasons", Text, nullable=True),  # JSON list of {"check", "detail"}
    Column("review_verdict", String(8), nullable=True),  # 'accept' | 'reject' | NULL (not reviewed)
    Column("reviewed_by", String(128), nullable=True),
    Column("reviewed_at", Float, nullable=True),
    Column("review_note", Text, nullable=True),
    # the episode's step ladder (ladders/segment.py): JSON list of steps, the segmenter+config
    # version that wrote it, the first failed step's name, or why it could not be segmented
    Column("step_ladder", Text, nullable=True),
    Column("ladder_version", String(64), nullable=True),
    Column("failed_step", String(128), nullable=True),
    Column("ladder_error", Text, nullable=True),
    # output, stamped with the versions that wrote it
    Column("schema_version", String(16), nullable=True),
    Column("pipeline_version", String(16), nullable=True),
    Column("mcap_path", String(1024), nullable=True),
    Column(
        "mcap_uri", String(1024), nullable=True
    ),  # the same file as an fsspec URL (file://, gs://): what manifests carry
    Column("mcap_bytes", BigInteger, nullable=True),
    Column("mcap_version", String(128), nullable=True),  # the MCAP object's version: a rewrite must replace exactly it
    # the training streams the MCAP carries beside the archive video, "name@spec-digest" comma separated
    # (episodes/read_profile.streams_column); NULL: none. What a read profile's runs check in the manifest.
    Column("training_streams", String(512), nullable=True),
    # what the transcode measured, for curation (time range, steps, frames, cameras with gaps)
    Column("start_ns", BigInteger, nullable=True),
    Column("end_ns", BigInteger, nullable=True),
    Column("n_steps", Integer, nullable=True),  # joint_states samples
    Column("n_frames", Integer, nullable=True),  # camera frames, all cameras
    Column("dropped_cameras", Text, nullable=True),  # JSON list of cameras with missing frames
    Column("updated_at", Float, nullable=False),
    Index("ix_episodes_batch", "batch_key"),
    Index(
        "ix_episodes_versions", "status", "pipeline_version", "schema_version", "batch_key"
    ),  # covers the drift query
)

# The latest results of a stage's gates for a file, one row per (file, stage): a replay of the
# stage replaces the row. One row a gate would be ~560M rows at 43M episodes (13 gates) and most of
# the registry's write time; the gates ride in the row as JSON, counts and failed names beside them.
gate_results = Table(
    "gate_results",
    metadata,
    Column("source_path", String(1024), primary_key=True),
    Column("stage", String(8), primary_key=True),  # 'pre' | 'post'
    Column("batch_key", String(64), nullable=False),
    Column("episode_id", String(128), nullable=True),
    Column("checked", Integer, nullable=False),  # gates run
    Column("failed", Integer, nullable=False),  # gates failed
    Column("failed_gates", Text, nullable=False),  # JSON list of the failed gates' names
    Column("gates", Text, nullable=False),  # JSON list of {gate, passed, action ('quarantine'|'flag'), detail}
    Column("pipeline_version", String(16), nullable=False),
    Column("checked_at", Float, nullable=False),
    Index("ix_gate_results_batch", "batch_key", "stage"),
)
GATE_FIELD_LIMITS = {"gate": 64, "action": 16}  # characters, inside gate_results.gates

# Files held back, with the reason; the raw file stays where it landed. (Its columns repeat the shape of the
# tables above, ingest_partitions', episodes', gate_results', as SQL tables do: each is its own table.)
quarantine = Table(
    "quarantine",
    metadata,
    Column("source_path", String(1024), primary_key=True),
    Column("batch_key", String(64), nullable=False),
    Column("episode_id", String(128), nullable=True),
    Column("stage", String(16), nullable=False),  # 'pre' | 'transcode' | 'post'
    Column("gate", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("stream", String(256), nullable=True),
    Column("pipeline_version", String(16), nullable=False),
    Column("quarantined_at", Float, nullable=False),
    Index("ix_quarantine_batch", "batch_key"),
)


# A published dataset version: name@version of a manifest, immutable once written (datasets.py).
datasets = Table(
    "datasets",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("version", String(128), primary_key=True),
    Column("spec_name", String(128), nullable=False),
    Column("spec_sha256", String(64), nullable=False),
    Column("manifest_sha256", String(64), nullable=False),
    Column("manifest_parquet_sha256", String(64), nullable=True),  # NULL: published before it was recorded
    Column("manifest_arrow_url", Text, nullable=False),
    Column("manifest_parquet_url", Text, nullable=False),
    Column("pipeline_versions", Text, nullable=False),  # JSON
    Column("schema_version", String(32), nullable=False),
    Column("rows", Integer, nullable=False),
    Column("episodes", Integer, nullable=False),
    Column("segment_hours", Float, nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=False),
    Column("notes", Text, nullable=False, default=""),
)

# The registry's own tables (what ``Registry.counts`` reports); the datasets table is the dataset registry's.
REGISTRY_TABLES = tuple(tab for tab in metadata.sorted_tables if tab is not datasets)


def parse_url(url: str | URL) -> URL:
    try:
        return make_url(url)
    except ArgumentError:
        raise ValueError(
            "registry URL is not a valid SQLAlchemy URL"
        ) from None  # never echo it: it may hold a password


def open_engine(url: str | URL) -> Engine:
    """The engine of the catalog database at ``url``: SQLite in WAL mode with a generous busy timeout (many
    runs share one file; its folder is made), PostgreSQL with liveness checks on checkout."""
    parsed = parse_url(url)
    kwargs: dict = {"future": True}
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite:
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True
    engine = create_engine(parsed, **kwargs)
    if sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def create_tables(engine: Engine, tables: list[Table]) -> None:
    """CREATE TABLE IF NOT EXISTS for ``tables``, then the additive migration: a column the code knows and
    an older database lacks is added (nullable, so old rows stay valid). Columns are never dropped or
    changed here."""
    metadata.create_all(engine, tables=tables, checkfirst=True)
    insp = inspect(engine)
    with engine.begin() as c:
        for table in tables:
            have = {col["name"] for col in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name not in have:
                    ddl = col.type.compile(dialect=engine.dialect)
                    c.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {ddl}")  # schema names


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer: many runs share one file
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()


def string_limits(table: Table) -> dict[str, int]:
    """The longest value, in characters, each bounded text column of ``table`` holds."""
    return dict(_LIMITS[table.name])


_LIMITS = {
    tab.name: {c.name: c.type.length for c in tab.columns if isinstance(c.type, String) and c.type.length}
    for tab in metadata.sorted_tables
}
