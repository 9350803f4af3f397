"""Step ladders through the whole path: MCAP episodes of an ingest batch → registry (SQLite and a
real PostgreSQL) → warehouse by CDC → curation by step."""

import json

import pyarrow as pa
import pytest

from dyna_resources.catalog.cdc import sync
from dyna_resources.catalog.curation import CurationSpec, CurationSpecError, curate
from dyna_resources.catalog.warehouse import Warehouse
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.sim.robot import ScriptedArm
from dyna_resources.ladders.config import LadderConfig
from dyna_resources.ladders.run import ladder_batch, ladder_episode
from dyna_resources.ladders.segment import segment
from tests.ingest.conftest import land
from tests.ingest.test_batches import ingest, one_batch

CONFIG = LadderConfig.from_mapping(None)


@pytest.fixture
def laddered(episode_factory, stores):
    """A batch of three 9 s episodes: a clean pick-and-place, a towel fold that slips, a drawer pull."""
    gens = [
        episode_factory(episode_id="ep-pick", task="pick_place", seed=3, success=True, duration_s=9.0),
        episode_factory(episode_id="ep-fold", task="fold_towel", seed=5, success=False, duration_s=9.0),
        episode_factory(episode_id="ep-drawer", task="open_drawer", seed=7, success=True, duration_s=9.0),
    ]
    for g in gens:
        land(stores, g)
    batch = one_batch(stores)
    ingest(stores, batch)
    return stores, batch, {g.spec.episode_id: g for g in gens}


def test_ladders_from_mcap_match_the_raw_streams_and_the_script(laddered):
    stores, batch, gens = laddered
    rep = ladder_batch(batch, stores.registry, CONFIG, pictures=1)
    assert sorted(rep.segmented) == ["ep-drawer", "ep-fold", "ep-pick"] and rep.errors == {}
    assert dict(rep.failed_steps) == {"fold": 1}
    assert set(rep.pictures) == {"ep-drawer", "ep-fold"}  # the first one, and the first with a failure
    assert all(p.startswith(b"\x89PNG") for p in rep.pictures.values())
    rows = {r["episode_id"]: r for r in stores.registry.episodes(batch)}
    for eid, g in gens.items():
        row = rows[eid]
        assert row["ladder_version"] == CONFIG.version and row["ladder_error"] is None
        stored = json.loads(row["step_ladder"])
        steps, _ = ladder_episode(row["mcap_uri"], row["task"], CONFIG)
        assert stored == [s.as_dict() for s in steps]
        with RawEpisode(g.path) as raw:  # the MCAP carries the streams exactly: the same ladder
            streams = {k: s for k, s in raw.streams.items()}
            streams = {
                k: type(s)(s.name, s.timestamps_ns, {f: v[:] for f, v in s.fields.items()}, s.labels)
                for k, s in streams.items()
            }
        with EpisodeReader(row["mcap_path"]) as r:
            start, end = r.start_ns, r.end_ns
        assert [s.as_dict() for s in segment(streams, start, end, row["task"], CONFIG)] == stored
        arm = ScriptedArm(
            seed=g.spec.seed,
            task=g.spec.task,
            robot_model=g.spec.robot_model,
            success=g.spec.success,
            duration_s=g.spec.duration_s,
        )
        assert [s["name"] for s in stored] == [t["name"] for t in arm.scripted_steps()]
    assert rows["ep-fold"]["failed_step"] == "fold" and rows["ep-pick"]["failed_step"] is None


def test_only_stale_ladders_are_redone(laddered):
    stores, batch, _ = laddered
    assert len(ladder_batch(batch, stores.registry, CONFIG).segmented) == 3
    before = {r["episode_id"]: r["updated_at"] for r in stores.registry.episodes(batch)}
    again = ladder_batch(batch, stores.registry, CONFIG, pictures=2)
    assert again.segmented == [] and next(iter(again.pictures)) == "ep-fold"  # drawn anyway, the failure first
    assert len(again.pictures) == 2
    assert {r["episode_id"]: r["updated_at"] for r in stores.registry.episodes(batch)} == before  # nothing written
    changed = LadderConfig.from_mapping({"thresholds": {"min_pause_s": 0.15}})
    assert stores.registry.outdated_ladder_batches(changed.version) == [batch]
    assert stores.registry.outdated_ladder_batches(CONFIG.version) == []
    assert len(ladder_batch(batch, stores.registry, changed).segmented) == 3
    assert {r["ladder_version"] for r in stores.registry.episodes(batch)} == {changed.version}


