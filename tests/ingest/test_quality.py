"""Quality scores on the sample fleet: clean episodes pass, the injected faults that reach
scoring (the others are quarantined by the pre gates) are flagged with the right reason, spike
fractions are measured up to dense spikes, and the thresholds come from configuration."""

import shutil

import h5py
import numpy as np
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.sim.robot import Quintic
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from dyna_resources.ingest.gates import GateConfig, GateConfigError
from dyna_resources.ingest.quality import (
    QualityConfig,
    QualityConfigError,
    SpikeScale,
    gap_fraction,
    rail_fraction,
    register_scorer,
    score_episode,
    spike_rows,
    spike_scale,
)

FAST = TranscodeSettings(video=VideoSettings(gop_frames=30, preset="ultrafast"))


def score(path, cameras=None, config=None):
    with RawEpisode(path) as raw:
        return score_episode(raw, cameras, config)


def checks(rep):
    return {r["check"] for r in rep.reasons}


@pytest.mark.parametrize("seed", [1234, 77, 4242])
def test_clean_episodes_pass_with_full_scores(episode_factory, seed, tmp_path):
    gen = episode_factory(seed=seed)
    cameras = transcode_episode(gen.path, tmp_path / "c.mcap", FAST).as_dict()["cameras"]
    assert {c: (v["dark_frames"], v["frozen_frames"]) for c, v in cameras.items()} == dict.fromkeys(cameras, (0, 0))
    rep = score(gen.path, cameras)
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
    assert checks(rep) == {"dark_frame_fraction"}  # black frames repeat, but count once: as dark
    assert gen.fault_detail["camera"] in rep.reasons[0]["detail"]


def test_frozen_camera_fails_on_frozen_frames_from_the_transcode(episode_factory, tmp_path):
    gen = episode_factory(fault="frozen_camera")
    cam, lo, hi = (gen.fault_detail[k] for k in ("camera", "from_frame", "to_frame"))
    cameras = transcode_episode(gen.path, tmp_path / "f.mcap", FAST).as_dict()["cameras"]
    assert {c: v["frozen_frames"] for c, v in cameras.items()} == {c: hi - lo if c == cam else 0 for c in cameras}
    rep = score(gen.path, cameras)
    assert rep.verdict == "fail" and rep.sensor_health == 0.0 and rep.smoothness == 1.0
    assert checks(rep) == {"frozen_frame_fraction"} and f"images/{cam}" in rep.reasons[0]["detail"]
    assert rep.measures["frozen_frame_fraction"] == pytest.approx((hi - lo) / cameras[cam]["frames"], abs=1e-6)


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
    assert checks(rep) == {"spike_fraction"} and "2 of 800 steps" in rep.reasons[0]["detail"]
    assert "'velocity': 2, 'acceleration': 0, 'jerk': 0" in rep.reasons[0]["detail"]  # its derivatives count once


@pytest.mark.parametrize("fraction", [0.005, 0.02, 0.05, 0.1])
def test_dense_spikes_are_measured_not_absorbed(episode_factory, tmp_path, fraction):
    """Encoder glitches on random steps and joints: the measured fraction follows the injected
    one (a scale that grew with the spikes would hide them above ~1 %)."""
    rng = np.random.default_rng(int(fraction * 1000))

    def glitch(v):
        rows = rng.choice(np.arange(2, len(v) - 2), round(fraction * len(v)), replace=False)
        sizes = rng.choice([-1, 1], len(rows)) * rng.uniform(0.5, 2, len(rows))
        v[rows, rng.integers(0, v.shape[1], len(rows))] += sizes
        return v

    gen = episode_factory(seed=77, duration_s=12.0)
    rep = score(_edit(gen.path, tmp_path / "g.h5", "observations/qvel", glitch))
    assert rep.measures["spike_fraction"] == pytest.approx(fraction, rel=0.15)
    assert rep.smoothness < 0.6 and checks(rep) == {"spike_fraction"}


