"""A run refuses a manifest whose episodes lack its read profile's stream, before any rank starts."""

import pyarrow as pa
import pytest

from dyna_resources.episodes.read_profiles import EMBEDDED
from trainer.launch import MissingStreamError, check_manifest_streams

T64 = EMBEDDED["t64"]


def write(path, columns: dict):
    table = pa.table(columns)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return path


def test_episodes_lacking_the_stream_are_named_once_each(tmp_path):
    token = T64.stream_token()
    other = EMBEDDED["t128"].stream_token()
    streams = pa.array([token, f"{other},{token}", other, None, other], pa.string()).dictionary_encode()
    arrow = write(tmp_path / "m.arrow", {"episode_id": ["a", "b", "c", "d", "c"], "training_streams": streams})
    with pytest.raises(MissingStreamError) as e:
        check_manifest_streams(arrow, T64, "gs://m/spec.arrow")
    assert e.value.episodes == ["c", "d"] and e.value.total == 2
    assert "gs://m/spec.arrow: 2 episode(s) lack training stream " + token in str(e.value)
    assert "'training_streams'" in str(e.value)
    check_manifest_streams(arrow, EMBEDDED["archive"], "m")  # a run of the archive stream reads them all


def test_a_manifest_built_before_the_column_lacks_it_everywhere(tmp_path):
    arrow = write(tmp_path / "old.arrow", {"episode_id": [f"e{i:02d}" for i in range(12)]})
    with pytest.raises(MissingStreamError, match=r"12 episode\(s\) lack .*: e00, e01, .*e09 and 2 more\."):
        check_manifest_streams(arrow, T64, "old")


def test_a_manifest_whose_episodes_all_carry_it_passes(tmp_path):
    token = T64.stream_token()
    arrow = write(tmp_path / "ok.arrow", {"episode_id": ["a", "b"], "training_streams": [token, token]})
    check_manifest_streams(arrow, T64, "ok")
