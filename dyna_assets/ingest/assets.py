"""The ingest assets, one materialization per ingest batch: recipes over the ingest engines.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import hashlib

from dagster import (AssetExecutionContext, AssetSpec, BackfillPolicy, DataVersion, MaterializeResult, MetadataValue,
                     multi_asset)

from dyna_resources import versions
from dyna_resources.faces import GatesResource, IngestResource, TranscodeResource
from dyna_resources.ingest.batches import batch_summary, inventory_batch, transcode_batch
from dyna_resources.ingest.gates import POST_GATES, PRE_GATES

from .. import k8s
from .checks import gate_check_results, gate_check_specs
from .partitions import batch_keys, ingest_batches


def version_tags() -> dict[str, str]:
    return {"dyna/schema_version": versions.SCHEMA_VERSION, "dyna/pipeline_version": versions.PIPELINE_VERSION}


# Backfills become few ranged runs: each run takes up to 16 batches and works through them.
BACKFILL = BackfillPolicy.multi_run(max_partitions_per_run=16)


def _partition_metadata(summary: dict, report) -> dict:
    """Everything shown for one batch; set per partition, so a ranged run shows each batch its own."""
    return {
        "files": summary["files"],
        "episodes": summary["episodes"],
        "hours": summary["hours"],
        "bytes_in": summary["bytes_in"],
        "bytes_out": summary["bytes_out"],
        "compression_ratio": summary["compression_ratio"],
        "quarantined": summary["quarantined"],
        "quarantined_reasons": MetadataValue.json(summary["quarantined_reasons"]),
        "episodes_by_status": MetadataValue.json(summary["episodes_by_status"]),
        "flags": MetadataValue.json(summary["flags"]),
        "pipeline_versions": MetadataValue.json(summary["pipeline_versions"]),
        "this_run_processed": len(report.processed),
        "this_run_skipped_up_to_date": len(report.skipped),
        "this_run_cpu_s": round(report.cpu_s, 2),
        "gates": MetadataValue.json({g: {"evaluated": t.evaluated, "failed": t.failed}
                                     for g, t in report.gates.items()}),
        **version_tags(),
    }


def _log_totals(context, reports) -> None:
    # Run totals go to the log, not to metadata: metadata on the result would be copied onto every batch.
    context.log.info(f"{len(reports)} batch(es): processed {sum(len(r.processed) for r in reports)}, "
                     f"up to date {sum(len(r.skipped) for r in reports)}, "
                     f"quarantined {sum(len(r.quarantined) for r in reports)}, "
                     f"cpu {sum(r.cpu_s for r in reports):.1f} s")


@multi_asset(
    specs=[AssetSpec("raw_episodes", code_version=versions.SCHEMA_VERSION, partitions_def=ingest_batches,
                     group_name="ingest", tags={"dyna/stage": "raw"},
                     description="Inventory of an ingest batch's raw files; pre-transform quality gates.")],
    check_specs=gate_check_specs("raw_episodes", PRE_GATES),
    partitions_def=ingest_batches, backfill_policy=BACKFILL, can_subset=True, op_tags=k8s.INGEST,
)
def raw_episodes(context: AssetExecutionContext, ingest: IngestResource, gates: GatesResource):
    stores, config = ingest.stores(), gates.config()
    reports = []
    for batch in batch_keys(context):
        rep = inventory_batch(batch, stores, config, log=context.log.warning)
        context.add_asset_metadata(_partition_metadata(batch_summary(batch, stores.registry, "pre"), rep),
                                   partition_key=batch)
        reports.append(rep)
    _log_totals(context, reports)
    yield MaterializeResult(asset_key="raw_episodes", tags=version_tags())
    yield from gate_check_results("raw_episodes", "pre", reports, config)


@multi_asset(
    specs=[AssetSpec("mcap_episodes", code_version=versions.PIPELINE_VERSION, partitions_def=ingest_batches,
                     deps=["raw_episodes"], group_name="ingest", tags={"dyna/stage": "mcap"},
                     description="H.264 MCAP per episode (topic-group chunks, version-stamped); post gates.")],
    check_specs=gate_check_specs("mcap_episodes", POST_GATES),
    partitions_def=ingest_batches, backfill_policy=BACKFILL, can_subset=True, pool="transcode",
    op_tags=k8s.TRANSCODE,
)
def mcap_episodes(context: AssetExecutionContext, ingest: IngestResource, gates: GatesResource,
                  transcode: TranscodeResource):
    stores, config = ingest.stores(), gates.config()
    reports = []
    for batch in batch_keys(context):
        rep = transcode_batch(batch, stores, config, settings=transcode.settings(), workers=transcode.pool_size(),
                              log=context.log.warning)
        summary = batch_summary(batch, stores.registry)
        context.add_asset_metadata(_partition_metadata(summary, rep), partition_key=batch)
        context.log.info(f"{batch}: transcoded {len(rep.processed)}, up to date {len(rep.skipped)}, "
                         f"quarantined {len(rep.quarantined)}")
        reports.append((rep, summary))
    digest = hashlib.sha256(repr(sorted((r.batch_key, s["pipeline_versions"], s["episodes"], s["bytes_out"])
                                        for r, s in reports)).encode()).hexdigest()[:16]
    _log_totals(context, [r for r, _ in reports])
    yield MaterializeResult(asset_key="mcap_episodes", tags=version_tags(), data_version=DataVersion(digest))
    yield from gate_check_results("mcap_episodes", "post", [r for r, _ in reports], config)
