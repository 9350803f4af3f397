import os
from pathlib import Path

import pytest
from dagster import DagsterInstance

from dyna_assets.definitions import defs
from dyna_assets.deployment import PRODUCTION_SETTINGS, embedded_resources, resources
from dyna_assets.ingest.local import landing_tick_in_process
from dyna_assets.ingest.sensors import landing_sensor
from dyna_resources.catalog.registry import Registry
from dyna_resources.cli import main as cli
from dyna_resources.ingest import landing as landing_mod
from dyna_resources.ingest.landing import LandingZone, StoreUnavailableError
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.resources import IngestResource


def touch(root, key, size=10):
    p = root / key
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x" * size)
    return p


def test_scan_lists_in_key_order_after_the_cursor_and_skips_hidden_and_foreign_files(tmp_path):
    for k in [
        "2026-11-28/a.h5",
        "2026-11-28/b.hdf5",
        "2026-11-29/a.h5",
        "2026-11-29.h5",
        "z.h5",
        "2026-11-29/.a.h5.123.tmp",
        ".hidden/x.h5",
        "2026-11-29/notes.txt",
    ]:
        touch(tmp_path, k)
    zone = LandingZone(tmp_path)
    keys = [f.path for f in zone.scan()]
    assert keys == ["2026-11-28/a.h5", "2026-11-28/b.hdf5", "2026-11-29.h5", "2026-11-29/a.h5", "z.h5"]
    assert keys == sorted(keys)
    assert [f.path for f in zone.scan(after="2026-11-28/b.hdf5")] == ["2026-11-29.h5", "2026-11-29/a.h5", "z.h5"]
    assert [f.path for f in zone.scan(after="2026-11-28/a.h5", limit=2)] == ["2026-11-28/b.hdf5", "2026-11-29.h5"]


def test_scan_after_cursor_does_not_descend_into_old_folders(tmp_path, monkeypatch):
    for day in range(1, 21):
        for i in range(5):
            touch(tmp_path, f"2026-11-{day:02d}/ep-{i}.h5")
    opened = []
    real = os.scandir

    def counting(path):
        opened.append(os.path.relpath(path, tmp_path))
        return real(path)

    monkeypatch.setattr(landing_mod.os, "scandir", counting)
    got = LandingZone(tmp_path).scan(after="2026-11-19/ep-4.h5")
    assert [f.path for f in got] == [f"2026-11-20/ep-{i}.h5" for i in range(5)]
    # the root, the folder holding the cursor, the new folder: none of the 18 older folders
    assert opened == [".", "2026-11-19", "2026-11-20"]


def test_unreachable_store_and_path_escape_are_refused(tmp_path):
    with pytest.raises(StoreUnavailableError, match="missing or unreadable"):
        LandingZone(tmp_path / "nope").scan()
    zone = LandingZone(tmp_path)
    for bad in ["../etc/passwd", "/etc/passwd", "a/../../b.h5", "a//b.h5"]:
        with pytest.raises(ValueError, match="escapes the landing root"):
            zone.resolve(bad)
    assert zone.resolve("site/ep.h5") == tmp_path / "site" / "ep.h5"


