"""Dataset registry: immutable name@version bound to a manifest hash, semver ordering, diffs,
published copies (Arrow IPC and Parquet) verified against their recorded hashes on resolve."""

import hashlib
import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from dyna_resources.catalog.datasets import (
    DatasetError,
    DatasetRegistry,
    ImmutableDatasetError,
    ManifestIntegrityError,
    UnknownDatasetError,
    parse_ref,
    resolve_manifest_url,
    semver_key,
)
from dyna_resources.catalog.manifest import write_manifest

H = 3_600_000_000_000  # one hour in ns


def manifest(dest, name, episodes):
    """episodes: (episode_id, task, [segment hours...]) -> manifest files + sidecar dict."""
    rows = {"episode_id": [], "task": [], "start_ns": [], "end_ns": []}
    for ep, task, segs in episodes:
        for h in segs:
            rows["episode_id"].append(ep)
            rows["task"].append(task)
            rows["start_ns"].append(0)
            rows["end_ns"].append(int(h * H))
    info = write_manifest(pa.table(rows), dest, name, count_by=("task",))
    return info, json.loads(Path(info.sidecar).read_text())


def publish(reg, name, version, info, sidecar, spec_text="name: s\n", notes=""):
    return reg.publish(
        name, version, "s", spec_text, sidecar, arrow_url=info.arrow, parquet_url=info.parquet, notes=notes
    )


@pytest.fixture
def reg(tmp_path):
    r = DatasetRegistry(f"sqlite:///{tmp_path / 'registry.sqlite'}", str(tmp_path / "store"))
    yield r
    r.close()


def test_publish_resolve_same_hash_and_immutable_copy(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1, 0.5])])
    ref, new = publish(reg, "mix", "1.0.0", info, sc)
    assert new and ref.sha256 == info.sha256 and ref.rows == 2 and ref.episodes == 1
    assert ref.arrow_url.startswith(f"file://{tmp_path / 'store'}/datasets/mix/1.0.0/")
    original = Path(info.arrow).read_bytes()
    # the spec's manifest is rebuilt with other rows: the published version does not move
    info2, _ = manifest(tmp_path / "m", "s", [("e2", "fold", [2])])
    assert info2.sha256 != info.sha256
    for r in ("mix@1.0.0", "mix", "mix@latest"):
        got = reg.resolve(r)
        assert got.sha256 == info.sha256
    assert Path(ref.arrow_url.removeprefix("file://")).read_bytes() == original
    assert resolve_manifest_url("mix@1.0.0", f"sqlite:///{tmp_path / 'registry.sqlite'}") == (
        ref.arrow_url,
        info.sha256,
    )


def test_published_copy_loads_through_the_trainer_verifier(reg, tmp_path):
    from trainer.manifest_loader import local_copy, open_manifest

    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    ref, _ = publish(reg, "mix", "1.0.0", info, sc)
    path = local_copy(ref.arrow_url, tmp_path / "cache")
    assert path.name == f"{info.sha256}.arrow" and open_manifest(path).num_rows == 1


