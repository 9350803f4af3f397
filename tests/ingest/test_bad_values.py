"""Values the reader accepts but no one can train on, on both registry backends: NaN and infinite
samples, a camera without frames, a clock jump of a hundred years, attributes larger than the
registry holds. Each hostile file is a good generated episode edited with h5py; each is held back
with its reason while the rest of its batch lands."""

import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
from dagster import DagsterInstance, materialize

from dyna_resources.catalog.registry import REJECTED, TRANSCODED
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.ingest.batches import inventory_batch, transcode_batch
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from tests.dyna_assets.test_ingest_graph import ASSETS, checks, home, md, resources, tick  # noqa: F401 (home: a fixture)

from .conftest import FAST, land

ALL_IN_ONE = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)
CENTURY_NS = int(100 * 365.25 * 86400 * 1e9)


def one_batch(stores) -> str:
    (batch,) = landing_tick(LandingCursor(), stores.landing, stores.registry, ALL_IN_ONE).created
    return batch.key


def ingest(stores, gates=None, settings=FAST):
    batch = one_batch(stores)
    gates = gates or GateConfig()
    pre = inventory_batch(batch, stores, gates)
    post = transcode_batch(batch, stores, gates, settings=settings, workers=2)
    return batch, pre, post


def hostile(stores_or_dir, good, name: str, edit) -> str:
    """A copy of a good episode (generated, or a path) landed as ``name`` with its own episode id,
    edited in place by ``edit(h5)``; returns its landing key."""
    root = stores_or_dir.landing.root if hasattr(stores_or_dir, "landing") else Path(stores_or_dir)
    path = root / name
    shutil.copyfile(getattr(good, "path", good), path)
    with h5py.File(path, "a") as f:
        f.attrs["episode_id"] = path.stem
        edit(f)
    return path.name


def nan_joint(f):
    f["observations/qpos"][5, 2] = np.nan


def inf_joint(f):
    f["observations/qvel"][7, 0] = np.inf
    f["observations/effort"][9, 1] = -np.inf


def nan_actions(f):
    f["action"][...] = np.nan


def empty_camera(f):
    del f["observations/images/wrist"], f["timestamps/images/wrist"]
    f.create_dataset("observations/images/wrist", shape=(0,), dtype=h5py.vlen_dtype(np.uint8))
    f.create_dataset("timestamps/images/wrist", data=np.zeros(0, np.int64))


def clock_jump(f):
    ts = f["timestamps/joints"]
    ts[200:] = ts[200:] + CENTURY_NS


def test_nan_inf_and_an_empty_camera_are_held_back_naming_the_field(episode_factory, stores):
    good = episode_factory(episode_id="ep-bv-good", seed=70, duration_s=1.5)
    land(stores, good)
    names = {
        k: hostile(stores, good, f"ep-bv-{k}.h5", fn)
        for k, fn in (
            ("nan-joint", nan_joint),
            ("inf-joint", inf_joint),
            ("nan-actions", nan_actions),
            ("empty-camera", empty_camera),
        )
    }
    batch, pre, post = ingest(stores)
    reg = stores.registry
    q = {r["source_path"]: r for r in reg.quarantined(batch)}
    assert set(q) == set(names.values())
    assert {r["gate"] for r in q.values()} == {"finite_values", "min_frames"}
    assert q[names["nan-joint"]]["reason"] == "joint_states.position: 1 NaN (of 2100 values, first at row 5)"
    assert q[names["inf-joint"]]["reason"] == (
        "joint_states.velocity: 1 +inf (of 2100 values, first at row 7); "
        "joint_states.effort: 1 -inf (of 2100 values, first at row 9)"
    )
    assert q[names["nan-actions"]]["reason"] == "action.command: 600 NaN (all values, first at row 0)"
    assert q[names["empty-camera"]]["gate"] == "min_frames"
    assert q[names["empty-camera"]]["reason"] == "frames per camera {'wrist': 0} < 1"
    status = {e["source_path"]: e["status"] for e in reg.episodes(batch)}
    assert status == {good.path.name: TRANSCODED, **{n: REJECTED for n in names.values()}}
    assert (pre.gates["finite_values"].evaluated, pre.gates["finite_values"].failed) == (5, 3)
    assert (pre.gates["min_frames"].evaluated, pre.gates["min_frames"].failed) == (5, 1)
    assert post.processed == ["ep-bv-good"]
    assert sorted(p.name for p in stores.mcap_dir.glob("*.mcap")) == ["ep-bv-good.mcap"]

    # configurable like the other gates: flag instead of quarantine, then a stricter frame floor
    flag = GateConfig.from_mapping({"finite_values": {"action": "flag"}, "min_frames": False})
    inventory_batch(batch, stores, flag)
    transcode_batch(batch, stores, flag, settings=FAST, workers=2)
    rows = {e["source_path"]: e for e in reg.episodes(batch)}
    assert {k: r["status"] for k, r in rows.items()} == {n: TRANSCODED for n in [good.path.name, *names.values()]}
    assert {k for k, r in rows.items() if not r["quality_ok"]} == {
        names["nan-joint"],
        names["inf-joint"],
        names["nan-actions"],
    }
    assert reg.quarantined(batch) == []
    strict = GateConfig.from_mapping({"min_frames": {"params": {"min_frames": 1000}}})
    rep = inventory_batch(batch, stores, strict)
    assert rep.gates["min_frames"].failed == 5


