from dagster import AssetCheckExecutionContext, AssetExecutionContext, DynamicPartitionsDefinition

from ..partitions import partition_keys

# One partition per ingest partition of the registry (sortable key such as 20261129-000042: the UTC day
# it opened, then a sequence), added by the landing sensor once the registry has sealed it; each holds
# byte-balanced work units (a few TiB in all in production), so a 1M-hour corpus stays in the thousands
# of partitions. The assets read their keys through ingest_partition_keys, which refuses any key that is
# not a safe identifier.
INGEST_PARTITIONS = "ingest_partitions"  # the definition's name (its .name attribute is typed str | None)
ingest_partitions = DynamicPartitionsDefinition(name=INGEST_PARTITIONS)


def ingest_partition_keys(context: AssetExecutionContext | AssetCheckExecutionContext) -> list[str]:
    """The run's ingest partition keys (several in a ranged backfill run), each checked before any is used."""
    return partition_keys(context, "ingest partition")
