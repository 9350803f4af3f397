"""One read profile, end to end, on an ephemeral Dagster instance: the deployment's one setting chooses the
training streams transcode writes and the backfill adds, what prewarm warms and what the trainer reads; a
manifest whose episodes lack the stream is refused before training, naming them and the backfill."""

import os
import shutil
import signal

import pyarrow as pa
from dagster import DagsterInstance, materialize

from dyna_assets.definitions import defs
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.read_profile import stream_token
from dyna_resources.ingest import training_backfill
from dyna_resources.ingest.faults import WORKER_DEATH_ATTEMPTS
from dyna_resources.resources import (
    CacheResource,
    HomeResource,
    IngestResource,
    TrainerResource,
    WarehouseResource,
)
from tests.dyna_assets.test_ingest_graph import md, resources, tick

PROFILES = """\
t32:
  training_streams: [{name: t32, height: 32, width: 32, gop_frames: 15, preset: veryfast}]
  read_stream: t32
  output_size: [32, 32]
t32-short:  # the same stream name, shorter GOPs: another stream to the registry
  training_streams: [{name: t32, height: 32, width: 32, gop_frames: 5, preset: veryfast}]
  read_stream: t32
  output_size: [32, 32]
"""
SPEC = "name: all\nwhere: {}\nsegments: {length_s: 1.0, stride_s: 1.0}\n"


def assets(*names):
    return [defs.get_assets_def(n) for n in names]


def deployment(res: dict, root, profile: str) -> dict:
    """The test's resources with the home's read profile set to ``profile``, as DYNA_READ_PROFILE does."""
    home = HomeResource(root=str(root), read_profile=profile)
    ingest = IngestResource(**{**res["ingest"]._get_non_default_public_field_values(), "home": home})
    return {
        **res,
        "home": home,
        "ingest": ingest,
        "warehouse": WarehouseResource(home=home),
        "cache": CacheResource(home=home, page_mb=0.25),
        "trainer": TrainerResource(nproc_per_node=1, max_restarts=0, steps=2, batch_size=2, workers=0),
    }


def land(root, episode_factory, prefix: str, seed: int, duration_s: float, **kw) -> dict:
    """Two episodes ``ep-<prefix>0``, ``ep-<prefix>1`` in the landing zone of home ``root``; its resources."""
    landing = root / "landing" / "2026-12-01"
    landing.mkdir(parents=True)
    for i in range(2):
        ep = episode_factory(episode_id=f"ep-{prefix}{i}", seed=seed + i, duration_s=duration_s)
        shutil.copyfile(ep.path, landing / f"{prefix}{i}.h5")
    return resources(root, units_on="process", **kw)


def ingest(instance, res: dict) -> str:
    """The landing tick's one partition, ingested (raw_episodes, mcap_episodes); its key."""
    (key,) = [r.partition_key for r in tick(instance, res).run_requests]
    assert materialize(
        assets("raw_episodes", "mcap_episodes"), instance=instance, partition_key=key, resources=res
    ).success
    return key


def archive_payloads(path) -> dict:
    with EpisodeReader(path) as r:
        return {cam: [au for _, au in r.iter_video(cam)] for cam in r.cameras}


