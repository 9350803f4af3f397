"""LeRobot interop: v3.0 / v2.1 read, import to raw episodes, export from MCAP, round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from dyna_resources.episodes.codec import (
    FULL_RANGE,
    StreamingH264Decoder,
    VideoSettings,
    decoded_to_rgb,
    jpeg_to_yuv,
    to_yuv,
)
from dyna_resources.episodes.lerobot import (
    CAMERA_PREFIX,
    TRANSCODE_CRF,
    LeRobotEpisode,
    LeRobotFormatError,
    export_lerobot,
    frame_to_jpeg,
    import_lerobot,
    read_lerobot,
    write_lerobot,
)
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.raw_format import (
    EpisodeMeta,
    RawEpisode,
    SampleStream,
    encode_jpeg,
    write_raw_episode,
)
from dyna_resources.episodes.transcode import TranscodeSettings, transcode_episode

FPS = 30
H, W = 64, 96


def _frames(n: int, seed: int) -> np.ndarray:
    """Smooth gradients plus a moving square: compressible, yet every frame differs."""
    y, x = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        base = np.stack([x * 2 + i * 2 + seed * 10, y * 3 + i, (x + y) // 2 + seed * 17], -1).astype(np.uint8)
        cx = 8 + (i * 4) % (W - 24)
        base[20:36, cx : cx + 16] = (170, 150 + seed * 10, 140)
        out[i] = base
    return out


def _episodes(lengths=(20, 14)) -> list[LeRobotEpisode]:
    rng = np.random.default_rng(0)
    eps = []
    for k, n in enumerate(lengths):
        eps.append(
            LeRobotEpisode(
                index=k,
                task=f"task {k % 2}",
                fps=FPS,
                timestamps=np.arange(n) / FPS,
                states=rng.normal(size=(n, 6)).astype(np.float32),
                actions=rng.normal(size=(n, 7)).astype(np.float32),
                frames={"observation.images.top": _frames(n, k), "observation.images.wrist": _frames(n, k + 2)},
                state_names=[f"j{i}" for i in range(6)],
            )
        )
    return eps


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _mean_psnr(ref: dict, got: dict) -> float:
    return float(np.mean([psnr(np.asarray(ref[k]), np.asarray(got[k])) for k in ref]))


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_read_written_dataset(tmp_path, version):
    src = _episodes()
    write_lerobot(src, tmp_path / "ds", fps=FPS, version=version)
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["codebase_version"] == version and info["total_frames"] == 34
    got = list(read_lerobot(tmp_path / "ds"))
    assert [e.index for e in got] == [0, 1] and [e.task for e in got] == ["task 0", "task 1"]
    for a, b in zip(src, got):
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_allclose(b.timestamps, np.arange(len(a)) / FPS, atol=1e-6)
        assert b.state_names == a.state_names
        assert set(b.frames) == set(a.frames)
        assert _mean_psnr(a.frames, b.frames) > 35


def _imported(tmp_path, src=None, **kwargs):
    """The source written as a LeRobot dataset, read back, and imported as raw episodes."""
    src = src or _episodes()
    write_lerobot(src, tmp_path / "in", fps=FPS)
    return src, list(read_lerobot(tmp_path / "in")), import_lerobot(tmp_path / "in", tmp_path / "landing", **kwargs)


def _transcoded(tmp_path, paths, crf=None) -> list:
    """Through the pipeline's own settings by default: imported episodes' site picks TRANSCODE_CRF."""
    mcaps = [tmp_path / "mcap" / f"{p.stem}.mcap" for p in paths]
    settings = TranscodeSettings() if crf is None else TranscodeSettings(video=VideoSettings(crf=crf), crf_by_site=())
    for p, m in zip(paths, mcaps, strict=True):
        transcode_episode(p, m, settings)
    return mcaps


def _mcap_frames(path) -> dict[str, np.ndarray]:
    out = {}
    with EpisodeReader(str(path)) as reader:
        for cam in reader.cameras:
            decoder = StreamingH264Decoder()
            out[cam] = np.stack([decoded_to_rgb(f) for _, au in reader.iter_video(cam) for f in decoder.feed(au)])
    return out


def test_round_trip_import_transcode_export(tmp_path):
    src, imported, paths = _imported(tmp_path, robot_id="so100-1")  # site "lerobot": CRF_BY_SITE applies
    assert [p.name for p in paths] == ["in-000000.h5", "in-000001.h5"]
    assert not list((tmp_path / "landing").glob(".*.tmp"))
    for p, ep in zip(paths, imported):
        with RawEpisode(p) as raw:
            assert raw.meta.robot_id == "so100-1" and raw.meta.task == ep.task
            assert sorted(raw.cameras) == ["top", "wrist"]
            np.testing.assert_array_equal(np.asarray(raw.streams["joint_states"].fields["position"]), ep.states)
            np.testing.assert_array_equal(np.asarray(raw.streams["action"].fields["command"]), ep.actions)
            ts = raw.cameras["top"].timestamps_ns
            np.testing.assert_array_equal(np.diff(ts), np.diff(np.round(ep.timestamps * 1e9).astype(np.int64)))
    mcaps = _transcoded(tmp_path, paths)
    with EpisodeReader(str(mcaps[0])) as r:
        assert r.transcode_settings()["video"]["crf"] == TRANSCODE_CRF  # chosen by the episode's site

    manifest = [{"uri": m.as_uri(), "episode_id": m.stem, "task": ep.task} for m, ep in zip(mcaps, imported)]
    export_lerobot(manifest + manifest[:1], tmp_path / "out")  # duplicate rows: one episode each
    exported = list(read_lerobot(tmp_path / "out"))
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and info["total_episodes"] == 2

    for orig, imp, exp, mcap in zip(src, imported, exported, mcaps, strict=True):
        assert exp.task == imp.task and len(exp) == len(imp)
        np.testing.assert_array_equal(exp.states, imp.states.astype(np.float32))
        np.testing.assert_array_equal(exp.actions, imp.actions.astype(np.float32))
        stored = _mcap_frames(mcap)
        for key in orig.frames:
            # the MCAP's H.264 is muxed as it is: the export decodes to the very same pixels
            np.testing.assert_array_equal(np.asarray(exp.frames[key]), stored[key.removeprefix(CAMERA_PREFIX)])
            p_in = psnr(orig.frames[key], np.asarray(imp.frames[key]))
            p_out = psnr(orig.frames[key], np.asarray(exp.frames[key]))
            # Measured 0.34-0.72 dB at TRANSCODE_CRF 12; the pipeline's default CRF 21 loses 1.8-2.7.
            assert p_out >= p_in - 1.0, (key, p_in, p_out)


def _seek_like_lerobot(path, timestamps, tolerance_s=1e-4) -> list[np.ndarray]:
    """Frames at file timestamps as LeRobot's PyAV backend finds them: seek to the keyframe before
    the first, decode through the last, take the frame closest to each (within tolerance_s)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        container.seek(int(min(timestamps) / stream.time_base), stream=stream, backward=True)
        loaded = []
        for frame in container.decode(stream):
            loaded.append(frame)
            if frame.time >= max(timestamps):
                break
    times = np.array([f.time for f in loaded])
    closest = np.abs(times[None, :] - np.asarray(timestamps)[:, None]).argmin(1)
    assert np.all(np.abs(times[closest] - timestamps) < tolerance_s), (times[closest], timestamps)
    return [decoded_to_rgb(loaded[i]) for i in closest]