def test_tick_packs_units_into_sealed_partitions_and_requests_at_most_k_then_nothing(tmp_path):
    zone_root = tmp_path / "landing"
    for i in range(30):
        touch(zone_root, f"2026-11-29/ep-{i:03d}.h5", size=100)
    reg = Registry.sqlite(tmp_path / "r.sqlite")
    settings = LandingSettings(
        settle_s=0, target_batch_bytes=500, partition_bytes=1000, max_runs_per_tick=2, max_wait_s=1e9, reconcile_every=0
    )
    zone = LandingZone(zone_root)
    plan = landing_tick(LandingCursor(), zone, reg, settings, now=1000.0)
    assert plan.new_files == 30 and len(plan.created) == 6 and len(plan.sealed) == 3
    assert all(b.files == 5 and b.bytes == 500 for b in plan.created)
    assert [p.seq for p in plan.launch] == [1, 2] and all(p.units == 2 and p.files == 10 for p in plan.launch)
    # every unit is in exactly one partition, in unit order
    units = reg.batches_after(0)
    assert [u.partition_key for u in units] == [p.key for p in plan.sealed for _ in range(2)]
    assert [u.key for u in reg.partition_units(plan.sealed[1].key)] == [units[2].key, units[3].key]
    # the rest go out K per tick; then nothing new -> nothing requested
    seen = [p.key for p in plan.launch]
    cursor = plan.cursor
    for _ in range(3):
        plan = landing_tick(LandingCursor.loads(cursor.dumps()), zone, reg, settings, now=1001.0)
        assert plan.new_files == 0 and not plan.created and not plan.sealed
        seen += [p.key for p in plan.launch]
        cursor = plan.cursor
    assert len(seen) == 3 == len(set(seen)) and seen == sorted(seen)
    assert not plan.launch and plan.listed == 0
    # a trickle below the target waits ... until its oldest file waited max_wait_s: then its unit is
    # released and its partition sealed in the same tick
    touch(zone_root, "2026-11-30/ep-000.h5", size=100)
    plan = landing_tick(cursor, zone, reg, settings, now=2000.0)
    assert plan.new_files == 1 and not plan.created and plan.pending_files == 1 and not plan.launch
    late = LandingSettings(
        settle_s=0, target_batch_bytes=500, partition_bytes=1000, max_runs_per_tick=2, max_wait_s=60, reconcile_every=0
    )
    plan = landing_tick(plan.cursor, zone, reg, late, now=2061.0)
    assert [b.files for b in plan.created] == [1] and [(p.seq, p.units, p.files) for p in plan.launch] == [(4, 1, 1)]
    assert reg.counts()["landed_files"] == 31 and reg.counts()["ingest_batches"] == 7
    assert reg.counts()["ingest_partitions"] == 4


def test_a_partition_fills_across_ticks_and_seals_when_full_or_old(tmp_path):
    zone_root = tmp_path / "landing"
    reg = Registry.sqlite(tmp_path / "r.sqlite")
    zone = LandingZone(zone_root)
    settings = LandingSettings(
        settle_s=0, target_batch_bytes=100, partition_bytes=300, max_wait_s=50, reconcile_every=0
    )
    cursor = LandingCursor()
    for tick in range(2):  # one full unit a tick: the partition stays open
        touch(zone_root, f"d{tick}/ep.h5", size=100)
        plan = landing_tick(cursor, zone, reg, settings, now=1000.0 + tick)
        cursor = plan.cursor
        assert len(plan.created) == 1 and not plan.sealed and not plan.launch
    touch(zone_root, "d2/ep.h5", size=100)
    plan = landing_tick(cursor, zone, reg, settings, now=1002.0)  # the third unit fills it
    assert [(p.units, p.bytes) for p in plan.sealed] == [(3, 300)] and plan.launch == plan.sealed
    cursor = plan.cursor
    touch(zone_root, "d3/ep.h5", size=100)
    plan = landing_tick(cursor, zone, reg, settings, now=1003.0)
    assert not plan.sealed
    plan = landing_tick(plan.cursor, zone, reg, settings, now=1003.0 + 50)  # open 50 s: sealed short
    assert [(p.units, p.bytes) for p in plan.sealed] == [(1, 100)]
    # replaying the registry's assignment changes nothing: a unit's partition is fixed once given
    before = [(u.key, u.partition_key) for u in reg.batches_after(0)]
    assert reg.assign_partitions(target_bytes=1, max_wait_s=0, seal_open=True) == []
    assert [(u.key, u.partition_key) for u in reg.batches_after(0)] == before


