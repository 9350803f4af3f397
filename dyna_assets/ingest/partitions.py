from dagster import AssetCheckExecutionContext, AssetExecutionContext, DynamicPartitionsDefinition, Failure

from dyna_resources.catalog.registry import Registry

from ..partitions import partition_keys

# One partition per ingest partition of the registry (sortable key such as 20261129-000042: the UTC day
# it opened, then a sequence), added by the landing sensor once the registry has sealed it; each holds
# byte-balanced work units (a few TiB in all in production), so a 1M-hour corpus stays in the thousands
# of partitions. The assets read their keys through ingest_partition_keys, which refuses any key that is
# not a safe identifier.
INGEST_PARTITIONS = "ingest_partitions"  # the definition's name (its .name attribute is typed str | None)
ingest_partitions = DynamicPartitionsDefinition(name=INGEST_PARTITIONS)


def ingest_partition_keys(
    context: AssetExecutionContext | AssetCheckExecutionContext, registry: Registry | None = None
) -> list[str]:
    """The run's ingest partition keys (several in a ranged backfill run), each checked before any is used:
    a safe identifier, and (given the ``registry``) one the registry sealed. Dagster's Materialize dialog
    offers "Add a partition" on every dynamic partitions definition and cannot be told not to (1.13), so
    a key typed there fails the run here, by name, before any partition of the run is touched."""
    keys = partition_keys(context, "ingest partition")
    unknown = [k for k in keys if registry is not None and not registry.has_partition(k)]
    if unknown:
        raise Failure(
            description=f"no ingest partition {', '.join(map(repr, unknown))} in the registry: ingest partitions are "
            "added by the landing sensor once the registry seals them, not by hand (Add a partition)",
            metadata={"unknown_partitions": ", ".join(unknown)},
            allow_retries=False,
        )
    return keys
