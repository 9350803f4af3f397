"""One file never blocks its batch, on both registry backends: whatever a file makes the reader,
the gates or the transcode raise, and even a file that kills its worker process, is quarantined
with its reason; the files after it are inspected and transcoded, and every outcome is recorded as
its episode finishes (no MCAP in place without its registry row), on the first run and on reruns.

The hostile files are good generated episodes edited with h5py. Some raise outside the reader's
typed errors today (ZeroDivisionError, ValueError); a stricter reader turns them into EpisodeErrors.
The assertions hold either way: the file is held back, named, with a reason.
"""

import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np

from dyna_resources.catalog.registry import TRANSCODED
from dyna_resources.episodes.raw_format import decode_jpeg, encode_jpeg
from dyna_resources.ingest.batches import inventory_batch, transcode_batch
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick

from .conftest import FAST

ALL_IN_ONE = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)


def hostile(stores, good, name: str, edit=None) -> str:
    """A copy of a good episode landed as ``name`` with its own episode id, edited by ``edit(h5)``."""
    path = stores.landing.root / name
    shutil.copyfile(good.path, path)
    with h5py.File(path, "a") as f:
        f.attrs["episode_id"] = Path(name).stem
        if edit:
            edit(f)
    return name


def recorder_rate(rate_hz):
    """An ALOHA recording (no /timestamps: every stream at rate_hz from started_at)."""

    def edit(f):
        del f["timestamps"]
        f.attrs["rate_hz"] = rate_hz

    return edit


def started(text):
    def edit(f):
        del f["timestamps"]
        f.attrs["started_at"] = text

    return edit


def success_array(f):
    f.attrs["success"] = np.array([1, 0, 1])


def frames(width: int, height: int, seed: int = 0):
    """Replace the wrist camera's frames with noise pictures of another size."""
    rng = np.random.default_rng(seed)
    pictures = [encode_jpeg(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), 50) for _ in range(4)]

    def edit(f):
        ds = f["observations/images/wrist"]
        for i in range(ds.shape[0]):
            ds[i] = np.frombuffer(pictures[i % len(pictures)], np.uint8)

    return edit


def rotten_frame(index: int):
    """The wrist camera as raw RGB frames (ALOHA's uncompressed layout), one gzip chunk per frame,
    with frame ``index``'s chunk overwritten on disk: bit rot that only reading that frame finds."""

    def edit(f):
        ds = f["observations/images/wrist"]
        rgb = np.stack([decode_jpeg(ds[i].tobytes(), f.filename, "wrist", i) for i in range(ds.shape[0])])
        del f["observations/images/wrist"]
        new = f.create_dataset("observations/images/wrist", data=rgb, chunks=(1, *rgb.shape[1:]), compression="gzip")
        info = new.id.get_chunk_info(index)
        f.flush()
        with open(f.filename, "r+b") as raw:
            raw.seek(info.byte_offset)
            raw.write(b"\xff" * info.size)

    return edit


def ingest(stores, batch, settings=FAST):
    gates = GateConfig()
    return inventory_batch(batch, stores, gates), transcode_batch(batch, stores, gates, settings=settings, workers=2)


def one_batch(stores) -> str:
    (batch,) = landing_tick(LandingCursor(), stores.landing, stores.registry, ALL_IN_ONE).created
    return batch.key


def assert_every_output_has_its_outcome(stores, batch):
    rows = stores.registry.episodes(batch)
    transcoded = sorted(f"{e['episode_id']}.mcap" for e in rows if e["status"] == TRANSCODED)
    assert sorted(p.name for p in stores.mcap_dir.glob("*.mcap")) == transcoded
    assert not list(stores.mcap_dir.glob(".*.tmp"))
    posts = {r["source_path"] for r in stores.registry.gate_results(batch, "post")}
    assert {e["source_path"] for e in rows if e["status"] == TRANSCODED} <= posts


