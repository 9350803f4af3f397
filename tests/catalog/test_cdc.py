"""CDC from the SQLite registry into the DuckDB warehouse: a random storm of inserts, updates
and deletes, synced with crashes in between, leaves the warehouse equal to the source."""

import random

import pytest
from sqlalchemy import delete, select, update

from dyna_resources.catalog import changelog, pg_logical
from dyna_resources.catalog import schema as t
from dyna_resources.catalog.cdc import consumer_name, drop_consumer, sync
from dyna_resources.catalog.registry import Registry
from dyna_resources.catalog.warehouse import Warehouse


def row(i: int, rng: random.Random) -> dict:
    return {
        "episode_id": f"ep-{i:05d}",
        "source_path": f"site/ep-{i:05d}.h5",
        "batch_key": f"b-{i % 7}",
        "status": rng.choice(["accepted", "transcoded", "quarantined"]),
        "source_bytes": rng.randint(1, 10**9),
        "duration_s": rng.uniform(1, 60),
        "task": rng.choice(["pick", "fold", "o'hare; DROP TABLE x"]),
        "success": rng.choice([True, False, None]),
        "camera_dead": rng.choice([True, False]),
        "cameras": '["a", "b"]',
        "updated_at": rng.uniform(0, 1e9),
        "pipeline_version": "1.0",
    }


def source_rows(reg: Registry) -> list[dict]:
    with reg.engine.begin() as c:
        return [dict(r) for r in c.execute(select(t.episodes).order_by(t.episodes.c.episode_id)).mappings()]


def storm(reg: Registry, rng: random.Random, live: set[int], n_ops: int, next_id: list[int]) -> None:
    with reg.engine.begin() as c:
        for _ in range(n_ops):
            op = rng.random()
            if op < 0.5 or not live:
                i = next_id[0]
                next_id[0] += 1
                c.execute(t.episodes.insert().values(**row(i, rng)))
                live.add(i)
            elif op < 0.85:
                i = rng.choice(sorted(live))
                c.execute(
                    update(t.episodes)
                    .where(t.episodes.c.episode_id == f"ep-{i:05d}")
                    .values(
                        status=rng.choice(["transcoded", "quarantined"]),
                        mcap_bytes=rng.randint(1, 10**8),
                        quality_ok=rng.choice([True, False, None]),
                    )
                )
            else:
                i = rng.choice(sorted(live))
                c.execute(delete(t.episodes).where(t.episodes.c.episode_id == f"ep-{i:05d}"))
                live.discard(i)


