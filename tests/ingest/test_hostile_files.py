"""Hostile, damaged and ALOHA-recorder files in one landing batch, through the real engines
(landing tick, inventory_batch, transcode_batch) and a real registry (SQLite, then PostgreSQL):
each bad file quarantined with its reason while the rest of the batch lands, every file with an
outcome, nothing outside the landing zone ever opened."""

import shutil

import h5py
import numpy as np
import pytest

from dyna_resources.catalog.registry import TRANSCODED
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.sim.aloha import ALOHA_CAMERAS, write_aloha_episode
from dyna_resources.ingest.batches import inventory_batch, transcode_batch
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from tests.conftest import small_spec
from tests.hostile_files import REACH_OUT, FileWatch, make_reach_out

from .conftest import FAST, land

ALL_IN_ONE = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)
OUTSIDE_VALUE = 1234.5678  # what the outside files hold (tests/hostile_files.py)


@pytest.fixture(scope="module")
def aloha_recordings(tmp_path_factory):
    """Two recorder files of one scripted session: padded JPEG + /compress_len (recorder order), raw RGB."""
    root = tmp_path_factory.mktemp("aloha")
    spec = small_spec("aloha", seed=93, duration_s=1.1, width=64, height=48)
    return {
        name: write_aloha_episode(spec, root / name, compress=(name == "episode_0.hdf5"))
        for name in ("episode_0.hdf5", "episode_1.hdf5")
    }


def _edit_attrs(path, **attrs):
    with h5py.File(path, "a") as f:
        for k, v in attrs.items():
            f.attrs[k] = v


def test_hostile_and_recorder_files_in_one_batch(episode_factory, aloha_recordings, stores, tmp_path):
    root = stores.landing.root
    good = episode_factory(episode_id="ep-hf-good", seed=71, duration_s=2.0)
    land(stores, good, "fleet/ep-hf-good.h5")
    land(
        stores,
        episode_factory(episode_id="ep-hf-odd", seed=72, duration_s=1.5, width=161, height=121),
        "fleet/ep-hf-odd.h5",
    )
    for folder in ("aloha", "hostile", "bad"):
        (root / folder).mkdir()
    for name, rec in aloha_recordings.items():
        shutil.copyfile(rec.path, root / "aloha" / name)

    # reaching outside: each dataset points at files outside the landing zone
    outside, expect = [], {}
    for kind in sorted(REACH_OUT):
        key = f"hostile/{kind}.h5"
        outside += make_reach_out(kind, good.path, root / key, tmp_path / "outside", episode_id=f"ep-hf-{kind}")
        expect[key] = (REACH_OUT[kind], REACH_OUT[kind])
    # attribute surprises (ValueError / ZeroDivisionError before) and a garbled file
    aloha_padded = aloha_recordings["episode_0.hdf5"].path
    for key, attr, value, words in (
        ("bad/started_at.hdf5", "started_at", "yesterday", "'yesterday'"),
        ("bad/rate_hz.hdf5", "rate_hz", 0, "got 0"),
        ("bad/success.hdf5", "success", np.array([True, False]), "shape (2,)"),
    ):
        shutil.copyfile(aloha_padded, root / key)
        _edit_attrs(root / key, **{attr: value})
        expect[key] = (attr, words)
    data = aloha_padded.read_bytes()
    (root / "bad/cut.hdf5").write_bytes(data[: len(data) * 9 // 10])
    expect["bad/cut.hdf5"] = (None, "truncated")

    plan = landing_tick(LandingCursor(), stores.landing, stores.registry, ALL_IN_ONE)
    (batch,) = [b.key for b in plan.created]
    with FileWatch(*outside) as watch:
        pre = inventory_batch(batch, stores, GateConfig())
        post = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
        assert not watch.touched(), "a file outside the landing zone was opened during the ingest"
        for p in outside:
            p.read_bytes()
        assert watch.touched()  # the watch works

    reg = stores.registry
    status = {
        e["source_path"]: (e["episode_id"], e["status"]) for e in reg.episodes(batch) if e["status"] == TRANSCODED
    }
    assert status == {
        "fleet/ep-hf-good.h5": ("ep-hf-good", TRANSCODED),
        "fleet/ep-hf-odd.h5": ("ep-hf-odd", TRANSCODED),
        "aloha/episode_0.hdf5": ("episode_0", TRANSCODED),
        "aloha/episode_1.hdf5": ("episode_1", TRANSCODED),
    }
    q = {r["source_path"]: r for r in reg.quarantined(batch)}
    assert set(q) == set(expect)
    for key, (stream, words) in expect.items():
        assert (q[key]["gate"], q[key]["stage"]) == ("readable", "pre"), q[key]
        assert q[key]["stream"] == stream and words in q[key]["reason"], q[key]
    for kind in REACH_OUT:  # the reason names the dataset
        assert REACH_OUT[kind] in q[f"hostile/{kind}.h5"]["reason"]
    # every landed file has an outcome, recorded in the registry
    landed = {f.path for f in reg.batch_files(batch)}
    assert landed == set(status) | set(q) and len(pre.processed) == len(landed)
    assert sorted(post.processed) == sorted(eid for eid, _ in status.values())

    by_path = {e["source_path"]: e for e in reg.episodes(batch)}
    for key, rec in aloha_recordings.items():
        e = by_path[f"aloha/{key}"]
        assert (e["n_steps"], e["n_frames"]) == (rec.steps, 4 * rec.steps)
        with EpisodeReader(e["mcap_path"]) as r:
            assert sorted(r.cameras) == sorted(ALOHA_CAMERAS)
            for cam in ALOHA_CAMERAS:  # each camera's own pictures, whatever the row order of /compress_len
                frames = r.read_frames([cam], [r.start_ns + 20 * 20_000_000])[cam]
                own = np.abs(frames.images[0].astype(int) - rec.render_frame(cam, 20)).mean()
                assert own < 14, (key, cam, own)
    with EpisodeReader(by_path["fleet/ep-hf-odd.h5"]["mcap_path"]) as r:
        cam = r.cameras[0]
        frames = r.read_frames([cam], [r.start_ns + 500_000_000], tolerance_ns=10**9)[cam]
        assert frames.images.shape[1:] == (120, 160, 3)  # 161x121 lost its last column and row
    # no outside value reached an MCAP
    for e in status:
        with EpisodeReader(by_path[e]["mcap_path"]) as r:
            for s in r.read_streams(None, r.start_ns, r.end_ns).values():
                assert not any(np.isclose(np.asarray(a, float), OUTSIDE_VALUE).any() for a in s.fields.values())
