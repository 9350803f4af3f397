"""The sample-fleet generator: determinism, realism of frames and streams, faults, fleet shape."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from dyna_resources.episodes import raw_format
from dyna_resources.episodes.errors import CorruptFrameError, MissingStreamError, RawFormatError, TimestampError
from dyna_resources.episodes.raw_format import SAMPLE_STREAMS, RawEpisode
from dyna_resources.episodes.sim import (
    FAULTS,
    TASKS,
    EpisodeSpec,
    SimulatedEpisode,
    assign_faults,
    fleet_specs,
    generate_fleet,
    write_episode,
)
from dyna_resources.episodes.sim import fleet as fleet_mod
from dyna_resources.episodes.sim.robot import ScriptedArm, fk_all
from dyna_resources.episodes.sim.scene import NoiseBank, SensorModel

W, H = 160, 120


def spec_(**kw) -> EpisodeSpec:
    base = dict(
        episode_id="ep-000001-test",
        seed=4242,
        task="pick_place",
        robot_id="arm-01",
        robot_model="dyna-a1",
        robot_sw_version="4.2.1",
        site="sfo-lab",
        operator="op-1",
        success=True,
        started_at="2026-11-02T08:15:00Z",
        duration_s=3.0,
        width=W,
        height=H,
    )
    base.update(kw)
    return EpisodeSpec(**base)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One file per fault (None = clean), written once for the module."""
    root = tmp_path_factory.mktemp("fleet")
    cache = {}

    def get(fault=None):
        if fault not in cache:
            cache[fault] = write_episode(spec_(), root / f"{fault or 'clean'}.h5", fault=fault)
        return cache[fault]

    return get


# -- determinism ---------------------------------------------------------------------------
def test_same_spec_gives_identical_frames_and_streams():
    a, b = SimulatedEpisode(spec_()), SimulatedEpisode(spec_())
    for cam in a.spec.cameras:
        for i in (0, 37, 80):
            assert np.array_equal(a.render_frame(cam, i), b.render_frame(cam, i)), (cam, i)
        assert np.array_equal(a.camera_timestamps(cam), b.camera_timestamps(cam))
    sa, sb = a.streams(), b.streams()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert np.array_equal(sa[name].timestamps_ns, sb[name].timestamps_ns)
        for f in sa[name].fields:
            assert np.array_equal(sa[name].fields[f], sb[name].fields[f]), (name, f)


def test_frame_depends_only_on_seed_camera_and_index():
    a, b = SimulatedEpisode(spec_()), SimulatedEpisode(spec_())
    first = a.render_frame("wrist", 50)  # rendered before anything else
    for cam in b.spec.cameras:  # other cameras and frames first, in another order
        for i in (70, 3, 49, 51):
            b.render_frame(cam, i)
    assert np.array_equal(first, b.render_frame("wrist", 50))


def test_different_seeds_differ():
    a, b = SimulatedEpisode(spec_()), SimulatedEpisode(spec_(seed=4243))
    for cam in a.spec.cameras:
        assert not np.array_equal(a.render_frame(cam, 10), b.render_frame(cam, 10))
    assert not np.array_equal(
        a.streams()["joint_states"].fields["position"], b.streams()["joint_states"].fields["position"]
    )


# -- frames --------------------------------------------------------------------------------
def test_frames_are_textured_and_move():
    sim = SimulatedEpisode(spec_())
    arm = sim.arm
    # frames where the end effector moves fast
    t = np.array([sim.frame_time("scene_left", i) for i in range(sim.n_frames("scene_left"))])
    speed = np.linalg.norm(arm.tcp(t + 0.01)[:, :3, 3] - arm.tcp(t)[:, :3, 3], axis=1) / 0.01
    i = int(np.argmax(speed[:-4]))
    assert speed[i] > 0.1
    for cam in sim.spec.cameras:
        f0, f1 = sim.render_frame(cam, i), sim.render_frame(cam, i + 3)
        assert f0.shape == (H, W, 3) and f0.dtype == np.uint8
        # real photographs, not flat colour: spread within the frame and fine detail
        assert f0.reshape(-1, 3).std(axis=0).mean() > 12, cam
        grad = np.abs(np.diff(f0.astype(np.int16), axis=1)).mean()
        assert grad > 2.0, (cam, grad)
        # motion: a visible part of the image changes by far more than noise
        moved = (np.abs(f1.astype(np.int16) - f0).max(axis=2) > 40).mean()
        assert moved > 0.003, (cam, moved)