def test_files_that_raise_anything_are_quarantined_and_the_rest_of_the_batch_lands(episode_factory, stores):
    good = episode_factory(episode_id="ep-bf-good", seed=80, duration_s=1.5)
    bad = {
        hostile(stores, good, "a-rate-zero.h5", recorder_rate(0.0)): "pre",
        hostile(stores, good, "b-yesterday.h5", started("yesterday")): "pre",
        hostile(stores, good, "c-success-array.h5", success_array): "pre",
        hostile(stores, good, "d-rotten-chunk.h5", rotten_frame(2)): None,  # not a sampled frame: past the pre gates
    }
    goods = [hostile(stores, good, f"e-good-{i}.h5") for i in range(4)]  # after the bad ones, in batch order
    batch = one_batch(stores)
    pre, post = ingest(stores, batch)
    reg = stores.registry

    q = {r["source_path"]: r for r in reg.quarantined(batch)}
    assert set(q) == set(bad)
    for name, stage in bad.items():
        assert q[name]["reason"], name
        assert stage is None or q[name]["stage"] == stage, (name, q[name])
    assert q["d-rotten-chunk.h5"]["stage"] == "transcode" and "read" in q["d-rotten-chunk.h5"]["reason"]
    assert {e["source_path"]: e["status"] for e in reg.episodes(batch) if e["status"] == TRANSCODED} == {
        g: TRANSCODED for g in goods
    }
    assert sorted(post.processed) == [f"e-good-{i}" for i in range(4)]
    assert {r["path"] for r in pre.quarantined + post.quarantined} == set(bad)
    assert_every_output_has_its_outcome(stores, batch)

    # a rerun is not blocked either, and redoes nothing
    before = reg.counts()
    _, post2 = ingest(stores, batch)
    assert reg.counts() == before and post2.processed == [] and sorted(post2.skipped) == sorted(post.processed)
    assert {r["source_path"] for r in reg.quarantined(batch)} == set(bad)


def test_a_file_that_kills_its_worker_is_quarantined_naming_it_and_the_others_land(episode_factory, stores):
    """A file that takes far more CPU than the per-episode limit (1080p noise pictures: ~13 s of
    encoding here): the kernel ends its worker with SIGXCPU; that episode is quarantined with how
    its worker died, the others are transcoded and recorded."""
    good = episode_factory(episode_id="ep-kill-good", seed=81, duration_s=1.5)
    bomb = hostile(stores, good, "a-bomb.h5", frames(1920, 1080))
    goods = [hostile(stores, good, f"b-good-{i}.h5") for i in range(3)]
    batch = one_batch(stores)
    pre, post = ingest(stores, batch, settings=replace(FAST, max_cpu_s=2))
    assert pre.quarantined == []
    ((q),) = stores.registry.quarantined(batch)
    assert (q["source_path"], q["episode_id"], q["stage"], q["gate"]) == (bomb, "a-bomb", "transcode", "transcode")
    assert q["reason"] == "the worker process died (SIGXCPU: over its CPU time limit of 2 s)"
    assert [r["path"] for r in post.quarantined] == [bomb]
    statuses = {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)}
    assert statuses == {bomb: "quarantined", **{g: TRANSCODED for g in goods}}
    assert sorted(post.processed) == [f"b-good-{i}" for i in range(3)]
    assert_every_output_has_its_outcome(stores, batch)


def one_column_qpos(f):
    """ALOHA-like joint states whose /observations/qpos was written 1-D beside 7-column qvel/effort."""
    n = f["observations/qpos"].shape[0]
    qpos = f["observations/qpos"][:, 0]
    del f["observations/qpos"]
    f["observations/qpos"] = qpos
    assert f["observations/qvel"].shape[1] != 1 and f["observations/qvel"].shape[0] == n


def test_joint_state_fields_that_disagree_on_the_joints_are_quarantined_naming_both(episode_factory, stores):
    good = episode_factory(episode_id="ep-cols-good", seed=82, duration_s=1.5)
    bad = hostile(stores, good, "a-one-column-qpos.h5", one_column_qpos)
    fine = hostile(stores, good, "b-fine.h5")
    batch = one_batch(stores)
    pre, post = ingest(stores, batch)
    (q,) = stores.registry.quarantined(batch)
    assert (q["source_path"], q["stage"], q["stream"]) == (bad, "pre", "observations/qvel")
    assert q["reason"].endswith(
        "7 column(s) in /observations/qvel, 1 in /observations/qpos: the joint_states "
        "fields must describe the same joints"
    ), q["reason"]
    assert [e["source_path"] for e in stores.registry.episodes(batch) if e["status"] == TRANSCODED] == [fine]
