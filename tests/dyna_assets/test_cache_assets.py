"""cache_sets on a real (ephemeral) Dagster instance, from a manifest written by the manifest writer:
a missing MCAP fails the `complete` check and nothing else; an Alluxio cluster that does not answer
fails the run with its address."""

import socket

import pyarrow as pa
from dagster import DagsterInstance, FloatMetadataValue, materialize

from dyna_assets.definitions import defs
from dyna_assets.deployment import embedded_resources
from dyna_resources.catalog.manifest import write_manifest


def manifest_home(tmp_path, uris):
    home = tmp_path / "home"
    (home / "manifests").mkdir(parents=True)
    rows = pa.table(
        {
            "episode_id": [f"ep{i}" for i in range(len(uris))],
            "uri": uris,
            "start_ns": [0] * len(uris),
            "end_ns": [1_000_000_000] * len(uris),
        }
    )
    write_manifest(rows, home / "manifests", "spec-a")
    return home


def run(home, instance, **settings):
    """cache_sets on the embedded resources of ``home``, with ``settings`` in their environment."""
    res = embedded_resources({"DYNA_HOME": str(home), **settings})
    instance.add_dynamic_partitions("curation_specs", ["spec-a"])
    return materialize(
        [defs.get_assets_def("cache_sets")],
        instance=instance,
        partition_key="spec-a",
        resources={"home": res["home"], "cache": res["cache"]},
        raise_on_error=False,
    )


def test_missing_mcap_fails_the_complete_check_not_the_run(tmp_path):
    home = manifest_home(tmp_path, [f"file://{tmp_path}/gone.mcap"])
    with DagsterInstance.ephemeral() as instance:
        result = run(home, instance)
        assert result.success
        (check,) = result.get_asset_check_evaluations()
        assert check.check_name == "complete" and not check.passed
        (m,) = result.asset_materializations_for_node("cache_sets")
        assert "gone.mcap" in str(m.metadata["errors"].value) and m.metadata["files"].value == 0
        # sizes in GB, as floats the Plots tab graphs; no raw byte counts
        for key in ("working_set_GB", "warmed_GB", "fetched_GB", "dataset_cached_GB", "seconds", "fetched_MBps"):
            assert isinstance(m.metadata[key], FloatMetadataValue), key
        assert not any("bytes" in k for k in m.metadata)


def test_unreachable_alluxio_cluster_fails_the_prewarm_naming_it(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = manifest_home(tmp_path, [f"file://{tmp_path}/ep.mcap"])
    alluxio = {
        "DYNA_ALLUXIO_WORKER_HOSTS": f"127.0.0.1:{port}",
        "DYNA_ALLUXIO_ORIGIN": f"file://{tmp_path}",
        "DYNA_ALLUXIO_PROBE_TIMEOUT_S": "0.2",
    }
    with DagsterInstance.ephemeral() as instance:
        result = run(home, instance, **alluxio)
        assert not result.success
        (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        assert f"127.0.0.1:{port}" in str(failure.step_failure_data.error)
