"""Conditional, atomic publication and quarantine moves on a local folder, gs:// (GCS emulator) and
s3:// (moto server).

gcp-storage-emulator accepts and ignores ``ifGenerationMatch`` everywhere (uploads, deletes,
rewrites) and ``sourceGeneration`` on rewrites. ``gcs_preconditions`` swaps its upload, delete and
rewrite handlers for ones that evaluate them as GCS does (412 when the live generation differs,
``0`` meaning "no live object"; a resumable session's condition is evaluated again on each chunk,
so on the one that would create the object) and records the conditions each request carried.
moto 5.2.5 evaluates ``If-None-Match``/``If-Match`` on PutObject, ``If-None-Match`` on
CompleteMultipartUpload and ``If-Match`` on DeleteObject, but ignores ``If-Match`` on
CompleteMultipartUpload and ``x-amz-copy-source-if-match`` on CopyObject (see the xfail below).
"""

from __future__ import annotations

import builtins
import os
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import pytest

from dyna_resources.storage import publish as publish_mod
from dyna_resources.storage.publish import PreconditionFailed, move_to_quarantine, publish_file
from dyna_resources.storage.stores import Store, StoreKeyError, StoreUnavailableError

DATA = bytes(range(256)) * 41 + b"tail"  # 10 500 bytes
PART = 5 << 20  # the smallest part size: files above it take the multipart / multi-chunk path
BIG = os.urandom(2 * PART + 12345)


@pytest.fixture(params=["file", "gs", "s3"])
def store(request, tmp_path) -> Store:
    prefix = f"publish/{uuid.uuid4().hex[:10]}/root"
    if request.param == "file":
        return Store.from_url(tmp_path / prefix)
    if request.param == "gs":
        gcs = request.getfixturevalue("gcs")
        request.getfixturevalue("gcs_preconditions")
        return Store.from_url(gcs.url(prefix), fs=gcs.fs)
    s3 = request.getfixturevalue("s3")
    return Store.from_url(s3.url(prefix), endpoint_url=s3.endpoint, fs=s3.fs)


# ---- GCS preconditions, as the real service evaluates them ----------------------------------------
@dataclass
class Conditions:
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (request kind, object name, ifGenerationMatch)
    sessions: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # upload_id -> (bucket, name, generation)
    after_rewrite: list = field(default_factory=list)  # callbacks run after a rewrite was served


@pytest.fixture
def gcs_preconditions(gcs, monkeypatch) -> Conditions:
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    state = Conditions()

    def live(storage, bucket, name) -> str:
        try:
            return str(storage.get_file_obj(bucket, name)["generation"])
        except NotFound:
            return "0"

    def refuse(response):
        response.status = HTTPStatus.PRECONDITION_FAILED
        message = "At least one of the pre-conditions you specified did not hold."
        response.json({"error": {"code": 412, "message": message}})

    def insert(request, response, storage, *args, **kwargs):
        q, bucket = request.query, request.params["bucket_name"]
        if "upload_id" in q:  # a chunk of a resumable session
            cond = state.sessions.get(q["upload_id"][0])
            if cond and live(storage, *cond[:2]) != cond[2]:
                return refuse(response)
            return objects_insert(request, response, storage, *args, **kwargs)
        name = q.get("name", [None])[0]
        want = q.get("ifGenerationMatch", [None])[0]
        if want is not None:
            state.seen.append((q.get("uploadType", ["?"])[0], name, want))
            if live(storage, bucket, name) != want:
                return refuse(response)
        objects_insert(request, response, storage, *args, **kwargs)
        if want is not None and q.get("uploadType") == ["resumable"]:
            upload_id = parse_qs(urlsplit(response["Location"]).query)["upload_id"][0]
            state.sessions[upload_id] = (bucket, name, want)

    def upload_partial(request, response, storage, *args, **kwargs):
        cond = state.sessions.get(request.query.get("upload_id", [""])[0])
        if cond and live(storage, *cond[:2]) != cond[2]:
            return refuse(response)
        objects_upload_partial(request, response, storage, *args, **kwargs)

    def delete(request, response, storage, *args, **kwargs):
        want = request.query.get("ifGenerationMatch", [None])[0]
        if want is not None:
            state.seen.append(("delete", request.params["object_id"], want))
            if live(storage, request.params["bucket_name"], request.params["object_id"]) != want:
                return refuse(response)
        objects_delete(request, response, storage, *args, **kwargs)

    def rewrite(request, response, storage, *args, **kwargs):
        source = request.query.get("sourceGeneration", [None])[0]
        if source is not None:
            state.seen.append(("rewrite", request.params["object_id"], source))
            if live(storage, request.params["bucket_name"], request.params["object_id"]) != source:
                response.status = HTTPStatus.NOT_FOUND  # that generation is gone
                return
        objects_rewrite(request, response, storage, *args, **kwargs)
        for callback in state.after_rewrite:
            callback()

    objects_insert, objects_upload_partial = objects.insert, objects.upload_partial
    objects_delete, objects_rewrite = objects.delete, objects.rewrite
    swaps = {
        objects.insert: insert,
        objects.upload_partial: upload_partial,
        objects.delete: delete,
        objects.rewrite: rewrite,
    }
    for _regex, handlers in server.HANDLERS:
        for method, fn in list(handlers.items()):
            if fn in swaps:
                monkeypatch.setitem(handlers, method, swaps[fn])
    return state


