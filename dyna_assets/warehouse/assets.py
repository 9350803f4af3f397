"""The warehouse `episodes` table, kept in sync with the registry by change-data-capture.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from collections import Counter

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from dyna_resources.catalog.cdc import sync
from dyna_resources.faces import IngestResource, WarehouseResource

from .. import k8s


@asset(group_name="warehouse", pool="duckdb", deps=["mcap_episodes", "step_ladders"], tags={"dyna/stage": "warehouse"},
       op_tags=k8s.WAREHOUSE,
       description="One row per episode in DuckDB, synced from the registry by CDC (SQLite change log or "
                   "PostgreSQL logical decoding); what curation queries.")
def warehouse_episodes(context: AssetExecutionContext, ingest: IngestResource, warehouse: WarehouseResource):
    registry = ingest.stores().registry
    with warehouse.open() as wh:
        report = sync(registry, wh)
        rows = wh.episodes()
        path = str(wh.path)
    status = Counter(r["status"] for r in rows)
    context.log.info(f"applied {report.changes} changes ({report.upserts} upserts, {report.deletes} deletes)")
    return MaterializeResult(metadata={
        "rows": len(rows),
        "rows_by_status": MetadataValue.json(dict(sorted(status.items()))),
        "hours_transcoded": round(sum(r["duration_s"] for r in rows if r["status"] == "transcoded") / 3600, 4),
        "changes_applied": report.changes,
        "upserts": report.upserts,
        "deletes": report.deletes,
        "cdc_position": str(report.position),
        "source": registry.describe(),
        "warehouse": MetadataValue.path(path),
    })
