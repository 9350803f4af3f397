"""ROS 2 bags landing whole beside legacy HDF5 episodes, through the landing sensor and the ingest assets on a
real (ephemeral) Dagster instance: bags in both storages, one split into several episodes, hostile ones
quarantined naming the bag and the topic, a bag without its metadata.yaml left alone until it appears."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, materialize
from mcap.reader import NonSeekingReader, make_reader

from dyna_resources import cli
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.sources.content import content_sha256
from tests.sources.bags import BagSpec, topic_map_yaml, write_bag

from .test_ingest_graph import ASSETS, md, resources, tick

SPEC = BagSpec(duration_s=2.0, depth=(("wrist_depth", "16UC1"),))  # the topic map's topics (depth: optional)


def land(home: Path, episode_factory) -> Path:
    landing = home / "landing" / "2026-12-07"
    landing.mkdir(parents=True)
    for i in range(2):
        g = episode_factory(episode_id=f"ep-h5-{i}", seed=400 + i, duration_s=2.0)
        shutil.copyfile(g.path, landing / f"ep-h5-{i}.h5")
    write_bag(landing / "bag-mcap", BagSpec(duration_s=2.0, custom_data={"task": "stack", "robot_id": "arm-7"}))
    write_bag(landing / "bag-sqlite", BagSpec(duration_s=2.0, storage="sqlite3"))
    write_bag(landing / "bag-split", BagSpec(duration_s=4.5, pauses=(1.5, 3.0)))  # 5 s pauses: 3 episodes
    write_bag(landing / "bag-h264", BagSpec(duration_s=2.0, h264_camera="wrist", h264_gop=20))  # copied (GOP <= 30)
    write_bag(landing / "bag-depth", BagSpec(duration_s=2.0, depth=SPEC.depth))
    write_bag(landing / "bag-garbled", BagSpec(duration_s=2.0, garble=("/joint_states", 17)))
    write_bag(landing / "bag-unmapped", BagSpec(duration_s=2.0, extra_topics=("/diagnostics",)))
    # its mapped wrist camera topic carries std_msgs/String, not an image
    write_bag(
        landing / "bag-wrong-type", BagSpec(cameras=("scene_left",), extra_topics=("/camera/wrist/image/compressed",))
    )
    write_bag(landing / "bag-truncated", BagSpec(duration_s=2.0))
    (storage,) = (landing / "bag-truncated").glob("*.mcap")
    with open(storage, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    write_bag(landing / "zz-recording", BagSpec(duration_s=2.0))  # still being recorded: no metadata.yaml yet
    (landing / "zz-recording" / "metadata.yaml").rename(home / "recording-metadata.yaml")
    (home / "ros2_topics.yaml").write_text(
        yaml.safe_dump(topic_map_yaml(SPEC, unmapped="refuse", split={"rule": "gap", "gap_s": 2.0}))
    )
    return landing


def ingest_once(home: Path):
    """One tick of the landing sensor and the partition it asks for materialized: (the registry, its key)."""
    res = resources(home, target_bytes=1 << 40, partition_bytes=1 << 40)
    registry = res["ingest"].stores().registry
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        assert materialize(ASSETS, instance=instance, partition_key=req.partition_key, resources=res).success
    return registry, req.partition_key


def test_bags_land_whole_split_into_episodes_and_hostile_ones_are_named(tmp_path, episode_factory, monkeypatch, capsys):
    home = tmp_path / "home"
    landing = land(home, episode_factory)
    res = resources(home, target_bytes=1 << 40, partition_bytes=1 << 40)
    registry = res["ingest"].stores().registry
    with DagsterInstance.ephemeral() as instance:
        first = tick(instance, res)
        (req,) = first.run_requests
        landed = {f.path: f for f in registry.batch_files([u.key for u in registry.partition_units(req.partition_key)])}
        bag = "2026-12-07/bag-mcap/metadata.yaml"
        assert sorted(landed) == sorted(
            [f"2026-12-07/ep-h5-{i}.h5" for i in range(2)]
            + [
                f"2026-12-07/bag-{n}/metadata.yaml"
                for n in ("mcap", "sqlite", "split", "h264", "depth", "garbled", "unmapped", "wrong-type", "truncated")
            ]
        )  # the recording without metadata.yaml is not landed
        assert landed[bag].bytes == sum(p.stat().st_size for p in (landing / "bag-mcap").iterdir())

        result = materialize(ASSETS, instance=instance, partition_key=req.partition_key, resources=res)
        assert result.success
        m = md(result, "mcap_episodes", req.partition_key)
        eps = {e["episode_id"]: e for e in registry.partition_episodes(req.partition_key)}
        split = [f"bag-split-{k:03d}" for k in range(3)]
        assert sorted(eps) == sorted(["ep-h5-0", "ep-h5-1", "bag-mcap", "bag-sqlite", "bag-h264", "bag-depth", *split])
        assert all(e["status"] == "transcoded" for e in eps.values()) and m["episodes"] == 9
        # lineage: format, where the item is, its content hash; a split bag's episodes share its bag
        assert eps["ep-h5-0"]["source_format"] == "hdf5"
        assert eps["ep-h5-0"]["source_uri"] == (landing / "ep-h5-0.h5").resolve().as_uri()
        assert eps["bag-mcap"]["source_format"] == eps["bag-sqlite"]["source_format"] == "ros2"
        assert eps["bag-mcap"]["source_uri"] == (landing / "bag-mcap").resolve().as_uri() + "/"
        assert eps["bag-mcap"]["source_sha256"] == content_sha256(landing / "bag-mcap")
        assert (eps["bag-mcap"]["task"], eps["bag-mcap"]["robot_id"]) == ("stack", "arm-7")
        assert json.loads(eps["bag-depth"]["stream_layout"]) == {
            "cameras": ["scene_left", "wrist"],
            "streams": {"action": {"command": 7}, "joint_states": {"position": 6, "velocity": 6}},
        }
        for eid in split:
            assert eps[eid]["source_path"] == f"2026-12-07/bag-split/metadata.yaml#{eid}"
            assert eps[eid]["source_uri"] == (landing / "bag-split").resolve().as_uri() + f"/#{eid}"
        assert sum(eps[e]["source_bytes"] for e in split) == landed["2026-12-07/bag-split/metadata.yaml"].bytes
        assert [eps[e]["start_ns"] < eps[n]["start_ns"] for e, n in zip(split, split[1:])] == [True, True]
        windows = [json.loads(eps[e]["source_window"])["log_ns"] for e in split]  # what each transcode read
        assert [a[1] <= b[0] for a, b in zip(windows, windows[1:])] == [True, True]
        # each MCAP passes the outside checks of an HDF5-sourced one and says where it came from
        for eid in ("bag-mcap", "bag-sqlite", "bag-h264", "bag-depth", *split):
            path = eps[eid]["mcap_path"]
            with open(path, "rb") as f:
                n = sum(1 for _ in make_reader(f, validate_crcs=True).iter_messages())
            with open(path, "rb") as f:
                assert sum(1 for _ in NonSeekingReader(f, validate_crcs=True).iter_messages()) == n > 0
            with EpisodeReader(path) as r:
                assert r.metadata()["source_format"] == "ros2" and sorted(r.cameras) == ["scene_left", "wrist"]
        assert [eps[e]["n_steps"] for e in split] == [75, 75, 75]  # 1.5 s of 50 Hz joint states each
        with EpisodeReader(eps["bag-h264"]["mcap_path"]) as r:  # the bag's H.264 as it was: copied
            stats = json.loads(r.metadata("dyna.stats")["cameras"])
            assert stats["wrist"]["copied"] and not stats["scene_left"]["copied"]
        with EpisodeReader(eps["bag-depth"]["mcap_path"]) as r:
            assert r.depth == ["wrist_depth"] and len(list(r.iter_depth("wrist_depth"))) == 20

        # the hostile bags, each quarantined naming its bag and the topic at fault; nothing else lost
        held = {
            q["source_path"].split("/")[1]: q
            for q in registry.quarantined([u.key for u in registry.partition_units(req.partition_key)])
        }
        assert sorted(held) == ["bag-garbled", "bag-truncated", "bag-unmapped", "bag-wrong-type"]
        assert held["bag-garbled"]["stream"] == "/joint_states"
        assert "message 17 (sensor_msgs/msg/JointState) does not decode" in held["bag-garbled"]["reason"]
        assert held["bag-unmapped"]["stream"] == "/diagnostics" and "does not name" in held["bag-unmapped"]["reason"]
        assert held["bag-wrong-type"]["stream"] == "/camera/wrist/image/compressed"
        assert "std_msgs/msg/String" in held["bag-wrong-type"]["reason"]
        assert held["bag-truncated"]["reason"].startswith("not a readable ROS 2 bag")
        assert held["bag-truncated"]["source_path"] == "2026-12-07/bag-truncated/metadata.yaml"

        # `dyna episode` shows the lineage
        monkeypatch.setenv("DYNA_HOME", str(home))
        monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
        capsys.readouterr()
        assert cli.main(["episode", "bag-split-002"]) == 0
        out = capsys.readouterr().out
        sha = content_sha256(landing / "bag-split")
        assert f"source: ros2 at {(landing / 'bag-split').resolve().as_uri()}/#bag-split-002, sha256 {sha}" in out

        # the recording finishes: its metadata.yaml appears, and the next tick lands and ingests it
        assert tick(instance, res, first.cursor).run_requests == []
        (home / "recording-metadata.yaml").rename(landing / "zz-recording" / "metadata.yaml")
        (late,) = tick(instance, res, first.cursor).run_requests
        assert materialize(ASSETS, instance=instance, partition_key=late.partition_key, resources=res).success
        (row,) = registry.partition_episodes(late.partition_key)
        assert (row["episode_id"], row["status"], row["source_format"]) == ("zz-recording", "transcoded", "ros2")


def test_a_frame_that_does_not_decode_in_a_split_bag_costs_only_its_episode(tmp_path):
    """Log times: the plan of the bag decodes no camera message, each episode's read (pre gates, then the
    worker's transcode) reads its own window of the bag, and the garbled frame in the second holds back
    that episode alone, naming the topic; the first and the third are transcoded."""
    home = tmp_path / "home"
    landing = home / "landing" / "2026-12-07"
    landing.mkdir(parents=True)
    spec = BagSpec(duration_s=4.5, pauses=(1.5, 3.0), garble=("/camera/wrist/image/compressed", 20))
    write_bag(landing / "long", spec)
    topics = topic_map_yaml(spec, timestamps="log", split={"rule": "gap", "gap_s": 2.0})
    (home / "ros2_topics.yaml").write_text(yaml.safe_dump(topics))
    registry, partition = ingest_once(home)
    eps = {e["episode_id"]: e for e in registry.partition_episodes(partition)}
    assert {e: r["status"] for e, r in eps.items()} == {"long-000": "transcoded", "long-002": "transcoded"}
    (held,) = registry.quarantined([u.key for u in registry.partition_units(partition)])
    assert held["source_path"] == "2026-12-07/long/metadata.yaml#long-001"
    assert held["stream"] == "/camera/wrist/image/compressed" and "does not decode" in held["reason"]
    for e in eps.values():
        with EpisodeReader(e["mcap_path"]) as r:
            assert {c: sum(1 for _ in r.iter_video(c)) for c in r.cameras} == {"scene_left": 15, "wrist": 15}


def test_lerobot_datasets_land_whole_and_each_episode_is_ingested_natively(tmp_path, episode_factory):
    from dyna_resources.sources import samples

    home = tmp_path / "home"
    landing = home / "landing" / "2026-12-07"
    landing.mkdir(parents=True)
    gens = [episode_factory(episode_id=f"ep-lr{i}", seed=450 + i, duration_s=2.0) for i in range(3)]
    samples.write_dataset([g.path for g in gens[:2]], landing / "ds-v3", version="v3.0")
    samples.write_dataset([gens[2].path], landing / "ds-v21", version="v2.1")
    res = resources(home, target_bytes=1 << 40, partition_bytes=1 << 40)
    registry = res["ingest"].stores().registry
    with DagsterInstance.ephemeral() as instance:
        (req,) = tick(instance, res).run_requests
        units = [u.key for u in registry.partition_units(req.partition_key)]
        assert sorted(f.path for f in registry.batch_files(units)) == [
            "2026-12-07/ds-v21/meta/info.json",
            "2026-12-07/ds-v3/meta/info.json",
        ]
        assert materialize(ASSETS, instance=instance, partition_key=req.partition_key, resources=res).success
    eps = {e["episode_id"]: e for e in registry.partition_episodes(req.partition_key)}
    assert sorted(eps) == ["ds-v21-000000", "ds-v3-000000", "ds-v3-000001"]
    assert eps["ds-v3-000001"]["source_path"] == "2026-12-07/ds-v3/meta/info.json#ds-v3-000001"
    assert eps["ds-v21-000000"]["source_path"] == "2026-12-07/ds-v21/meta/info.json"  # one episode: the item
    for eid, e in eps.items():
        assert (e["status"], e["source_format"], e["site"]) == ("transcoded", "lerobot", "lerobot"), eid
        # what a run checks before training: LeRobot rows hold joint positions and actions, nothing else
        assert json.loads(e["stream_layout"])["streams"] == {"action": {"command": 8}, "joint_states": {"position": 7}}
        with open(e["mcap_path"], "rb") as f:
            n = sum(1 for _ in make_reader(f, validate_crcs=True).iter_messages())
        with open(e["mcap_path"], "rb") as f:
            assert sum(1 for _ in NonSeekingReader(f, validate_crcs=True).iter_messages()) == n > 0
        with EpisodeReader(e["mcap_path"]) as r:
            assert r.metadata()["source_format"] == "lerobot" and len(r.cameras) == 3
    with EpisodeReader(eps["ds-v3-000001"]["mcap_path"]) as r:
        assert r.read_streams(None, r.start_ns, r.end_ns + 1)["joint_states"].fields["position"].shape[1] == 7


def test_datasets_lerobot_itself_wrote_land_through_the_sensor_and_the_assets(tmp_path):
    """LeRobot's own writers (v2.1 and v3.0, the project's lerobot venvs; skipped without them), then the
    landing sensor and the ingest assets in one run: every episode transcoded, its rows exact."""
    import numpy as np

    from tests.lerobot_interop.harness import LENGTHS, V3_VENV, V21_VENV, make_source

    venvs = {name: v for name, v in (("v21", V21_VENV), ("v30", V3_VENV)) if v.available}
    if not venvs:
        pytest.skip(V3_VENV.skip_reason)
    home = tmp_path / "home"
    landing = home / "landing" / "2026-12-07"
    landing.mkdir(parents=True)
    source = make_source(tmp_path / "source.npz")
    for name, venv in venvs.items():
        venv.run("create", landing / f"so100-{name}", tmp_path / "source.npz", home=tmp_path)
    (home / "gates.yaml").write_text("min_duration: {params: {min_s: 0.2}}\n")  # its episodes: 20 and 14 frames
    registry, partition = ingest_once(home)
    eps = {e["episode_id"]: e for e in registry.partition_episodes(partition)}
    assert sorted(eps) == [f"so100-{name}-{k:06d}" for name in sorted(venvs) for k in range(len(LENGTHS))]
    for eid, e in eps.items():
        k = int(eid[-6:])
        assert (e["status"], e["source_format"]) == ("transcoded", "lerobot"), eid
        with EpisodeReader(e["mcap_path"]) as r:
            assert sorted(r.cameras) == ["top", "wrist"]
            got = r.read_streams(None, r.start_ns, r.end_ns + 1)
            np.testing.assert_array_equal(got["joint_states"].fields["position"], source[f"state_{k}"])
            np.testing.assert_array_equal(got["action"].fields["command"], source[f"action_{k}"])
