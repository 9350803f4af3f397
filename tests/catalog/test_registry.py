"""Behaviour of the registry (system of record). Every test taking ``registry`` runs twice:
against SQLite and against a real PostgreSQL server (see conftest.py)."""

from __future__ import annotations

import calendar
import json

import pytest
from sqlalchemy import inspect

from dyna_resources.catalog.registry import (
    ACCEPTED,
    QUARANTINED,
    REJECTED,
    TRANSCODED,
    Batch,
    FieldValueError,
    LandedFile,
    Registry,
    RegistryUnavailableError,
    batch_key,
    registry_url_from_env,
)

T0 = float(calendar.timegm((2026, 11, 2, 8, 15, 0)))  # 2026-11-02 08:15:00 UTC
HOUR = "20261102T08"
TABLES = {"landed_files", "ingest_batches", "ingest_partitions", "episodes", "gate_results", "quarantine"}
EMPTY = {name: 0 for name in TABLES}


def table_names(registry) -> set[str]:
    """The registry's tables of record; besides them the per-partition version summary (derived) and,
    on SQLite, the CDC change log, its consumers' positions (PostgreSQL uses logical decoding) and
    the bulk writes' marker (empty outside a bulk write's transaction); and the dataset versions'
    table, which shares the catalog's one schema (``schema.py``) and is the dataset registry's."""
    names = set(inspect(registry.engine).get_table_names())
    assert {"partition_versions", "datasets"} <= names
    names -= {"partition_versions", "datasets"}
    if registry.backend == "sqlite":
        assert {"change_log", "change_log_consumers", "episode_bulk_writes"} <= names
        names -= {"change_log", "change_log_consumers", "episode_bulk_writes"}
    return names


def landed(n: int, start: int = 0, site: str = "site-a") -> list[LandedFile]:
    return [
        LandedFile(f"{site}/2026/ep-{i:06d}.h5", 1000 + i, 1_700_000_000_000_000_000 + i)
        for i in range(start, start + n)
    ]


def gate(name: str, passed: bool = True, action: str = "quarantine", detail: str = "", pv: str = "1.0") -> dict:
    return {"gate": name, "passed": passed, "action": action, "detail": detail, "pipeline_version": pv}


def episode_row(episode_id: str, status: str = ACCEPTED, **extra) -> dict:
    """A whole episode row, as the pre stage (inventory) writes it."""
    row = {
        "episode_id": episode_id,
        "status": status,
        "source_bytes": 123_456,
        "duration_s": 4.0,
        "source_sha256": "ab" * 32,
        "schema_version": None,
        "pipeline_version": None,
        "mcap_path": None,
        "mcap_bytes": None,
    }
    row.update(extra)
    return row


def counts(**nonzero) -> dict[str, int]:
    return {**EMPTY, **nonzero}


# -- the fixture itself ------------------------------------------------------------------------


def test_fixture_gives_an_empty_registry_on_the_requested_backend(registry, request):
    assert registry.engine.dialect.name == request.node.callspec.params["registry"]
    registry.ping()
    assert registry.counts() == EMPTY
    assert table_names(registry) == TABLES
    assert "***" not in registry.describe()  # the test servers have no password to hide


# -- landing -----------------------------------------------------------------------------------


def test_register_files_is_idempotent(registry):
    files = landed(5)
    assert registry.register_files(files, now=T0) == 5
    assert registry.register_files(files, now=T0 + 60) == 0
    assert registry.register_files(list(reversed(files)), now=T0 + 61) == 0
    assert registry.register_files([], now=T0 + 62) == 0
    assert registry.counts() == counts(landed_files=5)

    # A known path that changed size is not a new file, and its first record is kept.
    changed = LandedFile(files[0].path, 999_999, 42)
    assert registry.register_files([changed], now=T0 + 120) == 0
    assert registry.counts() == counts(landed_files=5)
    rows, oldest = registry.unbatched_files()
    assert sorted(rows) == files
    assert oldest == T0

    # New files among known ones: only the new ones count.
    assert registry.register_files(files + landed(2, start=5), now=T0 + 180) == 2
    assert registry.counts() == counts(landed_files=7)


def test_unbatched_files_lists_files_outside_batches_and_the_oldest(registry):
    assert registry.unbatched_files() == ([], None)
    a, b, c = landed(3)
    assert registry.register_files([a], now=T0 + 100) == 1
    assert registry.register_files([b], now=T0 + 10) == 1
    assert registry.register_files([c], now=T0 + 50) == 1

    rows, oldest = registry.unbatched_files()
    assert sorted(rows) == [a, b, c]
    assert oldest == T0 + 10

    [batch] = registry.create_batches([[b]], target_bytes=10_000, now=T0 + 200)
    rows, oldest = registry.unbatched_files()
    assert sorted(rows) == [a, c]
    assert oldest == T0 + 50

    registry.create_batches([[a, c]], target_bytes=10_000, now=T0 + 300)
    assert registry.unbatched_files() == ([], None)