class DiesBeforePosition:
    """A DuckDB connection that is 'killed' while recording the CDC position of an apply."""

    def __init__(self, inner, after_applies: int):
        self.inner, self.left = inner, after_applies

    def execute(self, sql, *args):
        if sql.startswith("INSERT OR REPLACE INTO cdc_position"):
            if self.left == 0:
                raise KeyboardInterrupt("killed mid-transaction")
            self.left -= 1
        return self.inner.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_storm_with_crashes_leaves_the_warehouse_equal_to_the_source(registry, tmp_path, seed, monkeypatch):
    """On SQLite (trigger change log) and PostgreSQL (logical decoding, pgoutput)."""
    rng = random.Random(seed)
    reg = registry
    wh_path = tmp_path / "warehouse.duckdb"
    live, next_id = set(), [0]
    crashes = 0
    for _round in range(12):
        storm(reg, rng, live, rng.randint(1, 400), next_id)
        wh = Warehouse(wh_path)
        if rng.random() < 0.4:  # the sync dies inside a warehouse transaction, rows written, position not
            wh.con = DiesBeforePosition(wh.con, after_applies=rng.randint(0, 2))
            try:
                sync(reg, wh, batch=50)
            except KeyboardInterrupt:
                crashes += 1
            wh.con = wh.con.inner
        elif rng.random() < 0.3:  # killed between the warehouse commit and pruning the log / advancing the slot
            monkeypatch.setattr(changelog, "prune", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
            monkeypatch.setattr(pg_logical, "advance", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
            with pytest.raises(KeyboardInterrupt):
                sync(reg, wh, batch=50)
            monkeypatch.undo()
            crashes += 1
        else:
            sync(reg, wh, batch=rng.choice([10, 1000]))
        wh.close()
    wh = Warehouse(wh_path)  # a fresh process would reopen it like this
    report = sync(reg, wh, batch=70)
    assert wh.episodes() == source_rows(reg)  # row for row, every column
    assert wh.count() == len(live) > 0
    assert crashes > 0 and report.position not in (0, "0", "0/0", None)
    # nothing new: nothing applied; the log is pruned up to the applied position
    again = sync(reg, wh)
    assert again.changes == 0
    if reg.backend == "sqlite":
        assert changelog.read_changes(reg.engine, 0, 10) == []  # pruned up to the applied position
    else:
        assert pg_logical.peek(reg.engine, pg_logical.install(reg.engine, ["episodes"]), 10) == []  # slot advanced
    wh.close()


def test_a_row_updated_and_deleted_between_syncs_is_deleted_once(registry, tmp_path):
    reg = registry
    rng = random.Random(0)
    with reg.engine.begin() as c:
        c.execute(t.episodes.insert().values(**row(1, rng)))
        c.execute(t.episodes.insert().values(**row(2, rng)))
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(reg, wh)
        assert wh.count() == 2
        with reg.engine.begin() as c:
            c.execute(update(t.episodes).where(t.episodes.c.episode_id == "ep-00001").values(status="transcoded"))
            c.execute(delete(t.episodes).where(t.episodes.c.episode_id == "ep-00001"))
            c.execute(update(t.episodes).where(t.episodes.c.episode_id == "ep-00002").values(episode_id="ep-00003"))
        rep = sync(reg, wh)
        assert (rep.upserts, rep.deletes) == (1, 2)
        assert [e["episode_id"] for e in wh.episodes()] == ["ep-00003"]


def test_a_dropped_consumer_keeps_no_changes_and_a_new_sync_starts_afresh(registry, tmp_path):
    """A warehouse that is gone: SQLite's log is pruned without it, PostgreSQL's slot (which would
    keep every WAL segment after it) is dropped; a later sync of it takes a snapshot again."""
    rng = random.Random(1)
    with registry.engine.begin() as c:
        c.execute(t.episodes.insert().values(**row(1, rng)))
    with Warehouse(tmp_path / "gone.duckdb") as gone, Warehouse(tmp_path / "kept.duckdb") as kept:
        sync(registry, gone)
        sync(registry, kept)
        drop_consumer(registry, gone)
        with registry.engine.begin() as c:
            c.execute(t.episodes.insert().values(**row(2, rng)))
        if registry.backend == "postgresql":
            with registry.engine.connect() as c:
                assert (
                    c.exec_driver_sql(
                        "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
                    ).scalar_one()
                    == 0
                )
        else:
            assert consumer_name(gone) not in changelog.consumers(registry.engine)
            sync(registry, kept)  # the only consumer left: the log is pruned behind it
            assert changelog.read_changes(registry.engine, 0, 10) == []
        gone.con.execute("DELETE FROM cdc_position")  # as a new warehouse in its place
        sync(registry, gone)
        assert [e["episode_id"] for e in gone.episodes()] == ["ep-00001", "ep-00002"]


def test_sync_killed_with_sigkill_resumes_from_its_last_applied_position(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    reg = Registry.sqlite(tmp_path / "r.sqlite")
    rng = random.Random(7)
    live, next_id = set(), [0]
    storm(reg, rng, live, 2000, next_id)
    with Warehouse(tmp_path / "w.duckdb") as wh:  # the first sync: a snapshot, the log pruned behind it
        snapshot_at = sync(reg, wh).position
    assert changelog.read_changes(reg.engine, 0, 1) == []
    for _ in range(10):
        storm(reg, rng, live, 2000, next_id)
    first_change = changelog.read_changes(reg.engine, 0, 1)[0].seq
    last_change = changelog.head(reg.engine)
    script = (
        "import sys; from dyna_resources.catalog.registry import Registry; "
        "from dyna_resources.catalog.warehouse import Warehouse; from dyna_resources.catalog.cdc import sync; "
        "sync(Registry.sqlite(sys.argv[1]), Warehouse(sys.argv[2]), batch=100)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "r.sqlite"), str(tmp_path / "w.duckdb")])
    deadline = time.monotonic() + 120
    while changelog.read_changes(reg.engine, 0, 1)[0].seq == first_change:  # until it has applied and pruned some
        assert proc.poll() is None, "sync ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first_unapplied = changelog.read_changes(reg.engine, 0, 1)[0].seq
    with Warehouse(tmp_path / "w.duckdb") as wh:
        resumed_from = int(wh.position(f"registry:{reg.describe()}"))
        assert snapshot_at < resumed_from < last_change and resumed_from >= first_unapplied - 1
        report = sync(reg, wh)
        assert 0 < report.changes < last_change - snapshot_at  # resumed, not restarted
        assert report.upserts + report.deletes <= report.changes
        assert wh.episodes() == source_rows(reg)


def test_warehouse_summary_matches_the_rows_it_aggregates(tmp_path):
    """warehouse_episodes' metadata is aggregate SQL in DuckDB: it must say what the rows say."""
    rng = random.Random(7)
    reg = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    storm(reg, rng, set(), 600, [0])
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(reg, wh)
        got = wh.summary(top_tasks=2)
        rows = source_rows(reg)
    done = [r for r in rows if r["status"] == "transcoded"]
    assert got["rows"] == len(rows)
    assert got["rows_by_status"] == {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}}
    assert got["hours_transcoded"] == pytest.approx(sum(r["duration_s"] for r in done) / 3600)
    by_task = {}
    for r in done:
        by_task[r["task"]] = by_task.get(r["task"], 0.0) + r["duration_s"] / 3600
    top = sorted(by_task, key=lambda k: (-by_task[k], k))[:2]
    assert got["tasks"] == len(by_task) == 3
    assert list(got["hours_by_task"]) == top + ["(other tasks)"]
    assert got["hours_by_task"]["(other tasks)"] == pytest.approx(sum(by_task[k] for k in by_task if k not in top))
    assert got["flags"]["camera_dead"] == sum(bool(r["camera_dead"]) for r in done)
    assert got["flags"]["quality_not_ok"] == sum(r["quality_ok"] is False for r in done)
    reg.close()


def column_checksums(con, table_sql: str, names: list[str]) -> tuple:
    """Per column, a hash sum over the rows (DuckDB): equal tables give equal tuples."""
    sums = ", ".join(f"sum(hash({n}))" for n in names)
    return con.execute(f"SELECT count(*), {sums} FROM {table_sql}").fetchone()


def test_first_sync_while_the_registry_is_written_converges_in_bounded_batches(registry, tmp_path, monkeypatch):
    import duckdb
    import pyarrow as pa

    from dyna_resources.catalog import warehouse as wh_mod

    rng, w_rng = random.Random(11), random.Random(12)
    live, next_id = set(), [0]
    storm(registry, rng, live, 3000, next_id)
    sizes: list[int] = []
    real_append = wh_mod.SnapshotLoad.append

    def append_while_written(self, batch):
        sizes.append(batch.num_rows)
        real_append(self, batch)
        storm(registry, w_rng, live, 20, next_id)  # other writers commit while the snapshot streams

    monkeypatch.setattr(wh_mod.SnapshotLoad, "append", append_while_written)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(registry, wh, snapshot_batch=64)
    monkeypatch.undo()
    # streamed in batches of the size asked for, never the whole table at once
    assert len(sizes) >= 10 and set(sizes[:-1]) == {64} and 0 < sizes[-1] <= 64
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(registry, wh)  # what was written during the snapshot and after it, applied once
        got = wh.episodes()
    assert got == source_rows(registry)  # row for row, every column
    names = [c.name for c in t.episodes.columns]
    with duckdb.connect() as con:
        con.register("src", pa.Table.from_pylist(source_rows(registry)))
        con.execute(f"ATTACH '{tmp_path / 'w.duckdb'}' AS wh (READ_ONLY)")
        assert column_checksums(con, "wh.episodes", names) == column_checksums(con, "src", names)


def test_the_change_log_is_pruned_only_behind_every_consumer(tmp_path):
    reg = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    rng = random.Random(5)
    live, next_id = set(), [0]
    storm(reg, rng, live, 200, next_id)
    a, b = Warehouse(tmp_path / "a.duckdb"), Warehouse(tmp_path / "b.duckdb")
    sync(reg, a)
    sync(reg, b)
    assert changelog.read_changes(reg.engine, 0, 1) == []  # both have everything
    storm(reg, rng, live, 200, next_id)
    mark = changelog.head(reg.engine)
    sync(reg, a)  # a is ahead; b still needs every change after its position
    b_at = changelog.consumers(reg.engine)[f"warehouse:{b.path.resolve()}"]
    kept = changelog.read_changes(reg.engine, 0, 10_000)
    assert kept and kept[0].seq == b_at + 1 and kept[-1].seq == mark
    sync(reg, b)
    assert changelog.read_changes(reg.engine, 0, 1) == []
    assert a.episodes() == b.episodes() == source_rows(reg)
    # a consumer that is dropped no longer holds the log back
    storm(reg, rng, live, 50, next_id)
    changelog.drop_consumer(reg.engine, f"warehouse:{b.path.resolve()}")
    sync(reg, a)
    assert changelog.read_changes(reg.engine, 0, 1) == []
    a.close()
    b.close()
    reg.close()


def _sqlite_registry_with_late_values(tmp_path, n: int = 300) -> Registry:
    """``n`` episodes; only the last 10 carry a review (text and real columns NULL in every row before)."""
    reg = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    rng = random.Random(3)
    with reg.engine.begin() as c:
        c.execute(t.episodes.insert(), [row(i, rng) for i in range(n)])
        c.execute(
            update(t.episodes)
            .where(t.episodes.c.episode_id >= f"ep-{n - 10:05d}")
            .values(review_verdict="accept", reviewed_by="ana", reviewed_at=1.5e9, review_note="o'k")
        )
    return reg


def test_a_sqlite_first_sync_is_read_by_a_child_process_whatever_its_first_batch_holds(tmp_path, caplog):
    """ADBC's SQLite driver types a column by the values of its first batch: columns that are NULL
    for the first batches and hold values later are read all the same, by the child process."""
    reg = _sqlite_registry_with_late_values(tmp_path)
    with caplog.at_level("WARNING", logger="dyna_resources.catalog.cdc"), Warehouse(tmp_path / "w.duckdb") as wh:
        sync(reg, wh, snapshot_batch=64)
        assert wh.episodes() == source_rows(reg)
    assert not caplog.records  # no fallback: the child read it
    reg.close()


def test_a_sqlite_snapshot_the_child_cannot_read_is_read_through_sqlite3_and_says_why(tmp_path, caplog, monkeypatch):
    from dyna_resources.catalog import arrow_reads

    reg = _sqlite_registry_with_late_values(tmp_path)
    monkeypatch.setattr(arrow_reads.sys, "executable", "/bin/false")  # the child dies before its first byte
    with caplog.at_level("WARNING", logger="dyna_resources.catalog.cdc"), Warehouse(tmp_path / "w.duckdb") as wh:
        sync(reg, wh, snapshot_batch=64)
        assert wh.episodes() == source_rows(reg)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert f"reading {tmp_path / 'r.sqlite'} failed (exit 1)" in msg and "through sqlite3" in msg
    reg.close()


def test_a_sqlite_snapshot_whose_child_dies_mid_stream_fails_naming_the_file(tmp_path):
    import os
    import signal

    from dyna_resources.catalog import arrow_reads
    from dyna_resources.catalog.warehouse import arrow_columns

    reg = _sqlite_registry_with_late_values(tmp_path, n=5000)  # ~2.5 MB of batches: the child waits on the pipe
    path = tmp_path / "r.sqlite"
    with arrow_reads.sqlite_snapshot(path, arrow_columns(), 64) as (position, batches):
        assert position == changelog.head(reg.engine)
        assert next(batches).num_rows == 64
        (child,) = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit()
            and _cmdline(p).startswith(
                b"%s\0-m\0dyna_resources.catalog.arrow_reads\0snapshot\0%s\0"
                % (os.fsencode(arrow_reads.sys.executable), os.fsencode(str(path)))
            )
        ]
        os.kill(child, signal.SIGKILL)
        with pytest.raises(arrow_reads.SqliteReadError, match=f"reading {path} failed"):
            sum(b.num_rows for b in batches)
    reg.close()


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.parametrize("child", ["reads", "fails"])
def test_sqlite_changed_rows_read_by_the_child_process_or_again_in_process(tmp_path, monkeypatch, caplog, child):
    """Incremental syncs of many keys read the changed rows in a child process (ADBC); one that
    fails is read again through sqlite3, and says so. Either way the warehouse equals the source."""
    from dyna_resources.catalog import arrow_reads, cdc

    reg = _sqlite_registry_with_late_values(tmp_path)
    rng, live, next_id = random.Random(8), set(range(300)), [300]
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(reg, wh)
        monkeypatch.setattr(cdc, "SQLITE_CHILD_KEYS", 1)
        if child == "fails":
            monkeypatch.setattr(arrow_reads.sys, "executable", "/bin/false")
        with caplog.at_level("WARNING", logger="dyna_resources.catalog.cdc"):
            for _ in range(3):
                storm(reg, rng, live, 150, next_id)
                assert sync(reg, wh).changes > 0
                assert wh.episodes() == source_rows(reg)
        warnings = [r.getMessage() for r in caplog.records]
        if child == "reads":
            assert warnings == []
        else:
            assert len(warnings) == 3 and all("reading the changed rows again through sqlite3" in w for w in warnings)
        # every key once: the warehouse holds no key twice (its tables declare none; each apply deletes first)
        assert wh.con.execute("SELECT count(*) = count(DISTINCT episode_id) FROM episodes").fetchone()[0]
    reg.close()
