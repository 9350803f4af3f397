"""``training_streams``: the deployment's read profile's training streams added to the MCAPs of an ingest
partition that lack them (``dyna_resources.ingest.training_backfill``). New episodes get them at
transcode; this is the backfill after the profile changes, partitioned like ``mcap_episodes``.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import hashlib

from dagster import AssetExecutionContext, DataVersion, Failure, MaterializeResult, MetadataValue, asset

from dyna_resources.figures import gigabytes, rounded
from dyna_resources.ingest.training_backfill import BackfillReport, backfill_partition
from dyna_resources.resources import IngestResource, TranscodeResource

from .. import k8s
from .assets import BACKFILL, retry_after_backoff, version_tags
from .partitions import ingest_partition_keys, ingest_partitions

SHOWN = 20  # episodes named per list in the metadata


def _metadata(profile_name: str, rep: BackfillReport) -> dict:
    return {
        "read_profile": profile_name,
        "streams": ", ".join(rep.streams) or "(none: the profile declares no training streams)",
        "episodes": rep.episodes,
        "episodes_current": len(rep.current),
        "this_run_added": len(rep.added),
        "this_run_added_GB": gigabytes(rep.bytes_added),
        "this_run_conflicts": MetadataValue.json(dict(list(rep.conflicts.items())[:SHOWN])),
        "this_run_failed": MetadataValue.json(dict(list(rep.failed.items())[:SHOWN])),
        "this_run_pending": MetadataValue.json(dict(list(rep.pending.items())[:SHOWN])),
        "this_run_s": rounded(rep.seconds),
        "this_run_cpu_s": rounded(rep.cpu_s),
    }


@asset(
    partitions_def=ingest_partitions,
    deps=["mcap_episodes"],
    group_name="ingest",
    tags={"dyna/stage": "training-streams"},
    backfill_policy=BACKFILL,
    pool="transcode",
    op_tags=k8s.TRANSCODE,
    description="The read profile's training streams (small, short-GOP copies of each camera) added to the "
    "partition's MCAPs that lack them, the archive video untouched. Backfill it after changing DYNA_READ_PROFILE.",
)
def training_streams(context: AssetExecutionContext, ingest: IngestResource, transcode: TranscodeResource):
    profile = ingest.home.profile()
    stores = ingest.stores()
    reports = []
    for partition in ingest_partition_keys(context, stores.registry):
        rep = backfill_partition(
            partition, stores, profile.training_streams, workers=transcode.pool_size(), log=context.log.warning
        )
        reports.append(rep)
        context.add_asset_metadata(_metadata(profile.name, rep), partition_key=partition)
        context.log.info(
            f"{partition}: {len(rep.added)} episode(s) given {', '.join(rep.streams) or 'no streams'}, "
            f"{len(rep.current)} already had them, {len(rep.conflicts)} conflicts, {len(rep.failed)} failed, "
            f"{len(rep.pending)} left pending by machine faults"
        )
    failed = {e: why for r in reports for e, why in r.failed.items()}
    pending = {e: why for r in reports for e, why in r.pending.items()}
    if failed or pending:  # after every partition is done: what the others did is recorded
        named = {**failed, **pending}
        failure = Failure(
            description=f"training_streams: {len(named)} episode(s) could not be given the streams"
            + (f" ({len(pending)} for machine faults, not their files')" if pending else "")
            + ": "
            + "; ".join(f"{e}: {why}" for e, why in list(named.items())[:5]),
            metadata={
                "failed": MetadataValue.json(dict(list(failed.items())[:SHOWN])),
                "pending": MetadataValue.json(dict(list(pending.items())[:SHOWN])),
            },
            allow_retries=False,
        )
        if not failed:  # every one was the machine's: a passing outage heals without a person
            retry_after_backoff(context, ingest, failure)
        raise failure
    digest = hashlib.sha256(
        repr(sorted((r.partition, r.streams, len(r.current) + len(r.added)) for r in reports)).encode()
    ).hexdigest()[:16]
    return MaterializeResult(
        tags={**version_tags(), "dyna/read_profile": profile.name}, data_version=DataVersion(digest)
    )
