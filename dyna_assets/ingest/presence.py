"""``mcap_episodes.mcaps_present``: a check per ingest partition that every MCAP the registry records is
in its store as recorded; what is missing or changed is marked ``missing`` (no manifest selects it, the
drift sensor has the partition transcoded again) and named. Run it from the partition's page (Checks →
Execute) or in a job; its engine is dyna_resources/ingest/presence.py."""

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from dyna_resources.ingest.presence import check_partition_mcaps
from dyna_resources.resources import IngestResource

from .partitions import ingest_partition_keys, ingest_partitions


@asset_check(
    asset="mcap_episodes",
    name="mcaps_present",
    partitions_def=ingest_partitions,
    blocking=False,
    description="Every MCAP the registry records for the partition is in its store, at the recorded size "
    "and version; fails naming what is missing or changed, and marks those episodes missing "
    "(excluded from manifests, transcoded again by the next run of the partition).",
)
def mcaps_present(context: AssetCheckExecutionContext, ingest: IngestResource) -> AssetCheckResult:
    stores = ingest.stores()
    found = [
        check_partition_mcaps(stores.registry, stores.sink(), key)
        for key in ingest_partition_keys(context, stores.registry)
    ]
    missing = [m for p in found for m in p.missing]
    for p in found:
        (context.log.info if p.ok else context.log.error)(p.describe())
    return AssetCheckResult(
        passed=not missing,
        severity=AssetCheckSeverity.ERROR,
        description=found[0].describe()
        if len(found) == 1
        else f"{len(missing)} MCAPs missing or changed in {sum(not p.ok for p in found)} of {len(found)} partitions",
        metadata={
            "partitions": ", ".join(p.partition_key for p in found),
            "checked": sum(p.checked for p in found),
            "missing": len(missing),
            "missing_episodes": MetadataValue.json(missing[:100]),
        },
    )