def test_immutable_and_identical_republish_is_noop(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    first, _ = publish(reg, "mix", "1.0.0", info, sc, notes="first")
    again, new = publish(reg, "mix", "1.0.0", info, sc, notes="other notes")
    assert not new and again == first
    info2, sc2 = manifest(tmp_path / "m", "s", [("e2", "pick", [1])])
    with pytest.raises(ImmutableDatasetError, match=r"mix@1\.0\.0.*manifest"):
        publish(reg, "mix", "1.0.0", info2, sc2)
    with pytest.raises(ImmutableDatasetError, match="spec text"):
        publish(reg, "mix", "1.0.0", info, sc, spec_text="name: s\nwhere: {}\n")
    assert reg.resolve("mix@1.0.0").sha256 == info.sha256


def test_manifest_changed_under_the_sidecar_is_refused(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    with pytest.raises(DatasetError, match="SHA-256"):
        publish(reg, "mix", "1.0.0", info, {**sc, "sha256": "0" * 64})
    with pytest.raises(UnknownDatasetError):
        reg.resolve("mix")


def test_semver_ordering_and_latest(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    order = [
        "0.9.0",
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.2.0",
        "1.10.0",
        "2.0.0-rc.1",
    ]
    assert (
        sorted(["1.10.0", "1.0.0-beta.11", *order[:5], "2.0.0-rc.1", "1.0.0", "1.2.0", "1.0.0-rc.1"], key=semver_key)
        == order
    )
    for v in ["1.2.0", "1.10.0", "1.0.0-rc.1", "0.9.0"]:
        publish(reg, "mix", v, info, sc)
    assert reg.versions("mix") == ["0.9.0", "1.0.0-rc.1", "1.2.0", "1.10.0"]
    assert reg.resolve("mix@latest").version == "1.10.0"
    publish(reg, "mix", "2.0.0-rc.1", info, sc)
    assert reg.resolve("mix").version == "2.0.0-rc.1"  # "latest" = highest, pre-releases included
    assert reg.previous("mix@1.2.0").version == "1.0.0-rc.1"


@pytest.mark.parametrize(
    "bad",
    ["", "@1.0.0", "mix@", "mix@1.0", "mix@01.0.0", "mix@1.0.0+build", "a@b@c", "mi x@1.0.0", "mix@v1.0.0", None, 3],
)
def test_malformed_refs(reg, bad):
    with pytest.raises(DatasetError):
        parse_ref(bad)
    with pytest.raises(DatasetError):
        reg.resolve(bad)


def test_bad_publish_input_and_unknowns(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    with pytest.raises(DatasetError, match="version"):
        publish(reg, "mix", "1.0", info, sc)
    with pytest.raises(DatasetError, match="name"):
        publish(reg, "bad name", "1.0.0", info, sc)
    with pytest.raises(DatasetError, match="sha256"):
        publish(reg, "mix", "1.0.0", info, {})
    with pytest.raises(UnknownDatasetError, match="'nope'"):
        reg.resolve("nope@1.0.0")
    publish(reg, "mix", "1.0.0", info, sc)
    with pytest.raises(UnknownDatasetError, match=r"mix@1\.0\.1.*published: 1\.0\.0"):
        reg.resolve("mix@1.0.1")


def test_diff_exact(reg, tmp_path):
    a, sa = manifest(tmp_path / "a", "s", [("e1", "pick", [1, 0.5]), ("e2", "fold", [2]), ("e3", "pick", [0.25])])
    b, sb = manifest(tmp_path / "b", "s", [("e2", "fold", [2, 1]), ("e3", "pick", [0.25]), ("e4", "wipe", [3])])
    publish(reg, "mix", "1.0.0", a, sa)
    publish(reg, "mix", "1.1.0", b, sb)
    d = reg.diff("mix@1.0.0", "mix@1.1.0")
    assert d.episodes_added == ["e4"] and d.episodes_removed == ["e1"]
    assert (d.rows_before, d.rows_after) == (4, 4)
    assert d.hours_by_task_before == {"fold": 2.0, "pick": 1.75}
    assert d.hours_by_task_after == {"fold": 3.0, "pick": 0.25, "wipe": 3.0}
    assert "+1 / -1" in d.markdown()


def test_postgres_round_trip(postgres_url, tmp_path):
    reg = DatasetRegistry(postgres_url, str(tmp_path / "store"))
    try:
        info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
        ref, new = publish(reg, "pg-mix", "1.0.0", info, sc)
        assert new and reg.resolve("pg-mix").sha256 == info.sha256 == ref.sha256
        assert not publish(reg, "pg-mix", "1.0.0", info, sc)[1]
    finally:
        reg.close()


def _sha(url: str) -> str:
    return hashlib.sha256(Path(url.removeprefix("file://")).read_bytes()).hexdigest()


def _tamper(url: str) -> None:
    """Flip one byte in the middle: same size, other content."""
    path = Path(url.removeprefix("file://"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_both_published_copies_are_hashed_at_publish(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    ref, _ = publish(reg, "mix", "1.0.0", info, sc)
    assert ref.sha256 == _sha(ref.arrow_url) and ref.parquet_sha256 == _sha(ref.parquet_url)
    assert ref.parquet_sha256 == hashlib.sha256(Path(info.parquet).read_bytes()).hexdigest()
    published = json.loads(Path(ref.arrow_url.removeprefix("file://")).with_suffix(".json").read_text())
    assert published["parquet_sha256"] == ref.parquet_sha256
    assert reg.resolve("mix@1.0.0") == ref


def test_a_changed_parquet_copy_fails_resolve_naming_the_file(reg, tmp_path):
    a, sa = manifest(tmp_path / "a", "s", [("e1", "pick", [1])])
    b, sb = manifest(tmp_path / "b", "s", [("e2", "pick", [1])])
    publish(reg, "mix", "1.0.0", a, sa)
    ref, _ = publish(reg, "mix", "1.1.0", b, sb)
    _tamper(ref.parquet_url)
    actual = _sha(ref.parquet_url)
    for call in (
        lambda: reg.resolve("mix@1.1.0"),
        lambda: reg.resolve("mix"),
        lambda: reg.diff("mix@1.0.0", "mix"),
        lambda: resolve_manifest_url("mix@1.1.0", f"sqlite:///{tmp_path / 'registry.sqlite'}"),
    ):
        with pytest.raises(ManifestIntegrityError) as e:
            call()
        msg = str(e.value)
        assert ref.parquet_url in msg and "Parquet" in msg and "mix@1.1.0" in msg
        assert ref.parquet_sha256 in msg and actual in msg and "manifest_parquet_sha256" in msg
    assert reg.resolve("mix@1.0.0").version == "1.0.0"  # the other version is intact
    assert reg.resolve("mix@1.1.0", verify=False) == ref  # looking the row up still works
    assert reg.previous("mix@1.1.0").version == "1.0.0"


def test_a_changed_or_missing_arrow_copy_fails_resolve(reg, tmp_path):
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    ref, _ = publish(reg, "mix", "1.0.0", info, sc)
    _tamper(ref.arrow_url)
    with pytest.raises(
        ManifestIntegrityError,
        match=rf"Arrow IPC manifest {ref.arrow_url} has SHA-256 \w+, but "
        rf"{ref.sha256} was recorded",
    ):
        reg.resolve("mix@1.0.0")
    Path(ref.arrow_url.removeprefix("file://")).unlink()
    with pytest.raises(ManifestIntegrityError, match="does not exist"):
        reg.resolve("mix@1.0.0")


def test_versions_published_before_the_parquet_hash_check_their_arrow_copy(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    reg = DatasetRegistry(url, str(tmp_path / "store"))
    info, sc = manifest(tmp_path / "m", "s", [("e1", "pick", [1])])
    ref, _ = publish(reg, "mix", "1.0.0", info, sc)
    reg.close()
    with sqlite3.connect(tmp_path / "registry.sqlite") as db:  # the table as older code created it
        db.execute("ALTER TABLE datasets DROP COLUMN manifest_parquet_sha256")
    reg = DatasetRegistry(url, str(tmp_path / "store"))  # adds the column back, NULL for old rows
    try:
        old = reg.resolve("mix@1.0.0")
        assert old.parquet_sha256 is None and old.sha256 == ref.sha256
        _tamper(old.parquet_url)
        assert reg.resolve("mix@1.0.0").version == "1.0.0"  # nothing recorded to check the Parquet against
        _tamper(old.arrow_url)
        with pytest.raises(ManifestIntegrityError, match="Arrow IPC"):
            reg.resolve("mix@1.0.0")
    finally:
        reg.close()


def test_a_dataset_declaration_is_read_or_refused_naming_its_file(tmp_path):
    from dyna_resources.catalog.datasets import DatasetDeclaration

    path = tmp_path / "spec-a.yaml"
    assert DatasetDeclaration.load(path) is None  # no declaration: nothing to publish
    path.write_text("name: mix\nversion: 1.2.0\n")
    assert DatasetDeclaration.load(path) == DatasetDeclaration("mix", "1.2.0", "")
    for bad in ("name: mix\n", "[1, 2]\n", "name: mix\nversion: 1.0.0\nowner: me\n"):
        path.write_text(bad)
        with pytest.raises(DatasetError, match=f"{path}: expected a mapping with name, version"):
            DatasetDeclaration.load(path)
