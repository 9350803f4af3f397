"""Publish a curation spec's current manifest as a dataset version, one partition per spec.

The dataset declaration sits beside the spec, in ``<curation>/datasets/<spec>.yaml``::

    name: pretrain-mix
    version: 2.1.0
    notes: adds fold_towel from site B

(Not a ``dataset:`` key in the spec: ``CurationSpec`` refuses unknown keys. Not
``<spec>.dataset.yaml`` next to it either: the curation sensor would take that file for a spec.)

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from dagster import AssetExecutionContext, DataVersion, Failure, MaterializeResult, MetadataValue, asset

from dyna_resources.catalog.datasets import DatasetDeclaration, DatasetError, publish_manifest
from dyna_resources.figures import rounded
from dyna_resources.resources import HomeResource

from .. import k8s
from ..curation.assets import per_spec
from ..partitions import partition_key


def _typed(v):
    """Dicts and lists as JSON, floats (``segment_hours``) to four significant digits, the rest as it is."""
    if isinstance(v, (dict, list)):
        return MetadataValue.json(v)
    return rounded(v) if isinstance(v, float) else v


@asset(
    **per_spec("dataset", "curation", k8s.DATASET),
    deps=["manifests"],
    description="The spec's current manifest published as an immutable dataset version (name@version, "
    "declared in $DYNA_HOME/curation/datasets/<spec>.yaml), with the diff against the previous one.",
)
def datasets(context: AssetExecutionContext, home: HomeResource):
    spec = partition_key(context, "curation spec")
    h = home.home()
    try:
        declared = DatasetDeclaration.load(h.dataset_declaration(spec))
        if declared is None:
            return MaterializeResult(
                metadata={"published": False, "reason": f"nothing to publish: no curation/datasets/{spec}.yaml"}
            )
        done = publish_manifest(
            home.resolved_registry_url(), home.manifests_url(), spec, declared, h.curation_spec(spec).read_text()
        )
    except DatasetError as e:
        raise Failure(str(e)) from None
    md = done.as_metadata()
    metadata = {k: _typed(v) for k, v in md.items()}
    metadata["arrow"] = MetadataValue.path(md["arrow"])
    if "diff_summary" in md:
        metadata["diff_summary"] = MetadataValue.md(md["diff_summary"])
    return MaterializeResult(metadata=metadata, data_version=DataVersion(done.ref.sha256))
