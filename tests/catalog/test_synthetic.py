"""The synthetic corpus (benchmarks' registries of 10^5-10^7 episodes) is written through the
registry's API with exact, reproducible counts, on SQLite and PostgreSQL; the bulk statements
refuse a column their table lacks."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dyna_resources.catalog import bulk, synthetic
from dyna_resources.catalog import schema as t
from dyna_resources.catalog.registry import QUARANTINED, REJECTED, TRANSCODED
from dyna_resources.ingest.gates import POST_GATES, PRE_GATES

# a mix with every fate present in a few hundred episodes
SHAPE = synthetic.CorpusShape(
    rejected=0.05, quarantined=0.05, flagged=0.1, not_transcoded=0.05, episodes_per_unit=12, units_per_partition=4
)


def rows(registry, drop=("batch_key", "updated_at")) -> list[tuple]:
    cols = [c for c in t.episodes.c if c.name not in drop]
    with registry.engine.begin() as c:
        return [tuple(r) for r in c.execute(select(*cols).order_by(t.episodes.c.episode_id))]


def test_populate_writes_the_pipelines_rows_with_exact_counts(registry):
    n = 300
    out = synthetic.populate(registry, n, seed=3, shape=SHAPE, units_per_call=5)
    assert (out["episodes"], out["units"]) == (n, 25)  # units of 12 episodes
    # partitions seal at 4 units' bytes (~4-5 units of ~8 GiB), the last one sealed open: every unit is in one
    assert out["partitions"] == len(registry.sealed_partitions_after(0)) and 5 <= out["partitions"] <= 7
    assert all(b.partition_key for b in registry.batches_after(0))
    eps = registry.episodes()
    status = {e["episode_id"]: e["status"] for e in eps}
    assert len(eps) == n and registry.counts()["landed_files"] == n
    post = sum(1 for s in status.values() if s in (TRANSCODED, QUARANTINED))
    held = sum(1 for s in status.values() if s in (REJECTED, QUARANTINED))
    assert 0 < held < post < n
    assert registry.counts()["gate_results"] == n + post  # a row per file and stage
    assert len(registry.quarantined()) == held
    assert all(e["mcap_uri"].startswith("gs://") for e in eps if e["status"] == TRANSCODED)
    # every written row carries its score from the gates it ran
    assert all(
        e["gates_checked"]
        == len(PRE_GATES) + (len(POST_GATES) if status[e["episode_id"]] in (TRANSCODED, QUARANTINED) else 0)
        for e in eps
    )
    # the per-partition version summary the drift sensor reads saw every write
    assert sum(r["episodes"] for r in registry.partition_version_counts()) == n


def test_populate_is_deterministic_and_independent_of_how_it_is_chunked(registry, tmp_path):
    from dyna_resources.catalog.registry import Registry

    synthetic.populate(registry, 150, seed=7, shape=SHAPE, units_per_call=2)
    other = Registry(f"sqlite:///{tmp_path / 'other.sqlite'}")
    try:
        synthetic.populate(other, 100, seed=7, shape=SHAPE, units_per_call=7)
        synthetic.populate(other, 50, start=100, seed=7, shape=SHAPE, units_per_call=7)
        assert rows(registry) == rows(other)
    finally:
        other.close()


def test_older_partitions_can_carry_an_older_pipeline_version(registry):
    per_partition = SHAPE.episodes_per_unit * SHAPE.units_per_partition
    synthetic.populate(
        registry,
        3 * per_partition,
        shape=SHAPE,
        units_per_call=SHAPE.units_per_partition,
        pipeline_version=lambda lo: "1.4" if lo < per_partition else "1.5",
    )
    stale = registry.outdated_partitions(schema_version="1.0", pipeline_version="1.5")
    assert len(stale) == 1 and len(registry.outdated_partitions(schema_version="1.0", pipeline_version="9.9")) == 3


def test_bulk_refuses_a_column_its_table_lacks(registry):
    with registry.engine.begin() as c, pytest.raises(KeyError, match="has no column"):
        bulk.upsert(c, registry.backend, t.quarantine, [{"source_path": "a", "nope; DROP TABLE x": 1}], ["source_path"])
