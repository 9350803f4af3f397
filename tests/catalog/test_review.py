"""Review of the episodes the quality scores could not decide: the registry write, the pool,
and the verdict reaching the warehouse by CDC and curation (SQLite and PostgreSQL)."""

import json

import pytest

from dyna_resources.catalog.cdc import sync
from dyna_resources.catalog.curation import CurationSpec, curate
from dyna_resources.catalog.warehouse import Warehouse

S = 1_000_000_000


def ep(i, verdict="pass", reasons=()):
    return {
        "episode_id": f"ep-{i}",
        "source_bytes": 1,
        "duration_s": 5.0,
        "task": "pick_place",
        "cameras": [],
        "status": "transcoded",
        "start_ns": 100 * S,
        "end_ns": 105 * S,
        "n_steps": 1000,
        "mcap_path": f"/data/ep-{i}.mcap",
        "mcap_uri": f"file:///data/ep-{i}.mcap",
        "pipeline_version": "1.0",
        "schema_version": "1.0",
        "smoothness_score": 1.0,
        "sensor_health_score": 0.7,
        "task_score": 1.0,
        "quality_verdict": verdict,
        "quality_reasons": json.dumps(list(reasons)),
    }


def fill(registry):
    reason = {"check": "frame_drop_fraction", "detail": "images/wrist misses 6% of its frames"}
    for i, v in enumerate(["pass", "review", "review", "fail"], 1):
        registry.record_outcome(
            source_path=f"ep-{i}.h5",
            batch_key="b1",
            stage="pre",
            gates=[],
            episode=ep(i, v, [reason] if v != "pass" else []),
        )


def test_review_validates_its_input(registry):
    fill(registry)
    with pytest.raises(ValueError, match="accept"):
        registry.review("ep-2", "maybe", "ann")
    with pytest.raises(ValueError, match="reviewer"):
        registry.review("ep-2", "accept", " ")
    with pytest.raises(KeyError):
        registry.review("ep-404", "accept", "ann")
    with pytest.raises(KeyError):  # values are bound, never spliced
        registry.review("ep-2'; DROP TABLE episodes; --", "accept", "ann")
    assert len(registry.episodes()) == 4


def test_pool_lists_undecided_review_episodes_with_reasons(registry):
    fill(registry)
    pool = registry.review_pool()
    assert [r["episode_id"] for r in pool] == ["ep-2", "ep-3"]
    assert pool[0]["quality_reasons"][0]["check"] == "frame_drop_fraction"
    registry.review("ep-2", "accept", "ann", note="drops outside the grasp", now=123.0)
    assert [r["episode_id"] for r in registry.review_pool()] == ["ep-3"]
    row = registry.episode_by_id("ep-2")
    assert (row["review_verdict"], row["reviewed_by"], row["reviewed_at"], row["review_note"]) == (
        "accept",
        "ann",
        123.0,
        "drops outside the grasp",
    )


def test_verdict_flows_by_cdc_to_the_warehouse_and_curation(registry, tmp_path):
    fill(registry)
    spec = CurationSpec.from_mapping({"name": "reviewed", "where": {"review_verdict": {"!=": "reject"}}})
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(registry, wh)
        chosen = lambda: sorted({r["episode_id"] for r in curate(wh, spec).read_all().to_pylist()})
        assert chosen() == ["ep-1", "ep-2", "ep-3", "ep-4"]  # NULL (not reviewed) is not 'reject'
        registry.review("ep-3", "reject", "bob")
        registry.review("ep-2", "accept", "bob")
        sync(registry, wh)
        rows = {r["episode_id"]: r for r in wh.episodes()}
        assert rows["ep-3"]["review_verdict"] == "reject" and rows["ep-3"]["reviewed_by"] == "bob"
        assert rows["ep-2"]["quality_verdict"] == "review"
        assert chosen() == ["ep-1", "ep-2", "ep-4"]
        accepted = CurationSpec.from_mapping(
            {
                "name": "strict",
                "where": {"quality_verdict": {"in": ["pass", "review"]}, "review_verdict": {"!=": "reject"}},
            }
        )
        assert sorted({r["episode_id"] for r in curate(wh, accepted).read_all().to_pylist()}) == ["ep-1", "ep-2"]


def test_review_pool_asset_lists_the_pool_with_reasons(tmp_path, monkeypatch):
    from dagster import DagsterInstance, materialize

    from dyna_assets.warehouse.review import review_pool
    from dyna_resources.catalog.registry import Registry
    from dyna_resources.resources import HomeResource, IngestResource

    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    reg = Registry(f"sqlite:///{home / 'registry.sqlite'}")
    fill(reg)
    reg.review("ep-2", "accept", "ana")
    reg.close()
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [review_pool], instance=instance, resources={"ingest": IngestResource(home=HomeResource(root=str(home)))}
        )
        (m,) = result.asset_materializations_for_node("review_pool")
        assert m.metadata["episodes"].value == 1  # ep-3: ep-2 was decided, ep-1 passed, ep-4 failed
        assert m.metadata["by_reason"].value == {"frame_drop_fraction": 1}
        assert "| ep-3 | b1 |" in m.metadata["pool"].value and "misses 6%" in m.metadata["pool"].value


def test_review_cli_lists_and_decides(tmp_path):
    import os
    import subprocess
    import sys

    from dyna_resources.catalog.registry import Registry

    home = tmp_path / "home"
    home.mkdir()
    reg = Registry(f"sqlite:///{home / 'registry.sqlite'}")
    fill(reg)
    reg.close()
    env = {k: v for k, v in os.environ.items() if k != "DYNA_REGISTRY_URL"} | {"DYNA_HOME": str(home)}
    cli = [sys.executable, "-m", "dyna_resources.cli", "review"]
    listed = subprocess.run([*cli, "list"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "ep-2" in listed.stdout and "ep-3" in listed.stdout and "ep-1" not in listed.stdout
    done = subprocess.run(
        [*cli, "set", "ep-2", "reject", "--by", "ana", "--note", "blurry"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    bad = subprocess.run(
        [*cli, "set", "ep-9", "accept", "--by", "ana"], env=env, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "ep-9" in (bad.stderr + bad.stdout)
    reg = Registry(f"sqlite:///{home / 'registry.sqlite'}")
    assert [r["episode_id"] for r in reg.review_pool()] == ["ep-3"]
    reg.close()
