"""The per-partition version summary stays exactly what a GROUP BY over the episodes says,
whatever writes them (registry methods, hand-run SQL), on SQLite and PostgreSQL; the drift
queries read it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from dyna_resources.catalog import partition_versions
from dyna_resources.catalog.registry import ACCEPTED, QUARANTINED, TRANSCODED, LandedFile, Outcome, Registry

T0 = 1_793_000_000.0


def truth(registry) -> list[dict]:
    """The summary recomputed from the rows of record."""
    q = (
        "SELECT COALESCE(b.partition_key, '') AS partition_key, e.status, COALESCE(e.pipeline_version, '') AS pv, "
        "COALESCE(e.schema_version, '') AS sv, COALESCE(e.ladder_version, '') AS lv, count(*) AS n "
        "FROM episodes e LEFT JOIN ingest_batches b ON b.batch_key = e.batch_key GROUP BY 1, 2, 3, 4, 5"
    )
    with registry.engine.connect() as c:
        rows = c.execute(text(q)).all()
    return sorted(
        (
            {
                "partition_key": r[0],
                "status": r[1],
                "pipeline_version": r[2],
                "schema_version": r[3],
                "ladder_version": r[4],
                "episodes": r[5],
            }
            for r in rows
        ),
        key=_order,
    )


def summary(registry) -> list[dict]:
    return sorted(registry.partition_version_counts(), key=_order)


def _order(r: dict) -> tuple:
    return (r["partition_key"], r["status"], r["pipeline_version"], r["schema_version"], r["ladder_version"])


def files(n: int, start: int = 0) -> list[LandedFile]:
    return [LandedFile(f"site-a/ep-{i:05d}.h5", 1000, i) for i in range(start, start + n)]


def inventory(registry, f: LandedFile, unit: str) -> str:
    eid = "ep-" + f.path[-8:-3]
    registry.record_outcome(
        source_path=f.path,
        batch_key=unit,
        stage="pre",
        gates=[],
        now=T0,
        episode={"episode_id": eid, "status": ACCEPTED, "source_bytes": f.bytes, "duration_s": 1.0},
    )
    return eid


def transcoded(registry, f: LandedFile, unit: str, eid: str, pv: str, status: str = TRANSCODED) -> None:
    registry.record_outcome(
        source_path=f.path,
        batch_key=unit,
        stage="post",
        gates=[],
        now=T0,
        episode={
            "episode_id": eid,
            "status": status,
            "pipeline_version": pv,
            "schema_version": "1.0",
            "mcap_uri": f"file:///o/{eid}.mcap",
        },
    )


def test_summary_follows_every_kind_of_write(registry):
    fs = files(9)
    registry.register_files(fs, now=T0)
    units = registry.create_batches([fs[0:3], fs[3:6], fs[6:9]], target_bytes=3000, now=T0)
    p1, p2 = registry.assign_partitions(target_bytes=6000, max_wait_s=0, now=T0)  # units 0+1, then unit 2
    assert summary(registry) == []

    ids = [inventory(registry, f, units[i // 3].key) for i, f in enumerate(fs)]
    assert summary(registry) == truth(registry)
    assert {r["partition_key"]: r["episodes"] for r in summary(registry)} == {p1.key: 6, p2.key: 3}

    for i in range(6):
        transcoded(registry, fs[i], units[i // 3].key, ids[i], "1.0" if i else "0.9")
    transcoded(registry, fs[6], units[2].key, ids[6], "1.0", status=QUARANTINED)
    registry.record_ladders([{"episode_id": ids[1], "steps": []}, {"episode_id": ids[4], "steps": []}], "lad-1")
    registry.record_ladders([{"episode_id": ids[2], "steps": []}], "lad-0")
    assert summary(registry) == truth(registry)
    # a transcode resets the ladder version (a new MCAP): the count moves with it
    transcoded(registry, fs[4], units[1].key, ids[4], "1.0")
    assert summary(registry) == truth(registry)

    # hand-run SQL is counted too: an update of a version, a status, and a delete
    with registry.engine.begin() as c:
        c.execute(text("UPDATE episodes SET pipeline_version = '0.8' WHERE episode_id = :e"), {"e": ids[3]})
        c.execute(text("UPDATE episodes SET status = 'accepted' WHERE episode_id = :e"), {"e": ids[5]})
        c.execute(text("DELETE FROM episodes WHERE episode_id = :e"), {"e": ids[8]})
    assert summary(registry) == truth(registry)
    assert all(r["episodes"] > 0 for r in summary(registry))  # emptied rows are dropped

    assert registry.outdated_partitions(schema_version="1.0", pipeline_version="1.0") == [p1.key]
    assert registry.outdated_partitions(schema_version="2.0", pipeline_version="1.0") == [p1.key, p2.key]
    assert registry.outdated_ladder_partitions("lad-1") == [p1.key]
    assert registry.outdated_ladder_partitions("lad-0") == [p1.key]  # ids[1]'s lad-1 is drift against lad-0


def test_a_unit_joining_a_partition_after_its_episodes_moves_their_counts(registry):
    fs = files(4)
    registry.register_files(fs, now=T0)
    units = registry.create_batches([fs[0:2], fs[2:4]], target_bytes=2000, now=T0)
    ids = [inventory(registry, f, units[i // 2].key) for i, f in enumerate(fs)]
    # episodes of a unit that no ingest_batches row names yet count under no partition
    inventory(registry, LandedFile("site-a/ep-99999.h5", 1000, 0), "20990101T00-000999")
    for i, f in enumerate(fs):
        transcoded(registry, f, units[i // 2].key, ids[i], "0.9")
    assert {r["partition_key"] for r in summary(registry)} == {""}
    assert registry.outdated_partitions(schema_version="1.0", pipeline_version="1.0") == []

    [part] = registry.assign_partitions(target_bytes=10_000, max_wait_s=0, now=T0)
    assert summary(registry) == truth(registry)
    assert {r["partition_key"]: r["episodes"] for r in summary(registry)} == {"": 1, part.key: 4}
    assert registry.outdated_partitions(schema_version="1.0", pipeline_version="1.0") == [part.key]


def test_a_registry_made_before_the_summary_is_back_filled(registry, tmp_path):
    fs = files(3)
    registry.register_files(fs, now=T0)
    [unit] = registry.create_batches([fs], target_bytes=3000, now=T0)
    [part] = registry.assign_partitions(target_bytes=3000, max_wait_s=0, now=T0)
    ids = [inventory(registry, f, unit.key) for f in fs]
    transcoded(registry, fs[0], unit.key, ids[0], "0.9")
    # as an older registry has it: no summary, no triggers
    with registry.engine.begin() as c:
        if registry.backend == "postgresql":
            for name in partition_versions._PG_TRIGGERS:
                c.execute(text(f"DROP TRIGGER {name} ON {'ingest_batches' if name == 'units_pv' else 'episodes'}"))
        else:
            for name in partition_versions._SQLITE_TRIGGERS:
                c.execute(text(f"DROP TRIGGER {name}"))
        c.execute(text("DROP TABLE partition_versions"))
        # written while no trigger existed, as older code wrote it
        c.execute(
            text(
                "UPDATE episodes SET status = 'transcoded', pipeline_version = '1.0', schema_version = '1.0' "
                "WHERE episode_id = :e"
            ),
            {"e": ids[1]},
        )

    reopened = Registry(registry.url.render_as_string(hide_password=False))
    try:
        assert summary(reopened) == truth(reopened)
        assert reopened.outdated_partitions(schema_version="1.0", pipeline_version="1.0") == [part.key]
        transcoded(reopened, fs[2], unit.key, ids[2], "1.0")  # and the triggers are back
        assert summary(reopened) == truth(reopened)
    finally:
        reopened.close()


def test_a_postgres_registry_with_the_row_level_trigger_gets_the_statement_triggers(registry):
    if registry.backend != "postgresql":
        return  # SQLite has row-level triggers only
    fs = files(4)
    registry.register_files(fs, now=T0)
    [unit] = registry.create_batches([fs], target_bytes=4000, now=T0)
    ids = [inventory(registry, f, unit.key) for f in fs]
    with registry.engine.begin() as c:  # the trigger of older registries (its body is not needed here)
        for name in partition_versions._PG_TRIGGERS[:3]:
            c.execute(text(f"DROP TRIGGER {name} ON episodes"))
        c.execute(
            text(
                "CREATE FUNCTION dyna_episodes_pv() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'the old trigger ran'; END $$"
            )
        )
        c.execute(
            text(
                "CREATE TRIGGER episodes_pv AFTER INSERT OR DELETE OR UPDATE ON episodes "
                "FOR EACH ROW EXECUTE FUNCTION dyna_episodes_pv()"
            )
        )
    reopened = Registry(registry.url.render_as_string(hide_password=False))
    try:
        with reopened.engine.begin() as c:
            names = set(c.execute(text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")).scalars())
        assert names == set(partition_versions._PG_TRIGGERS)
        for f, eid in zip(fs[:2], ids[:2], strict=True):
            transcoded(reopened, f, unit.key, eid, "1.0")  # would raise under the old trigger
        with reopened.engine.begin() as c:
            c.execute(text("DELETE FROM episodes WHERE episode_id = :e"), {"e": ids[3]})
        assert summary(reopened) == truth(reopened)
    finally:
        reopened.close()


def test_sqlite_triggers_without_the_bulk_writes_clause_are_made_again(registry):
    """An older SQLite registry's row triggers fire on every row of a bulk write too (and would
    count it twice next to the bulk write's own fold): reopened, they are replaced."""
    if registry.backend != "sqlite":
        return
    fs = files(6)
    registry.register_files(fs, now=T0)
    [unit] = registry.create_batches([fs], target_bytes=6000, now=T0)
    registry.assign_partitions(target_bytes=6000, max_wait_s=0, now=T0)
    ids = [inventory(registry, f, unit.key) for f in fs[:3]]
    with registry.engine.begin() as c:  # as older registries had them: no WHEN clause
        c.execute(text("DROP TRIGGER episodes_pv_insert"))
        c.execute(
            text(
                "CREATE TRIGGER episodes_pv_insert AFTER INSERT ON episodes BEGIN "
                "INSERT INTO partition_versions VALUES ('old', 'old', '', '', '', 1); END"
            )
        )
        c.execute(text("DROP TRIGGER episodes_cdc_insert"))
        c.execute(
            text(
                "CREATE TRIGGER episodes_cdc_insert AFTER INSERT ON episodes BEGIN "
                "INSERT INTO change_log (tbl, op, pk) VALUES ('episodes', 'I', 'old-' || NEW.episode_id); END"
            )
        )
    reopened = Registry(registry.url.render_as_string(hide_password=False))
    try:
        for f in fs[3:]:
            inventory(reopened, f, unit.key)
        transcoded(reopened, fs[0], unit.key, ids[0], "1.0")
        assert summary(reopened) == truth(reopened)
        with reopened.engine.begin() as c:
            logged = [tuple(r) for r in c.execute(text("SELECT op, pk FROM change_log ORDER BY seq"))]
        assert not [pk for _, pk in logged if pk.startswith("old-")]
        assert logged[-4:] == [("I", "ep-00003"), ("I", "ep-00004"), ("I", "ep-00005"), ("U", "ep-00000")]
    finally:
        reopened.close()