def test_reconciliation_sweeps_only_the_recent_window_a_page_a_tick(tmp_path):
    zone_root = tmp_path / "landing"
    reg = Registry.sqlite(tmp_path / "r.sqlite")
    zone = LandingZone(zone_root)
    settings = LandingSettings(
        settle_s=0, target_batch_bytes=10, max_wait_s=0, reconcile_every=3, reconcile_window=2, scan_limit=2
    )
    touch(zone_root, "b/ep-1.h5")
    plan = landing_tick(LandingCursor(), zone, reg, settings)
    plan = landing_tick(plan.cursor, zone, reg, settings)
    plan = landing_tick(plan.cursor, zone, reg, settings)  # third tick: the first mark, no sweep yet
    assert plan.cursor.marks == ["b/ep-1.h5"] and not plan.reconciled
    touch(zone_root, "a/ancient.h5")  # behind the oldest mark: outside the window, never swept
    touch(zone_root, "c/ep-2.h5")
    touch(zone_root, "d/ep-3.h5")
    plan = landing_tick(plan.cursor, zone, reg, settings)
    assert plan.new_files == 2 and plan.cursor.after == "d/ep-3.h5"
    touch(zone_root, "b/late-1.h5")  # behind the cursor, inside the window
    touch(zone_root, "c/late-2.h5")
    plan = landing_tick(plan.cursor, zone, reg, settings)
    assert plan.new_files == 0 and not plan.reconciled
    plan = landing_tick(plan.cursor, zone, reg, settings)  # sixth tick: a sweep from the oldest mark starts
    assert plan.reconciled and plan.swept == 2 and plan.new_files == 1  # b/late-1.h5, c/ep-2.h5
    assert plan.sweeping and plan.cursor.marks == ["b/ep-1.h5", "d/ep-3.h5"]
    plan = landing_tick(plan.cursor, zone, reg, settings)  # the sweep's second page
    assert plan.reconciled and plan.new_files == 1 and not plan.sweeping  # c/late-2.h5, then d/ep-3.h5 ends it
    known = {f.path for f in reg.batch_files([b.key for b in reg.batches_after(0)])}
    assert known == {"b/ep-1.h5", "b/late-1.h5", "c/ep-2.h5", "c/late-2.h5", "d/ep-3.h5"}


def test_a_cursor_from_before_partitions_loads(tmp_path):
    old = '{"after": "2026/ep.h5", "last_seq": 12, "ticks": 7}'
    cursor = LandingCursor.loads(old)
    assert (cursor.after, cursor.last_partition, cursor.ticks, cursor.marks) == ("2026/ep.h5", 0, 7, [])
    assert LandingCursor.loads(cursor.dumps()) == cursor


# -- what a user of the embedded default and a deployment get -------------------------------------
def _settings(environ: dict[str, str]) -> LandingSettings:
    return resources(environ)["ingest"].landing_settings()


def test_a_short_drop_is_released_within_a_minute_embedded_and_after_an_hour_in_production(tmp_path):
    production = {"DYNA_ENV": "production", **{k: f"/prod/{k.lower()}" for k in PRODUCTION_SETTINGS}}
    for environ, released_after in (({}, 30.0), (production, 3600.0)):
        settings = _settings(environ)  # what the landing sensor of that deployment ticks with
        assert settings.max_wait_s == released_after
        home = tmp_path / (environ.get("DYNA_ENV") or "embedded")
        assert (
            cli(
                [
                    "generate",
                    str(home / "landing"),
                    "--episodes",
                    "2",
                    "--width",
                    "32",
                    "--height",
                    "32",
                    "--duration-s",
                    "1",
                ]
            )
            == 0
        )
        zone, reg = LandingZone(home / "landing"), Registry.sqlite(home / "r.sqlite")
        t0 = 1_000_000.0
        plan = landing_tick(LandingCursor(), zone, reg, settings, now=t0)  # the tick that sees the drop
        assert plan.new_files == 2 and not plan.created and plan.pending_files == 2
        plan = landing_tick(plan.cursor, zone, reg, settings, now=t0 + released_after - 1)
        assert not plan.created and plan.pending_files == 2, environ
        plan = landing_tick(plan.cursor, zone, reg, settings, now=t0 + released_after)
        assert [b.files for b in plan.created] == [2] and [p.seq for p in plan.launch] == [1], environ
        reg.close()
    # the embedded sensor ticks every 30 s: registered at the first tick after the drop, released at the next
    assert landing_sensor.minimum_interval_seconds + _settings({}).max_wait_s <= 60


