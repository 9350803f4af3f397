"""The landing zone on object storage: gs:// on the GCS emulator, s3:// on a moto server.

gcp-storage-emulator ignores ``startOffset``, ``maxResults`` and ``pageToken`` on object listings
and ``generation`` on downloads (it serves every name under the prefix, in one page, latest
version). ``gcs_api`` swaps its list and download handlers for ones that follow the JSON API on
those parameters and records what each list request asked and was served; the tests that measure
what a scan requests run on it, and one test shows the plain emulator's answer is still right.
moto implements ``StartAfter``, ``MaxKeys``, continuation tokens and ``If-Match`` on GetObject.
"""

from __future__ import annotations

import base64
import logging
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus

import pytest

from dyna_resources.ingest.landing import LandingZone
from dyna_resources.ingest.object_landing import ObjectLandingZone, landing_zone
from dyna_resources.storage.publish import PreconditionFailed
from dyna_resources.storage.stores import Store, StoreKeyError, StoreUnavailableError

DATA = bytes(range(256)) * 41 + b"tail"  # 10 500 bytes, every offset distinguishable


# ---- the stores -----------------------------------------------------------------------------------
@pytest.fixture(params=["gs", "s3"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def store(backend, request) -> Store:
    prefix = f"landing/{uuid.uuid4().hex[:10]}/root"
    if backend == "gs":
        gcs = request.getfixturevalue("gcs")
        return Store.from_url(gcs.url(prefix), fs=gcs.fs)
    s3 = request.getfixturevalue("s3")
    return Store.from_url(s3.url(prefix), endpoint_url=s3.endpoint, fs=s3.fs)


def put_raw(store: Store, name: str, data: bytes = b"x" * 10) -> None:
    """Write an object named ``<root prefix>/<name>`` exactly (no key checks: any name a store accepts)."""
    bucket, _, prefix = store.root.split("://", 1)[1].partition("/")
    fs, full = store.filesystem, f"{prefix}/{name}"
    if store.protocol == "gs":
        from fsspec.asyn import sync
        from gcsfs.core import simple_upload

        sync(fs.loop, simple_upload, fs, bucket, full, data)
    else:
        fs.call_s3("put_object", Bucket=bucket, Key=full, Body=data)
    fs.invalidate_cache()


# ---- recording what list requests ask and get ------------------------------------------------------
@dataclass
class ListCall:
    query: dict[str, str]  # the request's parameters (first value of each)
    served: list[str]  # object names in the response


@dataclass
class ListLog:
    calls: list[ListCall] = field(default_factory=list)

    def served(self) -> list[str]:
        return [name for call in self.calls for name in call.served]


def _patch_handlers(monkeypatch, original, wrapper) -> None:
    from gcp_storage_emulator import server

    for _regex, handlers in server.HANDLERS:
        for method, fn in list(handlers.items()):
            if fn is original:
                monkeypatch.setitem(handlers, method, wrapper)


@pytest.fixture
def gcs_api(gcs, monkeypatch):
    """The emulator with object listings that honour ``startOffset`` (inclusive), ``maxResults`` and
    ``pageToken``, and downloads that honour ``generation`` (404 when that generation is not live),
    as the GCS JSON API documents; every list request is recorded in the returned ``ListLog``."""
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    log = ListLog()

    def ls(request, response, storage, *args, **kwargs):
        q = {k: v[0] for k, v in request.query.items()}
        files, _ = storage.get_file_list(request.params["bucket_name"], q.get("prefix"), None, None)
        names = sorted(files, key=lambda f: f["name"])
        if "pageToken" in q:
            last = base64.urlsafe_b64decode(q["pageToken"]).decode()
            names = [f for f in names if f["name"] > last]
        elif "startOffset" in q:
            names = [f for f in names if f["name"] >= q["startOffset"]]
        page = names[: int(q.get("maxResults", 1000))]
        body = {"kind": "storage#objects", "items": page}
        if len(page) < len(names):
            body["nextPageToken"] = base64.urlsafe_b64encode(page[-1]["name"].encode()).decode()
        log.calls.append(ListCall(q, [f["name"] for f in page]))
        response.json(body)

    def download(request, response, storage, *args, **kwargs):
        wanted = request.query.get("generation", [None])[0]
        if wanted is not None:
            try:
                live = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])["generation"]
            except NotFound:
                live = None
            if str(live) != wanted:
                response.status = HTTPStatus.NOT_FOUND
                return
        objects.download(request, response, storage, *args, **kwargs)

    _patch_handlers(monkeypatch, objects.ls, ls)
    _patch_handlers(monkeypatch, objects.download, download)
    return log


