"""The training-stream backfill on local stores, on each registry backend: current episodes are not
read, a damaged MCAP fails only its own episode, and a second run finds everything current."""

from __future__ import annotations

import errno
import os
import signal

from dyna_resources.catalog.registry import TRANSCODED
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.read_profile import stream_token
from dyna_resources.episodes.training_streams import TrainingStreamSpec
from dyna_resources.ingest import training_backfill
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.partitions import UnitJob, ingest_partition
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.ingest.training_backfill import backfill_partition

from .conftest import FAST, land

SPEC = TrainingStreamSpec("t32", 32, 32, gop_frames=15, preset="veryfast")


def test_a_damaged_mcap_fails_only_its_episode_and_current_ones_are_not_read(stores, episode_factory):
    for i in range(3):
        land(stores, episode_factory(episode_id=f"ep-tb{i}", seed=760 + i, duration_s=2.0), f"d/ep-tb{i}.h5")
    settings = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)
    (partition,) = landing_tick(LandingCursor(), stores.landing, stores.registry, settings).sealed
    ingest_partition(partition.key, UnitJob("pre", stores, GateConfig()))
    ingest_partition(partition.key, UnitJob("post", stores, GateConfig(), settings=FAST, workers=2))
    rows = {r["episode_id"]: r for r in stores.registry.partition_episodes(partition.key)}
    assert all(r["status"] == TRANSCODED for r in rows.values())
    damaged = rows["ep-tb2"]["mcap_path"]
    with open(damaged, "r+b") as f:  # its summary and footer cut off
        f.truncate(f.seek(0, 2) // 2)

    rep = backfill_partition(partition.key, stores, [SPEC], workers=2)
    assert sorted(rep.added) == ["ep-tb0", "ep-tb1"] and list(rep.failed) == ["ep-tb2"]
    assert damaged in rep.failed["ep-tb2"]  # named with its file and the reason
    assert rep.bytes_added > 0
    token = stream_token(SPEC)
    after = {r["episode_id"]: r for r in stores.registry.partition_episodes(partition.key)}
    for e in ("ep-tb0", "ep-tb1"):
        assert after[e]["training_streams"] == token
        with EpisodeReader(after[e]["mcap_path"]) as r:
            assert r.training_streams == {"t32": r.cameras}
    assert (
        after["ep-tb2"]["training_streams"] is None
        and after["ep-tb2"]["mcap_version"] == rows["ep-tb2"]["mcap_version"]
    )

    again = backfill_partition(partition.key, stores, [SPEC], workers=2)
    assert sorted(again.current) == ["ep-tb0", "ep-tb1"] and again.added == [] and list(again.failed) == ["ep-tb2"]
    # a second stream joins the first: both recorded, the first kept as it was
    wide = TrainingStreamSpec("t48", 48, 48, gop_frames=15, preset="veryfast")
    both = backfill_partition(partition.key, stores, [SPEC, wide], workers=1)
    assert sorted(both.added) == ["ep-tb0", "ep-tb1"]
    row = stores.registry.episode_by_id("ep-tb0")
    assert row["training_streams"] == ",".join(sorted([token, stream_token(wide)]))


def _transcoded(stores, episode_factory, ids: list[str], seed: int) -> str:
    for i, e in enumerate(ids):
        land(stores, episode_factory(episode_id=e, seed=seed + i, duration_s=1.5), f"d/{e}.h5")
    settings = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)
    (partition,) = landing_tick(LandingCursor(), stores.landing, stores.registry, settings).sealed
    ingest_partition(partition.key, UnitJob("pre", stores, GateConfig()))
    ingest_partition(partition.key, UnitJob("post", stores, GateConfig(), settings=FAST, workers=2))
    return partition.key


def test_machine_faults_are_tried_again_and_left_pending_not_failed(stores, episode_factory, monkeypatch, tmp_path):
    """A worker killed once is tried again and its episode gets the streams; a full disk on every attempt
    leaves the episode pending (not failed: nothing is its file's fault), its row untouched."""
    key = _transcoded(stores, episode_factory, ["ep-mf0", "ep-mf1", "ep-mf2"], 790)
    before = {r["episode_id"]: r for r in stores.registry.partition_episodes(key)}
    killed = tmp_path / "killed-once"
    real = training_backfill.add_training_streams

    def faulty(src, dst, specs):  # runs in the forked worker
        if "ep-mf0" in str(dst) and not killed.exists():
            killed.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        if "ep-mf1" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, specs)

    monkeypatch.setattr(training_backfill, "add_training_streams", faulty)
    rep = backfill_partition(key, stores, [SPEC], workers=2)
    assert killed.exists() and sorted(rep.added) == ["ep-mf0", "ep-mf2"]
    assert rep.failed == {} and list(rep.pending) == ["ep-mf1"] and "No space left on device" in rep.pending["ep-mf1"]
    row = stores.registry.episode_by_id("ep-mf1")
    assert row["training_streams"] is None and row["mcap_version"] == before["ep-mf1"]["mcap_version"]

    monkeypatch.setattr(training_backfill, "add_training_streams", real)  # the disk freed: the next run mends it
    healed = backfill_partition(key, stores, [SPEC], workers=2)
    assert healed.added == ["ep-mf1"] and sorted(healed.current) == ["ep-mf0", "ep-mf2"] and healed.pending == {}
