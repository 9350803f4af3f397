"""The evaluations and released_models assets on an ephemeral Dagster instance: an evaluation traces back
to the checkpoint, the dataset (manifest hash) and the code commit; evaluations of the same partition are
compared in a table; a release is published once, with the same lineage."""

import json
from pathlib import Path

from dagster import DagsterInstance, FloatMetadataValue, materialize

from dyna_assets.definitions import defs
from dyna_assets.training.evaluations import evaluations, released_models
from dyna_resources.catalog.manifest import write_manifest
from dyna_resources.resources import CacheResource, HomeResource, TrainerResource


def _md(result, name):
    (m,) = result.asset_materializations_for_node(name)
    return {k: getattr(v, "value", v) for k, v in m.metadata.items()}


def test_evaluations_and_releases_trace_to_dataset_and_code(tmp_path, mcap_fleet):
    _, manifest = mcap_fleet
    home = tmp_path / "home"
    write_manifest(manifest, home / "manifests", "spec-e")
    base = {"home": HomeResource(root=str(home)), "cache": CacheResource(home=HomeResource(root=str(home)))}
    trainer = {
        "nproc_per_node": 1,
        "max_restarts": 0,
        "batch_size": 2,
        "workers": 0,
        "checkpoint_every": 4,
        "image_size": 32,
    }
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["spec-e"])

        def deployed(steps):  # the deployment's trainer settings: evaluations find the run they trained
            return {**base, "trainer": TrainerResource(steps=steps, **trainer)}

        def train(steps):
            r = materialize(
                [defs.get_assets_def("checkpoints")],
                instance=instance,
                partition_key="spec-e",
                resources=deployed(steps),
            )
            assert r.success
            return _md(r, "checkpoints")

        def evaluate_and_release(steps):
            r = materialize(
                [evaluations, released_models], instance=instance, partition_key="spec-e", resources=deployed(steps)
            )
            assert r.success
            # typed for reading and the Plots tab: the error to four significant digits, the weights in GB
            (ev_m,) = r.asset_materializations_for_node("evaluations")
            (rel_m,) = r.asset_materializations_for_node("released_models")
            assert isinstance(ev_m.metadata["action_mse"], FloatMetadataValue)
            assert ev_m.metadata["action_mse"].value == float(f"{ev_m.metadata['action_mse'].value:.4g}")
            assert isinstance(rel_m.metadata["size_GB"], FloatMetadataValue) and rel_m.metadata["size_GB"].value > 0
            assert "size" not in rel_m.metadata
            return _md(r, "evaluations"), _md(r, "released_models")

        ck = train(4)
        ev, rel = evaluate_and_release(4)
        lineage = ck["lineage"]
        assert ev["lineage"] == lineage and ev["manifest_sha256"] == lineage["manifest_sha256"]
        assert ev["code_commit"] == lineage["code_commit"] and ev["code_commit"]
        assert ev["dataset_ref"] == lineage["dataset"] and ev["dataset_ref"] in ev["comparison"]
        assert ev["checkpoint_step"] == 4 and ev["checkpoint_sha256"] == ck["checkpoint"]["sha256"]
        assert ev["heldout_is_training_data"] and "not held out" in ev["note"]
        assert ev["action_mse"] > 0 and len(ev["metrics"]["action_mse_per_step"]) > 0
        assert json.loads(Path(ev["result_path"]).read_text())["checkpoint"]["sha256"] == ev["checkpoint_sha256"]
        assert ev["comparison"].count("\n") == 2  # header, rule, this row

        assert not rel["already_released"] and rel["checkpoint_step"] == 4
        assert rel["lineage"] == lineage and rel["manifest_sha256"] == lineage["manifest_sha256"]
        assert rel["code_commit"] == lineage["code_commit"] and rel["dataset_ref"] == lineage["dataset"]
        assert rel["url"] == f"file://{home.resolve()}/models/spec-e/{rel['sha256'][:16]}"
        assert (home / "models" / "spec-e" / rel["sha256"][:16] / "model.json").exists()

        ck2 = train(6)  # another run of the same spec: a new checkpoint, compared with the first
        ev2, rel2 = evaluate_and_release(6)
        assert ev2["checkpoint_sha256"] == ck2["checkpoint"]["sha256"] != ev["checkpoint_sha256"]
        rows = ev2["comparison"].splitlines()[2:]
        assert len(rows) == 2 and "(this)" in rows[0] and ev["checkpoint_sha256"][:12] in rows[1]
        assert rel2["sha256"] != rel["sha256"] and not rel2["already_released"]

        r = materialize([released_models], instance=instance, partition_key="spec-e", resources=deployed(6))
        again = _md(r, "released_models")
        assert again["already_released"] and (again["url"], again["sha256"]) == (rel2["url"], rel2["sha256"])