@pytest.fixture
def s3_list_log(s3):
    """Records the ListObjectsV2 requests the test's s3fs client sends and the keys they return."""
    log = ListLog()
    s3.fs.connect()  # the client exists only after the first call otherwise
    events = s3.fs.s3.meta.events

    def before(params, **kwargs):
        log.calls.append(ListCall({k: str(v) for k, v in params.items()}, []))

    def after(parsed, **kwargs):
        log.calls[-1].served.extend(o["Key"] for o in parsed.get("Contents", []))

    events.register("provide-client-params.s3.ListObjectsV2", before)
    events.register("after-call.s3.ListObjectsV2", after)
    yield log
    events.unregister("provide-client-params.s3.ListObjectsV2", before)
    events.unregister("after-call.s3.ListObjectsV2", after)


@pytest.fixture
def list_log(backend, request) -> ListLog:
    return request.getfixturevalue("gcs_api" if backend == "gs" else "s3_list_log")


def prefix_of(store: Store) -> str:
    return store.root.split("://", 1)[1].partition("/")[2] + "/"


# ---- listing --------------------------------------------------------------------------------------
def test_scan_lists_in_key_order_after_the_cursor_and_skips_hidden_and_foreign_objects(store, list_log, tmp_path):
    names = [
        "2026-11-28/a.h5",
        "2026-11-28/b.hdf5",
        "2026-11-29/a.h5",
        "2026-11-29.h5",
        "z.h5",
        "2026-11-29/.a.h5.123.tmp",
        ".hidden/x.h5",
        "2026-11-29/.uploading/c.h5",
        "2026-11-29/notes.txt",
        "2026-11-29/a.h5.part",
    ]
    for name in names:
        put_raw(store, name)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 10)
    put_raw(Store.from_url(store.root + "2", fs=store.filesystem), "a.h5")  # a sibling root sharing the prefix
    zone = ObjectLandingZone(store)
    keys = [f.path for f in zone.scan()]
    assert keys == ["2026-11-28/a.h5", "2026-11-28/b.hdf5", "2026-11-29.h5", "2026-11-29/a.h5", "z.h5"]
    assert keys == sorted(keys)
    assert [f.path for f in zone.scan(after="2026-11-28/b.hdf5")] == ["2026-11-29.h5", "2026-11-29/a.h5", "z.h5"]
    assert [f.path for f in zone.scan(after="2026-11-28/a.h5", limit=2)] == ["2026-11-28/b.hdf5", "2026-11-29.h5"]
    assert zone.scan(after="z.h5") == [] and zone.scan(limit=0) == []
    landed = zone.scan(limit=1)[0]
    assert landed.bytes == 10 and landed.mtime_ns > 1_600_000_000 * 10**9
    local = LandingZone(tmp_path)  # the same answers as the local zone over the same names
    for after, limit in [(None, None), ("2026-11-28/b.hdf5", None), ("2026-11-28/a.h5", 2), ("2026-11-29", None)]:
        assert [f.path for f in zone.scan(after, limit)] == [f.path for f in local.scan(after, limit)], (after, limit)


