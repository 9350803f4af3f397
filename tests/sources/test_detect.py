"""A landed item's format is told by its content: HDF5 by its signature (after a user block too), a ROS 2
bag by its directory's metadata.yaml (none yet: not ready), a LeRobot dataset by meta/info.json;
anything else is refused naming the item and what was expected."""

from __future__ import annotations

import json
import shutil

import h5py
import pytest

from dyna_resources.sources.detect import MCAP_MAGIC, BagNotReadyError, UnknownFormatError, detect


def test_the_legacy_hdf5_by_its_signature_whatever_its_name(tmp_path, episode_factory):
    ep = episode_factory(episode_id="ep-detect", duration_s=1.0)
    named = tmp_path / "recording.bin"
    shutil.copyfile(ep.path, named)
    assert detect(ep.path) == "hdf5" and detect(named) == "hdf5"
    with h5py.File(tmp_path / "user-block.h5", "w", userblock_size=1024) as f:
        f["x"] = [1, 2, 3]
    assert detect(tmp_path / "user-block.h5") == "hdf5"


def test_a_bag_directory_is_ready_only_with_its_metadata_yaml(tmp_path):
    bag = tmp_path / "rosbag2_2026_12_07"
    bag.mkdir()
    (bag / "rosbag2_2026_12_07_0.mcap").write_bytes(MCAP_MAGIC + b"\0" * 64)
    with pytest.raises(BagNotReadyError, match="no metadata.yaml yet") as e:
        detect(bag)
    assert str(bag) in str(e.value)
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: {version: 9}\n")
    assert detect(bag) == "ros2"
    with pytest.raises(UnknownFormatError, match="lands as its directory"):
        detect(bag / "rosbag2_2026_12_07_0.mcap")


def test_a_lerobot_dataset_by_its_info_json(tmp_path):
    ds = tmp_path / "pusht"
    (ds / "meta").mkdir(parents=True)
    (ds / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0"}))
    assert detect(ds) == "lerobot"
    (ds / "meta" / "info.json").write_text("{not json")
    with pytest.raises(UnknownFormatError, match="not JSON"):
        detect(ds)


@pytest.mark.parametrize("content", [b"", b"\xff\xd8\xff\xe0 a JPEG", b"PK\x03\x04 a zip"])
def test_anything_else_is_refused_naming_the_file_and_what_was_expected(tmp_path, content):
    path = tmp_path / "ep-0001.h5"
    path.write_bytes(content)
    with pytest.raises(UnknownFormatError) as e:
        detect(path)
    assert str(path) in str(e.value) and "ROS 2 bag directory" in str(e.value) and "HDF5" in str(e.value)
    (tmp_path / "folder").mkdir()
    with pytest.raises(UnknownFormatError, match="not a bag or dataset"):
        detect(tmp_path / "folder")