@pytest.mark.parametrize("gop", [None, 2])
def test_export_frames_found_by_timestamp(tmp_path, gop):
    """Remuxed (the MCAP's GOPs) or re-encoded with LeRobot's keyframe every 2 frames."""
    _, _, paths = _imported(tmp_path, _episodes((20, 14, 9)))
    export_lerobot([m.as_uri() for m in _transcoded(tmp_path, paths)], tmp_path / "out", gop=gop)
    exported = list(read_lerobot(tmp_path / "out"))
    episodes = pq.read_table(tmp_path / "out/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for key in ("observation.images.top", "observation.images.wrist"):
        video = tmp_path / "out/videos" / key / "chunk-000/file-000.mp4"
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            assert stream.average_rate == FPS and stream.frames == 43  # torchcodec's index = round(t * fps)
            keyframes = [round(p.pts * stream.time_base * FPS) for p in container.demux(stream) if p.is_keyframe]
        # every episode starts at a keyframe (with SPS/PPS in band)
        assert keyframes == ([0, 20, 34] if gop is None else [*range(0, 20, 2), *range(20, 34, 2), *range(34, 43, 2)])
        for ep, meta in zip(exported, episodes, strict=True):
            start = meta[f"videos/{key}/from_timestamp"]
            assert meta[f"videos/{key}/to_timestamp"] == pytest.approx(start + len(ep) / FPS)
            for rows in ([0], [len(ep) - 1], [1, 3, 4], list(range(len(ep)))):
                got = _seek_like_lerobot(video, [start + r / FPS for r in rows])
                np.testing.assert_array_equal(np.stack(got), np.asarray(ep.frames[key])[rows])


def test_export_reencodes_a_camera_that_is_not_one_frame_per_row(tmp_path, caplog):
    n = 12
    ts = 1_000_000_000 + np.arange(n, dtype=np.int64) * 33_333_333
    top, wrist = _frames(n, 0), _frames(n, 1)
    keep = np.array([i for i in range(n) if i != 5])  # the wrist camera dropped frame 5
    meta = EpisodeMeta(episode_id="drop", robot_model="so100", task="t", started_at="1970-01-01T00:00:01Z")
    streams = {
        "joint_states": SampleStream("joint_states", ts, {"position": np.arange(n * 2.0).reshape(n, 2)}),
        "action": SampleStream("action", ts, {"command": np.arange(n * 3.0).reshape(n, 3)}),
    }
    write_raw_episode(
        tmp_path / "drop.h5",
        meta,
        {
            "top": (ts, [encode_jpeg(f, 100) for f in top]),
            "wrist": (ts[keep], [encode_jpeg(wrist[i], 100) for i in keep]),
        },
        streams,
    )
    mcap = _transcoded(tmp_path, [tmp_path / "drop.h5"])[0]
    with caplog.at_level("WARNING", logger="dyna_resources.episodes.lerobot"):
        export_lerobot([mcap.as_uri()], tmp_path / "out")
    assert "camera wrist has 11 frames for 12 rows" in caplog.text
    (ep,) = read_lerobot(tmp_path / "out")
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["robot_type"] == "so100" and len(ep) == n
    np.testing.assert_array_equal(ep.states, np.arange(n * 2.0).reshape(n, 2))
    np.testing.assert_array_equal(np.asarray(ep.frames["observation.images.top"]), _mcap_frames(mcap)["top"])
    nearest = keep[[0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10]]  # row 5 ties between frames 4 and 6: the earlier
    assert psnr(wrist[nearest], np.asarray(ep.frames["observation.images.wrist"])) > 35


def test_episodes_of_another_size_start_a_new_video_file(tmp_path):
    small, large = _episodes((6,))[0], _episodes((5,))[0]
    large.frames = {k: np.repeat(np.repeat(np.asarray(f), 2, 1), 2, 2) for k, f in large.frames.items()}
    write_lerobot([small, large, small], tmp_path / "ds", fps=FPS)
    episodes = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    key = "observation.images.top"
    assert [e[f"videos/{key}/file_index"] for e in episodes] == [0, 1, 2]
    assert [e[f"videos/{key}/from_timestamp"] for e in episodes] == [0.0, 0.0, 0.0]
    got = list(read_lerobot(tmp_path / "ds"))
    assert [np.asarray(e.frames[key]).shape[1:3] for e in got] == [(H, W), (2 * H, 2 * W), (H, W)]
    assert psnr(np.asarray(large.frames[key]), np.asarray(got[1].frames[key])) > 35


def _av1_like_lerobot(src, root) -> None:
    """Re-encode each camera's v3.0 MP4 the way lerobot 0.4 writes it: AV1 (SVT), yuv420p from
    RGB through swscale's defaults (limited range), a keyframe every 2 frames, CRF 30."""
    for key in src[0].frames:
        path = root / "videos" / key / "chunk-000/file-000.mp4"
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libsvtav1", rate=FPS, options={"crf": "30", "g": "2", "preset": "10"})
            stream.pix_fmt, stream.width, stream.height = "yuv420p", W, H
            for frame in (f for ep in src for f in ep.frames[key]):
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode(None))