def test_scan_after_the_cursor_asks_the_store_for_nothing_before_it(store, list_log):
    for day in range(1, 21):
        for i in range(5):
            put_raw(store, f"2026-11-{day:02d}/ep-{i}.h5")
    list_log.calls.clear()
    cursor = "2026-11-19/ep-4.h5"
    got = ObjectLandingZone(store).scan(after=cursor)
    assert [f.path for f in got] == [f"2026-11-20/ep-{i}.h5" for i in range(5)]
    assert len(list_log.calls) == 1
    start = list_log.calls[0].query.get("startOffset") or list_log.calls[0].query.get("StartAfter")
    assert start == prefix_of(store) + cursor
    served = list_log.served()
    # the cursor itself at most (GCS' startOffset is inclusive); none of the 95 older objects
    assert [n for n in served if n < prefix_of(store) + cursor] == []
    assert len(served) <= 6


def test_limit_pages_through_filtered_names(store, list_log):
    for i in range(6):
        put_raw(store, f"d/ep-{i}.h5")
        put_raw(store, f"d/ep-{i}.h5.json")  # sorts between the raw files: listed, filtered out
        put_raw(store, f"d/.ep-{i}.h5.tmp")
    list_log.calls.clear()
    zone = ObjectLandingZone(store, page_size=2)
    got = zone.scan(after="d/ep-0.h5", limit=3)
    assert [f.path for f in got] == ["d/ep-1.h5", "d/ep-2.h5", "d/ep-3.h5"]
    sizes = [int(c.query.get("maxResults") or c.query["MaxKeys"]) for c in list_log.calls]
    assert len(sizes) > 1 and all(n <= 2 for n in sizes)  # several pages, none larger than page_size
    tokens = [c.query.get("pageToken") or c.query.get("ContinuationToken") for c in list_log.calls]
    assert tokens[0] is None and all(tokens[1:])  # later pages continue the first
    everything = [f.path for f in zone.scan()]
    assert everything == [f"d/ep-{i}.h5" for i in range(6)]


def test_an_emulator_that_ignores_start_offset_still_gets_the_right_answer(gcs):
    store = Store.from_url(gcs.url(f"landing/{uuid.uuid4().hex[:10]}"), fs=gcs.fs)
    for i in range(5):
        put_raw(store, f"a/ep-{i}.h5")
    got = ObjectLandingZone(store, page_size=2).scan(after="a/ep-2.h5", limit=1)
    assert [f.path for f in got] == ["a/ep-3.h5"]


def test_unsafe_keys_are_refused_and_never_listed(store, list_log, caplog, tmp_path):
    put_raw(store, "ok/ep.h5")
    unsafe = ["a\\b.h5", "q?x.h5"] + (["a//b.h5"] if store.protocol == "s3" else [])
    for name in unsafe:
        put_raw(store, name)
    zone = ObjectLandingZone(store)
    with caplog.at_level(logging.WARNING, logger="dyna_resources.ingest.object_landing"):
        assert [f.path for f in zone.scan()] == ["ok/ep.h5"]
    assert len([r for r in caplog.records if "skipping object" in r.getMessage()]) == len(unsafe)
    for bad in ["../etc/passwd.h5", "/etc/passwd.h5", "a/../../b.h5", "a//b.h5", "a\\b.h5", "a\0b.h5", "x?v=1.h5"]:
        with pytest.raises(StoreKeyError):
            zone.resolve(bad)
        with pytest.raises(StoreKeyError):
            zone.stage(bad, tmp_path)
    assert zone.resolve("ok/ep.h5") == f"{store.root}/ok/ep.h5"


# ---- staging --------------------------------------------------------------------------------------
def test_stage_round_trips_bytes_in_ranged_reads(store, list_log, tmp_path, request):
    put_raw(store, "2026-11-29/ep.h5", DATA)
    put_raw(store, "empty.h5", b"")
    zone = ObjectLandingZone(store, stage_chunk=4096)
    scratch = tmp_path / "scratch"
    path = zone.stage("2026-11-29/ep.h5", scratch, expect_size=len(DATA))
    assert path == scratch / "2026-11-29" / "ep.h5" and path.read_bytes() == DATA
    assert zone.stage("empty.h5", scratch).read_bytes() == b""
    assert sorted(p.name for p in scratch.rglob("*")) == ["2026-11-29", "empty.h5", "ep.h5"]  # no temp left
    if store.protocol == "gs":
        ranges = request.getfixturevalue("gcs").emulator.media_gets(f"{store.root}/2026-11-29/ep.h5")
        assert ranges == ["bytes=0-4095", "bytes=4096-8191", "bytes=8192-10499"]
    put_raw(store, "2026-11-29/ep.h5", DATA[:100])  # restaged: the new bytes replace the old copy
    assert zone.stage("2026-11-29/ep.h5", scratch).read_bytes() == DATA[:100]


