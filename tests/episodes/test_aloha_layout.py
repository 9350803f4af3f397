"""Files exactly as the ALOHA/ACT recorder writes them: /compress_len rows in the recorder's camera
order (cam_high, cam_low, cam_left_wrist, cam_right_wrist), which the file does not store, while
HDF5 lists the cameras sorted by name; or raw RGB frames. Both read and transcode camera by camera."""

import h5py
import numpy as np
import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.errors import CorruptFrameError
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.sim.aloha import ALOHA_CAMERAS, write_aloha_episode
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
from tests.conftest import small_spec

FAST = TranscodeSettings(video=VideoSettings(gop_frames=25, preset="veryfast"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One padded-JPEG and one raw-RGB recording of the same scripted episode, as `.hdf5`."""
    spec = small_spec("aloha", seed=91, duration_s=1.1, width=64, height=48)
    root = tmp_path_factory.mktemp("aloha")
    return {c: write_aloha_episode(spec, root / f"episode_{int(not c)}.hdf5", compress=c) for c in (True, False)}


def mean_abs(a, b) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_the_generator_writes_the_recorders_layout(recorded):
    with h5py.File(recorded[True].path) as f:
        assert set(f.attrs) == {"sim", "compress"}  # no camera list, no timestamps, no episode metadata
        assert list(f["observations/images"]) == sorted(ALOHA_CAMERAS) != list(ALOHA_CAMERAS)
        n = recorded[True].steps
        cl = f["compress_len"]
        assert cl.shape == (4, n) and cl.dtype == np.float32
        widths = {f[f"observations/images/{c}"].shape for c in ALOHA_CAMERAS}
        assert widths == {(n, int(cl[()].max()))}  # every camera padded to the longest JPEG of any camera
        for row, cam in enumerate(ALOHA_CAMERAS):  # rows in the recorder's order
            rows = f[f"observations/images/{cam}"][()]
            for i in (0, n - 1):
                jpeg = rows[i, : int(cl[row, i])].tobytes()
                assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9" and not rows[i, int(cl[row, i]) :].any()
        # the rows do not follow HDF5's (sorted) order: that order cuts the JPEGs at the wrong lengths
        sorted_row = sorted(ALOHA_CAMERAS).index("cam_low")
        assert not np.array_equal(cl[sorted_row], cl[ALOHA_CAMERAS.index("cam_low")])
        assert {
            k: f[k].dtype for k in ("observations/qpos", "observations/qvel", "observations/effort", "action")
        } == dict.fromkeys(("observations/qpos", "observations/qvel", "observations/effort", "action"), np.float32)
    with h5py.File(recorded[False].path) as f:
        ds = f["observations/images/cam_high"]
        assert ds.shape == (recorded[False].steps, 48, 64, 3) and ds.chunks == (1, 48, 64, 3)
        assert "compress_len" not in f


@pytest.mark.parametrize("compress", [True, False], ids=["padded_jpeg", "raw_rgb"])
def test_every_camera_reads_its_own_frames(recorded, compress):
    rec = recorded[compress]
    with RawEpisode(rec.path) as raw:
        assert raw.meta.episode_id == rec.path.stem and raw.meta.sim is True
        assert sorted(raw.cameras) == sorted(ALOHA_CAMERAS)
        for cam in ALOHA_CAMERAS:
            got = list(raw.cameras[cam].iter_frames(batch=9))
            assert len(got) == rec.steps
            for i in (0, rec.steps // 2, rec.steps - 1):
                own = mean_abs(got[i], rec.render_frame(cam, i))
                others = [mean_abs(got[i], rec.render_frame(c, i)) for c in ALOHA_CAMERAS if c != cam]
                if compress:
                    assert own < 12 and own < min(others) / 2  # JPEG q50 at 64x48, (cam, i, own, others)
                else:
                    assert own == 0
        assert np.array_equal(np.diff(raw.cameras["cam_low"].timestamps_ns), np.full(rec.steps - 1, 20_000_000))
        assert raw.streams["joint_states"].fields["position"].shape == (rec.steps, 14)


@pytest.mark.parametrize("compress", [True, False], ids=["padded_jpeg", "raw_rgb"])
def test_recorder_files_transcode_camera_by_camera(recorded, compress, tmp_path):
    rec = recorded[compress]
    out = tmp_path / "episode.mcap"
    report = transcode_episode(rec.path, out, FAST)
    assert {c: v.frames for c, v in report.cameras.items()} == dict.fromkeys(ALOHA_CAMERAS, rec.steps)
    with RawEpisode(rec.path) as raw, EpisodeReader(out) as r:
        for cam in ALOHA_CAMERAS:
            ts = raw.cameras[cam].timestamps_ns[[1, rec.steps - 2]]
            frames = r.read_frames([cam], ts)[cam]
            for k, i in enumerate((1, rec.steps - 2)):
                own = mean_abs(frames.images[k], rec.render_frame(cam, i))
                others = min(mean_abs(frames.images[k], rec.render_frame(c, i)) for c in ALOHA_CAMERAS if c != cam)
                assert own < 14 and own < others / 2, (cam, i, own, others)


def test_compress_len_is_not_needed_and_a_frame_without_its_end_marker_is_named(recorded, tmp_path):
    p = tmp_path / "episode_7.hdf5"
    p.write_bytes(recorded[True].path.read_bytes())
    with h5py.File(p, "a") as f:
        del f["compress_len"]
    with RawEpisode(p) as raw:
        assert len(list(raw.cameras["cam_right_wrist"].iter_yuv())) == recorded[True].steps
    with h5py.File(p, "a") as f:
        ds = f["observations/images/cam_left_wrist"]
        row = ds[5]
        end = len(row.tobytes().rstrip(b"\0"))
        row[end - 40 : end] = 0  # the last 40 bytes of the JPEG, its EOI marker with them
        ds[5] = row
    with RawEpisode(p) as raw:
        with pytest.raises(CorruptFrameError) as e:
            list(raw.cameras["cam_left_wrist"].iter_yuv())
    assert (e.value.stream, e.value.frame_index, e.value.path) == ("images/cam_left_wrist", 5, str(p))
    assert "EOI" in e.value.reason
