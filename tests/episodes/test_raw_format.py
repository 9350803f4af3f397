"""The legacy reader against hand-built files in the ALOHA/ACT recorder's own layouts."""

import h5py
import numpy as np
import pytest

from dyna_resources.episodes.errors import CorruptFrameError, MissingStreamError, RawFormatError, TimestampError
from dyna_resources.episodes.raw_format import RawEpisode, encode_jpeg


def _frames(n, h=48, w=64, seed=0):
    from skimage import data

    base = data.astronaut()[seed * 40 : seed * 40 + h * 4 : 4, 100 : 100 + w * 4 : 4]
    return [np.ascontiguousarray(np.roll(base, i, axis=1)) for i in range(n)]


def _aloha_file(path, *, compress=True, n=20, with_timestamps=False, cams=("cam_high", "cam_left_wrist")):
    """What the ALOHA recorder writes: 50 Hz, no timestamps, qpos/qvel/effort/action (T, 14)."""
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        f.attrs["sim"] = False
        f.attrs["compress"] = compress
        f.create_dataset("observations/qpos", data=rng.normal(size=(n, 14)))
        f.create_dataset("observations/qvel", data=rng.normal(size=(n, 14)))
        f.create_dataset("observations/effort", data=rng.normal(size=(n, 14)))
        f.create_dataset("action", data=rng.normal(size=(n, 14)))
        frames = {c: _frames(n, seed=i) for i, c in enumerate(cams)}
        if compress:
            jpegs = {c: [encode_jpeg(fr) for fr in frames[c]] for c in cams}
            padded = max(len(j) for js in jpegs.values() for j in js)
            lens = np.zeros((len(cams), n), dtype=np.int64)
            for ci, c in enumerate(cams):
                arr = np.zeros((n, padded), dtype=np.uint8)
                for i, j in enumerate(jpegs[c]):
                    arr[i, : len(j)] = np.frombuffer(j, np.uint8)
                    lens[ci, i] = len(j)
                f.create_dataset(f"observations/images/{c}", data=arr)
            f.create_dataset("compress_len", data=lens)
            f.attrs["camera_names"] = list(cams)
        else:
            for c in cams:
                f.create_dataset(f"observations/images/{c}", data=np.stack(frames[c]))
        if with_timestamps:
            f.create_dataset("timestamps/joints", data=np.arange(n, dtype=np.int64) * 20_000_000)
    return frames


def test_aloha_padded_jpeg_with_compress_len(tmp_path):
    p = tmp_path / "episode_0.hdf5"
    frames = _aloha_file(p, compress=True)
    with RawEpisode(p) as raw:
        assert raw.meta.episode_id == "episode_0"
        assert sorted(raw.cameras) == ["cam_high", "cam_left_wrist"]
        cam = raw.cameras["cam_left_wrist"]
        assert cam.encoding == "jpeg" and len(cam) == 20
        got = list(cam.iter_frames(batch=7))
        assert len(got) == 20
        assert np.abs(got[5].astype(int) - frames["cam_left_wrist"][5]).mean() < 6  # a JPEG of the same frame
        # no timestamps in the file: uniform 50 Hz
        assert np.array_equal(np.diff(raw.streams["joint_states"].timestamps_ns), np.full(19, 20_000_000))
        assert raw.streams["joint_states"].fields["position"].shape == (20, 14)
        assert raw.streams["action"].fields["command"].shape == (20, 14)


def test_aloha_uncompressed_rgb(tmp_path):
    p = tmp_path / "episode_1.hdf5"
    frames = _aloha_file(p, compress=False)
    with RawEpisode(p) as raw:
        cam = raw.cameras["cam_high"]
        assert cam.encoding == "rgb"
        assert np.array_equal(cam.frame(3), frames["cam_high"][3])
        assert np.array_equal(np.stack(list(cam.iter_frames())), np.stack(frames["cam_high"]))


