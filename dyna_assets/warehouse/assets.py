"""The warehouse `episodes` table, kept in sync with the registry by change-data-capture.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from dyna_resources.catalog.cdc import sync
from dyna_resources.resources import IngestResource, WarehouseResource

from .. import k8s


@asset(
    group_name="warehouse",
    pool="duckdb",
    deps=["mcap_episodes", "step_ladders"],
    tags={"dyna/stage": "warehouse"},
    op_tags=k8s.WAREHOUSE,
    description="One row per episode in DuckDB, synced from the registry by CDC (SQLite change log or "
    "PostgreSQL logical decoding); what curation queries.",
)
def warehouse_episodes(context: AssetExecutionContext, ingest: IngestResource, warehouse: WarehouseResource):
    registry = ingest.stores().registry
    with warehouse.open() as wh:
        report = sync(registry, wh)
        summary = wh.summary()  # aggregate queries in DuckDB: constant memory in the rows
        path = str(wh.path)
    context.log.info(f"applied {report.changes} changes ({report.upserts} upserts, {report.deletes} deletes)")
    return MaterializeResult(
        metadata={
            "rows": summary["rows"],
            "rows_by_status": MetadataValue.json(summary["rows_by_status"]),
            "hours_transcoded": round(summary["hours_transcoded"], 4),
            "tasks": summary["tasks"],
            "hours_by_task": MetadataValue.json({k: round(v, 4) for k, v in summary["hours_by_task"].items()}),
            "flags": MetadataValue.json(summary["flags"]),
            "changes_applied": report.changes,
            "upserts": report.upserts,
            "deletes": report.deletes,
            "cdc_position": str(report.position),
            "source": registry.describe(),
            "warehouse": MetadataValue.path(path),
        }
    )
