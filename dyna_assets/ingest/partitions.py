from dagster import AssetExecutionContext, DynamicPartitionsDefinition

from ..partitions import partition_keys

# One partition per ingest batch (sortable key such as 20261129T14-000123), added by the landing sensor;
# the assets read their keys through batch_keys, which refuses any key that is not a safe identifier.
ingest_batches = DynamicPartitionsDefinition(name="ingest_batches")


def batch_keys(context: AssetExecutionContext) -> list[str]:
    """The run's ingest batch keys (several in a ranged backfill run), each checked before any is used."""
    return partition_keys(context, "ingest batch")
