"""Cache sets and replicas, one partition per curation spec (like the manifests they follow).

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dyna_resources.figures import gigabytes, rounded
from dyna_resources.resources import CacheResource, HomeResource, ReplicaResource
from dyna_resources.storage.prewarm import prewarm_manifest
from dyna_resources.storage.replicate import replicate
from trainer.manifest_loader import local_copy, open_manifest

from .. import k8s
from ..curation.assets import per_spec
from ..partitions import partition_key


def _manifest(context: AssetExecutionContext, home: HomeResource):
    """This partition's (checked) name and manifest, through the node's verified local copy (what every
    rank maps)."""
    name = partition_key(context, "curation spec")
    path = local_copy(home.manifest_arrow_url(name), home.home().node_cache)
    return name, path, open_manifest(path)


@asset(
    **per_spec("cache", "cache", k8s.PREWARM),
    deps=["manifests"],
    check_specs=[
        AssetCheckSpec("complete", asset="cache_sets", description="every file of the manifest was prewarmed")
    ],
    description="Exactly the pages a training run on this manifest will read (chunks of the read profile's "
    "topic groups, found through each MCAP's chunk index), fetched into the node-local page "
    "cache before training; or an Alluxio load job when $DYNA_ALLUXIO_* configures a cluster.",
)
def cache_sets(context: AssetExecutionContext, home: HomeResource, cache: CacheResource):
    name, path, table = _manifest(context, home)
    manifest_sha = path.stem
    read_set = cache.read_set()
    version = read_set.data_version(manifest_sha)
    front = cache.alluxio_front()
    if front is not None:
        report = front.load(sorted(set(table.column("uri").to_pylist())))
        return MaterializeResult(
            metadata={
                "backend": "alluxio",
                "manifest_sha256": manifest_sha,
                **report.as_metadata(),
                "failed": MetadataValue.json(dict(report.failed)),
            },
            check_results=[AssetCheckResult(passed=report.ok, metadata={"failed": len(report.failed)})],
            data_version=DataVersion(version),
        )

    with cache.cache() as page_cache:
        prewarmed = prewarm_manifest(
            table,
            page_cache,
            read_set,
            dataset=name,
            parallel=cache.parallel,
            progress=lambda p: context.log.info(f"prewarm {name}: {p.summary()}"),  # at least every 30 s
        )
        usage = page_cache.usage()
        root = str(page_cache.root)
    for url, why in prewarmed.errors.items():
        context.log.warning(f"not prewarmed: {url}: {why}")
    return MaterializeResult(
        metadata={
            "backend": "page-cache",
            "cache_dir": MetadataValue.path(root),
            "manifest_sha256": manifest_sha,
            "groups": MetadataValue.json(list(read_set.groups)),
            **prewarmed.as_metadata(),
            "dataset_cached_GB": gigabytes(usage.get(name, 0)),
            "errors": MetadataValue.json(prewarmed.errors),
        },
        check_results=[
            AssetCheckResult(passed=not prewarmed.errors, metadata={"files_not_prewarmed": len(prewarmed.errors)})
        ],
        data_version=DataVersion(version),
    )


@asset(
    **per_spec("replica", "cache", k8s.REPLICA),
    deps=["manifests"],
    check_specs=[
        AssetCheckSpec(
            "complete", asset="mcap_replica", description="every MCAP file of the manifest is on the second origin"
        )
    ],
    description="The manifest's MCAP files copied to the second, neutral origin (S3-compatible): only what "
    "is missing, each verified by SHA-256 after upload and tagged with the primary's version so "
    "the page cache keys stay the same whichever origin a cluster reads.",
)
def mcap_replica(context: AssetExecutionContext, home: HomeResource, replica: ReplicaResource):
    _, _, table = _manifest(context, home)
    uris = sorted(set(table.column("uri").to_pylist()))
    store = replica.store()
    report = replicate(uris, replica.source(), store)
    for url, why in report.failed.items():
        context.log.warning(f"not replicated: {url}: {why}")
    return MaterializeResult(
        metadata={
            "replica": store.root,
            "files": len(uris),
            "copied": len(report.copied),
            "skipped_current": len(report.skipped),
            "copied_GB": gigabytes(report.bytes_copied),
            "seconds": rounded(report.seconds),
            "failed": MetadataValue.json(report.failed),
        },
        check_results=[AssetCheckResult(passed=not report.failed, metadata={"failed": len(report.failed)})],
    )
