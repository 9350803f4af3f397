"""Replication to a second (S3-compatible) origin: only what is missing, verified by checksum, and
the page cache keys the replica's bytes exactly like the primary's."""

from __future__ import annotations

import os

import pytest

from dyna_resources.storage.origins import Origins, Route
from dyna_resources.storage.page_cache import CacheConfig, PageCache
from dyna_resources.storage.replicate import replicate
from dyna_resources.storage.stores import Store
from tests.s3 import s3, s3_server  # noqa: F401  (pytest fixtures, used as parameters)

PAGE = 64 * 1024


@pytest.fixture
def primary(tmp_path):
    root = tmp_path / "primary" / "mcap"
    root.mkdir(parents=True)
    files = {}
    for i, n in enumerate((10, 3 * PAGE + 7, 5 * PAGE)):
        p = root / f"site-a/ep{i}.mcap"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(os.urandom(n))
        files[f"file://{p}"] = p.read_bytes()
    return f"file://{root}", files


def s3_store(s3, prefix: str) -> Store:
    return Store.from_url(f"s3://{s3.bucket}/{prefix}", fs=s3.fs)


def test_copies_only_what_is_missing_and_verifies(primary, s3):
    prefix, files = primary
    replica = s3_store(s3, "replica-a")
    first = replicate(files, prefix, replica)
    assert (len(first.copied), first.skipped, first.failed) == (3, [], {})
    assert first.bytes_copied == sum(len(b) for b in files.values())
    for url, data in files.items():
        key = url[len(prefix) + 1 :]
        assert replica.cat(key) == data
        assert s3.fs.metadata(replica._path(key))["dyna-sha256"]
    again = replicate(files, prefix, replica)
    assert (again.copied, len(again.skipped)) == ([], 3)
    changed = next(iter(files))
    with open(changed.removeprefix("file://"), "wb") as f:
        f.write(b"rewritten")
    third = replicate(files, prefix, replica)
    assert third.copied == [changed] and len(third.skipped) == 2
    assert replica.cat(changed[len(prefix) + 1 :]) == b"rewritten"


def test_missing_and_foreign_objects_are_reported_the_rest_copied(primary, s3, tmp_path):
    prefix, files = primary
    urls = [*files, f"{prefix}/site-a/gone.mcap", f"file://{tmp_path}/elsewhere.mcap"]
    report = replicate(urls, prefix, s3_store(s3, "replica-b"))
    assert len(report.copied) == 3
    assert "not found" in report.failed[f"{prefix}/site-a/gone.mcap"]
    assert "not below" in report.failed[f"file://{tmp_path}/elsewhere.mcap"]


def test_cache_keys_are_the_same_whichever_origin_is_read(primary, s3, tmp_path):
    prefix, files = primary
    replica = s3_store(s3, "replica-c")
    replicate(files, prefix, replica)
    cfg = CacheConfig(root=str(tmp_path / "cache"), page_size=PAGE, block_size=4096)
    with PageCache(cfg) as from_primary:
        for url, data in files.items():
            assert bytes(from_primary.read(url, 0, len(data))) == data
    routed = Origins(routes={prefix: Route(prefix, replica.root)}, stores={replica.root: replica})
    with PageCache(cfg, routed) as from_replica:
        for url, data in files.items():
            assert routed.info(url).version == Origins().info(url).version
            assert bytes(from_replica.read(url, 0, len(data))) == data
        assert from_replica.stats.origin_bytes == 0  # every page was already cached under the same keys
    with PageCache(CacheConfig(root=str(tmp_path / "cold"), page_size=PAGE, block_size=4096), routed) as cold:
        url, data = next(iter(files.items()))
        assert bytes(cold.read(url, 0, len(data))) == data and cold.stats.origin_bytes == len(data)


def test_local_replica_records_the_version_in_xattrs(primary, tmp_path):
    prefix, files = primary
    replica = Store.from_url(tmp_path / "neutral")
    try:
        report = replicate(files, prefix, replica)
    except OSError:
        pytest.skip("this file system keeps no user xattrs")
    if report.failed:
        pytest.skip(f"this file system keeps no user xattrs: {report.failed}")
    routed = Origins(routes={prefix: replica.root})
    for url in files:
        assert routed.info(url).version == Origins().info(url).version
    assert replicate(files, prefix, replica).skipped == list(files)
