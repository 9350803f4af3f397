"""One manifests partition per curation spec file; a new or edited spec is built at once, a deleted
one's partition is removed."""

import hashlib

from dagster import AssetKey, RunRequest, SensorEvaluationContext, SensorResult, sensor

from dyna_resources.keys import RULE, is_safe_key
from dyna_resources.resources import HomeResource

from ..deployment import AUTOMATIC_RUN_TAGS, sensor_on
from .assets import CURATION_SPECS, curation_specs


@sensor(
    **sensor_on([AssetKey("manifests")], 30),
    description="Curation spec files ($DYNA_HOME/curation/*.yaml) → one manifests partition each; a new or "
    "changed spec requests a build (run key = the spec's content hash).",
)
def curation_spec_sensor(context: SensorEvaluationContext, home: HomeResource):
    specs = {}
    for p in sorted(home.home().curation.glob("*.yaml")):
        if is_safe_key(p.stem):  # the file name becomes a partition key and a manifest file name
            specs[p.stem] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        elif not p.name.startswith("."):
            context.log.warning(f"ignoring curation spec {p.name}: the name must be {RULE}")
    known = set(context.instance.get_dynamic_partitions(CURATION_SPECS))
    new = sorted(set(specs) - known)
    gone = sorted(known - set(specs))  # its file was deleted: the partition goes too (its history stays in runs)
    if gone:
        context.log.info(f"curation spec(s) removed, their partitions with them: {gone}")
    return SensorResult(
        run_requests=[
            RunRequest(run_key=f"{name}-{digest}", partition_key=name, tags=AUTOMATIC_RUN_TAGS)
            for name, digest in specs.items()
        ],
        dynamic_partitions_requests=([curation_specs.build_add_request(new)] if new else [])
        + ([curation_specs.build_delete_request(gone)] if gone else []),
    )