def test_one_setting_chooses_the_streams_of_transcode_backfill_prewarm_and_trainer(tmp_path, episode_factory):
    root = tmp_path / "home"
    base = land(root, episode_factory, "r", 300, 3.0)
    archive = deployment(base, root, "archive")
    with DagsterInstance.ephemeral() as instance:
        key = ingest(instance, archive)
        registry = archive["ingest"].stores().registry
        rows = {r["episode_id"]: r for r in registry.partition_episodes(key)}
        assert sorted(rows) == ["ep-r0", "ep-r1"] and all(r["training_streams"] is None for r in rows.values())
        before = {e: archive_payloads(r["mcap_path"]) for e, r in rows.items()}

        # The deployment switches to t32 (one setting): the backfill adds the stream, the archive untouched.
        (root / "read_profiles.yaml").write_text(PROFILES)
        t32 = deployment(base, root, "t32")
        profile = t32["home"].profile()
        token = stream_token(profile.stream("t32"))
        done = materialize(assets("training_streams"), instance=instance, partition_key=key, resources=t32)
        assert done.success
        meta = md(done, "training_streams", key)
        assert (meta["this_run_added"], meta["episodes_current"], meta["streams"]) == (2, 0, token)
        after = {r["episode_id"]: r for r in registry.partition_episodes(key)}
        for e, r in after.items():
            assert r["training_streams"] == token
            assert r["mcap_version"] != rows[e]["mcap_version"] and r["mcap_bytes"] > rows[e]["mcap_bytes"]
            assert archive_payloads(r["mcap_path"]) == before[e]  # every archive access unit as it was
            with EpisodeReader(r["mcap_path"]) as reader:
                assert reader.training_streams == {"t32": reader.cameras}
        again = materialize(assets("training_streams"), instance=instance, partition_key=key, resources=t32)
        assert md(again, "training_streams", key)["this_run_added"] == 0
        assert md(again, "training_streams", key)["episodes_current"] == 2

        # Transcode writes what the profile declares; prewarm warms its stream; the trainer reads it.
        assert t32["transcode"].settings(profile).training_streams == profile.training_streams
        read_set = t32["cache"].read_set()
        assert (read_set.video_stream, read_set.groups) == ("t32", ("cameras", "proprio"))

        # The manifest carries each episode's streams; the run reads t32 at 32 x 32 and records the profile.
        t32["home"].home().curation_spec("all").write_text(SPEC)
        instance.add_dynamic_partitions("curation_specs", ["all"])
        assert materialize(assets("warehouse_episodes"), instance=instance, resources=t32).success
        assert materialize(assets("manifests"), instance=instance, partition_key="all", resources=t32).success
        with pa.memory_map(t32["home"].manifest_arrow_url("all").removeprefix("file://")) as f:
            manifest = pa.ipc.open_file(f).read_all()
        assert set(manifest.column("training_streams").cast(pa.string()).to_pylist()) == {token}
        cfg = t32["trainer"].prepare(t32["home"], t32["cache"], "all").config
        assert cfg["sample"]["stream"] == "t32" and cfg["sample"]["image_size"] == [32, 32]
        assert cfg["lineage"]["read_profile"] == {"name": "t32", "digest": profile.digest}

        # Another GOP under the same name is another stream: refused before training, naming what to do.
        short = deployment(base, root, "t32-short")
        refused = materialize(
            assets("checkpoints"), instance=instance, partition_key="all", resources=short, raise_on_error=False
        )
        assert not refused.success
        (failure,) = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.event_specific_data.error.message
        token_short = stream_token(short["home"].profile().stream("t32"))
        assert f"2 episode(s) lack training stream {token_short}" in message
        assert "ep-r0, ep-r1" in message and "'training_streams'" in message and key in message
        # the backfill mends it: the stream is replaced, the archive still untouched
        assert materialize(assets("training_streams"), instance=instance, partition_key=key, resources=short).success
        mended = {r["episode_id"]: r for r in registry.partition_episodes(key)}
        assert {r["training_streams"] for r in mended.values()} == {token_short}
        assert all(archive_payloads(r["mcap_path"]) == before[e] for e, r in mended.items())


def test_a_killed_backfill_worker_retries_the_step_after_a_back_off_and_fails_nothing(
    tmp_path, episode_factory, monkeypatch
):
    """A backfill worker killed on every attempt (out of memory, a signal) is the machine's fault, not the
    episode's: the step is retried after the back-off (the ingest's ``infra_retries``), and heals."""
    root = tmp_path / "home"
    base = land(root, episode_factory, "k", 340, 1.5, infra_retries=1)
    archive = deployment(base, root, "archive")
    with DagsterInstance.ephemeral() as instance:
        key = ingest(instance, archive)
        (root / "read_profiles.yaml").write_text(PROFILES)
        t32 = deployment(base, root, "t32")
        deaths = tmp_path / "deaths"
        real = training_backfill.add_training_streams

        def killed(src, dst, specs):  # in the forked worker: ep-k0's dies on each attempt of the first step
            if "ep-k0" in str(dst) and len(deaths.read_text() if deaths.exists() else "") < WORKER_DEATH_ATTEMPTS:
                with open(deaths, "a") as f:
                    f.write("x")
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst, specs)

        monkeypatch.setattr(training_backfill, "add_training_streams", killed)
        run = materialize(assets("training_streams"), instance=instance, partition_key=key, resources=t32)
        assert run.success and deaths.read_text() == "x" * WORKER_DEATH_ATTEMPTS
        kinds = [e.event_type_value for e in run.all_events]
        assert kinds.count("STEP_UP_FOR_RETRY") == 1 and "STEP_FAILURE" not in kinds
        token = stream_token(t32["home"].profile().stream("t32"))
        rows = archive["ingest"].stores().registry.partition_episodes(key)
        assert {r["training_streams"] for r in rows} == {token}