def test_a_bulk_write_folds_the_summary_and_logs_each_key_once(registry, monkeypatch):
    """SQLite's bulk writes stand the row triggers aside and write the summary and the change log
    themselves: new rows, replayed rows, updates, an update of an absent episode, one key twice.
    (PostgreSQL: the same summary through its statement-level triggers.)"""
    from dyna_resources.catalog import bulk
    from dyna_resources.catalog import schema as t
    from dyna_resources.catalog.registry import Outcome

    fs = files(6)
    registry.register_files(fs, now=T0)
    units = registry.create_batches([fs[:3], fs[3:]], target_bytes=3000, now=T0)
    registry.assign_partitions(target_bytes=3000, max_wait_s=0, now=T0)
    ids = [inventory(registry, f, units[0].key) for f in fs[:2]]

    def whole(i, unit):
        return Outcome(
            fs[i].path,
            unit,
            "pre",
            [],
            {"episode_id": f"ep-{i:05d}", "status": ACCEPTED, "source_bytes": 1000, "duration_s": 1.0},
        )

    def post(i, unit, pv, eid=None):
        return Outcome(
            fs[i].path,
            unit,
            "post",
            [],
            {"episode_id": eid or f"ep-{i:05d}", "status": TRANSCODED, "pipeline_version": pv, "schema_version": "1.0"},
        )

    start = _log_head(registry) if registry.backend == "sqlite" else 0
    registry.record_outcomes([whole(0, units[0].key), whole(3, units[1].key), whole(4, units[1].key)], now=T0)
    registry.record_outcomes(
        [
            post(0, units[0].key, "0.9"),
            post(1, units[0].key, "1.0"),
            post(3, units[1].key, "1.0"),
            post(3, units[1].key, "1.1"),
            post(5, units[1].key, "1.0", eid="ep-absent"),
        ],
        now=T0,
    )
    assert summary(registry) == truth(registry)
    assert registry.outdated_partitions(schema_version="1.0", pipeline_version="1.0") == [
        _partition_of(registry, u.key) for u in units
    ]
    assert registry.episode_by_id("ep-00003")["pipeline_version"] == "1.1"  # the later outcome of the call won
    if registry.backend != "sqlite":
        return  # PostgreSQL: statement-level triggers, and the change log is the WAL
    assert sorted(_log_since(registry, start)) == sorted(
        [("U", ids[0]), ("I", "ep-00003"), ("I", "ep-00004"), ("U", "ep-00000"), ("U", "ep-00001"), ("U", "ep-00003")]
    )

    # a bulk write that fails inside its transaction leaves no marker: the next hand-run write is counted
    run = bulk.run

    def boom(conn, write):
        if write.table is t.episodes and "UPDATE" in write.sql:  # the transcode outcome's update
            raise RuntimeError("the disk is gone")
        run(conn, write)

    monkeypatch.setattr(bulk, "run", boom)
    try:
        registry.record_outcomes([whole(2, units[0].key), post(4, units[1].key, "1.0")], now=T0)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failing write did not raise")
    assert registry.episode_by_id("ep-00002") is None  # rolled back with it
    with registry.engine.begin() as c:
        assert c.execute(text("SELECT count(*) FROM episode_bulk_writes")).scalar_one() == 0
        c.execute(text("UPDATE episodes SET pipeline_version = '0.7' WHERE episode_id = 'ep-00004'"))
    assert summary(registry) == truth(registry)
    assert _log_since(registry, start)[-1] == ("U", "ep-00004")


