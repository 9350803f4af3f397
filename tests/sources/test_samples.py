"""The sample converters: a legacy episode as a ROS 2 bag and as a LeRobot dataset holds the same frames and
samples (what make demo lands and the ingest benchmark compares the sources on)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dyna_resources.episodes.lerobot import read_lerobot
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.sources import samples
from dyna_resources.sources.ros2 import read_bag
from dyna_resources.sources.topic_map import parse


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_bag_made_from_an_episode_reads_back_as_that_episode(tmp_path, episode_factory, storage):
    gen = episode_factory(episode_id="ep-sample", seed=31, duration_s=2.0)
    samples.write_bag(gen.path, tmp_path / "bag", storage=storage)
    with RawEpisode(gen.path) as raw:
        (ep,) = read_bag(tmp_path / "bag", parse(samples.topic_map(sorted(raw.cameras)), "t"))
        assert (ep.meta.episode_id, ep.meta.task, ep.meta.robot_id) == ("ep-sample", raw.meta.task, raw.meta.robot_id)
        assert sorted(ep.streams) == sorted(raw.streams) and sorted(ep.cameras) == sorted(raw.cameras)
        for name, s in raw.streams.items():
            assert np.array_equal(ep.streams[name].timestamps_ns, s.timestamps_ns), name
            for f, col in s.fields.items():
                assert np.array_equal(ep.streams[name].fields[f], np.asarray(col[:], np.float64)), (name, f)
        for name, cam in raw.cameras.items():
            assert np.array_equal(ep.cameras[name].timestamps_ns, cam.timestamps_ns)
            assert list(ep.cameras[name].iter_jpeg()) == list(cam.iter_jpeg())  # the same JPEG bytes


def test_episodes_written_as_one_long_bag_are_cut_back_into_them_by_the_gap_rule(tmp_path, episode_factory):
    gens = [episode_factory(episode_id=f"ep-long{i}", seed=60 + i, duration_s=1.5) for i in range(3)]
    samples.write_bag([g.path for g in gens], tmp_path / "bag", gap_s=4.0)
    with RawEpisode(gens[0].path) as raw:
        doc = samples.topic_map(sorted(raw.cameras))
    got = read_bag(tmp_path / "bag", parse({**doc, "split": {"rule": "gap", "gap_s": 2.0}}, "t"))
    assert [ep.meta.episode_id for ep in got] == ["ep-long0-000", "ep-long0-001", "ep-long0-002"]
    for g, ep in zip(gens, got, strict=True):
        with RawEpisode(g.path) as raw:
            shift = ep.start_ns - raw.start_ns
            for name, cam in raw.cameras.items():
                assert np.array_equal(ep.cameras[name].timestamps_ns, cam.timestamps_ns + shift)
                assert list(ep.cameras[name].iter_jpeg()) == list(cam.iter_jpeg())
            pos = np.asarray(raw.streams["joint_states"].fields["position"][:], np.float64)
            assert np.array_equal(ep.streams["joint_states"].fields["position"], pos)
    assert [round((b.start_ns - a.end_ns) / 1e9, 6) for a, b in zip(got, got[1:])] == [4.0, 4.0]


def test_a_dataset_made_from_episodes_holds_a_row_per_frame(tmp_path, episode_factory):
    gens = [episode_factory(episode_id=f"ep-ds{i}", seed=40 + i, duration_s=2.0) for i in range(2)]
    root = samples.write_dataset([g.path for g in gens], tmp_path / "ds", version="v2.1")
    assert json.loads((root / "meta/info.json").read_text())["codebase_version"] == "v2.1"
    got = list(read_lerobot(root))
    for g, ep in zip(gens, got, strict=True):
        with RawEpisode(g.path) as raw:
            first = raw.cameras[sorted(raw.cameras)[0]]
            assert len(ep) == len(first) and sorted(ep.frames) == sorted(f"observation.images.{c}" for c in raw.cameras)
            assert ep.task == raw.meta.task and ep.states.shape == (len(first), 7)
