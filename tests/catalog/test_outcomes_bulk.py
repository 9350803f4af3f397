"""Outcomes written in bulk (one set-based transaction) leave the registry exactly as the same
outcomes written one at a time, on SQLite and PostgreSQL; a refused value writes nothing."""

from __future__ import annotations

import random
import sys

import pytest
from sqlalchemy import delete, select, text

from dyna_resources.catalog import bulk, pipelined
from dyna_resources.catalog import registry as registry_module
from dyna_resources.catalog import schema as t
from dyna_resources.catalog.registry import ACCEPTED, QUARANTINED, TRANSCODED, FieldValueError, Outcome
from dyna_resources.ingest.outcomes import OutcomeBuffer

NOW = 1_793_000_000.0
GATES = ["readable", "schema", "timestamps_monotonic", "finite_values", "decodable", "frame_counts"]


def outcomes(seed: int, n_files: int = 40) -> list[Outcome]:
    """Inventory of every file, then transcode outcomes, with quarantines, releases and repeats."""
    rng = random.Random(seed)
    out = []
    for i in range(n_files):
        path, unit = f"site-a/ep-{i:04d}.h5", f"20261201T10-{i % 4:06d}"
        gates = [
            {
                "gate": g,
                "passed": rng.random() > 0.2,
                "action": rng.choice(["quarantine", "flag"]),
                "detail": rng.choice(["", "x' OR 1=1; --"]),
                "pipeline_version": "1.5",
            }
            for g in GATES[:4]
        ]
        held = rng.random() < 0.2
        episode = {
            "episode_id": f"ep-{i:04d}",
            "status": "rejected" if held else ACCEPTED,
            "source_bytes": 1000 + i,
            "duration_s": rng.uniform(1, 90),
            "task": rng.choice(["pick", "fold"]),
            "cameras": ["a", "b"],
        }
        q = {"gate": "readable", "reason": "bad", "pipeline_version": "1.5"} if held else None
        out.append(Outcome(path, unit, "pre", gates, episode, q, True))
    for i in rng.sample(range(n_files), n_files // 2) * 2:  # every chosen file twice: the later outcome wins
        path, unit = f"site-a/ep-{i:04d}.h5", f"20261201T10-{i % 4:06d}"
        ok = rng.random() > 0.3
        gates = [
            {
                "gate": g,
                "passed": ok or rng.random() > 0.5,
                "action": "quarantine",
                "detail": "",
                "pipeline_version": "1.5",
            }
            for g in GATES[4:]
        ]
        episode = {
            "episode_id": f"ep-{i:04d}",
            "status": TRANSCODED if ok else QUARANTINED,
            "pipeline_version": "1.5",
            "schema_version": "1.0",
            "mcap_uri": f"file:///o/ep-{i:04d}.mcap" if ok else None,
            "mcap_bytes": rng.randint(1, 10**6) if ok else None,
        }
        q = (
            None
            if ok
            else {
                "gate": "decodable",
                "reason": f"unit {rng.randint(0, 9)} bad",
                "stage": "post",
                "pipeline_version": "1.5",
            }
        )
        out.append(Outcome(path, unit, "post", gates, episode, q, True))
    return out


def dump(registry) -> dict:
    with registry.engine.begin() as c:
        return {
            tab.name: sorted(tuple(r) for r in c.execute(select(tab)))
            for tab in (t.episodes, t.gate_results, t.quarantine)
        }


def wipe(registry) -> None:
    with registry.engine.begin() as c:
        for tab in (t.episodes, t.gate_results, t.quarantine):
            c.execute(delete(tab))


@pytest.mark.parametrize("seed,copy_from", [(1, bulk.COPY_FROM), (2, bulk.COPY_FROM), (3, 2)])
def test_bulk_outcomes_equal_one_at_a_time(registry, seed, copy_from, monkeypatch):
    monkeypatch.setattr(bulk, "COPY_FROM", copy_from)  # 2: PostgreSQL's bulk writes go through COPY and staging
    todo = outcomes(seed)
    for o in todo:
        registry.record_outcome(
            source_path=o.source_path,
            batch_key=o.batch_key,
            stage=o.stage,
            gates=o.gates,
            episode=o.episode,
            quarantine=o.quarantine,
            release_quarantine=o.release_quarantine,
            now=NOW,
        )
    one_by_one = dump(registry)
    assert len(one_by_one["episodes"]) == 40 and one_by_one["quarantine"] and one_by_one["gate_results"]
    wipe(registry)
    pre = [o for o in todo if o.stage == "pre"]
    post = [o for o in todo if o.stage == "post"]
    registry.record_outcomes(pre, now=NOW)  # a unit's inventory, then its transcode outcomes
    registry.record_outcomes(post[:7], now=NOW)
    registry.record_outcomes(post[7:], now=NOW)
    assert dump(registry) == one_by_one


def test_a_refused_value_in_a_bulk_write_writes_nothing(registry):
    todo = outcomes(3, n_files=10)[:10]
    bad = Outcome(
        "site-a/ok.h5",
        "u",
        "pre",
        [],
        {"episode_id": "e" * 129, "status": ACCEPTED, "source_bytes": 1, "duration_s": 1.0},
    )
    with pytest.raises(FieldValueError, match="episodes.episode_id"):
        registry.record_outcomes(todo + [bad], now=NOW)
    assert registry.counts()["episodes"] == registry.counts()["gate_results"] == 0


def test_outcome_buffer_commits_a_unit_once_or_groups_quick_outcomes(tmp_path):
    from dyna_resources.catalog.registry import Registry

    reg = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    todo = [o for o in outcomes(4, n_files=12) if o.stage == "pre"]
    unit = OutcomeBuffer(reg)  # the inventory: at the end only
    for o in todo:
        unit.add(o)
        assert unit.episode(o.episode["episode_id"])["source_path"] == o.source_path  # seen before it commits
    assert reg.counts()["episodes"] == 0 and unit.flushes == 0
    unit.flush()
    assert reg.counts()["episodes"] == 12 and unit.flushes == 1

    wipe(reg)
    eager = OutcomeBuffer(reg, min_interval_s=0.0)  # slow episodes: each durable as it finishes
    for k, o in enumerate(todo, 1):
        eager.add(o)
        assert reg.counts()["episodes"] == k
    wipe(reg)
    grouped = OutcomeBuffer(reg, max_outcomes=5, min_interval_s=3600.0)  # quick ones: the first, then fives
    for o in todo:
        grouped.add(o)
    assert grouped.flushes == 3 and reg.counts()["episodes"] == 11 and len(grouped.pending) == 1
    grouped.flush()
    assert reg.counts()["episodes"] == 12
    with reg.engine.begin() as c:  # the change log saw every row once per commit it was in
        assert c.execute(text("SELECT count(DISTINCT pk) FROM change_log")).scalar_one() == 12
    reg.close()


TRICKY = [
    "",
    "tab\there",
    "new\nline",
    "cr\rhere",
    "back\\slash \\N",
    "\\.",
    "quote ' \" ;--",
    "\u00e9\u6f22\U0001f916",
    "%s %(x)s",
    "\\t literal",
]


def test_copy_round_trips_every_kind_of_value(registry, monkeypatch):
    """Through COPY (PostgreSQL) as through executemany: text with the format's special characters,
    NULLs, booleans, big integers, floats including infinities."""
    import math

    monkeypatch.setattr(bulk, "COPY_FROM", 2)
    rows = [
        {
            "episode_id": f"ep-{i:04d}",
            "status": ACCEPTED,
            "source_bytes": 2**40 + i if i % 3 else -7,
            "duration_s": [1.5, math.inf, -math.inf, 1e-300, 0.1 + 0.2][i % 5],
            "task": TRICKY[i % len(TRICKY)],
            "operator": TRICKY[(i + 3) % len(TRICKY)],
            "mcap_uri": None if i % 2 else TRICKY[i % len(TRICKY)],
            "success": [True, False, None][i % 3],
            "sim": i % 2 == 1,
            "batch_key": "u",
            "source_path": f"p/{i}",
            "updated_at": NOW,
        }
        for i in range(25)
    ]
    with registry.engine.begin() as c:
        bulk.upsert(c, registry.backend, t.episodes, rows, ["episode_id"])
        bulk.update_by_key(
            c,
            registry.backend,
            t.episodes,
            [{"episode_id": r["episode_id"], "site": TRICKY[::-1][i % len(TRICKY)]} for i, r in enumerate(rows)],
            "episode_id",
        )
    got = {r["episode_id"]: r for r in registry.episodes()}
    assert len(got) == 25
    for i, r in enumerate(rows):
        g = got[r["episode_id"]]
        assert (g["task"], g["operator"], g["mcap_uri"], g["site"]) == (
            r["task"],
            r["operator"],
            r["mcap_uri"],
            TRICKY[::-1][i % len(TRICKY)],
        )
        assert (g["source_bytes"], g["success"], g["sim"], g["duration_s"]) == (
            r["source_bytes"],
            r["success"],
            r["sim"],
            r["duration_s"],
        )


@pytest.mark.parametrize("copy_from", [bulk.COPY_FROM, 2])
def test_scores_follow_the_rule_exactly_on_either_backend(registry, copy_from, monkeypatch):
    """gates_checked/gates_failed are the latest results of both stages, quality_score is
    round(1 - failed/checked, 6) as Python rounds it (PostgreSQL computes it in the writing
    statement, SQLite in Python: the two must agree to the last bit), NULL when nothing was checked."""
    monkeypatch.setattr(bulk, "COPY_FROM", copy_from)
    pairs = [(n, f) for n in range(0, 31) for f in range(0, n + 1)]
    pre, post = [], []
    for i, (n, f) in enumerate(pairs):
        path, unit, eid = f"site-a/s-{i:04d}.h5", "20261201T10-000000", f"s-{i:04d}"
        pre_n = n // 2
        gates = [
            {"gate": f"g{k}", "passed": k >= f, "action": "flag", "detail": "", "pipeline_version": "1.5"}
            for k in range(n)
        ]
        episode = {"episode_id": eid, "status": ACCEPTED, "source_bytes": 1, "duration_s": 1.0}
        pre.append(Outcome(path, unit, "pre", gates[:pre_n], episode, None, True))
        post.append(Outcome(path, unit, "post", gates[pre_n:], {"episode_id": eid, "status": TRANSCODED}, None, True))
    registry.record_outcomes(pre, now=NOW)
    registry.record_outcomes(post, now=NOW)
    registry.record_outcomes(post, now=NOW)  # a replay of a stage replaces its results, never adds to them
    rows = registry.episodes_by_ids([f"s-{i:04d}" for i in range(len(pairs))])
    for i, (n, f) in enumerate(pairs):
        r = rows[f"s-{i:04d}"]
        assert (r["gates_checked"], r["gates_failed"]) == (n, f), (n, f)
        assert r["quality_score"] == (round(1.0 - f / n, 6) if n else None), (n, f, r["quality_score"])


def test_a_call_written_in_parts_leaves_what_one_part_leaves(registry, monkeypatch):
    """PostgreSQL writes a large call part by part, the next part built while the server runs the
    one before: with a file's inventory and transcode outcomes, its repeats and its quarantine
    spread over the call, the registry ends as if the call had been one part."""
    todo = outcomes(5, n_files=60)
    mixed = todo[::2] + todo[1::2]  # a file's whole row and its partial rows far apart in one call
    registry.record_outcomes(mixed, now=NOW)
    whole_call = dump(registry)
    wipe(registry)
    cuts = []
    real_parts = pipelined.parts
    monkeypatch.setattr(pipelined, "parts", lambda *a: cuts.append(real_parts(*a)) or cuts[-1])
    monkeypatch.setattr(registry_module, "OUTCOME_PART", 8)
    registry.record_outcomes(mixed, now=NOW)
    assert dump(registry) == whole_call
    if registry.backend == "postgresql":
        assert len(cuts) == 1 and len(cuts[0]) > 3  # it was written in parts
        assert sorted(map(id, sum(cuts[0], []))) == sorted(map(id, mixed))


def test_a_refused_value_in_a_later_part_writes_nothing(registry, monkeypatch):
    monkeypatch.setattr(registry_module, "OUTCOME_PART", 4)
    todo = outcomes(3, n_files=20)
    bad = Outcome(
        "site-a/ok.h5",
        "u",
        "pre",
        [],
        {"episode_id": "e" * 129, "status": ACCEPTED, "source_bytes": 1, "duration_s": 1.0},
    )
    with pytest.raises(FieldValueError, match="episodes.episode_id"):
        registry.record_outcomes(todo + [bad], now=NOW)  # the earlier parts ran before the last was built
    assert registry.counts()["episodes"] == registry.counts()["gate_results"] == 0


def test_parts_keep_what_shares_a_key_together():
    def keys(item):
        return item[1:]

    items = [(k, f"f{k % 5}") for k in range(12)]  # five files, each in several items
    cut = pipelined.parts(items, keys, 2)
    assert [sorted(k for k, _ in p) for p in cut] == [[0, 1, 5, 6, 10, 11], [2, 3, 7, 8], [4, 9]]
    assert pipelined.parts(items[:3], keys, 2) == [items[:3]]  # fewer than two parts: one
    joining = [(0, "a"), (1, "b"), (2, "c"), (3, "a", "c")]  # joins the parts of a and c
    assert pipelined.parts(joining, keys, 1) == [joining]


def test_built_ahead_builds_in_order_and_raises_a_build_error_where_taken():
    interval = sys.getswitchinterval()
    assert list(pipelined.built_ahead([1, 2, 3], lambda x: x * 10)) == [10, 20, 30]

    def build(x):
        if x == 3:
            raise ValueError("part 3 is bad")
        return x

    got = []
    with pytest.raises(ValueError, match="part 3 is bad"):
        for b in pipelined.built_ahead([1, 2, 3, 4], build):
            got.append(b)
    assert got == [1, 2] and sys.getswitchinterval() == interval


def test_a_files_pre_and_post_outcomes_written_at_once_both_count_in_its_score(registry):
    """PostgreSQL, READ COMMITTED, two connections: the pre outcome's transaction has written its gate row
    and scored the episode, and waits (a third connection holds the file's quarantine row it releases);
    meanwhile the post outcome is written by another connection. Without a lock per file the post write
    commits first, scored without the pre row, and the pre write then commits a score without the post
    row: the episode's score misses a stage. With it, the post write waits and counts both."""
    import threading

    from sqlalchemy import text

    if registry.backend != "postgresql":
        pytest.skip("SQLite runs one writer at a time")
    path, unit, eid = "site-a/race.h5", "20261205T01-000000", "ep-race"

    def gates(n: int, failed: int) -> list[dict]:
        return [
            {"gate": f"g{k}", "passed": k >= failed, "action": "flag", "detail": "", "pipeline_version": "1.5"}
            for k in range(n)
        ]

    registry.record_outcomes(
        [
            Outcome(
                path,
                unit,
                "pre",
                [],
                {"episode_id": eid, "status": "accepted", "source_bytes": 1, "duration_s": 1.0},
                {"gate": "readable", "reason": "held", "pipeline_version": "1.5"},
            )
        ]
    )
    from dyna_resources.catalog.registry import Registry

    other = Registry(registry.url.render_as_string(hide_password=False))
    failed: list[BaseException] = []

    def write(reg, outcome):
        try:
            reg.record_outcomes([outcome])
        except BaseException as e:
            failed.append(e)

    pre = threading.Thread(target=write, args=(registry, Outcome(path, unit, "pre", gates(4, 1))))  # releases
    post = threading.Thread(
        target=write,
        args=(
            other,
            Outcome(
                path, unit, "post", gates(6, 2), {"episode_id": eid, "status": "transcoded"}, release_quarantine=False
            ),
        ),
    )
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    holder = registry.engine.connect()
    try:
        holder.execute(text("SELECT 1 FROM quarantine WHERE source_path = :p FOR UPDATE"), {"p": path})
        pre.start()
        with registry.engine.connect() as watch:
            while pre.is_alive() and not watch.execute(waiting).scalar_one():  # pre waits on the quarantine row
                watch.rollback()
            post.start()
            while post.is_alive() and watch.execute(waiting).scalar_one() < 2:  # post waits on the file's lock
                watch.rollback()
        holder.commit()
        pre.join()
        post.join()
    finally:
        holder.close()
        other.close()
    assert failed == []
    row = registry.episode_by_id(eid)
    assert (row["gates_checked"], row["gates_failed"], row["quality_score"]) == (10, 3, 0.7)