# ---- helpers ----------------------------------------------------------------------------------------
def write(tmp_path, data: bytes, name: str = "out.mcap"):
    path = tmp_path / f"{uuid.uuid4().hex[:6]}-{name}"
    path.write_bytes(data)
    return path


def leftovers(store: Store) -> list[str]:
    """What a failed publication might leave: local temp files, unfinished S3 multipart uploads."""
    if store.protocol == "file":
        root = store.root.removeprefix("file://")
        return sorted(
            os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs if f.startswith(".")
        )
    if store.protocol == "s3":
        bucket, _, prefix = store.root.split("://", 1)[1].partition("/")
        uploads = store.filesystem.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
        return [u["Key"] for u in uploads.get("Uploads", [])]
    return []


class _HookedFile:
    """A binary file whose ``read`` calls ``hook(n)`` first (n: how many reads came before)."""

    def __init__(self, f, hook):
        self._f, self._hook, self._n = f, hook, 0

    def read(self, size=-1):
        self._hook(self._n)
        self._n += 1
        return self._f.read(size)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def hook_reads_of(monkeypatch, path, hook) -> None:
    """``publish`` reads ``path`` through a file that runs ``hook`` before each read."""

    def opener(file, mode="r", *args, **kwargs):
        f = builtins.open(file, mode, *args, **kwargs)
        return _HookedFile(f, hook) if os.fspath(file) == os.fspath(path) and "r" in mode else f

    monkeypatch.setattr(publish_mod, "open", opener, raising=False)


# ---- publishing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("data", [DATA, b"", BIG], ids=["small", "empty", "multipart"])
def test_publish_round_trips_and_returns_the_new_version(store, tmp_path, data):
    src = write(tmp_path, data)
    info = publish_file(store, src, "mcap/ep-1.mcap", expect="absent", part_size=PART)
    assert store.cat("mcap/ep-1.mcap") == data
    assert info == store.info("mcap/ep-1.mcap") and info.size == len(data) and info.key == "mcap/ep-1.mcap"
    assert leftovers(store) == []


def test_publish_over_an_existing_object_with_expect_absent_is_refused(store, tmp_path):
    store.put_bytes("ep.mcap", b"old")
    before = store.info("ep.mcap")
    for data in (DATA, BIG):
        with pytest.raises(PreconditionFailed) as err:
            publish_file(store, write(tmp_path, data), "ep.mcap", expect="absent", part_size=PART)
        assert err.value.key == "ep.mcap" and "exists" in err.value.reason
    assert store.cat("ep.mcap") == b"old" and store.info("ep.mcap") == before
    assert leftovers(store) == []