def _partition_of(registry, unit_key: str) -> str:
    return registry.batch(unit_key).partition_key


def _log_head(registry) -> int:
    with registry.engine.begin() as c:
        return c.execute(text("SELECT coalesce(max(seq), 0) FROM change_log")).scalar_one()


def _log_since(registry, seq: int) -> list[tuple]:
    with registry.engine.begin() as c:
        return [
            tuple(r) for r in c.execute(text("SELECT op, pk FROM change_log WHERE seq > :s ORDER BY seq"), {"s": seq})
        ]


def test_a_postgres_registry_with_the_older_update_function_gets_this_one(registry):
    if registry.backend != "postgresql":
        return
    fs = files(2)
    registry.register_files(fs, now=T0)
    [unit] = registry.create_batches([fs], target_bytes=2000, now=T0)
    ids = [inventory(registry, f, unit.key) for f in fs]
    with registry.engine.begin() as c:  # as older registries had it (its body is not needed here)
        c.execute(
            text(
                "CREATE OR REPLACE FUNCTION dyna_episodes_pv_update() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'the old function ran'; END $$"
            )
        )
    reopened = Registry(registry.url.render_as_string(hide_password=False))
    try:
        for f, eid in zip(fs, ids, strict=True):
            transcoded(reopened, f, unit.key, eid, "1.0")  # would raise under the old function
        assert summary(reopened) == truth(reopened)
    finally:
        reopened.close()


