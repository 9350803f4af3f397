"""The batch engine with a real SQLite registry: gates, quarantine, idempotent replays, stale-only redo."""

import h5py
import pytest

from dyna_resources import versions
from dyna_resources.catalog.registry import QUARANTINED, REJECTED, TRANSCODED
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.ingest.batches import inventory_batch, transcode_batch
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.landing import StoreUnavailableError
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick

from .conftest import FAST, land

ALL_IN_ONE = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)


def one_batch(stores) -> str:
    plan = landing_tick(LandingCursor(), stores.landing, stores.registry, ALL_IN_ONE)
    (batch,) = plan.created
    return batch.key


def ingest(stores, batch, gates=None, workers=1):
    gates = gates or GateConfig()
    pre = inventory_batch(batch, stores, gates)
    post = transcode_batch(batch, stores, gates, settings=FAST, workers=workers)
    return pre, post


def test_faulty_files_are_quarantined_with_reasons_while_good_ones_land(episode_factory, stores, tmp_path):
    good = [episode_factory(episode_id=f"ep-good-{i}", seed=10 + i, duration_s=2.0) for i in range(2)]
    for g in good:
        land(stores, g)
    faults = {
        f: episode_factory(fault=f, episode_id=f"ep-{f.replace('_', '-')}", seed=40, duration_s=2.0)
        for f in ("truncated", "corrupt_jpeg", "non_monotonic", "missing_stream", "dead_camera", "dropped_frames")
    }
    for g in faults.values():
        land(stores, g)
    evil = land(stores, good[0], "evil.h5")
    with h5py.File(evil, "a") as f:
        f.attrs["episode_id"] = "../../outside"
    land(stores, good[1], "zz-copy-of-good-1.h5")  # same episode id as another file

    batch = one_batch(stores)
    pre, post = ingest(stores, batch, workers=2)
    reg = stores.registry
    status = {e["episode_id"]: e["status"] for e in reg.episodes(batch)}
    assert status == {
        "ep-good-0": TRANSCODED,
        "ep-good-1": TRANSCODED,
        "ep-dead-camera": TRANSCODED,
        "ep-dropped-frames": TRANSCODED,
        "ep-corrupt-jpeg": QUARANTINED,
    }
    q = {r["source_path"]: r for r in reg.quarantined(batch)}
    assert set(q) == {
        faults["truncated"].path.name,
        faults["corrupt_jpeg"].path.name,
        faults["non_monotonic"].path.name,
        faults["missing_stream"].path.name,
        "evil.h5",
        "zz-copy-of-good-1.h5",
    }
    assert (q[faults["truncated"].path.name]["gate"], q[faults["truncated"].path.name]["stage"]) == ("readable", "pre")
    assert q[faults["non_monotonic"].path.name]["gate"] == "timestamps_monotonic"
    assert q[faults["non_monotonic"].path.name]["stream"] == "joint_states"
    assert q[faults["missing_stream"].path.name]["gate"] == "required_streams"
    assert q["evil.h5"]["stream"] == "episode_id" and "not a safe identifier" in q["evil.h5"]["reason"]
    assert "duplicate episode_id 'ep-good-1'" in q["zz-copy-of-good-1.h5"]["reason"]
    cj = q[faults["corrupt_jpeg"].path.name]
    assert cj["stream"].startswith("images/") and "jpeg" in cj["reason"].lower()
    # flags for curation: kept, not quarantined (the default action of those gates is "flag")
    flags = {e["episode_id"]: (e["camera_dead"], e["camera_dropped"], e["quality_ok"]) for e in reg.episodes(batch)}
    assert flags["ep-dead-camera"] == (True, False, False)
    assert flags["ep-dropped-frames"] == (False, True, False)
    assert flags["ep-good-0"] == (False, False, True)
    # outputs: exactly the transcoded episodes, named by their safe ids, nothing outside the store
    assert sorted(p.name for p in stores.mcap_dir.glob("*.mcap")) == sorted(
        f"{k}.mcap" for k, v in status.items() if v == TRANSCODED
    )
    assert not list(tmp_path.parent.glob("outside*")) and not list(tmp_path.glob("outside*"))
    for e in reg.episodes(batch):
        if e["status"] == TRANSCODED:
            with EpisodeReader(e["mcap_path"]) as r:
                md = r.metadata()
            assert (md["pipeline_version"], md["schema_version"], md["source_sha256"]) == (
                versions.PIPELINE_VERSION,
                versions.SCHEMA_VERSION,
                e["source_sha256"],
            )
    assert post.gates["decodable"].evaluated == 4 and post.gates["decodable"].failed == 0
    # what curation filters on, measured by the transcode
    by_id = {e["episode_id"]: e for e in reg.episodes(batch)}
    g0 = by_id["ep-good-0"]
    assert g0["end_ns"] > g0["start_ns"] > 0 and abs((g0["end_ns"] - g0["start_ns"]) / 1e9 - g0["duration_s"]) < 1e-6
    assert g0["n_steps"] == 400 and g0["n_frames"] == 3 * 60 and g0["dropped_cameras"] == "[]"
    assert g0["ingested_at"] > 0 and g0["sim"] is True  # the sample fleet is simulated and says so
    assert by_id["ep-dropped-frames"]["dropped_cameras"] != "[]"
    assert pre.gates["dead_camera"].failed == 1 and pre.gates["frame_drops"].failed == 1

    # replaying both steps adds no row and redoes nothing
    before = reg.counts()
    pre2, post2 = ingest(stores, batch)
    assert reg.counts() == before
    assert post2.processed == [] and sorted(post2.skipped) == sorted(k for k, v in status.items() if v == TRANSCODED)