def test_wrist_camera_pans_over_the_scene():
    sim = SimulatedEpisode(spec_())
    n = sim.n_frames("wrist")
    a, b = sim.render_frame("wrist", 2), sim.render_frame("wrist", n // 2)
    assert np.abs(a.astype(np.int16) - b).mean() > 15  # a different view, not a shaken one
    l0, l1 = sim.render_frame("scene_left", 2), sim.render_frame("scene_left", 3)
    assert np.abs(l0.astype(np.int16) - l1).mean() < 6  # a scene camera barely moves


def test_sensor_noise_is_moderate_signal_dependent_and_fresh_per_frame():
    bank = NoiseBank(7, W, H)
    sm = SensorModel(7, 1, W, H, bank)
    sm.gain_map[:] = 1.0
    sm.gain = lambda t, rng: 1.0  # noise only
    sig = {}
    for v in (40, 128, 220):
        flat = np.full((H, W, 3), v, np.uint8)
        out = sm.apply(flat, 0.0, np.random.default_rng([1, v])).astype(np.float64)
        assert abs(out.mean() - v) < 0.3
        sig[v] = out.std()
    assert 1.5 < sig[128] < 2.5, sig
    assert sig[40] < sig[128] < sig[220], sig
    flat = np.full((H, W, 3), 128, np.uint8)
    n1 = sm.apply(flat, 0.0, np.random.default_rng([1, 2])).astype(np.float64) - 128
    n2 = sm.apply(flat, 0.0, np.random.default_rng([1, 3])).astype(np.float64) - 128
    assert abs(np.corrcoef(n1.ravel(), n2.ravel())[0, 1]) < 0.1


def test_lighting_drifts_over_the_episode():
    sim = SimulatedEpisode(spec_(duration_s=3.0))
    sm = sim.renderer.sensors["scene_left"]
    gains = [sm.gain(t, np.random.default_rng(0)) for t in np.linspace(0, 3, 30)]
    assert 0.8 < min(gains) and max(gains) < 1.2
    assert max(gains) - min(gains) > 0.002


# -- streams -------------------------------------------------------------------------------
def test_stream_shapes_rates_labels_and_timestamps():
    sim = SimulatedEpisode(spec_())
    st = sim.streams()
    assert set(st) == set(SAMPLE_STREAMS)
    widths = {"joint_states": 7, "ee_pose": 7, "gripper": 1, "wrench": 6, "imu": 6, "action": 8}
    rates = {"action": 50.0}
    start = sim.meta().started_at_ns
    for name, s in st.items():
        hz = rates.get(name, 200.0)
        n = len(s)
        assert abs(n - 3.0 * hz) <= 1, (name, n)
        for f, a in s.fields.items():
            assert a.dtype == np.float64 and a.shape == (n, widths[name]) and np.isfinite(a).all(), (name, f)
        ts = s.timestamps_ns
        assert ts.dtype == np.int64 and ts[0] >= start and ts[-1] < start + 3.2e9
        d = np.diff(ts)
        assert (d > 0).all()
        assert np.abs(d - 1e9 / hz).max() < 0.45e6, name  # jitter <= 0.2 ms on each stamp
    js = st["joint_states"]
    expect = [f"joint{i}" for i in range(6)] + ["gripper"]
    assert all(js.labels[f] == expect for f in ("position", "velocity", "effort"))
    assert st["ee_pose"].labels["pose"] == ["x", "y", "z", "qx", "qy", "qz", "qw"]
    assert st["action"].labels["command"][:7] == expect
    for cam in sim.spec.cameras:
        ts = sim.camera_timestamps(cam)
        assert len(ts) == 90 and (np.diff(ts) > 0).all()
        assert np.abs(np.diff(ts) - 1e9 / 30).max() < 0.45e6


def test_velocity_is_the_derivative_of_position_and_pose_is_the_fk():
    sim = SimulatedEpisode(spec_(task="wipe_table", duration_s=6.0))
    js = sim.streams()["joint_states"]
    t = js.timestamps_ns / 1e9
    p, v = js.fields["position"], js.fields["velocity"]
    fd = np.diff(p, axis=0) / np.diff(t)[:, None]
    mid = 0.5 * (v[1:] + v[:-1])
    assert np.abs(v[:, :6]).max() > 0.3  # it does move
    assert np.median(np.abs(fd - mid)) < 5e-3
    assert np.percentile(np.abs(fd[:, :6] - mid[:, :6]), 99) < 0.03
    pose = sim.streams()["ee_pose"].fields["pose"]
    assert np.allclose(np.linalg.norm(pose[:, 3:], axis=1), 1.0, atol=1e-9)
    fk = fk_all(sim.arm.arm, p[:, :6])[:, 7, :3, 3]
    assert np.abs(fk - pose[:, :3]).max() < 1e-3
    assert (pose[:, 2] > -0.01).all()  # never through the table
    # quaternion sign continuity: no jumps between consecutive samples
    assert (np.einsum("ij,ij->i", pose[1:, 3:], pose[:-1, 3:]) > 0.9).all()


def test_action_leads_measured_positions():
    sim = SimulatedEpisode(spec_(duration_s=6.0))
    st = sim.streams()
    act, js = st["action"], st["joint_states"]
    ta, tj = act.timestamps_ns / 1e9, js.timestamps_ns / 1e9
    errs = {}
    for lag_ms in (0, 30, 60, 90, 120):
        q = np.stack([np.interp(ta + lag_ms / 1000, tj, js.fields["position"][:, j]) for j in range(6)], axis=1)
        errs[lag_ms] = np.abs(q - act.fields["command"][:, :6]).mean()
    assert min(errs, key=errs.get) in (30, 60, 90) and errs[60] < errs[0], errs


def test_gripper_wrench_imu_are_physical():
    sim = SimulatedEpisode(spec_(duration_s=6.0))
    st = sim.streams()
    g = st["gripper"].fields["position"][:, 0]
    assert g.min() >= 0.0 and g.max() <= 0.086 and g.max() - g.min() > 0.02  # opens and closes
    imu = st["imu"].fields["accel_gyro"]
    assert abs(np.median(np.linalg.norm(imu[:, :3], axis=1)) - 9.81) < 0.3
    w = st["wrench"].fields["force_torque"]
    fz = np.linalg.norm(w[:, :3], axis=1)
    quiet = np.median(np.abs(np.diff(fz)))
    assert np.abs(np.diff(fz)).max() > 20 * quiet  # contact spikes stand out of the noise
    eff = st["joint_states"].fields["effort"]
    assert np.abs(eff[:, 1]).mean() > 5.0  # the shoulder carries the arm's weight


@pytest.mark.parametrize("task", TASKS)
def test_failed_episodes_visibly_fail(task):
    end = {}
    for success in (True, False):
        arm = ScriptedArm(seed=11, task=task, robot_model="dyna-a1", success=success, duration_s=10.0)
        s = arm.script
        st = arm.world_state(9.9)
        if task == "pick_place":
            moved = [
                np.linalg.norm(pos[:2] - np.array(o.place)) < 0.03 and abs(pos[2] - o.size[2] / 2) < 1e-6
                for o, pos, _ in st.objects
            ]
            end[success] = all(moved)
        elif task == "fold_towel":
            end[success] = bool(st.towel_edge[0] < s.towel.centre[0])
        elif task == "open_drawer":
            end[success] = st.drawer_offset > 0.1
        else:
            end[success] = st.stain_alpha < 0.3
        if not success:
            assert s.failure_mode in ("miss", "slip")
    assert end == {True: True, False: False}


# -- round trip through the reader ---------------------------------------------------------
def test_written_episode_round_trips(written):
    gen = written()
    sim = SimulatedEpisode(gen.spec)
    with RawEpisode(gen.path) as raw:
        assert raw.meta == sim.meta() and raw.meta.sim is True
        ref = sim.streams()
        assert set(raw.streams) == set(ref)
        for name, s in ref.items():
            got = raw.streams[name]
            assert np.array_equal(got.timestamps_ns, s.timestamps_ns), name
            for f, a in s.fields.items():
                assert np.array_equal(got.fields[f], a), (name, f)
                assert got.labels[f] == s.labels[f]
        for cam in gen.spec.cameras:
            c = raw.cameras[cam]
            assert np.array_equal(c.timestamps_ns, sim.camera_timestamps(cam))
            assert np.array_equal(gen.frame_indices[cam], np.arange(len(c)))
            for i in (0, len(c) // 2, len(c) - 1):
                assert psnr(c.frame(i), sim.render_frame(cam, i)) > 30, (cam, i)
    assert not list(gen.path.parent.glob("*.tmp"))


# -- faults --------------------------------------------------------------------------------
def test_fault_dropped_frames(written):
    gen = written("dropped_frames")
    sim = SimulatedEpisode(gen.spec)
    cam = gen.fault_detail["camera"]
    idx = gen.frame_indices[cam]
    n = sim.n_frames(cam)
    assert 0.03 * n <= n - len(idx) <= 0.08 * n
    assert (np.diff(idx) > 1).any() and idx[0] == 0 and idx[-1] == n - 1
    with RawEpisode(gen.path) as raw:
        assert len(raw.cameras[cam]) == len(idx)
        ts = raw.cameras[cam].timestamps_ns
        assert np.array_equal(ts, sim.camera_timestamps(cam)[idx])
        gap = int(np.flatnonzero(np.diff(idx) > 1)[0])
        assert ts[gap + 1] - ts[gap] > 1.5e9 / 30  # a hole in time
        assert psnr(raw.cameras[cam].frame(gap + 1), sim.render_frame(cam, int(idx[gap + 1]))) > 30
        for other in gen.spec.cameras:
            if other != cam:
                assert len(raw.cameras[other]) == n


def test_fault_dead_camera(written):
    gen = written("dead_camera")
    cam, k = gen.fault_detail["camera"], gen.fault_detail["from_frame"]
    with RawEpisode(gen.path) as raw:
        frames = list(raw.cameras[cam].iter_frames())
        assert len(frames) == len(gen.frame_indices[cam])
        assert all(f.max() == 0 for f in frames[k:])
        assert all(f.mean() > 20 for f in frames[:k])
        for other in gen.spec.cameras:
            if other != cam:
                assert raw.cameras[other].frame(len(frames) - 1).mean() > 20


def test_fault_non_monotonic(written):
    gen = written("non_monotonic")
    with pytest.raises(TimestampError) as e:
        RawEpisode(gen.path)
    assert e.value.stream == "joint_states" and "joint_states" in str(e.value) and str(gen.path) in str(e.value)
    assert f"index {gen.fault_detail['index'] + 1}" in str(e.value)


def test_fault_truncated(written):
    gen = written("truncated")
    clean = written()
    assert abs(gen.path.stat().st_size - 0.6 * clean.path.stat().st_size) < 0.02 * clean.path.stat().st_size
    with pytest.raises(RawFormatError) as e:
        RawEpisode(gen.path)
    assert type(e.value) is RawFormatError and str(gen.path) in str(e.value)


def test_fault_corrupt_jpeg(written):
    gen = written("corrupt_jpeg")
    cam, k = gen.fault_detail["camera"], gen.fault_detail["frame"]
    with RawEpisode(gen.path) as raw:  # opening succeeds
        c = raw.cameras[cam]
        c.frame(k - 1 if k else k + 1)
        with pytest.raises(CorruptFrameError) as e:
            c.frame(k)
        assert e.value.stream == f"images/{cam}" and e.value.frame_index == k
        assert f"frame {k}" in str(e.value)
        with pytest.raises(CorruptFrameError) as e2:
            for _ in c.iter_frames():
                pass
        assert e2.value.frame_index == k


def test_fault_missing_stream(written):
    gen = written("missing_stream")
    with pytest.raises(MissingStreamError) as e:
        RawEpisode(gen.path)
    assert e.value.stream == "action" and "/action" in str(e.value)


def test_unknown_fault_is_refused(tmp_path):
    with pytest.raises(ValueError):
        write_episode(spec_(), tmp_path / "x.h5", fault="cosmic_rays")
    assert not list(tmp_path.iterdir())


def test_failed_write_leaves_no_files(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = SimulatedEpisode.render_frame

    def flaky(self, camera, i):
        calls["n"] += 1
        if calls["n"] > 20:
            raise RuntimeError("renderer crashed")
        return real(self, camera, i)

    monkeypatch.setattr(SimulatedEpisode, "render_frame", flaky)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        write_episode(spec_(), tmp_path / "ep.h5")
    assert calls["n"] > 20
    assert list(tmp_path.iterdir()) == []


# -- the fleet -----------------------------------------------------------------------------
def test_fleet_is_diverse_deterministic_and_faulty_where_asked(tmp_path):
    faults = {"corrupt_jpeg": 1, "missing_stream": 1, "dropped_frames": 1}
    eps = generate_fleet(tmp_path, 10, seed=3, width=64, height=48, duration_s=(1.5, 2.5), faults=faults)
    specs = [g.spec for g in eps]
    assert specs == fleet_specs(10, seed=3, width=64, height=48, duration_s=(1.5, 2.5))
    assert [s.episode_id for s in specs] != [s.episode_id for s in fleet_specs(10, seed=4)]
    ids = [s.episode_id for s in specs]
    assert len(set(ids)) == 10 and all(re.fullmatch(r"ep-\d{6}-[0-9a-f]{8}", i) for i in ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{i}.h5" for i in ids)
    assert len({s.robot_id for s in specs}) >= 3 and len({s.robot_model for s in specs}) >= 2
    sw = {s.robot_id: s.robot_sw_version for s in specs}
    assert len(set(sw.values())) == len(sw)  # each robot runs its own software version
    assert {s.task for s in specs} == set(TASKS)
    assert len({s.site for s in specs}) >= 2 and len({s.operator for s in specs}) >= 3
    assert sum(s.success for s in specs) >= 6
    assert len({s.started_at[:10] for s in specs}) >= 2
    assert all(1.5 <= s.duration_s <= 2.5 for s in specs) and len({s.duration_s for s in specs}) > 1
    assert len({s.seed for s in specs}) == 10
    got = {g.fault: g for g in eps if g.fault}
    assert set(got) == set(faults) and sum(g.fault is not None for g in eps) == 3
    with pytest.raises(MissingStreamError):
        RawEpisode(got["missing_stream"].path)
    for g in eps:
        if g.fault in (None, "dropped_frames"):
            with RawEpisode(g.path) as raw:
                assert raw.meta.episode_id == g.spec.episode_id and raw.meta.robot_id == g.spec.robot_id


def test_fleet_with_worker_processes_writes_identical_files(tmp_path):
    a = generate_fleet(tmp_path / "a", 2, seed=5, width=48, height=32, duration_s=1.0)
    b = generate_fleet(tmp_path / "b", 2, seed=5, width=48, height=32, duration_s=1.0, workers=2)

    def digest(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert [g.spec for g in a] == [g.spec for g in b]
    assert [digest(g.path) for g in a] == [digest(g.path) for g in b]


def test_fault_assignment_validation():
    got = assign_faults(6, {f: 1 for f in FAULTS}, seed=1)
    assert sorted(got.values()) == sorted(FAULTS) and len(got) == 6
    with pytest.raises(ValueError):
        assign_faults(2, {"truncated": 3})
    with pytest.raises(ValueError):
        assign_faults(5, {"bit_rot": 1})


def test_spec_is_validated():
    with pytest.raises(ValueError):
        spec_(task="juggle")
    with pytest.raises(ValueError):
        spec_(cameras=())
    s = spec_()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1  # type: ignore[misc]


def test_cli(tmp_path, capsys):
    rc = fleet_mod.main(
        [
            "--out",
            str(tmp_path),
            "--episodes",
            "2",
            "--seed",
            "1",
            "--width",
            "48",
            "--height",
            "32",
            "--duration-s",
            "1.0",
            "--faults",
            "truncated=1",
        ]
    )
    assert rc == 0
    files = sorted(tmp_path.glob("*.h5"))
    assert len(files) == 2
    assert "truncated" in capsys.readouterr().out
    bad = 0
    for f in files:
        try:
            RawEpisode(f).close()
        except RawFormatError:
            bad += 1
    assert bad == 1
    assert fleet_mod.main(["--out", str(tmp_path / "x"), "--episodes", "1", "--faults", "nope=1"]) == 2


def test_write_streams_frames_lazily(tmp_path, monkeypatch):
    """write_raw_episode gets iterators, not lists: at most one frame is alive at a time."""
    seen = {}
    real = raw_format.write_raw_episode

    def spy(path, meta, cameras, streams):
        seen.update({c: type(v[1]) for c, v in cameras.items()})
        return real(path, meta, cameras, streams)

    monkeypatch.setattr(raw_format, "write_raw_episode", spy)
    write_episode(spec_(duration_s=0.5), tmp_path / "e.h5")
    assert seen and all(not isinstance(t, (list, tuple)) and hasattr(t, "__next__") for t in seen.values())
