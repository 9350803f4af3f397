"""The prewarm sensor fires once per manifest DataVersion, on a real (ephemeral) Dagster instance."""

from dagster import AssetMaterialization, DagsterInstance, build_sensor_context

from dyna_assets.cache.sensors import DATA_VERSION_TAG, manifest_prewarm_sensor


def record(instance, partition: str, version: str) -> None:
    instance.report_runless_asset_event(
        AssetMaterialization(asset_key="manifests", partition=partition, tags={DATA_VERSION_TAG: version})
    )


def tick(instance, cursor):
    result = manifest_prewarm_sensor(build_sensor_context(instance=instance, cursor=cursor))
    return [(r.partition_key, r.tags["dyna/manifest_version"]) for r in result.run_requests], result.cursor


def test_sensor_fires_once_per_manifest_version():
    with DagsterInstance.ephemeral() as instance:
        assert tick(instance, None)[0] == []
        record(instance, "spec-a", "v1")
        record(instance, "spec-b", "w1")
        fired, cursor = tick(instance, None)
        assert fired == [("spec-a", "v1"), ("spec-b", "w1")]
        assert tick(instance, cursor)[0] == []  # nothing new
        record(instance, "spec-a", "v1")  # rebuilt, same content
        fired, cursor = tick(instance, cursor)
        assert fired == []
        record(instance, "spec-a", "v2")
        record(instance, "spec-a", "v3")  # two builds between ticks: only the latest is warmed
        record(instance, "spec-b", "w1")
        fired, cursor = tick(instance, cursor)
        assert fired == [("spec-a", "v3")]
        record(instance, "spec-a", "v2")  # back to an older content: a new prewarm (the cache may have evicted it)
        assert tick(instance, cursor)[0] == [("spec-a", "v2")]


def test_run_keys_are_stable_per_version():
    with DagsterInstance.ephemeral() as instance:
        record(instance, "spec-a", "abc123")
        first = manifest_prewarm_sensor(build_sensor_context(instance=instance)).run_requests
        again = manifest_prewarm_sensor(build_sensor_context(instance=instance)).run_requests
        assert [r.run_key for r in first] == [r.run_key for r in again] == ["prewarm-spec-a-abc123"]