def test_generated_drops_sort_after_the_landing_cursor_so_the_next_tick_sees_them(tmp_path, capsys):
    home = tmp_path / "home"
    res = embedded_resources({"DYNA_HOME": str(home)})
    ingest = res["ingest"] = IngestResource(home=res["home"], target_batch_bytes=1 << 40, max_wait_s=0)
    cursor = None
    with DagsterInstance.ephemeral() as instance:
        for seed, landed in ((0, 2), (1, 4), (0, 6)):  # the same seed again: the same episode names, a new drop
            argv = [
                "generate",
                str(home / "landing"),
                "--episodes",
                "2",
                "--seed",
                str(seed),
                "--width",
                "32",
                "--height",
                "32",
                "--duration-s",
                "1",
            ]
            assert cli(argv) == 0
            printed = [Path(line.split()[0]) for line in capsys.readouterr().out.splitlines()]
            keys = [p.relative_to(home / "landing").as_posix() for p in printed]
            assert len(keys) == 2 and all(k.count("/") == 1 for k in keys), keys  # <UTC time>/<episode>.h5
            before = cursor
            tick = landing_tick_in_process(instance, defs, cursor, res)  # the landing sensor, as deployed
            cursor = tick.cursor
            # seen by the incremental listing (the reconciliation scan runs only every 120 ticks)
            assert ingest.stores().registry.counts()["landed_files"] == landed, (before, keys)
            assert all(k > (LandingCursor.loads(before).after or "") for k in keys)
            assert len(tick.run_requests) == 1  # each drop its own batch and run
    ingest.stores().registry.close()


def _file_partitions(reg: Registry) -> dict[str, str]:
    units = {u.key: u.partition_key for u in reg.batches_after(0)}
    return {f.path: units[u] for u in units for f in reg.batch_files(u)}


def test_a_files_partition_is_deterministic_and_survives_a_tick_that_died_half_way(tmp_path, monkeypatch):
    zone_root = tmp_path / "landing"
    rng = __import__("random").Random(4)
    for i in range(60):
        touch(zone_root, f"2026-11-{29 + i // 30}/site-{i % 3}/ep-{i:03d}.h5", size=rng.randint(50, 400))
    zone = LandingZone(zone_root)
    settings = LandingSettings(
        settle_s=0, target_batch_bytes=1000, partition_bytes=3000, max_wait_s=100, scan_limit=25, reconcile_every=0
    )

    def run(reg: Registry, die_at: int | None = None) -> None:
        cursor, tick = LandingCursor(), 0
        while True:
            if tick == die_at:  # the tick dies after packing units, before they join partitions
                with monkeypatch.context() as m:
                    m.setattr(reg, "assign_partitions", lambda **kw: (_ for _ in ()).throw(OSError("killed")))
                    with pytest.raises(OSError):
                        landing_tick(cursor, zone, reg, settings, now=1000.0 + tick)
            plan = landing_tick(cursor, zone, reg, settings, now=1000.0 + tick)  # Dagster keeps the old cursor
            cursor, tick = plan.cursor, tick + 1
            if not plan.listed and not plan.launch and tick > 5:
                break
        landing_tick(cursor, zone, reg, settings, now=5000.0)  # the rest: released and sealed by age

    a, b = Registry.sqlite(tmp_path / "a.sqlite"), Registry.sqlite(tmp_path / "b.sqlite")
    run(a)
    run(b, die_at=1)
    assert _file_partitions(a) == _file_partitions(b) and len(_file_partitions(a)) == 60
    assert len(set(_file_partitions(a).values())) >= 3
    assert [p.key for p in a.sealed_partitions_after(0)] == [p.key for p in b.sealed_partitions_after(0)]
    before = _file_partitions(a)
    run(a)  # ticking the same zone again from a fresh cursor moves nothing
    assert _file_partitions(a) == before
