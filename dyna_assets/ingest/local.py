"""Drive ingest in-process, as the daemon would: one landing-sensor tick, then each requested
run executed on the given instance. Used by `make demo`, the benchmark and tests; a deployed
instance does the same with `dagster-daemon` and the run queue."""

import time
from collections.abc import Mapping
from pathlib import Path

from dagster import DagsterInstance, Definitions, SensorResult, build_sensor_context, materialize

from .sensors import landing_sensor


def _resources(defs: Definitions, resources: Mapping | None) -> dict:
    given = resources or defs.resources
    assert given is not None, "the definitions carry their resources (build_definitions binds them)"
    return dict(given)


def landing_tick_in_process(
    instance: DagsterInstance, defs: Definitions, cursor: str | None, resources: Mapping | None = None
):
    given = _resources(defs, resources)  # only what the sensor uses: others (Ray) start nothing here
    # a context manager: resources with nested resources (each holds ``home``) are set up as generators
    with build_sensor_context(
        instance=instance,
        cursor=cursor,
        definitions=defs,
        resources={k: given[k] for k in landing_sensor.required_resource_keys},
    ) as ctx:
        result = landing_sensor(ctx)
    assert isinstance(result, SensorResult), "the landing sensor always returns a SensorResult"
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def ingest_landed(
    instance: DagsterInstance,
    defs: Definitions,
    *,
    cursor_file: Path | None = None,
    resources: Mapping | None = None,
    run_config: Mapping | None = None,
    max_ticks: int = 1000,
):
    """Tick until nothing new is requested and nothing is settling (files the landing sensor saw but waits
    for, see ``tick.py``: the loop sleeps until they may have settled); returns every run's in-process result."""
    from dyna_resources.ingest.tick import LandingCursor

    resources = _resources(defs, resources)
    assets = [defs.get_assets_def(k) for k in ("raw_episodes", "mcap_episodes", "step_ladders")]
    cursor = cursor_file.read_text() if cursor_file and cursor_file.exists() else None
    results = []
    for _ in range(max_ticks):
        tick = landing_tick_in_process(instance, defs, cursor, resources)
        cursor = tick.cursor
        if cursor_file:
            cursor_file.write_text(cursor)
        if not tick.run_requests:
            if not LandingCursor.loads(cursor).settling:
                break
            time.sleep(resources["ingest"].settle_s)  # a file stands still this long before it lands
            continue
        for req in tick.run_requests:
            results.append(
                materialize(
                    assets,
                    instance=instance,
                    partition_key=req.partition_key,
                    resources=resources,
                    run_config=run_config or {},
                    tags=req.tags,
                    raise_on_error=False,
                )
            )
    return results


def check_mcaps_present(
    instance: DagsterInstance,
    defs: Definitions,
    partitions: list[str],
    *,
    resources: Mapping | None = None,
    run_config: Mapping | None = None,
):
    """``mcap_episodes.mcaps_present`` run for each ingest partition (Checks → Execute in the UI): every
    recorded MCAP looked up in its store; what is missing is marked and named."""
    from dagster import AssetSelection

    from .presence import mcaps_present

    resources = _resources(defs, resources)
    return [
        materialize(
            [defs.get_assets_def("mcap_episodes"), mcaps_present],
            instance=instance,
            resources=resources,
            run_config=run_config or {},
            tags={"dagster/partition": key},
            selection=AssetSelection.checks(mcaps_present),
            raise_on_error=False,
        )
        for key in partitions
    ]


def reprocess_stale(
    instance: DagsterInstance, defs: Definitions, *, resources: Mapping | None = None, run_config: Mapping | None = None
):
    """What the drift sensor launches, run in-process: `mcap_episodes` and `step_ladders` for every
    ingest partition holding episodes stamped with older versions (inside each, only those are redone)."""
    from dyna_resources import versions

    resources = _resources(defs, resources)
    registry = resources["ingest"].stores().registry
    stale = registry.outdated_partitions(
        schema_version=versions.SCHEMA_VERSION, pipeline_version=versions.PIPELINE_VERSION
    )
    assets = [defs.get_assets_def(k) for k in ("mcap_episodes", "step_ladders")]
    return [
        materialize(
            assets,
            instance=instance,
            partition_key=key,
            resources=resources,
            run_config=run_config or {},
            tags={"dyna/trigger": "drift"},
            raise_on_error=False,
        )
        for key in stale
    ]


def check_versions_current(
    instance: DagsterInstance, defs: Definitions, *, resources: Mapping | None = None, run_config: Mapping | None = None
):
    """What the version check sensor launches, run in-process: ``mcap_episodes.versions_current`` recorded
    for every ingest partition (a fresh cursor: all of them). The run's result, or None when none is known."""
    from .staleness import version_check_sensor

    given = _resources(defs, resources)
    with build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={k: given[k] for k in version_check_sensor.required_resource_keys},
    ) as ctx:
        data = version_check_sensor.evaluate_tick(ctx)
    if not data.run_requests:
        return None
    (request,) = data.run_requests
    config = {**(run_config or {}), **(request.run_config or {})}
    return defs.get_job_def("report_version_checks").execute_in_process(
        run_config=config, instance=instance, resources=given, tags=request.tags, raise_on_error=False
    )