# -- batches -----------------------------------------------------------------------------------


def test_batch_key_format_is_sortable():
    assert batch_key(1, T0) == f"{HOUR}-000001"
    assert batch_key(123456, T0 + 3600) == "20261102T09-123456"
    keys = [batch_key(seq, T0 + 3600 * (seq // 3)) for seq in range(1, 12)]
    assert sorted(keys) == keys


def test_create_batches_keys_seq_and_membership(registry):
    files = landed(6)
    assert registry.register_files(files, now=T0) == 6

    first = registry.create_batches([files[0:2], files[2:3]], target_bytes=5000, now=T0)
    assert first == [
        Batch(1, f"{HOUR}-000001", 2, files[0].bytes + files[1].bytes),
        Batch(2, f"{HOUR}-000002", 1, files[2].bytes),
    ]
    # The sequence continues across calls; the hour comes from the creation time.
    second = registry.create_batches([files[3:6]], target_bytes=5000, now=T0 + 3600)
    assert second == [Batch(3, "20261102T09-000003", 3, sum(f.bytes for f in files[3:6]))]

    batches = first + second
    assert sorted(b.key for b in batches) == [b.key for b in batches]
    assert registry.batch_files(batches[0].key) == files[0:2]
    assert registry.batch_files(batches[1].key) == files[2:3]
    assert registry.batch_files(batches[2].key) == files[3:6]
    for b in batches:
        assert registry.batch(b.key) == b
    assert registry.unbatched_files() == ([], None)
    assert registry.counts() == counts(landed_files=6, ingest_batches=3)

    # Nothing left to batch: no batch is created and the sequence does not move.
    assert registry.create_batches([files[0:3]], target_bytes=5000, now=T0) == []
    assert registry.create_batches([], target_bytes=5000, now=T0) == []
    registry.register_files(landed(1, start=6), now=T0)
    assert registry.create_batches([landed(1, start=6)], target_bytes=5000, now=T0) == [
        Batch(4, f"{HOUR}-000004", 1, 1006)
    ]


def test_create_batches_never_moves_a_batched_file(registry):
    files = landed(4)
    registry.register_files(files, now=T0)
    [b1] = registry.create_batches([files[0:2]], target_bytes=5000, now=T0)

    # Overlapping groups (another tick packed some of these first): batched files stay put,
    # a group that lost files is created with the rest, a group with nothing left is dropped.
    created = registry.create_batches([files[1:4], files[0:2]], target_bytes=5000, now=T0 + 1)
    assert created == [Batch(2, f"{HOUR}-000002", 2, files[2].bytes + files[3].bytes)]
    assert registry.batch_files(b1.key) == files[0:2]
    assert registry.batch(b1.key) == b1
    assert registry.batch_files(created[0].key) == files[2:4]

    # Same group in one call twice: the second copy finds nothing free.
    registry.register_files(landed(2, start=4), now=T0)
    again = registry.create_batches([landed(2, start=4), landed(2, start=4)], target_bytes=5000, now=T0 + 2)
    assert [b.seq for b in again] == [3]

    members = [f for b in registry.batches_after(0) for f in registry.batch_files(b.key)]
    assert sorted(members) == landed(6)  # every file in exactly one batch
    assert registry.counts() == counts(landed_files=6, ingest_batches=3)


def test_batches_after_pages_in_seq_order(registry):
    files = landed(5)
    registry.register_files(files, now=T0)
    made = registry.create_batches([[f] for f in files], target_bytes=1000, now=T0)
    assert [b.seq for b in made] == [1, 2, 3, 4, 5]

    assert registry.batches_after(0) == made
    assert registry.batches_after(0, limit=2) == made[0:2]
    assert registry.batches_after(2, limit=2) == made[2:4]
    assert registry.batches_after(4, limit=2) == made[4:5]
    assert registry.batches_after(5) == []
    assert registry.batches_after(5, limit=2) == []


def test_unknown_batch_raises_key_error(registry):
    with pytest.raises(KeyError, match="20990101T00-999999"):
        registry.batch("20990101T00-999999")
    assert registry.batch_files("20990101T00-999999") == []


# -- episodes, gates, quarantine ---------------------------------------------------------------


def _one_batch(registry, n: int = 1) -> tuple[list[LandedFile], str]:
    files = landed(n)
    registry.register_files(files, now=T0)
    [b] = registry.create_batches([files], target_bytes=10_000, now=T0)
    return files, b.key


def test_episode_row_round_trips_every_column(registry):
    [f], key = _one_batch(registry)
    episode = episode_row(
        "ep-000001",
        robot_id="arm-07",
        robot_model="dyna-a1",
        robot_sw_version="4.2.1",
        task="pick_place",
        site="sfo-lab",
        operator="op-3",
        success=True,
        started_at="2026-11-02T08:15:00Z",
        cameras=["wrist", "head"],
        timestamps_ok=True,
        camera_dropped=False,
        camera_dead=False,
        frame_drop_fraction=0.25,
        quality_ok=True,
        source_bytes=2**40 + 7,
        duration_s=12.5,
        ingested_at=T0,
        start_ns=1_793_000_000_123_456_789,
        end_ns=1_793_000_012_623_456_789,
        n_steps=2500,
        n_frames=1125,
        dropped_cameras='["wrist"]',
        sim=False,
        mcap_uri="gs://bucket/mcap/ep-000001.mcap",
        mcap_version="1765432100123456",
        training_streams="t128@0a1b2c3d,t64@4e5f6a7b",
        dark_frame_fraction=0.5,
        frozen_frame_fraction=0.125,
        smoothness_score=0.95,
        sensor_health_score=0.75,
        task_score=1.0,
        quality_verdict="review",
        quality_reasons='[{"check": "frame_drop_fraction", "detail": "x"}]',
        review_verdict="accept",
        reviewed_by="ann",
        reviewed_at=T0 + 1,
        review_note="ok",
        step_ladder='[{"name": "reach"}]',
        ladder_version="heuristic-1.0123456789",
        failed_step="grasp",
        ladder_error="no procedure",
        source_format="ros2",
        source_uri="gs://fleet/raw/2026-11-02/run-4/#ep-000001",
        source_window='{"ns": [1, 2], "log_ns": [0, 3]}',
        stream_layout='{"cameras":["head","wrist"],"streams":{"action":{"command":8}}}',
    )
    registry.record_outcome(
        source_path=f.path, batch_key=key, stage="pre", gates=[gate("readable")], episode=episode, now=T0 + 5
    )

    row = registry.episode_by_id("ep-000001")
    expected = {
        **episode,
        "cameras": json.dumps(["wrist", "head"]),
        "source_path": f.path,
        "batch_key": key,
        "updated_at": T0 + 5,
        "gates_checked": 1,
        "gates_failed": 0,
        "quality_score": 1.0,
    }
    assert row == expected
    assert json.loads(row["cameras"]) == ["wrist", "head"]
    assert registry.episodes() == [expected]
    assert registry.episodes(key) == [expected]
    assert registry.episodes("20990101T00-999999") == []
    assert registry.episode_by_id("ep-404") is None

    # Columns left out take their defaults.
    registry.register_files(landed(1, start=1), now=T0)
    [b2] = registry.create_batches([landed(1, start=1)], target_bytes=10_000, now=T0)
    registry.record_outcome(
        source_path=landed(1, start=1)[0].path,
        batch_key=b2.key,
        stage="pre",
        gates=[],
        episode={"episode_id": "ep-000002", "status": ACCEPTED, "source_bytes": 10, "duration_s": 1.0},
        now=T0 + 6,
    )
    minimal = registry.episode_by_id("ep-000002")
    assert {
        k: minimal[k]
        for k in ("robot_id", "robot_model", "robot_sw_version", "task", "site", "operator", "started_at", "cameras")
    } == {
        "robot_id": "",
        "robot_model": "",
        "robot_sw_version": "",
        "task": "",
        "site": "",
        "operator": "",
        "started_at": "",
        "cameras": "[]",
    }
    assert minimal["success"] is None and minimal["source_sha256"] is None and minimal["quality_ok"] is None


def test_values_one_backend_would_refuse_are_refused_on_both_naming_the_column(registry):
    """PostgreSQL's VARCHAR(n) refuses what SQLite stores; NUL characters the other way round. The
    registry checks every value itself, the same on both, before writing anything."""
    [f], key = _one_batch(registry)
    before = registry.counts()

    def record(**kw):
        args = {
            "source_path": f.path,
            "batch_key": key,
            "stage": "pre",
            "gates": [gate("readable")],
            "episode": episode_row("ep-000001"),
        }
        registry.record_outcome(**{**args, **kw})

    with pytest.raises(
        FieldValueError, match=r"^episodes\.task: 10000000 characters, the registry stores at most 256$"
    ):
        record(episode=episode_row("ep-000001", task="x" * 10_000_000))
    with pytest.raises(
        FieldValueError, match=r"^episodes\.site: 129 characters, the registry stores at most 128$"
    ) as e:
        record(episode=episode_row("ep-000001", site="s" * 129))
    assert (e.value.table, e.value.column) == ("episodes", "site")
    with pytest.raises(FieldValueError, match=r"^episodes\.operator: contains a NUL character"):
        record(episode=episode_row("ep-000001", operator="op\x00-3"))
    with pytest.raises(FieldValueError, match=r"^quarantine\.stream: 257 characters"):
        record(quarantine={"gate": "readable", "reason": "r", "stream": "/" * 257, "pipeline_version": "1.0"})
    with pytest.raises(FieldValueError, match=r"^gate_results\.gate: 65 characters"):
        record(gates=[gate("g" * 65)])
    assert registry.counts() == before  # nothing half-written: not even the gate results

    record(
        episode=episode_row("ep-000001", task="t" * 256, operator="o" * 128),
        quarantine={"gate": "readable", "reason": "\u00e9" * 100_000, "stream": "/" * 256, "pipeline_version": "1.0"},
    )
    row = registry.episode_by_id("ep-000001")
    assert (row["task"], row["operator"]) == ("t" * 256, "o" * 128)  # at the limit: stored whole on both
    (q,) = registry.quarantined()
    assert q["reason"] == "\u00e9" * 100_000 and q["stream"] == "/" * 256  # limits count characters, not bytes
    with pytest.raises(FieldValueError, match=r"^episodes\.reviewed_by: 129 characters"):
        registry.review("ep-000001", "accept", "r" * 129)


def test_record_outcome_is_idempotent(registry):
    [f], key = _one_batch(registry)
    gates = [
        gate("readable"),
        gate("timestamps", passed=False, detail="non-monotonic ts at 1.5s"),
        gate("camera_drop", passed=False, action="flag", detail="head: 3 frames"),
    ]
    episode = episode_row("ep-000001", status=REJECTED, cameras=["head"], timestamps_ok=False)
    q = {
        "gate": "timestamps",
        "reason": "non-monotonic ts at 1.5s",
        "stream": "/joint_states",
        "pipeline_version": "1.0",
    }
    for _ in range(2):
        registry.record_outcome(
            source_path=f.path, batch_key=key, stage="pre", gates=gates, episode=episode, quarantine=q, now=T0 + 10
        )
    assert registry.counts() == counts(
        landed_files=1, ingest_batches=1, episodes=1, gate_results=1, quarantine=1
    )  # one row per file and stage

    results = registry.gate_results(key)
    assert [(r["gate"], r["stage"], r["passed"], r["action"], r["detail"], r["episode_id"]) for r in results] == [
        ("camera_drop", "pre", False, "flag", "head: 3 frames", "ep-000001"),
        ("readable", "pre", True, "quarantine", "", "ep-000001"),
        ("timestamps", "pre", False, "quarantine", "non-monotonic ts at 1.5s", "ep-000001"),
    ]
    assert registry.quarantined() == [
        {
            "source_path": f.path,
            "batch_key": key,
            "episode_id": "ep-000001",
            "stage": "pre",
            "gate": "timestamps",
            "reason": "non-monotonic ts at 1.5s",
            "stream": "/joint_states",
            "pipeline_version": "1.0",
            "quarantined_at": T0 + 10,
        }
    ]
    assert registry.quarantined(key) == registry.quarantined()
    assert registry.episode_by_id("ep-000001")["status"] == REJECTED
    scored = registry.episode_by_id("ep-000001")
    assert (scored["gates_checked"], scored["gates_failed"], scored["quality_score"]) == (3, 2, pytest.approx(1 / 3))

    # A replay after the file was fixed: gates overwrite their rows, the quarantine is released.
    fixed = [gate("readable"), gate("timestamps"), gate("camera_drop", action="flag")]
    registry.record_outcome(
        source_path=f.path,
        batch_key=key,
        stage="pre",
        gates=fixed,
        episode=episode_row("ep-000001", status=ACCEPTED, timestamps_ok=True),
        quarantine=None,
        now=T0 + 20,
    )
    assert registry.counts() == counts(landed_files=1, ingest_batches=1, episodes=1, gate_results=1)
    assert [(r["gate"], r["passed"], r["detail"], r["checked_at"]) for r in registry.gate_results(key, "pre")] == [
        ("camera_drop", True, "", T0 + 20),
        ("readable", True, "", T0 + 20),
        ("timestamps", True, "", T0 + 20),
    ]
    assert registry.gate_results(key, "post") == []
    assert registry.quarantined() == []
    row = registry.episode_by_id("ep-000001")
    assert (row["status"], row["updated_at"], row["timestamps_ok"]) == (ACCEPTED, T0 + 20, True)
    assert json.loads(row["cameras"]) == ["head"]  # columns the replay did not name keep their values
    assert (row["gates_checked"], row["gates_failed"], row["quality_score"]) == (3, 0, 1.0)  # counted once


def test_post_stage_updates_the_episode_without_source_bytes(registry):
    [f], key = _one_batch(registry)
    registry.record_outcome(
        source_path=f.path,
        batch_key=key,
        stage="pre",
        gates=[gate("readable")],
        episode=episode_row("ep-000001", robot_id="arm-07", quality_ok=True),
        now=T0,
    )
    update = {
        "episode_id": "ep-000001",
        "status": TRANSCODED,
        "schema_version": "1.0",
        "pipeline_version": "2.0",
        "mcap_path": "/out/ep-000001.mcap",
        "mcap_bytes": 55_000,
        "quality_ok": True,
    }
    for _ in range(2):
        registry.record_outcome(
            source_path=f.path,
            batch_key=key,
            stage="post",
            gates=[gate("decodable", pv="2.0")],
            episode=update,
            now=T0 + 30,
        )
    row = registry.episode_by_id("ep-000001")
    assert {k: row[k] for k in (*update, "robot_id", "source_bytes", "duration_s", "updated_at")} == {
        **update,
        "robot_id": "arm-07",
        "source_bytes": 123_456,
        "duration_s": 4.0,
        "updated_at": T0 + 30,
    }
    assert registry.counts() == counts(landed_files=1, ingest_batches=1, episodes=1, gate_results=2)
    assert [(r["stage"], r["gate"], r["pipeline_version"]) for r in registry.gate_results(key)] == [
        ("post", "decodable", "2.0"),
        ("pre", "readable", "1.0"),
    ]
    assert (row["gates_checked"], row["gates_failed"], row["quality_score"]) == (2, 0, 1.0)  # both stages

    # An update for an episode the registry does not know adds no row.
    registry.record_outcome(
        source_path="site-a/unknown.h5",
        batch_key=key,
        stage="post",
        gates=[],
        episode={"episode_id": "ep-404", "status": TRANSCODED},
        now=T0 + 40,
    )
    assert registry.episode_by_id("ep-404") is None
    assert registry.counts()["episodes"] == 1


def test_quarantine_release_only_when_asked(registry):
    [f], key = _one_batch(registry)
    registry.record_outcome(
        source_path=f.path,
        batch_key=key,
        stage="pre",
        gates=[gate("readable")],
        episode=episode_row("ep-000001"),
        now=T0,
    )
    q = {
        "gate": "transcode",
        "stage": "transcode",
        "reason": "h264 encoder failed",
        "stream": "/cam/head",
        "pipeline_version": "2.0",
    }
    registry.record_outcome(
        source_path=f.path,
        batch_key=key,
        stage="post",
        gates=[],
        episode={"episode_id": "ep-000001", "status": QUARANTINED, "pipeline_version": "2.0", "schema_version": "1.0"},
        quarantine=q,
        now=T0 + 1,
    )
    [held] = registry.quarantined(key)
    assert (held["stage"], held["gate"], held["stream"], held["episode_id"]) == (
        "transcode",
        "transcode",
        "/cam/head",
        "ep-000001",
    )

    # A newer failure replaces the record (still one row per file).
    registry.record_outcome(
        source_path=f.path,
        batch_key=key,
        stage="post",
        gates=[gate("decodable", False)],
        quarantine={**q, "reason": "decode mismatch", "gate": "decodable", "stage": "post"},
        now=T0 + 2,
    )
    [held] = registry.quarantined(key)
    assert (held["stage"], held["gate"], held["reason"], held["quarantined_at"]) == (
        "post",
        "decodable",
        "decode mismatch",
        T0 + 2,
    )
    assert held["episode_id"] is None  # neither episode nor quarantine named one this time

    # release_quarantine=False keeps the record untouched.
    registry.record_outcome(
        source_path=f.path,
        batch_key=key,
        stage="pre",
        gates=[gate("readable")],
        episode=episode_row("ep-000001", status=QUARANTINED),
        quarantine=None,
        release_quarantine=False,
        now=T0 + 3,
    )
    assert registry.quarantined(key) == [held]

    # The default releases it; other files' records are untouched.
    registry.record_outcome(
        source_path="site-a/other.h5",
        batch_key=key,
        stage="pre",
        gates=[],
        quarantine={"gate": "readable", "reason": "truncated", "pipeline_version": "2.0"},
        now=T0 + 4,
    )
    registry.record_outcome(source_path=f.path, batch_key=key, stage="post", gates=[], now=T0 + 5)
    assert [r["source_path"] for r in registry.quarantined()] == ["site-a/other.h5"]
    assert registry.quarantined()[0]["stream"] is None
    assert registry.counts()["quarantine"] == 1


# -- drift ------------------------------------------------------------------------------------


def _stage(
    registry, path: str, key: str, episode_id: str, status: str, pv: str | None = None, sv: str | None = "1.0"
) -> None:
    """Pre stage writes the row, then (for transcoded/quarantined) the post stage stamps versions."""
    pre_status = REJECTED if status == REJECTED else ACCEPTED
    registry.record_outcome(
        source_path=path,
        batch_key=key,
        stage="pre",
        gates=[gate("readable")],
        episode=episode_row(episode_id, status=pre_status),
        now=T0,
    )
    if status in (TRANSCODED, QUARANTINED):
        registry.record_outcome(
            source_path=path,
            batch_key=key,
            stage="post",
            gates=[gate("decodable", pv=pv)],
            episode={
                "episode_id": episode_id,
                "status": status,
                "pipeline_version": pv,
                "schema_version": sv,
                "mcap_path": f"/out/{episode_id}.mcap",
            },
            now=T0 + 1,
        )


def test_stale_episodes_and_outdated_batches(registry):
    files = landed(12)
    registry.register_files(files, now=T0)
    a, b, c, d, e = registry.create_batches(
        [files[0:5], files[5:8], files[8:9], files[9:10], files[10:12]], target_bytes=10_000, now=T0
    )
    kw = dict(schema_version="1.0", pipeline_version="2.0")

    # a: every status; b: only up to date or never transcoded; c: accepted only (not drift);
    # d: written under another schema version; e: transcoded/quarantined at the current versions.
    plan = [
        (files[0], a, "a-1-accepted", ACCEPTED, None, None),
        (files[1], a, "a-2-transcoded-old", TRANSCODED, "1.0", "1.0"),
        (files[2], a, "a-3-transcoded-new", TRANSCODED, "2.0", "1.0"),
        (files[3], a, "a-4-quarantined-old", QUARANTINED, "1.0", "1.0"),
        (files[4], a, "a-5-rejected", REJECTED, None, None),
        (files[5], b, "b-1-transcoded-new", TRANSCODED, "2.0", "1.0"),
        (files[6], b, "b-2-rejected", REJECTED, None, None),
        (files[7], b, "b-3-accepted", ACCEPTED, None, None),
        (files[8], c, "c-1-accepted", ACCEPTED, None, None),
        (files[9], d, "d-1-transcoded-schema-0.9", TRANSCODED, "2.0", "0.9"),
        (files[10], e, "e-1-transcoded-new", TRANSCODED, "2.0", "1.0"),
        (files[11], e, "e-2-quarantined-new", QUARANTINED, "2.0", "1.0"),
    ]
    for f, batch, eid, status, pv, sv in plan:
        _stage(registry, f.path, batch.key, eid, status, pv, sv)
    assert registry.counts()["episodes"] == 12
    assert [r["status"] for r in registry.episodes()] == [p[3] for p in plan]

    def stale(batch):
        return [r["episode_id"] for r in registry.stale_episodes(batch.key, **kw)]

    assert stale(a) == ["a-1-accepted", "a-2-transcoded-old", "a-4-quarantined-old"]
    assert stale(b) == ["b-3-accepted"]
    assert stale(c) == ["c-1-accepted"]
    assert stale(d) == ["d-1-transcoded-schema-0.9"]
    assert stale(e) == []
    assert registry.stale_episodes("20990101T00-999999", **kw) == []

    assert registry.outdated_batches(**kw) == sorted([a.key, d.key])
    # At the old pipeline version the picture flips: what 2.0 wrote is the drift.
    assert registry.outdated_batches(schema_version="1.0", pipeline_version="1.0") == [a.key, b.key, d.key, e.key]
    assert [r["episode_id"] for r in registry.stale_episodes(a.key, schema_version="1.0", pipeline_version="1.0")] == [
        "a-1-accepted",
        "a-3-transcoded-new",
    ]

    # Re-transcoding the stale rows at the current version clears the drift.
    for f, batch, eid, status, pv, sv in plan:
        if status in (TRANSCODED, QUARANTINED) and (pv, sv) != ("2.0", "1.0"):
            _stage(registry, f.path, batch.key, eid, TRANSCODED, "2.0", "1.0")
    assert registry.outdated_batches(**kw) == []
    assert stale(a) == ["a-1-accepted"]


def test_units_join_partitions_in_order_and_drift_is_found_per_partition(registry):
    files = landed(6)
    registry.register_files(files, now=T0)
    units = registry.create_batches([[f] for f in files], target_bytes=1000, now=T0)
    assert all(u.partition_key is None for u in units)
    # 1000-1005 bytes a unit: a partition of 2500 bytes is full at its third unit
    sealed = registry.assign_partitions(target_bytes=2500, max_wait_s=3600, now=T0)
    assert [(p.seq, p.key, p.units, p.files) for p in sealed] == [
        (1, "20261102-000001", 3, 3),
        (2, "20261102-000002", 3, 3),
    ]
    assert sealed[0].bytes == sum(f.bytes for f in files[:3]) and sealed[0].sealed
    assert [u.key for u in registry.partition_units(sealed[1].key)] == [u.key for u in units[3:]]
    assert [u.partition_key for u in registry.batches_after(0)] == [sealed[0].key] * 3 + [sealed[1].key] * 3
    assert registry.batch(units[4].key).partition_key == sealed[1].key
    # an open partition gains units across calls and is sealed by age
    more = landed(1, start=6)
    registry.register_files(more, now=T0)
    registry.create_batches([more], target_bytes=1000, now=T0 + 10)
    assert registry.assign_partitions(target_bytes=2500, max_wait_s=3600, now=T0 + 10) == []
    opened = registry.partition("20261102-000003")
    assert not opened.sealed and opened.units == 1
    assert registry.sealed_partitions_after(0) == sealed and registry.sealed_partitions_after(1) == sealed[1:]
    [late] = registry.assign_partitions(target_bytes=2500, max_wait_s=3600, now=T0 + 10 + 3600)
    assert (late.key, late.units, late.sealed_at) == (opened.key, 1, T0 + 10 + 3600)
    assert [p.key for p in registry.sealed_partitions_after(0, limit=2)] == [sealed[0].key, sealed[1].key]
    with pytest.raises(KeyError, match="no ingest partition"):
        registry.partition_units("20990101-999999")
    # drift is named by partition: one old episode in unit 5 makes partition 2 stale, nothing else
    for f, u, pv in ((files[0], units[0], "2.0"), (files[4], units[4], "1.0")):
        _stage(registry, f.path, u.key, f"ep-{f.path[-9:-3]}", TRANSCODED, pv, "1.0")
    kw = dict(schema_version="1.0", pipeline_version="2.0")
    assert registry.outdated_batches(**kw) == [units[4].key]
    assert registry.outdated_partitions(**kw) == [sealed[1].key]
    assert registry.outdated_ladder_partitions("ladder-1") == []
    assert [e["episode_id"] for e in registry.episodes([u.key for u in units[3:]])] == ["ep-000004"]
    with pytest.raises(ValueError, match="target_bytes"):
        registry.assign_partitions(target_bytes=0, max_wait_s=1)


# -- input never reaches SQL as text ------------------------------------------------------------


def test_hostile_values_are_bound_parameters(registry):
    path = "site-a/x'); DROP TABLE episodes;--.h5"
    other = "site-a/\"quoted\" %s %(x)s \\ back; DELETE FROM landed_files WHERE '1'='1.h5"
    episode_id = "ep-'; DROP TABLE landed_files;--"
    files = [LandedFile(path, 10, 1), LandedFile(other, 20, 2)]
    assert registry.register_files(files, now=T0) == 2
    assert sorted(registry.unbatched_files()[0]) == sorted(files)
    [b] = registry.create_batches([files], target_bytes=100, now=T0)
    assert registry.batch_files(b.key) == sorted(files)

    ep = episode_row(episode_id, task="pick'); DELETE FROM quarantine;--", operator='o"p', cameras=["c'); --"])
    reason = "bad header: '); DROP TABLE quarantine;--"
    registry.record_outcome(
        source_path=path,
        batch_key=b.key,
        stage="pre",
        gates=[gate("readable", False, detail=reason)],
        episode=ep,
        quarantine={"gate": "readable", "reason": reason, "stream": "%s", "pipeline_version": "1.0"},
        now=T0,
    )
    registry.record_outcome(
        source_path=path,
        batch_key=b.key,
        stage="post",
        gates=[],
        episode={"episode_id": episode_id, "mcap_path": "/out/'; --.mcap"},
        release_quarantine=False,
        now=T0 + 1,
    )

    row = registry.episode_by_id(episode_id)
    assert (row["episode_id"], row["source_path"], row["task"], row["operator"], row["mcap_path"]) == (
        episode_id,
        path,
        "pick'); DELETE FROM quarantine;--",
        'o"p',
        "/out/'; --.mcap",
    )
    assert json.loads(row["cameras"]) == ["c'); --"]
    [q] = registry.quarantined()
    assert (q["source_path"], q["episode_id"], q["reason"], q["stream"]) == (path, episode_id, reason, "%s")
    [g] = registry.gate_results(b.key)
    assert (g["source_path"], g["detail"]) == (path, reason)
    assert registry.episode_by_id("x' OR '1'='1") is None
    with pytest.raises(KeyError):
        registry.batch("x' OR '1'='1")

    assert table_names(registry) == TABLES
    assert registry.counts() == counts(landed_files=2, ingest_batches=1, episodes=1, gate_results=1, quarantine=1)


# -- failures and configuration ------------------------------------------------------------------


def test_unreachable_registry_raises_without_leaking_the_password():
    url = "postgresql+psycopg2://dyna:s3cret-pw@127.0.0.1:1/nope"  # port 1: connection refused
    with pytest.raises(RegistryUnavailableError) as info:
        Registry(url)
    err = info.value
    assert "s3cret-pw" not in str(err) and "s3cret-pw" not in repr(err)
    assert "127.0.0.1" in str(err)
    assert "dyna:***@127.0.0.1:1/nope" in str(err)
    assert err.__cause__ is None and err.__suppress_context__


def test_invalid_url_raises_value_error_without_echoing_it():
    with pytest.raises(ValueError) as info:
        Registry("not a url :: s3cret-pw")
    assert "s3cret-pw" not in str(info.value) and "not a url" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_registry_url_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
    assert registry_url_from_env(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'registry.sqlite'}"
    monkeypatch.setenv("DYNA_REGISTRY_URL", "postgresql+psycopg2://dyna@db.internal:5432/dyna")
    assert registry_url_from_env(tmp_path) == "postgresql+psycopg2://dyna@db.internal:5432/dyna"


def test_sqlite_constructor_creates_the_parent_folder(tmp_path):
    reg = Registry.sqlite(tmp_path / "nested" / "home" / "registry.sqlite")
    try:
        assert (tmp_path / "nested" / "home" / "registry.sqlite").is_file()
        assert reg.counts() == EMPTY
        assert reg.describe() == f"sqlite:///{(tmp_path / 'nested' / 'home' / 'registry.sqlite').resolve()}"
    finally:
        reg.close()


def test_an_older_registry_gains_new_columns_when_opened(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE episodes (episode_id VARCHAR(128) PRIMARY KEY, source_path VARCHAR(1024) NOT NULL, "
        "batch_key VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL, source_bytes BIGINT NOT NULL, "
        "duration_s FLOAT NOT NULL, updated_at FLOAT NOT NULL)"
    )
    con.execute("INSERT INTO episodes VALUES ('ep-old', 'a.h5', 'b1', 'transcoded', 5, 2.0, 0.0)")
    con.commit()
    con.close()
    reg = Registry(f"sqlite:///{path}")
    (row,) = reg.episodes()
    assert row["episode_id"] == "ep-old" and row["n_steps"] is None and row["start_ns"] is None
    assert {"n_steps", "start_ns", "end_ns", "n_frames", "dropped_cameras", "ingested_at"} <= set(row)
    reg.close()


# -- migration from one row a gate ------------------------------------------------------------------


def test_a_registry_with_one_row_a_gate_is_folded_into_a_row_per_stage(registry, monkeypatch):
    import dyna_resources.catalog.registry as reg_mod

    files, key = _one_batch(registry, 3)
    for i, f in enumerate(files):
        registry.record_outcome(
            source_path=f.path,
            batch_key=key,
            stage="pre",
            gates=[gate("readable")],
            episode=episode_row(f"ep-{i:06d}"),
            now=T0,
        )
    # the old layout, as a registry written before gate_results holds it
    with registry.engine.begin() as c:
        c.exec_driver_sql("DELETE FROM gate_results")
        c.exec_driver_sql("""CREATE TABLE quality_results (source_path VARCHAR(1024) NOT NULL,
            stage VARCHAR(8) NOT NULL, gate VARCHAR(64) NOT NULL, batch_key VARCHAR(64) NOT NULL,
            episode_id VARCHAR(128), passed BOOLEAN NOT NULL, action VARCHAR(16) NOT NULL, detail TEXT NOT NULL,
            pipeline_version VARCHAR(16) NOT NULL, checked_at FLOAT NOT NULL,
            PRIMARY KEY (source_path, stage, gate))""")
        ins = "INSERT INTO quality_results VALUES (%s)" % ", ".join(
            ["?" if registry.backend == "sqlite" else "%s"] * 10
        )
        legacy = [
            (
                f.path,
                stage,
                g,
                key,
                f"ep-{i:06d}",
                ok,
                "flag" if g == "frame_drops" else "quarantine",
                "" if ok else f"{g} failed",
                "1.0" if g != "zz_late" else "1.1",
                T0 + i,
            )
            for i, f in enumerate(files)
            for stage, g, ok in (
                ("pre", "readable", True),
                ("pre", "frame_drops", i != 1),
                ("pre", "zz_late", True),
                ("post", "decodable", i != 2),
            )
        ]
        c.exec_driver_sql(ins, legacy)
    monkeypatch.setattr(reg_mod, "LEGACY_PAGE", 5)  # a file's gates split across pages
    reopened = Registry(registry.engine.url.render_as_string(hide_password=False))
    try:
        assert "quality_results" not in inspect(reopened.engine).get_table_names()
        assert reopened.counts()["gate_results"] == 6  # 3 files x 2 stages
        got = [
            (
                r["source_path"],
                r["stage"],
                r["gate"],
                r["passed"],
                r["action"],
                r["detail"],
                r["pipeline_version"],
                r["checked_at"],
            )
            for r in reopened.gate_results(key)
        ]
        assert sorted(got) == sorted((p, s, g, ok, a, d, v, at) for p, s, g, _, _, ok, a, d, v, at in legacy)
        with reopened.engine.begin() as c:
            rows = c.exec_driver_sql(
                "SELECT source_path, stage, checked, failed, failed_gates FROM gate_results ORDER BY source_path, stage"
            ).all()
        assert [tuple(r) for r in rows] == [
            (files[0].path, "post", 1, 0, "[]"),
            (files[0].path, "pre", 3, 0, "[]"),
            (files[1].path, "post", 1, 0, "[]"),
            (files[1].path, "pre", 3, 1, '["frame_drops"]'),
            (files[2].path, "post", 1, 1, '["decodable"]'),
            (files[2].path, "pre", 3, 0, "[]"),
        ]
    finally:
        reopened.close()
