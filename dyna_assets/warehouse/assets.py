"""The warehouse `episodes` table, kept in sync with the registry by change-data-capture.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from dyna_resources import versions
from dyna_resources.catalog.cdc import sync
from dyna_resources.catalog.selection import selections, spec_files
from dyna_resources.figures import rounded
from dyna_resources.resources import HomeResource, IngestResource, WarehouseResource

from .. import k8s


@asset(
    group_name="warehouse",
    pool="duckdb",
    deps=["mcap_episodes", "step_ladders"],
    tags={"dyna/stage": "warehouse"},
    op_tags=k8s.WAREHOUSE,
    description="One row per episode in DuckDB, synced from the registry by CDC (SQLite change log or "
    "PostgreSQL logical decoding); what curation queries. Records what each curation spec now "
    "selects (a fingerprint): a manifest whose selection changed is rebuilt by the curation sensor.",
)
def warehouse_episodes(
    context: AssetExecutionContext, home: HomeResource, ingest: IngestResource, warehouse: WarehouseResource
):
    registry = ingest.stores().registry
    specs, _ = spec_files(home.home().curation)
    with warehouse.open() as wh:
        report = sync(registry, wh)
        summary = wh.summary()  # aggregate queries in DuckDB: constant memory in the rows
        selected = selections(wh, specs, schema=versions.SCHEMA_VERSION, pipeline=versions.PIPELINE_VERSION)
        stale = wh.stale_count(schema=versions.SCHEMA_VERSION, pipeline=versions.PIPELINE_VERSION)
        path = str(wh.path)
    context.log.info(f"applied {report.changes} changes ({report.upserts} upserts, {report.deletes} deletes)")
    for name, sel in selected.items():
        if sel.error:
            context.log.warning(f"curation spec {name}: {sel.error}")
        else:
            context.log.info(f"curation spec {name}: selects {sel.episodes} episodes ({sel.digest})")
    return MaterializeResult(
        metadata={
            "rows": summary["rows"],
            "rows_by_status": MetadataValue.json(summary["rows_by_status"]),
            "hours_transcoded": rounded(summary["hours_transcoded"]),
            "tasks": summary["tasks"],
            "hours_by_task": MetadataValue.json({k: rounded(v) for k, v in summary["hours_by_task"].items()}),
            "flags": MetadataValue.json(summary["flags"]),
            "stale_episodes": stale,
            "selections": MetadataValue.json({name: sel.as_json() for name, sel in selected.items()}),
            "changes_applied": report.changes,
            "upserts": report.upserts,
            "deletes": report.deletes,
            "cdc_position": str(report.position),
            "source": registry.describe(),
            "warehouse": MetadataValue.path(path),
        }
    )