def test_import_keeps_limited_range_av1_frames(tmp_path):
    src = _episodes()
    write_lerobot(src, tmp_path / "in", fps=FPS)
    _av1_like_lerobot(src, tmp_path / "in")
    decoded = list(read_lerobot(tmp_path / "in", rgb=False))
    assert decoded[0].frames["observation.images.top"][0].color_range != FULL_RANGE
    paths = import_lerobot(tmp_path / "in", tmp_path / "landing")
    for path, ep in zip(paths, decoded, strict=True):
        with RawEpisode(path) as raw:
            for key, frames in ep.frames.items():
                jpeg = np.stack(list(raw.cameras[key.removeprefix(CAMERA_PREFIX)].iter_frames()))
                # the import's JPEG adds ~0.15 dB to what the AV1 already lost
                assert psnr(np.stack([decoded_to_rgb(f) for f in frames]), jpeg) > 45, key


def test_jpeg_from_planes_keeps_full_range_planes():
    frame = to_yuv(_frames(1, 0)[0])
    planes = jpeg_to_yuv(frame_to_jpeg(frame, 100)).to_ndarray()
    assert psnr(frame.to_ndarray(), planes) > 50
    assert len(frame_to_jpeg(frame, 90)) < len(frame_to_jpeg(frame, 100))


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_statistics_as_lerobot_writes_them(tmp_path, version):
    src = _episodes()
    write_lerobot(src, tmp_path / "ds", fps=FPS, version=version)
    stats = json.loads((tmp_path / "ds/meta/stats.json").read_text())
    names = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
    assert set(stats) == {
        "observation.state",
        "action",
        "observation.images.top",
        "observation.images.wrist",
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    }
    assert all(set(s) == names for s in stats.values())
    states = np.concatenate([e.states for e in src])
    np.testing.assert_allclose(stats["observation.state"]["mean"], states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["std"], states.std(0), rtol=1e-5)
    assert stats["index"]["count"] == [34] and stats["frame_index"]["max"] == [19]
    top = stats["observation.images.top"]
    assert np.asarray(top["mean"]).shape == (3, 1, 1) and top["count"] == [34]
    pixels = np.concatenate([e.frames["observation.images.top"] for e in src]).reshape(-1, 3) / 255
    np.testing.assert_allclose(np.ravel(top["mean"]), pixels.mean(0), atol=0.01)
    np.testing.assert_allclose(np.ravel(top["std"]), pixels.std(0), atol=0.01)
    if version == "v3.0":
        episodes = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet").to_pylist()
        np.testing.assert_allclose(episodes[1]["stats/action/min"], src[1].actions.min(0))
        assert episodes[0]["stats/observation.images.wrist/count"] == [20]
    else:
        lines = (tmp_path / "ds/meta/episodes_stats.jsonl").read_text().splitlines()
        np.testing.assert_allclose(json.loads(lines[1])["stats"]["action"]["min"], src[1].actions.min(0))


