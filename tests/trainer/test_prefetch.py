"""Origin prefetch: a cold epoch read from the GCS emulator and the loopback S3 server, with no prewarm,
delivers the samples a local read does, byte for byte; the bytes fetched are the blocks the epoch
needs, once; a range that keeps failing fails only its unit's samples, naming the object, and one that
fails once is retried."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dyna_resources.episodes.errors import WindowError
from dyna_resources.storage.cache_fs import CachedFileSystem
from dyna_resources.storage.origins import Origins
from dyna_resources.storage.page_cache import CacheConfig, PageCache
from dyna_resources.storage.prewarm import ReadSet, plan_manifest
from dyna_resources.storage.stores import Store, StoreUnavailableError
from trainer.elastic import ElasticStream

from .test_gop_dataset import DENSE

BLOCK = 4096


def stream(manifest, shards=4, **kw) -> ElasticStream:
    return ElasticStream(manifest, DENSE, loader="gop", batch_size=2, seed=3, shards=shards, **kw)


def epoch(ds: ElasticStream) -> list[dict]:
    try:
        return list(iter(ds))
    finally:
        ds.close()


def same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for k in ("frames", "future", "proprio", "actions", "row", "anchor_ns"):
            if k in x:
                assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), k


def samples(batches: list[dict]) -> dict[tuple[int, int], np.ndarray]:
    """(row, anchor) -> the sample's frames, over an epoch's batches."""
    out = {}
    for b in batches:
        for i, key in enumerate(zip(b["row"].tolist(), b["anchor_ns"].tolist(), strict=True)):
            out[key] = b["frames"][i].numpy()
    return out


def uploaded(manifest: pa.Table, paths, fs, url_of) -> pa.Table:
    urls = {}
    for p in paths:
        fs.put_file(str(p), url_of(f"prefetch/{p.name}"))
        urls[f"file://{p}"] = url_of(f"prefetch/{p.name}")
    uris = [urls.get(u, urls.get(f"file://{u}")) for u in manifest.column("uri").to_pylist()]
    return manifest.set_column(manifest.column_names.index("uri"), "uri", pa.array(uris))


@pytest.fixture(params=["gs", "s3"])
def remote(request, mcap_fleet):
    """The fleet's MCAPs in an object store (the GCS emulator or the moto S3 server), its manifest and origins."""
    paths, manifest = mcap_fleet
    if request.param == "gs":
        gcs = request.getfixturevalue("gcs")
        root, fs, url_of = f"gs://{gcs.bucket}", gcs.fs, gcs.url
    else:
        s3 = request.getfixturevalue("s3")
        root, fs, url_of = f"s3://{s3.bucket}", s3.fs, s3.url
    origins = Origins(stores={root: Store.from_url(root, fs=fs)})
    return uploaded(manifest, paths, fs, url_of), origins


def cold(tmp_path, origins, name="c") -> PageCache:
    return PageCache(CacheConfig(root=str(tmp_path / name), page_size=64 * 1024, block_size=BLOCK), origins)