def test_an_outcome_write_that_deadlocks_is_written_again(registry, monkeypatch, caplog):
    """A real deadlock on PostgreSQL: another transaction holds partition p2's summary row, the
    outcome write (in two parts: p1's episode, then p2's) takes p1's row and waits for p2's, then
    the other asks for p1's. The server aborts the outcome write (it waited first); the registry
    writes it again once the other has committed, and the summary is what the rows say."""
    import threading

    from dyna_resources.catalog import registry as registry_module

    if registry.backend != "postgresql":
        pytest.skip("SQLite runs one writer at a time: no lock waits on rows, no deadlocks")
    fs = files(4)
    registry.register_files(fs, now=T0)
    units = registry.create_batches([fs[0:2], fs[2:4]], target_bytes=2000, now=T0)
    p1, p2 = registry.assign_partitions(target_bytes=2000, max_wait_s=0, now=T0)
    inventory(registry, fs[0], units[0].key)  # each partition's summary row exists
    inventory(registry, fs[2], units[1].key)
    monkeypatch.setattr(registry_module, "OUTCOME_PART", 1)  # one outcome a part: one statement a partition

    def episode(f, unit):
        return Outcome(
            f.path,
            unit,
            "pre",
            [],
            {"episode_id": "ep-" + f.path[-8:-3], "status": ACCEPTED, "source_bytes": f.bytes, "duration_s": 1.0},
        )

    failed = []

    def write():
        try:
            registry.record_outcomes([episode(fs[1], units[0].key), episode(fs[3], units[1].key)], now=T0)
        except Exception as e:  # handed to the test's thread
            failed.append(e)

    other = registry.engine.connect()
    try:
        other.exec_driver_sql("SET deadlock_timeout = '60s'")  # the server's detector runs in the writer
        bump = text("UPDATE partition_versions SET episodes = episodes WHERE partition_key = :p")
        other.execute(bump, {"p": p2.key})
        writer = threading.Thread(target=write)
        writer.start()
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        with registry.engine.connect() as watch:
            while writer.is_alive() and not watch.execute(waiting).scalar_one():
                watch.rollback()  # a fresh snapshot of pg_stat_activity each time
        other.execute(bump, {"p": p1.key})  # the cycle: returns once the writer is aborted
        other.commit()
        writer.join()
    finally:
        other.close()
    assert failed == []
    assert "deadlock detected" in caplog.text and "attempt 2 of" in caplog.text
    assert {r["partition_key"]: r["episodes"] for r in summary(registry)} == {p1.key: 2, p2.key: 2}
    assert summary(registry) == truth(registry)


def test_an_outcome_write_that_keeps_deadlocking_raises_after_its_attempts(registry, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from dyna_resources.catalog import registry as registry_module

    if registry.backend != "postgresql":
        pytest.skip("SQLite runs one writer at a time: no deadlocks")
    calls = []

    class Deadlock(Exception):  # what psycopg2 raises, as far as the registry looks: its SQLSTATE
        pgcode = "40P01"

    def deadlocks(*_):
        calls.append(1)
        raise OperationalError("INSERT ...", {}, Deadlock("deadlock detected"))

    monkeypatch.setattr(registry, "_record_outcomes_once", deadlocks)
    with pytest.raises(OperationalError, match="deadlock detected"):
        registry.record_outcomes([Outcome("site-a/x.h5", "u", "pre", [], None)], now=T0)
    assert len(calls) == registry_module.OUTCOME_ATTEMPTS
