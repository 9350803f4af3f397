"""The Dagster internals this project needs, in one place (checked against Dagster 1.13).

What the public API lacks:

- A sensor that backfills chosen (asset, partition) pairs of several assets in ONE backfill (the
  drift sensor: ``mcap_episodes`` and ``step_ladders`` of the stale partitions, ``step_ladders``
  alone of the re-segmented ones) can say so only with ``RunRequest.for_asset_graph_subset`` and
  an ``AssetGraphSubset``; Dagster keeps both private ("AssetGraphSubset is not part of the public
  API", its docstring says). The public ``RunRequest(partition_key=...)`` launches one run per
  partition, outside the backfill daemon and its page in the UI.
- Listing the backfills in flight: ``DagsterInstance.get_backfills`` is public, its filter
  (``BulkActionsFilter``) and the statuses (``BulkActionStatus``) are not exported.
- Tests record a backfill in flight as the daemon would, with ``PartitionBackfill``.
- One partition's history of an asset check (``versions_current``, reported per partition by a
  sensor): the instance's public ``get_latest_asset_check_evaluation_record`` has no partition; the
  event log storage's history takes a ``PartitionKeyFilter``, not exported.
- Whether a partition is stale, and why (the UI's "Unsynced"): ``CachingStaleStatusResolver`` is
  what the webserver uses, not exported; tests ask it that a checkpoint trained on a manifest goes
  stale when the manifest gets a new DataVersion.

``tests/dyna_assets/test_dagster_private.py`` exercises every name here on a real instance, so an
upgrade that moves or changes one fails there, by name, before any sensor does.
"""

from collections.abc import Iterable, Mapping

from dagster import AssetCheckEvaluation, AssetCheckKey, AssetKey, DagsterInstance, RunRequest
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill

__all__ = [
    "BulkActionStatus",
    "FINISHED",
    "backfill_request",
    "backfills_in_flight",
    "check_history",
    "record_backfill",
    "requested_partitions",
    "stale_status",
]

FINISHED = frozenset(
    {
        BulkActionStatus.COMPLETED,
        BulkActionStatus.COMPLETED_SUCCESS,
        BulkActionStatus.COMPLETED_FAILED,
        BulkActionStatus.FAILED,
        BulkActionStatus.CANCELED,
    }
)


def backfill_request(pairs: Iterable[tuple[AssetKey, str]], asset_graph, tags: Mapping[str, str]) -> RunRequest:
    """A sensor's request for one backfill of exactly the (asset, partition key) ``pairs``."""
    subset = AssetGraphSubset.from_asset_partition_set({AssetKeyPartitionKey(k, p) for k, p in pairs}, asset_graph)
    return RunRequest.for_asset_graph_subset(subset, tags=dict(tags))


def requested_partitions(subset_holder) -> set[tuple[AssetKey, str | None]]:
    """The (asset, partition key) pairs of a backfill request, or of a backfill's target."""
    subset = getattr(subset_holder, "asset_graph_subset", None)
    if subset is None:
        subset = subset_holder.asset_backfill_data.target_subset
    return {(ap.asset_key, ap.partition_key) for ap in subset.iterate_asset_partitions()}


def backfills_in_flight(instance: DagsterInstance, tag: str) -> list:
    """Requested (not yet finished) backfills carrying ``tag: "true"``; filtered here, not by the storage's
    tag filter, which misses backfill tags on SQLite storage."""
    requested = instance.get_backfills(filters=BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED]))
    return [b for b in requested if b.tags.get(tag) == "true"]


def record_backfill(instance: DagsterInstance, request: RunRequest, backfill_id: str) -> None:
    """Record ``request``'s backfill as in flight, as the sensor daemon does when it takes the request."""
    assert request.asset_graph_subset is not None, "a backfill's RunRequest names its asset graph subset"
    instance.add_backfill(
        PartitionBackfill.from_asset_graph_subset(
            backfill_id=backfill_id,
            backfill_timestamp=0.0,
            tags=request.tags,
            dynamic_partitions_store=instance,
            asset_graph_subset=request.asset_graph_subset,
            title=None,
            description=None,
            run_config=None,
        )
    )


def check_history(instance: DagsterInstance, key: AssetCheckKey, partition: str, limit: int = 20) -> list:
    """The ``limit`` latest evaluations (:class:`AssetCheckEvaluation`) of check ``key`` for one partition,
    newest first."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=limit, partition_filter=PartitionKeyFilter(key=partition)
    )
    out = []
    for r in records:
        event = r.event.dagster_event if r.event is not None else None
        data = event.event_specific_data if event is not None else None
        if isinstance(data, AssetCheckEvaluation):
            out.append(data)
    return out


def stale_status(instance: DagsterInstance, assets: list, key: AssetKey, partition: str | None) -> tuple[str, list]:
    """The partition's stale status (``FRESH``, ``STALE``, ``MISSING``) in the graph of ``assets`` and its root
    causes, each (asset key, partition, reason)."""
    from dagster._utils.test.data_versions import get_stale_status_resolver  # a test helper: only tests ask

    resolver = get_stale_status_resolver(instance, assets)
    causes = [
        (c.dependency.asset_key if c.dependency else c.key.asset_key, c.key.partition_key, c.reason)
        for c in resolver.get_stale_root_causes(key, partition)
    ]
    return resolver.get_status(key, partition).value, causes