def test_a_cold_epoch_from_the_object_store_is_byte_identical_and_fetches_what_it_needs_once(
    remote, mcap_fleet, tmp_path
):
    manifest, origins = remote
    local = epoch(stream(mcap_fleet[1]))
    with cold(tmp_path, origins) as cache:
        fs = CachedFileSystem(cache)
        ds = stream(manifest, options={"open_file": fs.open}, prefetch_batches=4, page_cache=cache)
        got = epoch(ds)
        same(got, local)
        fetched = cache.stats.origin_bytes
        # the blocks the epoch needs, each once: no more than what a prewarm of the manifest would fetch
        with cold(tmp_path, origins, "plan") as other:
            plan = plan_manifest(manifest, CachedFileSystem(other), ReadSet(video_stream=DENSE.stream))
            wanted = sum(
                len({k for a, b in f.ranges for k in range(a // BLOCK, (b - 1) // BLOCK + 1)}) * BLOCK
                for f in plan.files
            )
        assert 0 < fetched <= wanted
        # a second rank on the node finds it warm
        again = epoch(stream(manifest, options={"open_file": fs.open}, prefetch_batches=4, page_cache=cache))
        same(again, local)
        assert cache.stats.origin_bytes == fetched


class FailingOrigins(Origins):
    """The store's origins, with every read of one object failing (``times`` reads; -1: for ever)."""

    def __init__(self, inner: Origins, bad: str, times: int = -1):
        super().__init__(stores=dict(inner.stores))
        self.bad, self.left, self.failed = bad, times, 0

    def read(self, url, start, end, version):
        if url == self.bad and self.left != 0:
            self.left -= 1
            self.failed += 1
            raise StoreUnavailableError(url, "injected: connection reset")
        return super().read(url, start, end, version)


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_a_range_that_keeps_failing_fails_only_its_samples_naming_the_object(remote, mcap_fleet, tmp_path):
    manifest, origins = remote
    local = epoch(stream(mcap_fleet[1], shards=1))  # one shard: batches mix the episodes' units
    uris = manifest.column("uri").to_pylist()
    first = {uris[r] for r in local[0]["row"].tolist()}
    bad = next(u for u in dict.fromkeys(uris) if u not in first)  # the first batch has good samples to repeat
    failing = FailingOrigins(origins, bad)
    with cold(tmp_path, failing) as cache:
        fs = CachedFileSystem(cache)
        opts = {"open_file": fs.open, "bad_samples": "skip"}
        got = epoch(stream(manifest, shards=1, options=opts, prefetch_batches=4, page_cache=cache))
    bad_rows = {i for i, u in enumerate(uris) if u == bad}
    want = {k: f for k, f in samples(local).items() if k[0] not in bad_rows}
    got_samples = samples(got)
    # every sample of the other episodes, byte-identical; none of the failing object's (a batch whose every
    # sample failed repeats the last good one, so counts are compared on distinct samples)
    assert set(got_samples) == set(want) and all(np.array_equal(got_samples[k], want[k]) for k in want)
    assert sum(int(b["skipped"]) for b in got) == len(samples(local)) - len(want) > 0
    assert failing.failed > 0
    with cold(tmp_path, FailingOrigins(origins, bad), "raise") as cache:
        fs = CachedFileSystem(cache)
        with pytest.raises(WindowError, match="could not be read from the origin") as e:
            epoch(stream(manifest, options={"open_file": fs.open}, prefetch_batches=4, page_cache=cache))
        assert bad in str(e.value)


@pytest.mark.parametrize("remote", ["gs"], indirect=True)
def test_a_range_that_fails_once_is_retried_and_no_sample_is_lost(remote, mcap_fleet, tmp_path):
    manifest, origins = remote
    bad = manifest.column("uri")[0].as_py()
    local = epoch(stream(mcap_fleet[1]))
    failing = FailingOrigins(origins, bad, times=1)
    with cold(tmp_path, failing) as cache:
        fs = CachedFileSystem(cache)
        ds = stream(manifest, options={"open_file": fs.open}, prefetch_batches=4, page_cache=cache)
        got = list(iter(ds))
        retries = ds._prefetcher.stats.retries
        ds.close()
    same(got, local)
    assert failing.failed == 1 and sum(int(b["skipped"]) for b in got) == 0
    assert retries <= 1  # the prefetch retried it, or the decode read it after the one failure


def test_a_manifest_of_a_few_batches_prefetches_across_epochs(mcap_fleet, tmp_path):
    """A look-ahead longer than an epoch reaches into later ones while the first is read (continuous)."""
    _, manifest = mcap_fleet
    short = manifest.slice(0, 2)  # 2 shards of 10 batches: a shard's lane is made after the look-ahead passed it
    local = stream(short, shards=2, continuous=True)
    per_epoch = local.batches_per_epoch
    it = iter(local)
    want = [next(it) for _ in range(3 * per_epoch)]
    local.close()
    with cold(tmp_path, Origins()) as cache:
        fs = CachedFileSystem(cache)
        ds = stream(
            short, shards=2, continuous=True, options={"open_file": fs.open}, prefetch_batches=48, page_cache=cache
        )
        it = iter(ds)
        got = [next(it) for _ in range(3 * per_epoch)]
        ds.close()
    same(got, want)
