import json

import h5py

from dyna_resources.episodes.batch import inspect_raw, transcode_batch
from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.transcode import TranscodeSettings

SETTINGS = TranscodeSettings(video=VideoSettings(gop_frames=30))


def test_unsafe_episode_id_is_rejected_before_it_names_a_file(episode_factory, tmp_path):
    gen = episode_factory(episode_id="ep-evil", seed=77, duration_s=2.0)
    evil = tmp_path / "evil.h5"
    evil.write_bytes(gen.path.read_bytes())
    with h5py.File(evil, "a") as f:
        f.attrs["episode_id"] = "../../outside"
    item = inspect_raw(evil)
    assert item.error and item.error["stream"] == "episode_id" and "not a safe identifier" in item.error["reason"]
    out, quarantine = tmp_path / "mcap", tmp_path / "q"
    report = transcode_batch([item], out, quarantine, settings=SETTINGS, workers=1)
    assert not report.transcoded and len(report.quarantined) == 1
    assert not list(tmp_path.parent.glob("outside*")) and not list(out.glob("*"))
    assert json.loads((quarantine / "evil.h5.json").read_text())["kind"] == "raw_format"


def test_batch_skips_up_to_date_and_redoes_changed_sources(episode_factory, tmp_path):
    gen = episode_factory(episode_id="ep-batch", seed=5, duration_s=2.0)
    src = tmp_path / "ep-batch.h5"
    src.write_bytes(gen.path.read_bytes())
    out, q = tmp_path / "mcap", tmp_path / "q"
    first = transcode_batch([inspect_raw(src)], out, q, settings=SETTINGS, workers=1)
    assert [r["episode_id"] for r in first.transcoded] == ["ep-batch"]
    again = transcode_batch([inspect_raw(src)], out, q, settings=SETTINGS, workers=1)
    assert again.up_to_date == ["ep-batch"] and not again.transcoded
    with h5py.File(src, "a") as f:  # the source changed: its hash no longer matches the stamp
        f.attrs["operator"] = "op-9"
    third = transcode_batch([inspect_raw(src)], out, q, settings=SETTINGS, workers=1)
    assert [r["episode_id"] for r in third.transcoded] == ["ep-batch"]
