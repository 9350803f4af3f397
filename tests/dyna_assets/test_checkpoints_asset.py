"""The checkpoints asset on an ephemeral Dagster instance: the trainer launched through Pipes,
metrics streamed back, lineage recorded; materializing again resumes the same run."""

import base64
import json
from pathlib import Path

from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    FloatMetadataValue,
    MarkdownMetadataValue,
    materialize,
)

from dyna_assets.cache.sensors import DATA_VERSION_TAG
from dyna_assets.dagster_private import stale_status
from dyna_assets.definitions import defs
from dyna_resources.catalog.manifest import write_manifest
from dyna_resources.resources import CacheResource, HomeResource, TrainerResource


def small_frames(home: Path) -> HomeResource:
    """A home whose read profile hands the model 32 x 32 archive frames (a small, quick model)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "read_profiles.yaml").write_text("archive32: {output_size: [32, 32]}\n")
    return HomeResource(root=str(home), read_profile="archive32")


def test_checkpoints_asset_trains_through_pipes_and_records_lineage(tmp_path, mcap_fleet):
    _, manifest = mcap_fleet
    home = tmp_path / "home"
    write_manifest(manifest, home / "manifests", "spec-t")
    res = {
        "home": small_frames(home),
        "cache": CacheResource(home=small_frames(home)),
        "trainer": TrainerResource(
            nproc_per_node=1, max_restarts=0, steps=6, batch_size=2, workers=0, checkpoint_every=3
        ),
    }
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["spec-t"])

        def upstream(name, version):  # what a manifests / cache_sets build records (built by hand here)
            instance.report_runless_asset_event(
                AssetMaterialization(name, partition="spec-t", tags={DATA_VERSION_TAG: version})
            )

        upstream("manifests", "manifest-v1")
        upstream("cache_sets", "warm-v1")
        result = materialize(
            [defs.get_assets_def("checkpoints")], instance=instance, partition_key="spec-t", resources=res
        )
        assert result.success
        (m,) = result.asset_materializations_for_node("checkpoints")
        md = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        assert md["steps"] == 6 and md["attempt"] == 0 and md["optimizer_mode"] == "single"
        assert md["loss_last"] < md["loss_first"]
        assert [p["step"] for p in md["loss_curve"]] == [5, 6]  # streamed while training (log_every 5, last)
        # the same curves drawn: a PNG inline in the markdown metadata
        assert isinstance(m.metadata["curves"], MarkdownMetadataValue)
        prefix = "![loss and data wait by step](data:image/png;base64,"
        assert md["curves"].startswith(prefix)
        assert base64.b64decode(md["curves"][len(prefix) : -1])[:8] == b"\x89PNG\r\n\x1a\n"
        # the PNG is over the 1,000 characters Dagster shows in place; the loss line beside it is not
        assert isinstance(m.metadata["loss"], MarkdownMetadataValue) and len(md["loss"]) < 1000
        assert md["loss"].startswith("![loss from ") and "(data:image/svg+xml,%3Csvg" in md["loss"]
        # the trainer's floats rounded for reading, still numbers the Plots tab graphs
        for key in ("loss_first", "loss_last", "samples_per_s", "checkpoint_write_s"):
            assert isinstance(m.metadata[key], FloatMetadataValue), key
            assert md[key] == float(f"{md[key]:.4g}"), key
        lineage = md["lineage"]
        assert lineage["curation_spec"] == "spec-t" and len(lineage["manifest_sha256"]) == 64
        assert lineage["pipeline_version"] and lineage["code_commit"]
        profile = small_frames(home).profile()
        assert lineage["read_profile"] == {"name": "archive32", "digest": profile.digest}
        assert md["config"]["sample"]["image_size"] == [32, 32] and md["config"]["sample"]["stream"] is None
        done = json.loads((Path(md["checkpoints_dir"]) / "step-000000006" / "COMPLETE.json").read_text())
        assert done["extra"]["lineage"] == lineage
        again = materialize(
            [defs.get_assets_def("checkpoints")], instance=instance, partition_key="spec-t", resources=res
        )
        (m2,) = again.asset_materializations_for_node("checkpoints")
        assert m2.metadata["steps"].value == 6 and m2.metadata["checkpoints_dir"].value == md["checkpoints_dir"]
        # trained on this manifest: current; a manifest with new content makes the checkpoint stale, naming it
        graph = [defs.get_assets_def(k) for k in ("manifests", "cache_sets", "checkpoints")]
        assert stale_status(instance, graph, AssetKey("checkpoints"), "spec-t") == ("FRESH", [])
        upstream("manifests", "manifest-v2")
        status, causes = stale_status(instance, graph, AssetKey("checkpoints"), "spec-t")
        assert status == "STALE" and [(k, p) for k, p, _ in causes] == [(AssetKey("manifests"), "spec-t")], causes


def _manifest_of_copies(tmp_path: Path, mcap_fleet, spec: str) -> tuple[list[Path], Path]:
    """The session's MCAPs copied (they stay whole: a test damages its own copies) and a manifest of the
    copies written under ``spec`` in a new home: (the copies, the home)."""
    import shutil

    from tests.conftest import segment_rows

    paths, _ = mcap_fleet
    copies = []
    for p in paths:
        copies.append(tmp_path / "mcap" / p.name)
        copies[-1].parent.mkdir(exist_ok=True)
        shutil.copyfile(p, copies[-1])
    home = tmp_path / "home"
    write_manifest(segment_rows(copies), home / "manifests", spec)
    return copies, home


def _train_until_it_fails(home: Path, spec: str, workers: int):
    """The checkpoints partition ``spec`` materialized (torchrun with 2 restarts): the Failure it raises."""
    import pytest
    from dagster import Failure

    res = {
        "home": small_frames(home),
        "cache": CacheResource(home=small_frames(home)),
        "trainer": TrainerResource(
            nproc_per_node=1, max_restarts=2, steps=6, batch_size=2, workers=workers, checkpoint_every=3
        ),
    }
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", [spec])
        with pytest.raises(Failure) as failed:
            materialize([defs.get_assets_def("checkpoints")], instance=instance, partition_key=spec, resources=res)
    return failed.value


def _attempts(home: Path, spec: str) -> list[str]:
    """The attempts torchrun made of the run that recorded a fatal fault: ["0"] when no restart read."""
    from trainer.train import FATAL_FILE

    (run_dir,) = [p.parent for p in (home / "runs" / spec).glob("*/" + FATAL_FILE)]
    return sorted(p.name for p in (run_dir / "attempts").iterdir())


def test_an_object_gone_from_the_store_fails_training_by_name_and_torchrun_does_not_read_again(tmp_path, mcap_fleet):
    """An MCAP the manifest names is deleted: the rank that opens it records the fault, torchrun's restarts
    stop at once without reading again, and the Dagster run fails naming the object (no run retry)."""
    copies, home = _manifest_of_copies(tmp_path, mcap_fleet, "spec-gone")
    copies[1].unlink()
    failed = _train_until_it_fails(home, "spec-gone", workers=0)
    gone = copies[1].resolve().as_uri()
    assert failed.description.startswith(f"training stopped: {gone} is gone from its store")
    assert failed.metadata["object"].value == gone and failed.allow_retries is False
    # torchrun restarted it twice, and neither restart read anything: only the first attempt ran
    assert _attempts(home, "spec-gone") == ["0"]


def test_a_damaged_episode_fails_training_by_name_through_a_dataloader_worker_and_is_not_retried(tmp_path, mcap_fleet):
    """An MCAP the manifest names is cut short after the manifest was written: the DataLoader worker that
    reads it fails, the rank records a fault no restart mends (bad_samples="raise"), torchrun's restarts
    stop at once, and the Dagster run fails naming the file and what mends it (no run retry)."""
    copies, home = _manifest_of_copies(tmp_path, mcap_fleet, "spec-cut")
    with open(copies[1], "r+b") as f:
        f.truncate(copies[1].stat().st_size // 2)
    failed = _train_until_it_fails(home, "spec-cut", workers=1)
    assert failed.description.startswith("training stopped: ") and copies[1].name in failed.description
    assert "(the manifest names an episode that does not read). Re-ingest the episode" in failed.description
    assert "bad_samples to 'skip'" in failed.description and "Traceback" not in failed.description
    assert failed.metadata["fault"].value == "damaged_episode" and failed.allow_retries is False
    assert _attempts(home, "spec-cut") == ["0"]  # the restarts read nothing


def test_the_trainer_refuses_an_unknown_bad_samples_policy_by_name():
    import pytest

    with pytest.raises(ValueError, match="bad_samples 'ignore': expected one of 'raise', 'skip'"):
        TrainerResource(bad_samples="ignore").settings()
