"""The partition keys of a run, checked before an asset uses them (``dyna_resources.keys``).

Every partitioned asset (ingest batches and curation specs) takes its key through these, so a
key added through the Dagster API that is not a safe identifier fails the run, naming the key,
before it reaches a path, a query or a store. ``allow_retries=False``: the key will not improve.
"""

from dagster import AssetCheckExecutionContext, AssetExecutionContext, Failure

from dyna_resources.keys import UnsafeKeyError, check_key


def partition_key(context: AssetExecutionContext, what: str = "partition key") -> str:
    """The run's one partition key, checked."""
    return partition_keys(context, what)[0]


def partition_keys(
    context: AssetExecutionContext | AssetCheckExecutionContext, what: str = "partition key"
) -> list[str]:
    """Every partition key of the run (a ranged backfill run has several), all checked first."""
    keys = list(context.partition_keys)
    try:
        return [check_key(k, what) for k in keys]
    except UnsafeKeyError as e:
        if hasattr(context, "selected_asset_keys"):
            names = [k.to_user_string() for k in context.selected_asset_keys]
        else:  # an asset check's context selects checks
            names = [f"{k.asset_key.to_user_string()}.{k.name}" for k in context.selected_asset_check_keys]
        assets = ", ".join(sorted(names))
        raise Failure(
            description=f"{assets}: {e}",
            metadata={"partition_key": repr(e.key), "reason": e.reason},
            allow_retries=False,
        ) from None
