"""The checkpoints asset on an ephemeral Dagster instance: the trainer launched through Pipes,
metrics streamed back, lineage recorded; materializing again resumes the same run."""

import json
from pathlib import Path

from dagster import DagsterInstance, materialize

from dyna_assets.definitions import defs
from dyna_resources.catalog.manifest import write_manifest
from dyna_resources.faces import CacheResource, HomeResource, TrainerResource


def test_checkpoints_asset_trains_through_pipes_and_records_lineage(tmp_path, mcap_fleet):
    _, manifest = mcap_fleet
    home = tmp_path / "home"
    write_manifest(manifest, home / "manifests", "spec-t")
    res = {"home": HomeResource(root=str(home)), "cache": CacheResource(home_root=str(home)),
           "trainer": TrainerResource(nproc_per_node=1, max_restarts=0, steps=6, batch_size=2, workers=0,
                                      checkpoint_every=3, image_size=32)}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["spec-t"])
        result = materialize([defs.get_assets_def("checkpoints")], instance=instance, partition_key="spec-t",
                             resources=res)
        assert result.success
        (m,) = result.asset_materializations_for_node("checkpoints")
        md = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        assert md["steps"] == 6 and md["attempt"] == 0 and md["optimizer_mode"] == "single"
        assert md["loss_last"] < md["loss_first"]
        assert [p["step"] for p in md["loss_curve"]] == [5, 6]  # streamed while training (log_every 5, last)
        lineage = md["lineage"]
        assert lineage["curation_spec"] == "spec-t" and len(lineage["manifest_sha256"]) == 64
        assert lineage["pipeline_version"] and lineage["code_commit"]
        done = json.loads((Path(md["checkpoints_dir"]) / "step-000000006" / "COMPLETE.json").read_text())
        assert done["extra"]["lineage"] == lineage
        again = materialize([defs.get_assets_def("checkpoints")], instance=instance, partition_key="spec-t",
                            resources=res)
        (m2,) = again.asset_materializations_for_node("checkpoints")
        assert m2.metadata["steps"].value == 6 and m2.metadata["checkpoints_dir"].value == md["checkpoints_dir"]