def test_an_episode_that_cannot_be_segmented_keeps_the_reason_and_the_batch_goes_on(laddered):
    stores, batch, _ = laddered
    config = LadderConfig.from_mapping(
        {"procedures": {"pick_place": {"cycle": [{"step": "reach", "ends_at": "grip_close"}]}}}
    )
    no_drawer = LadderConfig(
        config.segmenter,
        config.signals,
        config.thresholds,
        {k: v for k, v in config.procedures.items() if k != "open_drawer"},
        "nodrawer01",
    )
    rep = ladder_batch(batch, stores.registry, no_drawer)
    assert sorted(rep.segmented) == ["ep-fold", "ep-pick"]
    assert "no procedure for task 'open_drawer'" in rep.errors["ep-drawer"]
    row = stores.registry.episode_by_id("ep-drawer")
    assert row["step_ladder"] is None and "open_drawer" in row["ladder_error"]
    assert row["ladder_version"] == no_drawer.version  # not retried until the version changes
    assert ladder_batch(batch, stores.registry, no_drawer).segmented == []


def test_a_new_mcap_resets_its_ladder(laddered, monkeypatch):
    stores, batch, _ = laddered
    ladder_batch(batch, stores.registry, CONFIG)
    from dyna_resources import versions

    monkeypatch.setattr(versions, "PIPELINE_VERSION", "99.0")
    ingest(stores, batch)  # the pipeline bump rewrites every MCAP of the batch
    assert {r["ladder_version"] for r in stores.registry.episodes(batch)} == {None}
    assert len(ladder_batch(batch, stores.registry, CONFIG).segmented) == 3


def _manifest(wh, spec: dict) -> pa.Table:
    return curate(wh, CurationSpec.from_mapping(spec)).read_all()


def test_steps_reach_the_warehouse_by_cdc_and_curation_selects_by_step(laddered, tmp_path):
    stores, batch, _ = laddered
    ladder_batch(batch, stores.registry, CONFIG)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(stores.registry, wh)
        steps = wh.steps()
        ladders = {r["episode_id"]: json.loads(r["step_ladder"]) for r in stores.registry.episodes(batch)}
        assert len(steps) == sum(len(v) for v in ladders.values())
        assert [s["step"] for s in wh.steps("ep-fold")] == [s["name"] for s in ladders["ep-fold"]]
        fold = next(s for s in wh.steps("ep-fold") if s["step"] == "fold")
        assert (fold["outcome"], fold["failure_mode"]) == ("failure", "slip")

        # "only the folding step": segments inside fold windows only, with the step named
        only_fold = _manifest(
            wh,
            {
                "name": "fold-only",
                "steps": {"where": {"step": "fold"}},
                "segments": {"length_s": 0.5, "stride_s": 0.25},
            },
        )
        assert only_fold.num_rows > 0 and set(only_fold["step"].to_pylist()) == {"fold"}
        assert set(only_fold["episode_id"].to_pylist()) == {"ep-fold"}
        for a, b in zip(only_fold["start_ns"].to_pylist(), only_fold["end_ns"].to_pylist()):
            assert fold["start_ns"] <= a and b <= fold["end_ns"]
        # "episodes that failed at the fold": whole episodes, by the steps table or by failed_step
        failed = _manifest(
            wh, {"name": "failed-fold", "steps": {"where": {"step": "fold", "outcome": "failure"}, "scope": "episode"}}
        )
        by_column = _manifest(wh, {"name": "failed-fold", "where": {"failed_step": "fold"}})
        assert set(failed["episode_id"].to_pylist()) == {"ep-fold"} and failed.equals(by_column)
        assert "step" not in failed.column_names
        grasps = _manifest(
            wh,
            {
                "name": "grasps",
                "steps": {"where": {"step": "grasp", "outcome": "success"}},
                "segments": {"length_s": 0.2, "stride_s": 0.2},
            },
        )
        assert set(grasps["episode_id"].to_pylist()) == {"ep-pick", "ep-fold", "ep-drawer"}

        # a reviewer's relabel flows the same way: re-segmenting replaces the steps, never adds
        ladder_batch(batch, stores.registry, LadderConfig.from_mapping({"thresholds": {"min_pause_s": 0.15}}))
        sync(stores.registry, wh)
        assert len(wh.steps()) == len(steps)


@pytest.mark.parametrize(
    "steps,field",
    [
        ({"where": {"stepp": "fold"}}, "steps.where.stepp"),
        ({"where": {"step": {"~": "fold"}}}, "steps.where.step"),
        ({"where": {"step": "fold"}, "scope": "batch"}, "steps.scope"),
        ({"step": "fold"}, "steps"),
    ],
)
def test_bad_step_selection_names_the_field(steps, field):
    with pytest.raises(CurationSpecError, match=field.replace(".", r"\.")):
        CurationSpec.from_mapping({"name": "x", "steps": steps})