def test_missing_info_json(tmp_path):
    write_lerobot(_episodes((5,)), tmp_path / "ds", fps=FPS)
    (tmp_path / "ds/meta/info.json").unlink()
    with pytest.raises(LeRobotFormatError, match="info.json"):
        list(read_lerobot(tmp_path / "ds"))


def test_unknown_version(tmp_path):
    write_lerobot(_episodes((5,)), tmp_path / "ds", fps=FPS)
    p = tmp_path / "ds/meta/info.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "codebase_version": "v9.9"}))
    with pytest.raises(LeRobotFormatError, match="v9.9"):
        list(read_lerobot(tmp_path / "ds"))


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_truncated_video_names_the_file(tmp_path, version):
    write_lerobot(_episodes((12,)), tmp_path / "ds", fps=FPS, version=version)
    video = next((tmp_path / "ds/videos").rglob("*.mp4"))
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 2])
    with pytest.raises(LeRobotFormatError, match=video.name):
        list(read_lerobot(tmp_path / "ds"))


def test_frame_count_mismatch(tmp_path):
    write_lerobot(_episodes((8,)), tmp_path / "ds", fps=FPS, version="v2.1")
    # the episode's video now holds 8 frames for 6 data rows
    data = next((tmp_path / "ds/data").rglob("*.parquet"))
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(data).slice(0, 6), data)
    with pytest.raises(LeRobotFormatError, match="8 frames in the video for 6 data rows"):
        list(read_lerobot(tmp_path / "ds"))


def test_lerobot_module_is_plain_python():
    code = "import sys, dyna_resources.episodes.lerobot; print('dagster' in sys.modules, 'lerobot' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


def test_a_failed_export_leaves_nothing_and_a_dataset_is_never_written_over(tmp_path):
    _, _, paths = _imported(tmp_path)
    good = _transcoded(tmp_path, paths)[0]
    missing = tmp_path / "mcap" / "gone.mcap"
    with pytest.raises(Exception, match="gone.mcap"):
        export_lerobot([good.as_uri(), missing.as_uri()], tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    assert export_lerobot([good.as_uri()], tmp_path / "out") == tmp_path / "out"
    with pytest.raises(FileExistsError, match="not empty"):
        export_lerobot([good.as_uri()], tmp_path / "out")
    assert [e.index for e in read_lerobot(tmp_path / "out")] == [0]
