"""Manifests, one partition per curation spec file.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from collections import Counter

import pyarrow.compute as pc
from dagster import (AssetExecutionContext, DataVersion, DynamicPartitionsDefinition, MaterializeResult,
                     MetadataValue, asset)

from dyna_resources.catalog.curation import CurationSpec, curate
from dyna_resources.catalog.manifest import write_manifest
from dyna_resources.faces import HomeResource, WarehouseResource

curation_specs = DynamicPartitionsDefinition(name="curation_specs")


@asset(partitions_def=curation_specs, deps=["warehouse_episodes"], group_name="curation", pool="duckdb",
       tags={"dyna/stage": "manifest"},
       description="The curation spec's ONE SQL query over the warehouse, written as a zstd Parquet manifest "
                   "plus an Arrow IPC copy (fixed record batches) for mmap loading; content-hashed.")
def manifests(context: AssetExecutionContext, home: HomeResource, warehouse: WarehouseResource):
    h = home.home()
    spec = CurationSpec.load(h.curation / f"{context.partition_key}.yaml")
    sql, params = spec.compile()
    with warehouse.open(read_only=True) as wh:
        table = curate(wh, spec)
    info = write_manifest(table, h.manifests, context.partition_key, extra={"spec": spec.name, "sql": sql})
    seconds = pc.sum(pc.subtract(table["end_ns"], table["start_ns"])).as_py() or 0
    count = lambda col: dict(Counter(table[col].to_pylist()).most_common(20))  # noqa: E731
    return MaterializeResult(
        metadata={
            "rows": info.rows,
            "episodes": len(set(table["episode_id"].to_pylist())),
            "segment_hours": round(seconds / 1e9 / 3600, 4),
            "by_task": MetadataValue.json(count("task")),
            "by_robot": MetadataValue.json(count("robot_id")),
            "by_site": MetadataValue.json(count("site")),
            "pipeline_versions": MetadataValue.json(count("pipeline_version")),
            "sha256": info.sha256,
            "parquet": MetadataValue.path(info.parquet),
            "arrow": MetadataValue.path(info.arrow),
            "arrow_bytes": info.arrow_bytes,
            "sql": MetadataValue.md(f"```sql\n{sql}\n```"),
            "params": MetadataValue.json({k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                                          for k, v in params.items()}),
        },
        data_version=DataVersion(info.sha256),
    )
