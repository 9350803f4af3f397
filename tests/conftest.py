import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.sim import EpisodeSpec, write_episode
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode

# No test may use the user's home (`make test` exports DYNA_HOME=./.dyna): this process's default home is
# an empty throwaway folder, set before any test module loads the definitions, and must stay empty.
# A test that needs a home makes its own.
UNUSED_HOME = tempfile.mkdtemp(prefix="dyna-tests-unused-home-")
os.environ["DYNA_HOME"] = UNUSED_HOME


@pytest.fixture(scope="session", autouse=True)
def default_home_stays_unused():
    yield
    written = sorted(str(p.relative_to(UNUSED_HOME)) for p in Path(UNUSED_HOME).rglob("*"))
    shutil.rmtree(UNUSED_HOME, ignore_errors=True)
    assert not written, (
        f"tests wrote into the default home $DYNA_HOME={UNUSED_HOME} (each test makes its own): {written[:20]}"
    )


def small_spec(episode_id: str = "ep-test-000001", **overrides) -> EpisodeSpec:
    base = dict(
        episode_id=episode_id,
        seed=1234,
        task="pick_place",
        robot_id="arm-07",
        robot_model="dyna-a1",
        robot_sw_version="4.2.1",
        site="sfo-lab",
        operator="op-3",
        success=True,
        started_at="2026-11-02T08:15:00Z",
        duration_s=4.0,
        width=160,
        height=120,
    )
    base.update(overrides)
    return EpisodeSpec(**base)


@pytest.fixture(scope="session")
def episode_factory(tmp_path_factory):
    """Writes (and caches per arguments) a generated legacy episode; returns the GeneratedEpisode."""
    root = tmp_path_factory.mktemp("episodes")
    cache = {}

    def make(fault: str | None = None, **overrides):
        key = (fault, tuple(sorted(overrides.items())))
        if key not in cache:
            spec = small_spec(**overrides)
            name = f"{spec.episode_id}-{len(cache)}.h5"
            cache[key] = write_episode(spec, Path(root) / name, fault=fault)
        return cache[key]

    return make


def replace_spec(spec: EpisodeSpec, **changes) -> EpisodeSpec:
    return dataclasses.replace(spec, **changes)


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


from tests.gcs import gcs, gcs_emulator, gcs_unreachable  # noqa: E402,F401  (fixtures: a GCS emulator on 127.0.0.1)
from tests.postgres import postgres_url, registry  # noqa: E402,F401  (fixtures: SQLite and a throwaway PostgreSQL)
from tests.s3 import s3, s3_server, s3_unreachable_endpoint  # noqa: E402,F401  (fixtures: a moto S3 server on 127.0.0.1)

# Longest first. `make test` runs `-n 2 --dist loadfile`: each file on one worker, files handed out in
# collection order. The files that take minutes (the daemon tests, the tiny benchmarks) start first, so
# the other worker's short files fill in beside them instead of one of them running alone at the end
# (tests/test_benchmarks.py, collected last, was a 4-minute tail). Measured with --durations.
SLOW_FILES = (
    "tests/dyna_assets/test_deploy_drift.py",
    "tests/test_benchmarks.py",
    "tests/dyna_assets/test_deploy_kill.py",
    "tests/dyna_assets/test_deploy_retry.py",
    "tests/dyna_assets/test_e2e_webserver.py",
    "tests/dyna_assets/test_ingest_graph.py",
)


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(SLOW_FILES)))  # stable: the rest keep order
