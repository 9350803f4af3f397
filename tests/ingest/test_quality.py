"""Quality scores on the sample fleet: clean episodes pass, the injected faults that reach
scoring (the others are quarantined by the pre gates) are flagged with the right reason, and
the thresholds come from configuration."""

import shutil

import h5py
import numpy as np
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from dyna_resources.ingest.gates import GateConfig, GateConfigError
from dyna_resources.ingest.quality import (QualityConfig, QualityConfigError, gap_fraction, rail_fraction,
                                           register_scorer, score_episode)

FAST = TranscodeSettings(video=VideoSettings(gop_frames=30, preset="ultrafast"))


def score(path, cameras=None, config=None):
    with RawEpisode(path) as raw:
        return score_episode(raw, cameras, config)


def checks(rep):
    return {r["check"] for r in rep.reasons}


@pytest.mark.parametrize("seed", [1234, 77, 4242])
def test_clean_episodes_pass_with_full_scores(episode_factory, seed):
    rep = score(episode_factory(seed=seed).path)
    assert (rep.verdict, rep.smoothness, rep.sensor_health, rep.task, rep.reasons) == ("pass", 1.0, 1.0, 1.0, [])


def test_dropped_frames_go_to_review_with_frame_drops_and_gaps(episode_factory):
    gen = episode_factory(fault="dropped_frames")
    rep = score(gen.path)
    assert rep.verdict == "review" and rep.smoothness == 1.0 and 0.5 <= rep.sensor_health < 0.9
    assert {"frame_drop_fraction", "timestamp_gap_fraction"} <= checks(rep)
    assert gen.fault_detail["camera"] in next(r["detail"] for r in rep.reasons if r["check"] == "frame_drop_fraction")


def test_dead_camera_fails_on_dark_frames_from_the_transcode(episode_factory, tmp_path):
    gen = episode_factory(fault="dead_camera")
    report = transcode_episode(gen.path, tmp_path / "d.mcap", FAST).as_dict()
    rep = score(gen.path, report["cameras"])
    assert rep.verdict == "fail" and rep.sensor_health == 0.0
    assert checks(rep) == {"dark_frame_fraction"}
    assert gen.fault_detail["camera"] in rep.reasons[0]["detail"]


def _edit(src, dst, key, fn):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as h5:
        a = h5[key][...]
        h5[key][...] = fn(a)
    return dst


def test_a_velocity_spike_lowers_smoothness(episode_factory, tmp_path):
    def spike(v):
        v[400:402, 2] += 3.0  # rad/s for 10 ms: an encoder glitch
        return v
    rep = score(_edit(episode_factory().path, tmp_path / "s.h5", "observations/qvel", spike))
    assert rep.smoothness < 0.9 and rep.sensor_health == 1.0 and rep.verdict != "pass"
    assert checks(rep) == {"spike_fraction"} and "acceleration" in rep.reasons[0]["detail"]


def test_an_effort_spike_lowers_smoothness(episode_factory, tmp_path):
    def spike(e):
        e[300:304, 1] += 50 * e[:, 1].std()
        return e
    rep = score(_edit(episode_factory().path, tmp_path / "e.h5", "observations/effort", spike))
    assert rep.smoothness < 1.0 and "effort" in rep.reasons[0]["detail"]


def test_a_clipped_force_sensor_lowers_sensor_health(episode_factory, tmp_path):
    def clip(w):
        hi = np.percentile(w[:, 2], 90)
        w[:, 2] = np.minimum(w[:, 2], hi)  # 10 % of samples on the rail
        return w
    rep = score(_edit(episode_factory().path, tmp_path / "w.h5", "observations/wrench", clip))
    assert checks(rep) == {"saturation_fraction"} and rep.verdict == "fail"
    assert "wrench" in rep.reasons[0]["detail"]


def test_task_success_is_pluggable(episode_factory):
    failed = episode_factory(seed=99, success=False).path
    rep = score(failed)
    assert (rep.task, rep.verdict, checks(rep)) == (0.0, "review", {"task"})
    register_scorer("always_one", lambda meta: 1.0)
    assert score(failed, config=QualityConfig.from_mapping({"task_scorer": "always_one"})).verdict == "pass"
    with pytest.raises(QualityConfigError, match="task_scorer"):
        QualityConfig.from_mapping({"task_scorer": "nope"})


def test_thresholds_from_the_gates_file_change_the_verdict(episode_factory, tmp_path):
    gen = episode_factory(fault="dropped_frames")
    (tmp_path / "gates.yaml").write_text(
        "gates: {frame_drops: {action: flag}}\n"
        "quality:\n"
        "  measures: {frame_drop_fraction: {ok: 0.1, zero: 0.5}, timestamp_gap_fraction: {ok: 0.1, zero: 0.5}}\n")
    lenient = GateConfig.load(tmp_path / "gates.yaml").quality_config()
    assert score(gen.path, config=lenient).verdict == "pass"
    strict = GateConfig.load(None, {"quality": {"verdict": {"sensor_health": {"fail_below": 0.9}}}}).quality_config()
    assert score(gen.path, config=strict).verdict == "fail"
    with pytest.raises(GateConfigError, match="quality"):
        GateConfig.load(None, {"quality": {"measures": {"frame_drop_fraction": {"ok": 0.5, "zero": 0.1}}}})
    assert GateConfig.load(None).quality_config() == QualityConfig()


def test_measurements():
    ts = np.arange(100) * 10
    assert gap_fraction(ts, 3) == 0.0
    assert gap_fraction(np.delete(ts, range(40, 50)), 3) == pytest.approx(110 / 990)
    x = np.sin(np.linspace(0, 6, 1000))[:, None]
    assert rail_fraction(x) == 0.0
    assert rail_fraction(np.clip(x, -0.5, 0.5)) > 0.3


def test_an_episode_that_cannot_be_scored_goes_to_review_with_the_reason(tmp_path):
    import json

    from dyna_resources.ingest.batches import quality_row
    from dyna_resources.ingest.gates import GateConfig

    bad = tmp_path / "gone.h5"
    bad.write_bytes(b"not hdf5")
    row = quality_row(bad, {}, GateConfig.load(tmp_path / "no-gates.yaml"))
    assert row["quality_verdict"] == "review"
    (reason,) = json.loads(row["quality_reasons"])
    assert reason["check"] == "scoring" and "quality not scored" in reason["detail"]