def test_gate_settings_change_what_is_checked_and_what_is_held_back(episode_factory, stores):
    land(stores, episode_factory(fault="dead_camera", episode_id="ep-dead", seed=41, duration_s=2.0))
    land(stores, episode_factory(episode_id="ep-short", seed=42, duration_s=1.5))
    batch = one_batch(stores)
    strict = GateConfig.from_mapping(
        {
            "dead_camera": {"action": "quarantine"},
            "min_duration": {"params": {"min_s": 1.8}},
            "frame_drops": False,
            "size_sanity": False,
        }
    )
    pre, post = ingest(stores, batch, strict)
    assert "frame_drops" not in pre.gates and "size_sanity" not in post.gates
    q = {r["episode_id"]: r["gate"] for r in stores.registry.quarantined(batch)}
    assert q == {"ep-dead": "dead_camera", "ep-short": "min_duration"}
    assert {e["episode_id"]: e["status"] for e in stores.registry.episodes(batch)} == {
        "ep-dead": REJECTED,
        "ep-short": REJECTED,
    }
    # the defaults again: both accepted (dead camera only flagged), quarantine released, both transcoded
    pre, post = ingest(stores, batch)
    assert stores.registry.quarantined(batch) == []
    assert sorted(post.processed) == ["ep-dead", "ep-short"]
    with pytest.raises(ValueError, match="gates file not found"):
        GateConfig.load(stores.landing.root / "missing.yaml", required=True)
    with pytest.raises(ValueError, match="unknown gate 'dead_cam'"):
        GateConfig.from_mapping({"dead_cam": False})
    with pytest.raises(ValueError, match="action must be one of"):
        GateConfig.from_mapping({"dead_camera": {"action": "drop"}})
    with pytest.raises(ValueError, match="unknown param"):
        GateConfig.from_mapping({"min_duration": {"params": {"min_seconds": 3}}})


def test_changed_source_is_redone_and_unchanged_is_not(episode_factory, stores):
    src = land(stores, episode_factory(episode_id="ep-change", seed=5, duration_s=2.0))
    batch = one_batch(stores)
    _, post = ingest(stores, batch)
    assert post.processed == ["ep-change"]
    with h5py.File(src, "a") as f:
        f.attrs["operator"] = "op-9"
    _, post = ingest(stores, batch)
    assert post.processed == ["ep-change"] and stores.registry.counts()["episodes"] == 1


def test_pipeline_version_bump_redoes_only_the_stale_batch(episode_factory, stores, monkeypatch):
    land(stores, episode_factory(episode_id="ep-a1", seed=51, duration_s=2.0), "a/ep-a1.h5")
    land(stores, episode_factory(episode_id="ep-a2", seed=52, duration_s=2.0), "a/ep-a2.h5")
    a = one_batch(stores)
    ingest(stores, a)
    monkeypatch.setattr(versions, "PIPELINE_VERSION", "9.9-test")
    land(stores, episode_factory(episode_id="ep-b1", seed=53, duration_s=2.0), "b/ep-b1.h5")
    plan = landing_tick(
        LandingCursor(after="a/ep-a2.h5", last_partition=1), stores.landing, stores.registry, ALL_IN_ONE
    )
    (b,) = [x.key for x in plan.created]
    _, post_b = ingest(stores, b)
    assert post_b.processed == ["ep-b1"]
    reg = stores.registry
    assert reg.outdated_batches(schema_version=versions.SCHEMA_VERSION, pipeline_version="9.9-test") == [a]
    mtime_b = (stores.mcap_dir / "ep-b1.mcap").stat().st_mtime_ns
    _, post_a = ingest(stores, a)
    assert sorted(post_a.processed) == ["ep-a1", "ep-a2"]
    assert reg.outdated_batches(schema_version=versions.SCHEMA_VERSION, pipeline_version="9.9-test") == []
    assert {e["pipeline_version"] for e in reg.episodes()} == {"9.9-test"}
    assert (stores.mcap_dir / "ep-b1.mcap").stat().st_mtime_ns == mtime_b
    with EpisodeReader(stores.mcap_dir / "ep-a1.mcap") as r:
        assert r.metadata()["pipeline_version"] == "9.9-test"


def test_unreachable_landing_store_fails_the_step_and_records_nothing(episode_factory, stores):
    land(stores, episode_factory(episode_id="ep-x", seed=60, duration_s=2.0))
    batch = one_batch(stores)
    stores.landing.root.rename(stores.landing.root.with_name("moved"))
    before = stores.registry.counts()
    with pytest.raises(StoreUnavailableError, match="missing or unreadable"):
        inventory_batch(batch, stores, GateConfig())
    assert stores.registry.counts() == before


def test_a_dark_camera_is_flagged_from_every_frame_even_with_the_sampling_gate_off(episode_factory, stores):
    land(stores, episode_factory(fault="dead_camera", episode_id="ep-dark", seed=43, duration_s=2.0))
    land(stores, episode_factory(episode_id="ep-lit", seed=44, duration_s=2.0))
    batch = one_batch(stores)
    ingest(stores, batch, GateConfig.from_mapping({"dead_camera": False}))
    flags = {e["episode_id"]: (e["status"], e["camera_dead"], e["quality_ok"]) for e in stores.registry.episodes(batch)}
    assert flags == {"ep-dark": (TRANSCODED, True, False), "ep-lit": (TRANSCODED, None, True)}