def test_publish_with_the_version_read_replaces_it_and_a_stale_version_is_refused(store, tmp_path):
    first = publish_file(store, write(tmp_path, b"v1"), "ep.mcap")
    second = publish_file(store, write(tmp_path, b"v2"), "ep.mcap", expect=first.version)
    assert store.cat("ep.mcap") == b"v2" and second.version != first.version
    for stale in (first.version, "g1", "e0000"):
        with pytest.raises(PreconditionFailed, match="expected"):
            publish_file(store, write(tmp_path, b"v3"), "ep.mcap", expect=stale)
    big = publish_file(store, write(tmp_path, BIG), "ep.mcap", expect=second.version, part_size=PART)
    assert store.cat("ep.mcap") == BIG and big == store.info("ep.mcap")
    with pytest.raises(PreconditionFailed, match="no object"):
        publish_file(store, write(tmp_path, b"x"), "missing.mcap", expect=first.version)
    assert not store.exists("missing.mcap")


@pytest.mark.parametrize("data", [DATA, BIG], ids=["single", "multipart"])
def test_a_writer_that_gets_there_during_the_upload_wins_and_nothing_else_appears(store, tmp_path, monkeypatch, data):
    """The object appears after the up-front check and before the final request: the store refuses it."""
    src = write(tmp_path, data)
    hook_reads_of(monkeypatch, src, lambda n: n == 0 and store.put_bytes("ep.mcap", b"the other writer's"))
    with pytest.raises(PreconditionFailed):
        publish_file(store, src, "ep.mcap", expect="absent", part_size=PART)
    assert store.cat("ep.mcap") == b"the other writer's"
    assert leftovers(store) == []


@pytest.mark.parametrize("data", [DATA, BIG], ids=["single", "multipart"])
def test_a_rewrite_during_the_upload_fails_the_version_condition(store, tmp_path, monkeypatch, data, request):
    if store.protocol == "s3" and data is BIG:
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="moto 5.2.5 ignores If-Match on CompleteMultipartUpload (real S3 refuses it with 412)",
            )
        )
    first = publish_file(store, write(tmp_path, b"v1"), "ep.mcap")
    src = write(tmp_path, data)
    hook_reads_of(monkeypatch, src, lambda n: n == 0 and store.put_bytes("ep.mcap", b"rewritten meanwhile"))
    with pytest.raises(PreconditionFailed):
        publish_file(store, src, "ep.mcap", expect=first.version, part_size=PART)
    assert store.cat("ep.mcap") == b"rewritten meanwhile"
    assert leftovers(store) == []


@pytest.mark.parametrize("data", [DATA, BIG], ids=["single", "multipart"])
def test_a_local_read_error_mid_upload_leaves_no_object(store, tmp_path, monkeypatch, data):
    src = write(tmp_path, data)
    broken = OSError(5, "disk went away")

    def fail_second_read(n):
        if n == 1:
            raise broken

    hook_reads_of(monkeypatch, src, fail_second_read)
    with pytest.raises(OSError) as err:
        publish_file(store, src, "ep.mcap", part_size=PART)
    assert err.value is broken  # the file's own error, not reported as the store being unavailable
    assert not store.exists("ep.mcap") and store.ls() == []
    assert leftovers(store) == []


def test_a_file_that_changes_during_the_upload_is_not_published(store, tmp_path, monkeypatch):
    src = write(tmp_path, BIG)
    hook_reads_of(monkeypatch, src, lambda n: n == 1 and src.write_bytes(BIG[: PART + 1]))  # truncated mid-upload
    with pytest.raises(OSError, match=r"shrank|changed"):
        publish_file(store, src, "ep.mcap", part_size=PART)
    assert not store.exists("ep.mcap") and leftovers(store) == []