def test_noise_free_and_quantized_trajectories_have_no_spikes():
    """Minimum-jerk moves (some as fast as a 70 ms gripper close) with pauses: no noise, so
    the median deviation is 0; the same quantized to an encoder's resolution."""
    t = np.arange(2400) / 200.0
    knots = np.array([0.0, 0.3, 1.1, 1.17, 2.0, 2.6, 2.7, 4.0, 5.5, 5.57, 7.0, 9.0, 12.0])
    values = np.random.default_rng(3).uniform(-1.5, 1.5, size=(len(knots), 6))
    values[1] = values[0]  # a pause
    plan = Quintic(knots, values)
    vel, pos = plan(t, 1), plan(t)
    quantized = np.round(pos / 2e-3) * 2e-3
    for js in (
        {"position": pos, "velocity": vel},
        {"position": quantized},
        {"position": pos, "velocity": np.round(vel / 0.01) * 0.01, "effort": np.round(30 * vel)},
    ):
        mask, counts = spike_rows(js, 8.0)
        assert not mask.any(), counts
    vel[40, 3] += 0.01  # at rest
    vel[1000, 3] += 0.2  # mid-move (1.8 rad/s): seen as the acceleration doublet it makes
    mask, counts = spike_rows({"position": pos, "velocity": vel}, 8.0)
    assert np.flatnonzero(mask).tolist() == [40, 1000, 1001] and counts["velocity"] == 1


def test_at_a_dataset_rate_fast_motion_is_motion_and_single_step_glitches_are_spikes():
    """At 30 Hz (a LeRobot dataset) the rule is in time: 20 ms is under a step, so a spike is a
    single-step pulse and the derivatives are not checked. The same minimum-jerk moves (a 70 ms
    gripper close is two steps) count nothing; the 200 Hz rule read them as spikes. Single-step
    velocity glitches are counted, each once."""
    t = np.arange(360) / 30.0
    knots = np.array([0.0, 0.3, 1.1, 1.17, 2.0, 2.6, 2.7, 4.0, 5.5, 5.57, 7.0, 9.0, 12.0])
    values = np.random.default_rng(3).uniform(-1.5, 1.5, size=(len(knots), 6))
    pos = Quintic(knots, values)(t)
    assert spike_scale(30.0) == SpikeScale(pulse=1, lag=1, span=17, derivatives=False, margin=1.5)
    assert spike_scale(200.0) == SpikeScale(pulse=4, lag=2, span=17, derivatives=True, margin=1.0)
    mask, counts = spike_rows({"position": pos}, 8.0, rate_hz=30.0)
    assert not mask.any(), counts
    assert spike_rows({"position": pos}, 8.0)[0].any()  # as if it were 200 Hz
    vel = np.diff(pos, axis=0, prepend=pos[:1])
    rows = [50, 120, 200, 300]
    vel[rows, [0, 2, 4, 5]] += 3 * np.abs(vel).max()
    mask, counts = spike_rows({"position": pos, "velocity": vel}, 8.0, rate_hz=30.0)
    assert np.flatnonzero(mask).tolist() == rows and counts == {"velocity": 4, "acceleration": 0, "jerk": 0}


def test_an_effort_spike_lowers_smoothness(episode_factory, tmp_path):
    def spike(e):
        e[300:304, 1] += 50 * e[:, 1].std()
        return e

    rep = score(_edit(episode_factory().path, tmp_path / "e.h5", "observations/effort", spike))
    assert rep.smoothness < 0.9 and "'effort': 4" in rep.reasons[0]["detail"]  # 20 ms wide: still a spike


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
        "  measures: {frame_drop_fraction: {ok: 0.1, zero: 0.5}, timestamp_gap_fraction: {ok: 0.1, zero: 0.5}}\n"
    )
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

    from dyna_resources.ingest.episode_transcode import quality_row
    from dyna_resources.ingest.gates import GateConfig

    bad = tmp_path / "gone.h5"
    bad.write_bytes(b"not hdf5")
    row = quality_row(bad, {}, GateConfig.load(tmp_path / "no-gates.yaml"))
    assert row["quality_verdict"] == "review"
    (reason,) = json.loads(row["quality_reasons"])
    assert reason["check"] == "scoring" and "quality not scored" in reason["detail"]