def test_a_clock_jump_is_held_back_by_max_duration_and_bounded_work_with_the_gate_off(episode_factory, stores):
    good = episode_factory(episode_id="ep-cj-good", seed=71, duration_s=1.5)
    land(stores, good)
    jump = hostile(stores, good, "ep-cj-jump.h5", clock_jump)
    batch, _, _ = ingest(stores)
    (q,) = stores.registry.quarantined(batch)
    assert (q["source_path"], q["gate"], q["stage"]) == (jump, "max_duration", "pre")
    assert q["reason"].startswith(
        "timestamps span 3.15576e+09 s > 14400 s; largest step 3.15576e+09 s in joint_states at index 200"
    )
    assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {
        good.path.name: TRANSCODED,
        jump: REJECTED,
    }

    # The gate off: the transcode works through the samples, not the century between them (the
    # CPU limit turns a regression into a quarantine instead of a hung test).
    off = GateConfig.from_mapping({"max_duration": False})
    inventory_batch(batch, stores, off)
    post = transcode_batch(batch, stores, off, settings=replace(FAST, max_cpu_s=60), workers=2)
    assert post.quarantined == [] and post.processed == ["ep-cj-jump"]
    with EpisodeReader(stores.mcap_dir / "ep-cj-jump.mcap") as r:
        joints = r.read_streams(["joint_states"], 0, 2**63 - 1)["joint_states"].timestamps_ns
    with h5py.File(stores.landing.root / jump) as f:
        assert np.array_equal(joints, f["timestamps/joints"][()])


def test_an_attribute_too_large_for_the_registry_is_held_back_naming_it_on_both_backends(episode_factory, stores):
    good = episode_factory(episode_id="ep-big-good", seed=72, duration_s=1.5)
    land(stores, good)
    huge = hostile(stores, good, "ep-big-task.h5", lambda f: f.attrs.__setitem__("task", "x" * 10_000_000))
    batch, _, post = ingest(stores)
    q = {r["source_path"]: r for r in stores.registry.quarantined(batch)}
    assert set(q) == {huge}
    assert (q[huge]["gate"], q[huge]["stage"], q[huge]["stream"]) == ("readable", "pre", "task")
    assert q[huge]["reason"] == "attribute 'task': 10000000 characters, the registry stores at most 256"
    assert q[huge]["episode_id"] == "ep-big-task"
    assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {good.path.name: TRANSCODED}
    assert post.processed == ["ep-big-good"]


def test_the_new_gates_are_asset_checks_of_a_real_run(home):
    good = home / "landing" / "2026-11-29" / "ep-g0.h5"
    for name, edit in (("ep-nan.h5", nan_actions), ("ep-nocam.h5", empty_camera)):
        hostile(good.parent, good, name, edit)
    res = resources(home, units_on="process")
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        result = materialize(ASSETS[:1], instance=instance, partition_key=req.partition_key, resources=res)
        assert result.success
        c = checks(result)
        assert {g for a, g in c if a == "raw_episodes"} >= {"finite_values", "min_frames", "max_duration"}
        finite, frames = c[("raw_episodes", "finite_values")], c[("raw_episodes", "min_frames")]
        assert not finite.passed and finite.metadata["failed"].value == 1
        assert finite.metadata["failures"].value[0]["path"] == "2026-11-29/ep-nan.h5"
        assert not frames.passed and frames.metadata["failed"].value == 1
        assert c[("raw_episodes", "max_duration")].passed
        raw = md(result, "raw_episodes", req.partition_key)
        assert raw["quarantined"] == 3  # the truncated file, the NaN actions, the empty camera