def test_gcs_uploads_carry_the_generation_condition(gcs, gcs_preconditions, tmp_path):
    store = Store.from_url(gcs.url(f"publish/{uuid.uuid4().hex[:10]}"), fs=gcs.fs)
    name = store.root.split("/", 3)[3] + "/ep.mcap"
    first = publish_file(store, write(tmp_path, b"v1"), "ep.mcap", expect="absent")
    publish_file(store, write(tmp_path, b"v2"), "ep.mcap", expect=first.version)
    publish_file(store, write(tmp_path, b"v3"), "ep.mcap")
    assert gcs_preconditions.seen == [("resumable", name, "0"), ("resumable", name, first.version[1:])]


def test_unsafe_keys_and_unreachable_stores(tmp_path, request, monkeypatch):
    src = write(tmp_path, b"x")
    local = Store.from_url(tmp_path / "root")
    for bad in ["../outside", "/abs", "a//b", "a\\b", "a\0b", "x?versionId=1"]:
        with pytest.raises(StoreKeyError):
            publish_file(local, src, bad)
    assert not (tmp_path / "outside").exists()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-do-not-print")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    stores = [
        Store.from_url("gs://bucket/prefix", fs=request.getfixturevalue("gcs_unreachable")),
        Store.from_url("s3://bucket/prefix", endpoint_url=request.getfixturevalue("s3_unreachable_endpoint")),
    ]
    for store in stores:
        for expect in (None, "absent"):
            with pytest.raises(StoreUnavailableError) as err:
                publish_file(store, src, "k", expect=expect)
            assert err.value.url.startswith(store.root) and "sekrit" not in str(err.value)
        with pytest.raises(StoreUnavailableError):
            move_to_quarantine(store, "k", "quarantine")
    with pytest.raises(FileNotFoundError):  # a missing local file is not the store's fault
        publish_file(stores[1], tmp_path / "nope", "k")


# ---- quarantine ------------------------------------------------------------------------------------
def test_move_to_quarantine(store, tmp_path):
    publish_file(store, write(tmp_path, DATA), "2026/ep.mcap")
    moved = move_to_quarantine(store, "2026/ep.mcap", "quarantine/")
    assert moved.key == "quarantine/2026/ep.mcap" and moved == store.info("quarantine/2026/ep.mcap")
    assert store.cat("quarantine/2026/ep.mcap") == DATA and not store.exists("2026/ep.mcap")
    assert store.ls() == ["quarantine/2026/ep.mcap"]
    with pytest.raises(FileNotFoundError):
        move_to_quarantine(store, "2026/ep.mcap", "quarantine")
    with pytest.raises(StoreKeyError):
        move_to_quarantine(store, "../x", "quarantine")


def test_quarantine_keeps_a_source_rewritten_during_the_move(store, request):
    """The copy is made, then the source changes: it is not deleted (the delete is conditional)."""
    if store.protocol == "file":
        pytest.skip("local: a rename moves exactly the file it names")
    store.put_bytes("ep.mcap", b"held back")

    def rewrite():
        store.put_bytes("ep.mcap", b"a newer upload")

    if store.protocol == "gs":
        request.getfixturevalue("gcs_preconditions").after_rewrite.append(rewrite)
    else:
        events = store.filesystem.s3.meta.events

        def after_copy(**kwargs):
            _rewrite_with_another_client(store)

        events.register("after-call.s3.CopyObject", after_copy)
        request.addfinalizer(lambda: events.unregister("after-call.s3.CopyObject", after_copy))
    with pytest.raises(PreconditionFailed, match="source was kept"):
        move_to_quarantine(store, "ep.mcap", "quarantine")
    assert store.cat("ep.mcap") == b"a newer upload"
    assert store.cat("quarantine/ep.mcap") == b"held back"


def _rewrite_with_another_client(store: Store) -> None:
    """Another process's upload, from inside an s3fs event hook (its event loop is busy: boto3 is not on it)."""
    import boto3

    from tests.s3 import KEY, REGION, SECRET

    client = boto3.client(
        "s3", endpoint_url=store.endpoint_url, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
    )
    bucket, _, prefix = store.root.split("://", 1)[1].partition("/")
    client.put_object(Bucket=bucket, Key=f"{prefix}/ep.mcap", Body=b"a newer upload")
