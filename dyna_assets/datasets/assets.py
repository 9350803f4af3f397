"""Publish a curation spec's current manifest as a dataset version, one partition per spec.

The dataset declaration sits beside the spec, in ``<curation>/datasets/<spec>.yaml``::

    name: pretrain-mix
    version: 2.1.0
    notes: adds fold_towel from site B

(Not a ``dataset:`` key in the spec: ``CurationSpec`` refuses unknown keys. Not
``<spec>.dataset.yaml`` next to it either: the curation sensor would take that file for a spec.)

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import json
from pathlib import Path

import fsspec
import yaml
from dagster import (
    AssetExecutionContext,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dyna_resources.catalog.datasets import DatasetError, DatasetRegistry
from dyna_resources.resources import HomeResource

from .. import k8s
from ..curation.assets import curation_specs
from ..partitions import partition_key


def dataset_declaration(path: Path) -> dict | None:
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or set(data) - {"name", "version", "notes"} or not {"name", "version"} <= set(data):
        raise Failure(f"{path}: expected a mapping with name, version and optional notes")
    return {"name": str(data["name"]), "version": str(data["version"]), "notes": str(data.get("notes") or "")}


@asset(partitions_def=curation_specs, deps=["manifests"], group_name="curation",
       tags={"dyna/stage": "dataset"}, op_tags=k8s.DATASET,
       description="The spec's current manifest published as an immutable dataset version (name@version, "
                   "declared in $DYNA_HOME/curation/datasets/<spec>.yaml), with the diff against the previous one.")
def datasets(context: AssetExecutionContext, home: HomeResource):
    spec = partition_key(context, "curation spec")
    h = home.home()
    declared = dataset_declaration(h.dataset_declaration(spec))
    if declared is None:
        return MaterializeResult(metadata={"published": False, "reason": "nothing to publish: no "
                                           f"curation/datasets/{spec}.yaml"})
    base = f"{home.manifests_url().rstrip('/')}/{spec}"
    with fsspec.open(f"{base}.json", "rt") as f:
        sidecar = json.load(f)
    reg = DatasetRegistry(home.resolved_registry_url(), home.manifests_url())
    try:
        try:
            ref, new = reg.publish(declared["name"], declared["version"], spec,
                                   h.curation_spec(spec).read_text(), sidecar,
                                   arrow_url=f"{base}.arrow", parquet_url=f"{base}.parquet", notes=declared["notes"])
        except DatasetError as e:
            raise Failure(str(e)) from None
        previous = reg.previous(ref.ref)
        diff = reg.diff(previous.ref, ref.ref) if previous else None
    finally:
        reg.close()
    metadata = {
        "published": True,
        "new": new,
        "dataset": ref.ref,
        "sha256": ref.sha256,
        "rows": ref.rows,
        "episodes": ref.episodes,
        "segment_hours": ref.segment_hours,
        "arrow": MetadataValue.path(ref.arrow_url),
        "pipeline_versions": MetadataValue.json(ref.pipeline_versions),
    }
    if diff is not None:
        d = diff.as_dict()
        metadata["previous"] = previous.ref
        metadata["diff"] = MetadataValue.json({**d, "episodes_added": d["episodes_added"][:100],
                                               "episodes_removed": d["episodes_removed"][:100],
                                               "n_added": len(diff.episodes_added),
                                               "n_removed": len(diff.episodes_removed)})
        metadata["diff_summary"] = MetadataValue.md(diff.markdown())
    return MaterializeResult(metadata=metadata, data_version=DataVersion(ref.sha256))
