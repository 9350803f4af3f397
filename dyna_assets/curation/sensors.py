"""Manifests follow their specs and the data: one manifests partition per curation spec file; a new or
edited spec is built at once, a deleted one's partition is removed, and a manifest whose spec now
selects something else in the warehouse (dyna_resources/catalog/selection.py) is rebuilt."""

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from dyna_resources.catalog.selection import Selection, spec_digest, spec_files
from dyna_resources.keys import RULE
from dyna_resources.resources import HomeResource

from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on
from .assets import CURATION_SPECS, curation_specs

MANIFESTS = AssetKey("manifests")
WAREHOUSE = AssetKey("warehouse_episodes")


@sensor(
    **sensor_on("curation_spec_sensor", 30, [MANIFESTS]),
    description="Curation spec files ($DYNA_HOME/curation/*.yaml) → one manifests partition each. Builds a "
    "manifest when its spec is new or changed (run key: the spec's content hash), and again when "
    "the latest warehouse sync says the spec now selects other episodes or versions than the "
    "manifest was built from (run key: + that selection's fingerprint; tag dyna/trigger says which).",
)
def curation_spec_sensor(context: SensorEvaluationContext, home: HomeResource):
    files, ignored = spec_files(home.home().curation)
    for name in ignored:
        context.log.warning(f"ignoring curation spec {name}: the name must be {RULE}")
    known = set(context.instance.get_dynamic_partitions(CURATION_SPECS))
    new = sorted(set(files) - known)
    gone = sorted(known - set(files))  # its file was deleted: the partition goes too (its history stays in runs)
    if gone:
        context.log.info(f"curation spec(s) removed, their partitions with them: {gone}")
    in_warehouse = _latest_selections(context.instance)
    requests = []
    for name, path in files.items():
        digest = spec_digest(path)
        built = None if name in new else _built_from(context.instance, name)
        now = in_warehouse.get(name)
        if now is not None and now.spec != digest:
            now = None  # the warehouse saw an older edit of the spec: only the spec's own key applies
        if built is not None and built.spec == digest and (now is None or now.digest in ("", built.digest)):
            continue  # built from this spec, and the warehouse selects what the manifest holds
        if built is None or built.spec != digest:
            trigger = "new-spec" if built is None else "spec-changed"
        else:
            trigger = "selection-changed"  # the run's tags say from what to what
        tags = {"dyna/trigger": trigger, "dyna/spec_digest": digest, **AUTOMATIC_RUN_TAGS}
        if now is not None and now.digest:
            tags |= {"dyna/selection": now.digest, "dyna/selected_episodes": str(now.episodes)}
        if built is not None:
            tags |= {"dyna/built_from_selection": built.digest}
        key = f"{name}-{digest}" + (f"-{now.digest}" if now is not None and now.digest else "")
        requests.append(RunRequest(run_key=key, partition_key=name, tags=tags))
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=([curation_specs.build_add_request(new)] if new else [])
        + ([curation_specs.build_delete_request(gone)] if gone else []),
    )


def _metadata_json(instance: DagsterInstance, records_filter: AssetRecordsFilter, key: str) -> dict | None:
    records = instance.fetch_materializations(records_filter, limit=1, ascending=False).records
    event = records[0].asset_materialization if records else None
    value = event.metadata.get(key) if event is not None else None
    data = getattr(value, "value", None)
    return data if isinstance(data, dict) else None


def _latest_selections(instance: DagsterInstance) -> dict[str, Selection]:
    """What each spec selects as of the latest warehouse sync."""
    data = _metadata_json(instance, AssetRecordsFilter(asset_key=WAREHOUSE), "selections") or {}
    return {name: Selection.from_json(sel) for name, sel in data.items()}


def _built_from(instance: DagsterInstance, name: str) -> Selection | None:
    """What the latest build of manifest ``name`` selected (None: never built, or built before
    manifests recorded it)."""
    data = _metadata_json(instance, AssetRecordsFilter(asset_key=MANIFESTS, asset_partitions=[name]), "selection")
    return Selection.from_json(data) if data else None
