"""Sensors: the landing sensor turns arrivals into work units, ingest partitions and runs; the
drift sensor backfills exactly the partitions that an older pipeline or schema version wrote,
and re-segments exactly the partitions whose step ladders an older segmenter or ladder
configuration wrote."""

import hashlib
import json

from dagster import AssetKey, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from dyna_resources import versions
from dyna_resources.ingest.tick import LandingCursor, landing_tick
from dyna_resources.resources import IngestResource, LadderResource

from ..dagster_private import backfill_request, backfills_in_flight
from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on
from .partitions import INGEST_PARTITIONS, ingest_partitions

INGEST_ASSETS = [AssetKey("raw_episodes"), AssetKey("mcap_episodes"), AssetKey("step_ladders")]
DRIFT_ASSETS = [AssetKey("mcap_episodes"), AssetKey("step_ladders")]  # what a drift backfill may redo
DRIFT_TAG = "dyna/drift"


@sensor(
    **sensor_on("landing_sensor", 30, INGEST_ASSETS),
    description="New raw files → registry → byte-balanced work units → ingest partitions (a few TiB "
    "each) → one Dagster partition and run per sealed partition (at most max_runs_per_tick "
    "per tick; the run queue staggers them).",
)
def landing_sensor(context: SensorEvaluationContext, ingest: IngestResource):
    stores = ingest.stores()
    plan = landing_tick(
        LandingCursor.loads(context.cursor),
        stores.landing,  # type: ignore[arg-type]  # landing_tick takes either landing zone, annotated LandingZone
        stores.registry,
        ingest.landing_settings(),
    )
    context.log.info(
        f"listed {plan.listed} (new {plan.new_files}), packed {len(plan.created)} work units, "
        f"sealed {len(plan.sealed)} partitions, launching {len(plan.launch)}, "
        f"{plan.pending_files} files pending"
        + (f" [reconciliation sweep: {plan.swept} keys]" if plan.reconciled else "")
    )
    # Partitions already handed to Dagster (a fresh cursor, e.g. after the demo ran ticks by hand) are not relaunched.
    keys = [p.key for p in plan.launch if not context.instance.has_dynamic_partition(INGEST_PARTITIONS, p.key)]
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=k,
                partition_key=k,
                asset_selection=INGEST_ASSETS,
                tags={"dyna/ingest_partition": k, "dyna/trigger": "landing", **AUTOMATIC_RUN_TAGS},
            )
            for k in keys
        ],
        dynamic_partitions_requests=[ingest_partitions.build_add_request(keys)] if keys else [],
        cursor=plan.cursor.dumps(),
    )


# The daemon only accepts a backfill request (RunRequest.for_asset_graph_subset) from a sensor that declares
# the assets it may target, and refuses a subset reaching outside them.
@sensor(
    **sensor_on("version_drift_sensor", 60, DRIFT_ASSETS),
    description="Ingest partitions holding episodes of an outdated PIPELINE/SCHEMA_VERSION → ONE backfill "
    "of mcap_episodes + step_ladders for exactly those partitions, plus step_ladders alone for "
    "partitions whose ladders an older segmenter/config wrote (never while one is in flight).",
)
def version_drift_sensor(context: SensorEvaluationContext, ingest: IngestResource, ladders: LadderResource):
    registry = ingest.stores().registry
    ladder_version = ladders.config().version

    # Both from the registry's per-partition version summary; only the stale keys are looked up in
    # Dagster (one that was never handed to it cannot be backfilled), never the whole partition list.
    def known(keys: list[str]) -> list[str]:
        return [k for k in keys if context.instance.has_dynamic_partition(INGEST_PARTITIONS, k)]

    stale = known(
        registry.outdated_partitions(schema_version=versions.SCHEMA_VERSION, pipeline_version=versions.PIPELINE_VERSION)
    )
    stale_set = set(stale)
    relabel = known([p for p in registry.outdated_ladder_partitions(ladder_version) if p not in stale_set])
    if not stale and not relabel:
        return SkipReason("every ingest partition is at the current versions")
    in_flight = backfills_in_flight(context.instance, DRIFT_TAG)
    if in_flight:
        return SkipReason(f"drift backfill {in_flight[0].backfill_id} still in flight")
    want = {
        "schema": versions.SCHEMA_VERSION,
        "pipeline": versions.PIPELINE_VERSION,
        "batches": stale,
        "ladder": ladder_version,
        "relabel": relabel,
    }
    fingerprint = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:16]
    if context.cursor == fingerprint:
        return SkipReason(
            f"{len(stale) + len(relabel)} stale partitions were already backfilled once at these "
            "versions; see that backfill's failures"
        )
    mcap, ladder = DRIFT_ASSETS
    wanted = [(k, b) for b in stale for k in (mcap, ladder)] + [(ladder, b) for b in relabel]
    context.update_cursor(fingerprint)
    context.log.info(
        f"backfilling {len(stale)} stale partitions to pipeline {versions.PIPELINE_VERSION}: "
        f"{stale[:20]}; re-segmenting {len(relabel)} partitions to ladder {ladder_version}: "
        f"{relabel[:20]}"
    )
    assert context.repository_def is not None, "a sensor is evaluated within its code location's repository"
    return backfill_request(
        wanted,
        context.repository_def.asset_graph,
        tags={
            DRIFT_TAG: "true",
            "dyna/trigger": "drift",
            "dyna/pipeline_version": versions.PIPELINE_VERSION,
            "dyna/ladder_version": ladder_version,
            **AUTOMATIC_RUN_TAGS,  # each run of the backfill, retried while the backfill is in progress
        },
    )