def test_missing_camera_and_missing_required_stream(tmp_path):
    p = tmp_path / "nocam.hdf5"
    with h5py.File(p, "w") as f:
        f.create_dataset("observations/qpos", data=np.zeros((5, 3)))
        f.create_dataset("action", data=np.zeros((5, 3)))
    with pytest.raises(MissingStreamError, match="images"):
        RawEpisode(p)
    p2 = tmp_path / "noqpos.hdf5"
    _aloha_file(p2)
    with h5py.File(p2, "a") as f:
        del f["observations/qpos"]
    with pytest.raises(MissingStreamError, match="joint_states") as e:
        RawEpisode(p2)
    assert str(p2) in str(e.value)


def test_non_monotonic_and_mismatched_timestamps(tmp_path):
    p = tmp_path / "ts.hdf5"
    _aloha_file(p, with_timestamps=True)
    with h5py.File(p, "a") as f:
        ts = f["timestamps/joints"][()]
        ts[7], ts[8] = ts[8], ts[7]
        f["timestamps/joints"][...] = ts
    with pytest.raises(TimestampError, match="index 8") as e:
        RawEpisode(p)
    assert e.value.stream == "joint_states"
    with h5py.File(p, "a") as f:
        del f["timestamps/joints"]
        f.create_dataset("timestamps/joints", data=np.arange(19, dtype=np.int64))
    with pytest.raises(TimestampError, match="19 timestamps for 20 samples"):
        RawEpisode(p)


def test_truncated_and_non_hdf5_files(tmp_path):
    p = tmp_path / "t.hdf5"
    _aloha_file(p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(RawFormatError, match="cannot open as HDF5") as e:
        RawEpisode(p)
    assert e.value.path == str(p)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(RawFormatError):
        RawEpisode(junk)


def test_corrupt_jpeg_names_camera_and_frame(tmp_path):
    p = tmp_path / "c.hdf5"
    _aloha_file(p)
    with h5py.File(p, "a") as f:
        row = f["observations/images/cam_high"][4]
        row[10:] = 0  # keep SOI, destroy the rest
        f["observations/images/cam_high"][4] = row
    with RawEpisode(p) as raw:
        with pytest.raises(CorruptFrameError) as e:
            list(raw.cameras["cam_high"].iter_frames())
    assert e.value.frame_index == 4 and e.value.stream == "images/cam_high"
    assert str(p) in str(e.value)


@pytest.mark.parametrize("layout", ["jpeg", "aloha_rgb"])
def test_odd_frame_sizes_lose_their_last_column_and_row_in_the_transcode(layout, episode_factory, tmp_path):
    """H.264 in 4:2:0 has no odd sizes: a 161x121 camera becomes 160x120 (source pixels only, none
    invented) instead of failing the transcode with "yuv420p needs even frame sizes"."""
    from dyna_resources.episodes.codec import VideoSettings
    from dyna_resources.episodes.mcap_reader import EpisodeReader
    from dyna_resources.episodes.sim import SimulatedEpisode
    from dyna_resources.episodes.sim.aloha import write_aloha_episode
    from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode
    from tests.conftest import small_spec

    if layout == "jpeg":
        gen = episode_factory(episode_id="ep-odd", seed=83, duration_s=1.2, width=161, height=121)
        sim = SimulatedEpisode(gen.spec)
        src, render = gen.path, lambda cam, i: sim.render_frame(cam, int(gen.frame_indices[cam][i]))
    else:
        rec = write_aloha_episode(
            small_spec("odd", seed=84, duration_s=1.1, width=161, height=121),
            tmp_path / "episode_3.hdf5",
            compress=False,
            camera_names=("cam_high", "cam_low"),
        )
        src, render = rec.path, rec.render_frame
    out = tmp_path / "odd.mcap"
    report = transcode_episode(src, out, TranscodeSettings(video=VideoSettings(gop_frames=30, preset="veryfast")))
    assert {(c.width, c.height) for c in report.cameras.values()} == {(160, 120)}
    with RawEpisode(src) as raw, EpisodeReader(out) as r:
        for cam in raw.cameras:
            ts = raw.cameras[cam].timestamps_ns[[2, 20]]
            frames = r.read_frames([cam], ts)[cam]
            assert frames.images.shape[1:] == (120, 160, 3)
            for k, i in enumerate((2, 20)):
                diff = np.abs(frames.images[k].astype(int) - render(cam, i)[:120, :160]).mean()
                assert diff < 6, (cam, i, diff)
