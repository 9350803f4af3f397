"""A small transcoded fleet and its manifest, shared by the trainer tests."""

import pyarrow as pa
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode


def segment_rows(paths, length_s: float = 2.0, stride_s: float = 0.5) -> pa.Table:
    rows = {"episode_id": [], "uri": [], "start_ns": [], "end_ns": []}
    for i, p in enumerate(paths):
        with EpisodeReader(p) as r:
            t, end = r.start_ns, r.end_ns
        while t + int(length_s * 1e9) <= end:
            rows["episode_id"].append(f"ep{i}")
            rows["uri"].append(f"file://{p}")
            rows["start_ns"].append(t)
            rows["end_ns"].append(t + int(length_s * 1e9))
            t += int(stride_s * 1e9)
    return pa.table(rows)


@pytest.fixture(scope="session")
def mcap_fleet(episode_factory, tmp_path_factory):
    """Three 4 s episodes at 160x120 (1 s GOPs) as MCAP, and a manifest of 2 s segments every 0.5 s."""
    out = tmp_path_factory.mktemp("fleet")
    paths = []
    for i in range(3):
        gen = episode_factory(episode_id=f"ep-train-{i}", seed=300 + i, duration_s=4.0, width=160, height=120)
        path = out / f"ep{i}.mcap"
        transcode_episode(gen.path, path, TranscodeSettings(video=VideoSettings(gop_frames=30, preset="veryfast")))
        paths.append(path)
    return paths, segment_rows(paths)
