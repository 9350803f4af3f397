"""Manifests, one partition per curation spec file.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from typing import Any

from dagster import (
    AssetExecutionContext,
    DataVersion,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dyna_resources import versions
from dyna_resources.catalog.curation import CurationSpec, CurationSpecError, curate, missing_episodes
from dyna_resources.catalog.manifest import write_manifest
from dyna_resources.catalog.selection import selection_of, spec_digest
from dyna_resources.figures import gigabytes, rounded
from dyna_resources.resources import HomeResource, WarehouseResource

from .. import k8s
from ..partitions import partition_key

# One partition per spec file stem, added by the curation sensor; every asset of the partition checks
# its key (dyna_assets/partitions.py), since anyone with API access can add one.
CURATION_SPECS = "curation_specs"  # the definition's name (its .name attribute is typed str | None)
curation_specs = DynamicPartitionsDefinition(name=CURATION_SPECS)


def per_spec(stage: str, group: str, pod: dict) -> dict[str, Any]:
    """What every asset partitioned by curation spec declares: the partitions, its group, its stage
    tag (the UI filters by it) and the pod it asks for (k8s.py)."""
    return {"partitions_def": curation_specs, "group_name": group, "tags": {"dyna/stage": stage}, "op_tags": pod}


@asset(
    **per_spec("manifest", "curation", k8s.MANIFEST),
    deps=["warehouse_episodes"],
    pool="duckdb",
    description="The curation spec's ONE SQL query over the warehouse, written as a zstd Parquet manifest "
    "plus an Arrow IPC copy (fixed record batches) for mmap loading; content-hashed (its DataVersion). "
    "Rebuilt when its spec changes or when what the spec selects in the warehouse changes.",
)
def manifests(context: AssetExecutionContext, home: HomeResource, warehouse: WarehouseResource):
    name = partition_key(context, "curation spec")
    try:
        spec_file = home.home().curation_spec(name)
        spec = CurationSpec.load(spec_file)
        sql, params = spec.compile()
        with warehouse.open(read_only=True) as wh:
            # what this build selects, on the same snapshot: the curation sensor compares it with the
            # warehouse's latest record and rebuilds when they differ
            selection = selection_of(
                wh,
                spec,
                spec_file_digest=spec_digest(spec_file),
                schema=versions.SCHEMA_VERSION,
                pipeline=versions.PIPELINE_VERSION,
            )
            info = write_manifest(
                curate(wh, spec),
                home.manifests_url(),
                name,
                count_by=("task", "robot_id", "site", "pipeline_version", "schema_version"),
                extra={"spec": spec.name, "sql": sql},
            )
            missing = missing_episodes(wh, spec)
    except CurationSpecError as e:
        raise Failure(description=str(e), metadata={"field": e.field}, allow_retries=False) from None
    if missing:  # their MCAPs are gone or changed (mcap_episodes.mcaps_present): never selected, named
        context.log.warning(
            f"{len(missing)} episode(s) the spec selects are left out, their MCAPs missing: "
            + "; ".join(f"{e} ({u})" for e, u in missing[:10])
        )
    stats = info.stats
    top = lambda col: dict(list(stats.get(f"by_{col}", {}).items())[:20])
    return MaterializeResult(
        metadata={
            "rows": info.rows,
            "missing_excluded": len(missing),
            "missing_episodes": MetadataValue.json([{"episode_id": e, "mcap_uri": u} for e, u in missing[:100]]),
            "episodes": stats.get("episodes", 0),
            "stale_episodes": selection.stale_episodes,
            "selection": MetadataValue.json(selection.as_json()),
            "segment_hours": rounded(stats.get("segment_hours", 0.0)),
            "by_task": MetadataValue.json(top("task")),
            "by_robot": MetadataValue.json(top("robot_id")),
            "by_site": MetadataValue.json(top("site")),
            "versions": MetadataValue.json({"pipeline": top("pipeline_version"), "schema": top("schema_version")}),
            "sha256": info.sha256,
            "parquet": MetadataValue.path(info.parquet),
            "arrow": MetadataValue.path(info.arrow),
            "arrow_GB": gigabytes(info.arrow_bytes),
            "parquet_GB": gigabytes(info.parquet_bytes),
            "sql": MetadataValue.md(f"```sql\n{sql}\n```"),
            "params": MetadataValue.json(
                {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
            ),
        },
        data_version=DataVersion(info.sha256),
    )
