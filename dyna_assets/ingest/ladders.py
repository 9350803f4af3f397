"""The ``step_ladders`` asset: every episode of an ingest partition cut into its task's procedure steps.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import base64
import hashlib

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)

from dyna_resources.ladders.config import SEGMENTER_VERSION
from dyna_resources.ladders.run import LadderReport, ladder_batch
from dyna_resources.resources import IngestResource, LadderResource

from .. import k8s
from .assets import BACKFILL
from .partitions import ingest_partition_keys, ingest_partitions


def _pictures_markdown(report: LadderReport) -> str:
    # Dagster renders markdown metadata; a data: URL keeps the PNG inside the event log, no file server needed.
    return (
        "\n\n".join(
            f"**{eid}**\n\n![step ladder of {eid}](data:image/png;base64,{base64.b64encode(png).decode()})"
            for eid, png in report.pictures.items()
        )
        or "(no episode segmented in this run)"
    )


def _partition_metadata(report: LadderReport) -> dict:
    return {
        "ladder_version": report.version,
        "segmented_this_run": len(report.segmented),
        "not_segmented": MetadataValue.json(report.errors),
        "failed_at_step": MetadataValue.json(dict(report.failed_steps.most_common())),
        "seconds_by_step": MetadataValue.json({k: round(v, 2) for k, v in sorted(report.step_seconds.items())}),
        "ladders": MetadataValue.md(_pictures_markdown(report)),
    }


@multi_asset(
    specs=[
        AssetSpec(
            "step_ladders",
            code_version=SEGMENTER_VERSION,
            partitions_def=ingest_partitions,
            deps=["mcap_episodes"],
            group_name="ingest",
            tags={"dyna/stage": "labels"},
            description="Each episode cut into its task's procedure steps (duration, outcome, failure "
            "mode) in the registry; a ladder picture per sampled episode.",
        )
    ],
    partitions_def=ingest_partitions,
    backfill_policy=BACKFILL,
    can_subset=True,
    op_tags=k8s.LADDERS,
)
def step_ladders(context: AssetExecutionContext, ingest: IngestResource, ladders: LadderResource):
    registry, config = ingest.stores().registry, ladders.config()
    reports = []
    for partition in ingest_partition_keys(context):
        units = [u.key for u in registry.partition_units(partition)]
        rep = ladder_batch(partition, registry, config, pictures=ladders.pictures, log=context.log.warning, units=units)
        context.add_asset_metadata(_partition_metadata(rep), partition_key=partition)
        context.log.info(
            f"{partition}: segmented {len(rep.segmented)}, not segmentable {len(rep.errors)}, "
            f"failed at {dict(rep.failed_steps)}"
        )
        reports.append(rep)
    digest = hashlib.sha256(repr(sorted((r.batch_key, r.version) for r in reports)).encode())
    yield MaterializeResult(
        asset_key="step_ladders",
        data_version=DataVersion(digest.hexdigest()[:16]),
        tags={"dyna/ladder_version": config.version},
    )
