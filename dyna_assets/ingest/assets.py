"""The ingest assets, one materialization per ingest partition (its work units inside the run):
recipes over the ingest engines.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import dataclasses
import hashlib

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    RetryRequested,
    TableColumn,
    TableMetadataValue,
    TableRecord,
    TableSchema,
    multi_asset,
)
from dagster_ray import RayResource

from dyna_resources import versions
from dyna_resources.catalog.episode_view import EpisodeView, batch_episode_views
from dyna_resources.figures import gigabytes, megabytes, rounded
from dyna_resources.ingest.batch_summary import BatchSummary, batch_summary
from dyna_resources.ingest.gates import POST_GATES, PRE_GATES
from dyna_resources.ingest.partitions import PartitionReport, UnitJob, ingest_partition
from dyna_resources.ingest.ray_units import UnitResources
from dyna_resources.resources import GatesResource, IngestResource, TranscodeResource

from .. import k8s
from ..ray import connect_for_units
from .checks import gate_check_results, gate_check_specs
from .partitions import ingest_partition_keys, ingest_partitions
from .run_guard import held_run_lease


def version_tags() -> dict[str, str]:
    return {"dyna/schema_version": versions.SCHEMA_VERSION, "dyna/pipeline_version": versions.PIPELINE_VERSION}


# Backfills become few ranged runs: each run takes up to 16 partitions and works through them.
BACKFILL = BackfillPolicy.multi_run(max_partitions_per_run=16)


def _partition_metadata(summary: BatchSummary, report: PartitionReport) -> dict:
    """Everything shown for one partition; set per partition, so a ranged run shows each its own. Sizes in
    GB and floats to four significant digits (``dyna_resources.figures``): read at a glance, graphed."""
    rep = report.combined
    return {
        **summary.as_metadata(),
        "this_run_processed": len(rep.processed),
        "this_run_skipped_up_to_date": len(rep.skipped),
        "this_run_cpu_s": rounded(rep.cpu_s),
        "this_run_staging_swept_files": rep.staging_swept[0],  # raw files killed workers left staged
        "this_run_staging_swept_GB": gigabytes(rep.staging_swept[1]),
        "this_run_codec_cpu_s": rounded(rep.codec_cpu_s),
        "this_run_failed_units": MetadataValue.json(report.failed_units),
        "gates": MetadataValue.json({g: {"evaluated": t.evaluated, "failed": t.failed} for g, t in rep.gates.items()}),
        **version_tags(),
    }


EPISODES_SHOWN = 500  # rows of a partition's episodes table; `dyna episode ID` looks up any other


def _episodes_table(views: list[EpisodeView]) -> TableMetadataValue:
    """One row per episode of the partition: status, verdicts, versions, failed step, its length and MCAP
    size (typed columns: ``float``, in the unit the name says), how to open it."""
    rows = []
    for v in views[:EPISODES_SHOWN]:
        row = v.as_row()
        opens = row.pop("open")  # the command last, after the figures
        row["duration_s"] = rounded(v.duration_s) if v.duration_s is not None else None
        row["mcap_MB"] = megabytes(v.mcap_bytes) if v.mcap_bytes is not None else None
        rows.append({**row, "open": opens})
    names = list(rows[0]) if rows else ["episode_id"]
    columns = [TableColumn(c, "float" if c in ("duration_s", "mcap_MB") else "string") for c in names]
    return MetadataValue.table([TableRecord(r) for r in rows], schema=TableSchema(columns))


def _summary(registry, partition: str, stage: str = "post") -> BatchSummary:
    return batch_summary([u.key for u in registry.partition_units(partition)], registry, stage)


def _log_totals(context, reports: list[PartitionReport]) -> None:
    # Run totals go to the log, not to metadata: metadata on the result would be copied onto every partition.
    combined = [r.combined for r in reports]
    context.log.info(
        f"{len(reports)} partition(s): processed {sum(len(r.processed) for r in combined)}, "
        f"up to date {sum(len(r.skipped) for r in combined)}, "
        f"quarantined {sum(len(r.quarantined) for r in combined)}, "
        f"cpu {sum(r.cpu_s for r in combined):.1f} s"
    )


def _fail_on_failed_units(context, asset: str, reports: list[PartitionReport], ingest: IngestResource) -> None:
    """Units that failed whole (their worker could not record anything, or a machine fault left episodes
    pending) fail the step once every other unit is done: what the others did is recorded, and a retry
    redoes only what is still stale. When every failure was the machine's, the step is run again after a
    back-off (bounded: ``ingest.infra_retries``), so a passing outage heals without a person."""
    failed = {f"{r.partition_key}/{u}": why for r in reports for u, why in r.failed_units.items()}
    if not failed:
        return
    machine = {f"{r.partition_key}/{u}" for r in reports for u in r.infrastructure_units}
    failure = Failure(
        description=f"{asset}: {len(failed)} work unit(s) failed"
        + (
            " for infrastructure faults (episodes left pending, nothing quarantined for it)"
            if machine == set(failed)
            else ""
        )
        + ": "
        + "; ".join(f"{k}: {v}" for k, v in list(failed.items())[:5]),
        metadata={
            "failed_units": MetadataValue.json(failed),
            "infrastructure_units": MetadataValue.json(sorted(machine)),
        },
    )
    if machine == set(failed):
        retry_after_backoff(context, ingest, failure)
    raise failure


def retry_after_backoff(context, ingest: IngestResource, failure: Failure) -> None:
    """For a step whose every failure was the machine's: run it again after an exponential back-off,
    ``ingest.infra_retries`` times at most (then this returns and the caller raises ``failure``)."""
    if context.retry_number < ingest.infra_retries:
        wait_s = ingest.infra_retry_wait_s * 2**context.retry_number
        context.log.warning(
            f"{failure.description}; retrying the step in {wait_s:g} s "
            f"(attempt {context.retry_number + 2} of {ingest.infra_retries + 1})"
        )
        raise RetryRequested(max_retries=ingest.infra_retries, seconds_to_wait=wait_s) from failure


@multi_asset(
    specs=[
        AssetSpec(
            "raw_episodes",
            code_version=versions.SCHEMA_VERSION,
            partitions_def=ingest_partitions,
            group_name="ingest",
            tags={"dyna/stage": "raw"},
            description="Inventory of an ingest partition's raw files (its byte-balanced work units); "
            "pre-transform quality gates.",
        )
    ],
    check_specs=gate_check_specs("raw_episodes", PRE_GATES),
    partitions_def=ingest_partitions,
    backfill_policy=BACKFILL,
    can_subset=True,
    op_tags=k8s.INGEST,
)
def raw_episodes(context: AssetExecutionContext, ingest: IngestResource, gates: GatesResource, ray: RayResource):
    stores, config = ingest.stores(), gates.config()
    job = UnitJob("pre", stores, config)
    reports = [
        _ingest(context, partition, job, ingest, ray) for partition in ingest_partition_keys(context, stores.registry)
    ]
    _log_totals(context, reports)
    _fail_on_failed_units(context, "raw_episodes", reports, ingest)
    yield MaterializeResult(asset_key="raw_episodes", tags=version_tags())
    yield from gate_check_results("raw_episodes", "pre", [r.combined for r in reports], config)


@multi_asset(
    specs=[
        AssetSpec(
            "mcap_episodes",
            code_version=versions.PIPELINE_VERSION,
            partitions_def=ingest_partitions,
            deps=["raw_episodes"],
            group_name="ingest",
            tags={"dyna/stage": "mcap"},
            description="H.264 MCAP per episode (topic-group chunks, version-stamped); post gates.",
        )
    ],
    check_specs=gate_check_specs("mcap_episodes", POST_GATES),
    partitions_def=ingest_partitions,
    backfill_policy=BACKFILL,
    can_subset=True,
    pool="transcode",
    op_tags=k8s.TRANSCODE,
)
def mcap_episodes(
    context: AssetExecutionContext,
    ingest: IngestResource,
    gates: GatesResource,
    transcode: TranscodeResource,
    ray: RayResource,
):
    stores, config = ingest.stores(), gates.config()
    on_ray = ingest.units_on_ray()
    job = UnitJob(
        "post",
        stores,
        config,
        settings=transcode.settings(ingest.home.profile()),
        workers=transcode.unit_cpus if on_ray else transcode.pool_size(),
        mp_context="forkserver" if on_ray else None,
    )
    reports = [
        _ingest(context, partition, job, ingest, ray, transcode.unit_resources())
        for partition in ingest_partition_keys(context, stores.registry)
    ]
    summaries = [(r.partition_key, _summary(stores.registry, r.partition_key)) for r in reports]
    digest = hashlib.sha256(
        repr(sorted((k, s.pipeline_versions, s.episodes, s.bytes_out) for k, s in summaries)).encode()
    ).hexdigest()[:16]
    _log_totals(context, reports)
    _fail_on_failed_units(context, "mcap_episodes", reports, ingest)
    yield MaterializeResult(asset_key="mcap_episodes", tags=version_tags(), data_version=DataVersion(digest))
    yield from gate_check_results("mcap_episodes", "post", [r.combined for r in reports], config)


def _ingest(
    context,
    partition: str,
    job: UnitJob,
    ingest: IngestResource,
    ray: RayResource,
    resources: UnitResources | None = None,
) -> PartitionReport:
    """One partition's stage, its units on Ray or in this process; its metadata set on the partition."""
    on_ray = ingest.units_on_ray()
    if on_ray:
        connect_for_units(context, ray)
    with held_run_lease(context, job.stores.registry, f"{job.stage}:{partition}") as lease:
        rep = ingest_partition(
            partition,
            dataclasses.replace(job, lease=lease),
            units_on="ray" if on_ray else "process",
            resources=resources,
            log=context.log.warning,
            on_progress=lambda p: context.log.info(f"{partition} {job.stage}: {p.summary()}"),
        )
    registry = job.stores.registry
    summary = _summary(registry, partition, job.stage)
    episodes = batch_episode_views(registry, [u.key for u in registry.partition_units(partition)])
    context.add_asset_metadata(
        {**_partition_metadata(summary, rep), "episodes_table": _episodes_table(episodes)}, partition_key=partition
    )
    c = rep.combined
    context.log.info(
        f"{partition} {job.stage}: processed {len(c.processed)}, up to date {len(c.skipped)}, "
        f"quarantined {len(c.quarantined)}, units failed {len(rep.failed_units)}"
    )
    return rep