def test_stage_refuses_a_size_other_than_registered_and_a_missing_object(store, list_log, tmp_path):
    put_raw(store, "ep.h5", DATA)
    zone = ObjectLandingZone(store)
    with pytest.raises(PreconditionFailed, match="were registered"):
        zone.stage("ep.h5", tmp_path, expect_size=len(DATA) + 1)
    with pytest.raises(FileNotFoundError):
        zone.stage("gone.h5", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_stage_fails_when_the_object_is_rewritten_mid_copy(store, list_log, tmp_path, monkeypatch):
    put_raw(store, "ep.h5", DATA)
    zone = ObjectLandingZone(store, stage_chunk=4096)
    real = zone._ranges

    def rewrite_after_first_range(key, size, pin):  # another uploader replaces the object mid-copy
        for i, chunk in enumerate(real(key, size, pin)):
            yield chunk
            if i == 0:
                put_raw(store, "ep.h5", DATA[::-1])

    monkeypatch.setattr(zone, "_ranges", rewrite_after_first_range)
    with pytest.raises(PreconditionFailed, match="while it was staged"):
        zone.stage("ep.h5", tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither a mixed file nor a temp file
    monkeypatch.undo()
    assert zone.stage("ep.h5", tmp_path).read_bytes() == DATA[::-1]


# ---- failures and construction ---------------------------------------------------------------------
def test_unreachable_store_is_unavailable(backend, request, monkeypatch, tmp_path):
    secret = "sekrit-do-not-print"
    if backend == "gs":
        zone = ObjectLandingZone(Store.from_url("gs://bucket/prefix", fs=request.getfixturevalue("gcs_unreachable")))
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        zone = ObjectLandingZone("s3://bucket/prefix", endpoint_url=request.getfixturevalue("s3_unreachable_endpoint"))
    for call in (zone.check, zone.scan, lambda: zone.scan(after="a.h5", limit=3), lambda: zone.stage("a.h5", tmp_path)):
        with pytest.raises(StoreUnavailableError) as err:
            call()
        assert err.value.url.startswith(f"{backend}://bucket/prefix") and err.value.reason
        assert secret not in str(err.value)


def test_missing_bucket_is_unavailable(backend, request):
    if backend == "gs":
        store = Store.from_url("gs://no-such-bucket-here/p", fs=request.getfixturevalue("gcs").fs)
    else:
        s3 = request.getfixturevalue("s3")
        store = Store.from_url("s3://no-such-bucket-here/p", endpoint_url=s3.endpoint, fs=s3.fs)
    zone = ObjectLandingZone(store)
    for call in (zone.check, zone.scan):
        with pytest.raises(StoreUnavailableError, match="bucket not found"):
            call()


def test_check_passes_on_a_reachable_empty_zone(store):
    zone = ObjectLandingZone(store)
    zone.check()
    assert zone.scan() == []


def test_landing_zone_picks_the_implementation_from_the_url(tmp_path, s3):
    local = landing_zone(tmp_path)
    assert isinstance(local, LandingZone) and local.root == tmp_path
    assert landing_zone(f"file://{tmp_path}/").root == tmp_path
    gs = landing_zone("gs://bucket/landing/")
    assert isinstance(gs, ObjectLandingZone) and gs.root == "gs://bucket/landing"
    s3_zone = landing_zone("s3://bucket/landing", endpoint_url=s3.endpoint)
    assert isinstance(s3_zone, ObjectLandingZone) and s3_zone.store.endpoint_url == s3.endpoint
    with pytest.raises(ValueError):
        ObjectLandingZone(Store.from_url(tmp_path))
    with pytest.raises(ValueError):
        landing_zone("ftp://host/x")
