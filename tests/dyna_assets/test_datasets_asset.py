"""The `datasets` asset on an ephemeral Dagster instance: publish, a second version with its diff,
and a rebuilt manifest that cannot change a published version."""

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance, FloatMetadataValue, materialize

from dyna_assets.datasets.assets import datasets
from dyna_resources.catalog.datasets import DatasetRegistry, ManifestIntegrityError
from dyna_resources.catalog.manifest import write_manifest
from dyna_resources.resources import HomeResource

H = 3_600_000_000_000


def write(home, episodes):
    rows = {
        "episode_id": [e for e, _, _ in episodes],
        "task": [t for _, t, _ in episodes],
        "start_ns": [0] * len(episodes),
        "end_ns": [int(h * H) for _, _, h in episodes],
    }
    return write_manifest(pa.table(rows), home / "manifests", "spec-a", count_by=("task",))


def declare(home, version):
    (home / "curation" / "datasets").mkdir(parents=True, exist_ok=True)
    (home / "curation" / "datasets" / "spec-a.yaml").write_text(f"name: mix\nversion: {version}\nnotes: test\n")


def run(home, instance):
    return materialize(
        [datasets], instance=instance, partition_key="spec-a", resources={"home": HomeResource(root=str(home))}
    )


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An embedded home (SQLite registry, local manifest store) with the curation spec ``spec-a``."""
    monkeypatch.delenv("DYNA_REGISTRY_URL", raising=False)
    monkeypatch.delenv("DYNA_MANIFEST_STORE", raising=False)
    home = tmp_path / "home"
    (home / "curation").mkdir(parents=True)
    (home / "curation" / "spec-a.yaml").write_text("name: spec-a\n")
    return home


def test_publish_versions_diff_and_immutability(home):
    v1 = write(home, [("e1", "pick", 1), ("e2", "fold", 2)])
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["spec-a"])
        (m,) = run(home, instance).asset_materializations_for_node("datasets")
        assert m.metadata["published"].value is False and "nothing to publish" in m.metadata["reason"].value

        declare(home, "1.0.0")
        (m,) = run(home, instance).asset_materializations_for_node("datasets")
        assert m.metadata["dataset"].value == "mix@1.0.0" and m.metadata["sha256"].value == v1.sha256
        assert m.metadata["rows"].value == 2 and m.metadata["episodes"].value == 2
        assert "diff" not in m.metadata
        hours = m.metadata["segment_hours"]  # a float for the Plots tab, rounded for reading
        assert isinstance(hours, FloatMetadataValue) and hours.value == float(f"{hours.value:.4g}") > 0

        v2 = write(home, [("e2", "fold", 2), ("e3", "pick", 0.5)])
        declare(home, "1.1.0")
        (m,) = run(home, instance).asset_materializations_for_node("datasets")
        assert m.metadata["dataset"].value == "mix@1.1.0" and m.metadata["sha256"].value == v2.sha256
        diff = m.metadata["diff"].value
        assert diff["episodes_added"] == ["e3"] and diff["episodes_removed"] == ["e1"]
        assert diff["hours_by_task_before"] == {"fold": 2.0, "pick": 1.0}
        assert diff["hours_by_task_after"] == {"fold": 2.0, "pick": 0.5}
        assert m.metadata["previous"].value == "mix@1.0.0"

        # the manifest is rebuilt with other rows while the declaration still says 1.1.0: refused
        write(home, [("e9", "wipe", 3)])
        result = materialize(
            [datasets],
            instance=instance,
            partition_key="spec-a",
            raise_on_error=False,
            resources={"home": HomeResource(root=str(home))},
        )
        assert not result.success
        (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "mix@1.1.0" in str(failure.step_failure_data.error) and "immutable" in str(
            failure.step_failure_data.error
        )

    reg = DatasetRegistry(f"sqlite:///{home / 'registry.sqlite'}")
    try:
        for ref, info in (("mix@1.0.0", v1), ("mix@1.1.0", v2)):
            got = reg.resolve(ref)
            assert got.sha256 == info.sha256
            data = Path(got.arrow_url.removeprefix("file://")).read_bytes()
            assert hashlib.sha256(data).hexdigest() == info.sha256
    finally:
        reg.close()


def test_training_names_its_data_by_dataset_version(home):
    from dyna_resources.resources import CacheResource, TrainerResource

    v1 = write(home, [("e1", "pick", 1), ("e2", "fold", 2)])
    declare(home, "1.0.0")
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["spec-a"])
        run(home, instance)
    write(home, [("e9", "pick", 3)])  # the spec's manifest moves on; the dataset version does not
    h = HomeResource(root=str(home))
    training = TrainerResource(dataset="mix@1.0.0").prepare(
        h, CacheResource(home=HomeResource(root=str(home))), "spec-a"
    )
    assert training.config["lineage"]["dataset"] == "mix@1.0.0"
    assert training.config["lineage"]["manifest_sha256"] == v1.sha256
    assert "/datasets/mix/1.0.0/" in training.config["manifest"]
    # A published manifest rewritten in the store, its sidecar forged to match, is refused: the
    # downloaded copy's hash is checked against the one the registry recorded at publish.
    arrow = Path(training.config["manifest"].removeprefix("file://"))
    sidecar = arrow.with_suffix(".json")
    forged = arrow.read_bytes() + b"\0"
    arrow.write_bytes(forged)
    meta = json.loads(sidecar.read_text())
    meta["sha256"], meta["arrow_bytes"] = hashlib.sha256(forged).hexdigest(), len(forged)
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(ManifestIntegrityError, match="published as " + v1.sha256):
        TrainerResource(dataset="mix@1.0.0").prepare(h, CacheResource(home=HomeResource(root=str(home))), "spec-a")
