"""The object-store layer on three real backends: a local folder, gs:// on the GCS emulator,
s3:// on a moto server (an S3-compatible origin reached through ``endpoint_url``)."""

from __future__ import annotations

import os
import uuid

import pytest

from dyna_resources.storage.stores import (
    Store,
    StoreKeyError,
    StoreUnavailableError,
    check_key,
    redact,
)

BACKENDS = ["file", "gs", "s3"]
DATA = bytes(range(256)) * 41 + b"tail"  # 10 500 bytes, every offset distinguishable


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path) -> Store:
    """A store rooted at a fresh prefix of its backend; its siblings share the bucket / folder."""
    prefix = f"stores/{uuid.uuid4().hex[:10]}/root"
    if request.param == "file":
        return Store.from_url(tmp_path / prefix)
    if request.param == "gs":
        gcs = request.getfixturevalue("gcs")
        return Store.from_url(gcs.url(prefix), fs=gcs.fs)
    s3 = request.getfixturevalue("s3")
    return Store.from_url(s3.url(prefix), endpoint_url=s3.endpoint, fs=s3.fs)


def sibling(store: Store, name: str) -> Store:
    """A store next to ``store``'s root (same filesystem): what a traversal key would reach."""
    parent = store.root.rsplit("/", 1)[0]
    return Store.from_url(f"{parent}/{name}", endpoint_url=store.endpoint_url, fs=store.filesystem)


def test_round_trip_put_cat_open(store, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    store.put_file(src, "episodes/ep-1.mcap")
    assert store.cat("episodes/ep-1.mcap") == DATA
    with store.open("episodes/ep-1.mcap", "rb") as f:
        assert f.read() == DATA
    with store.open("episodes/ep-2.mcap", "wb") as f:
        f.write(DATA[:100])
        f.write(DATA[100:])
    assert store.cat("episodes/ep-2.mcap") == DATA
    store.put_bytes("small", b"xyz")
    assert store.cat("small") == b"xyz"
    assert store.url("episodes/ep-1.mcap") == f"{store.root}/episodes/ep-1.mcap"
    assert store.root.startswith(f"{store.protocol}://")


def test_ranged_reads_equal_slices(store):
    store.put_bytes("blob", DATA)
    n = len(DATA)
    for start, end in [
        (0, 1),
        (0, 4096),
        (1, 2),
        (4095, 4097),
        (1000, 9000),
        (n - 4, n),
        (n - 1, None),
        (5000, None),
        (None, 10),
        (0, n),
        (n - 100, n + 50),
    ]:
        expected = DATA[start:end]
        assert store.cat("blob", start, end) == expected, (start, end)


def test_info_version_changes_on_rewrite(store):
    store.put_bytes("obj", b"a" * 1000)
    first = store.info("obj")
    assert first.size == 1000 and first.key == "obj" and first.version
    assert store.info("obj") == first  # stable while unchanged
    store.put_bytes("obj", b"b" * 1000)  # same size, other bytes
    second = store.info("obj")
    assert second.size == 1000
    assert second.version != first.version
    store.put_bytes("obj", b"c" * 10)
    third = store.info("obj")
    assert third.size == 10 and third.version not in (first.version, second.version)
    with pytest.raises(FileNotFoundError):
        store.info("missing")


def test_ls(store):
    for key in ["a/x", "a/y/z", "ab", "b/c", "top"]:
        store.put_bytes(key, key.encode())
    sibling(store, "root2").put_bytes("a/x", b"not mine")  # shares the root's name as a prefix
    assert store.ls() == ["a/x", "a/y/z", "ab", "b/c", "top"]
    assert store.ls("a") == ["a/x", "a/y/z"]
    assert store.ls("a/") == ["a/x", "a/y/z"]
    assert store.ls("a/y") == ["a/y/z"]
    assert store.ls("nothing") == []


def test_exists_and_delete(store):
    assert not store.exists("k/v")
    store.put_bytes("k/v", b"1")
    assert store.exists("k/v")
    assert not store.exists("k")  # a folder, not an object
    store.delete("k/v")
    assert not store.exists("k/v")
    assert store.ls() == []
    store.delete("k/v")  # idempotent
    with pytest.raises(FileNotFoundError):
        store.cat("k/v")


def test_delete_never_expands_globs(store):
    store.put_bytes("g/a1", b"1")
    store.put_bytes("g/a2", b"2")
    store.delete("g/a*")
    assert store.ls("g") == ["g/a1", "g/a2"]


BAD_KEYS = [
    "../outside",
    "a/../../outside",
    "..",
    "/abs/key",
    "a//b",
    "a/",
    "",
    "a\\..\\b",
    "a\0b",
    "./a",
    "a/./b",
    "x?versionId=1",
    "x#1",
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_unsafe_keys_are_rejected(store, key):
    with pytest.raises(StoreKeyError) as err:
        check_key(key)
    assert err.value.key == key and err.value.reason
    for call in (
        lambda: store.url(key),
        lambda: store.cat(key),
        lambda: store.open(key, "rb"),
        lambda: store.open(key, "wb"),
        lambda: store.put_bytes(key, b"x"),
        lambda: store.exists(key),
        lambda: store.info(key),
        lambda: store.delete(key),
    ):
        with pytest.raises(StoreKeyError):
            call()


def test_no_key_escapes_the_root(store, tmp_path):
    outside = sibling(store, "outside")
    outside.put_bytes("secret", b"not yours")
    src = tmp_path / "evil.bin"
    src.write_bytes(b"evil")
    for key in ["../outside/secret", "../../outside/secret", "a/../../outside/secret"]:
        for call in (store.cat, lambda k: store.put_file(src, k), store.delete, store.info):
            with pytest.raises(StoreKeyError):
                call(key)
    with pytest.raises(StoreKeyError):
        store.ls("../outside")
    assert outside.cat("secret") == b"not yours"
    assert outside.ls() == ["secret"]
    assert store.ls() == []


def test_local_symlink_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", root / "link")
    store = Store.from_url(root)
    with pytest.raises(StoreKeyError, match="outside the store root"):
        store.cat("link/f")


def test_local_writes_are_atomic(tmp_path):
    store = Store.from_url(f"file://{tmp_path}/r")
    store.put_bytes("k", b"old")
    with pytest.raises(RuntimeError), store.open("k", "wb") as f:
        f.write(b"partial")
        raise RuntimeError("writer died")
    assert store.cat("k") == b"old"
    assert os.listdir(tmp_path / "r") == ["k"]  # no temp file left behind
    with store.open("k", "wb") as f:
        f.write(b"new")
        assert store.cat("k") == b"old"  # readers see the old object until the writer closes
        assert store.ls() == ["k"]  # the temp file is not listed
    assert store.cat("k") == b"new"


def test_from_url_forms(tmp_path):
    assert Store.from_url(tmp_path).root == f"file://{tmp_path}"
    assert Store.from_url(f"file://{tmp_path}/").root == f"file://{tmp_path}"
    assert Store.from_url("gs://bucket/a/b/").root == "gs://bucket/a/b"
    assert Store.from_url("gcs://bucket").root == "gs://bucket"
    assert Store.from_url("s3a://bucket/p", endpoint_url="http://h:1").endpoint_url == "http://h:1"
    for bad in ["ftp://x/y", "gs://", "s3://bucket/../x", "file://relative/path"]:
        with pytest.raises(ValueError):
            Store.from_url(bad)
    assert Store.from_url("gs://b/p") == Store.from_url("gs://b/p", fs=object())  # fs is not identity


def test_s3_store_built_from_url_and_environment(s3, monkeypatch):
    """No ready filesystem: s3fs is built from the endpoint URL; credentials come from AWS_* variables."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = Store.from_url(s3.url(f"env/{uuid.uuid4().hex[:8]}"), endpoint_url=s3.endpoint)
    store.put_bytes("k", DATA)
    assert store.cat("k", 10, 20) == DATA[10:20]
    assert s3.fs.cat_file(f"{store.root.removeprefix('s3://')}/k") == DATA


@pytest.mark.parametrize("backend", ["gs", "s3"])
def test_unreachable_store_is_unavailable(backend, request, monkeypatch):
    secret = "sekrit-do-not-print"
    if backend == "gs":
        fs = request.getfixturevalue("gcs_unreachable")
        store = Store.from_url("gs://bucket/prefix", fs=fs)
    else:
        endpoint = request.getfixturevalue("s3_unreachable_endpoint")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries; read from the environment
        store = Store.from_url("s3://bucket/prefix", endpoint_url=endpoint)
    for call in (
        lambda: store.cat("k"),
        lambda: store.info("k"),
        lambda: store.exists("k"),
        lambda: store.ls(),
        lambda: store.put_bytes("k", b"x"),
    ):
        with pytest.raises(StoreUnavailableError) as err:
            call()
        assert err.value.url.startswith(f"{backend}://bucket/prefix")
        assert err.value.reason
        assert secret not in str(err.value) and secret not in repr(err.value.args)
        assert err.value.__cause__ is None and err.value.__suppress_context__


def test_credentials_in_an_endpoint_url_stay_out_of_errors(s3_unreachable_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    endpoint = s3_unreachable_endpoint.replace("//", "//user:pw-do-not-print@")
    store = Store.from_url("s3://bucket/prefix", endpoint_url=endpoint)
    assert "pw-do-not-print" not in repr(store) and "pw-do-not-print" not in str(store)
    with pytest.raises(StoreUnavailableError) as err:
        store.info("k")
    assert "pw-do-not-print" not in str(err.value)


def test_redact():
    assert redact("http://user:pw@host:1/x?a=1&X-Amz-Signature=abc") == "http://***@host:1/x?a=1&X-Amz-Signature=***"
    assert (
        redact('Could not connect to "https://k:s@h/b?token=t"') == 'Could not connect to "https://***@h/b?token=***"'
    )


def test_s3_open_reads_the_rewritten_object_not_a_cached_version(s3):
    import s3fs

    from dyna_resources.storage.stores import Store
    from tests.s3 import KEY, REGION, SECRET

    store = Store.from_url(f"s3://{s3.bucket}/reopen", fs=s3.fs)
    store.put_bytes("obj", b"first version")
    store.ls()  # fills this filesystem's listing cache with the first version's size and ETag
    writer = s3fs.S3FileSystem(
        key=KEY,
        secret=SECRET,
        skip_instance_cache=True,  # another process, in effect
        client_kwargs={"endpoint_url": s3.endpoint, "region_name": REGION},
    )
    writer.pipe_file(f"{s3.bucket}/reopen/obj", b"second, longer version")
    with store.open("obj") as f:
        assert f.read() == b"second, longer version"


class HungEndpoint:
    """``http://127.0.0.1:<port>`` that accepts connections and reads requests but never answers the
    first ``hang`` of them (they time out); later ones get a 404 at once, so a client retrying more
    often than it was told ends with FileNotFoundError instead of waiting on."""

    def __init__(self, hang: int):
        import socket
        import threading

        self.hang, self.requests = hang, []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._open: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            line = conn.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace")
            if not line:
                conn.close()
                continue
            self.requests.append(line)
            if len(self.requests) <= self.hang:
                self._open.append(conn)  # kept open, never answered
            else:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()

    def close(self) -> None:
        self._sock.close()
        for c in self._open:
            c.close()


@pytest.fixture
def hung_endpoint():
    server = HungEndpoint(hang=4)
    yield server
    server.close()


@pytest.mark.parametrize("attempts", [None, "1"])
def test_hung_s3_origin_fails_after_bounded_attempts_naming_the_store(hung_endpoint, monkeypatch, tmp_path, attempts):
    """Through the page cache, as training reads: each request times out (read timeout from the
    environment) and is tried 3 times in all (or AWS_MAX_ATTEMPTS), not s3fs' 5 x botocore's 5."""
    from dyna_resources.storage.origins import Origins
    from dyna_resources.storage.page_cache import CacheConfig, PageCache

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("DYNA_S3_ENDPOINT_URL", hung_endpoint.url),
        ("DYNA_S3_READ_TIMEOUT_S", "0.3"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    if attempts is None:
        monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    else:
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", attempts)
    with (
        PageCache(CacheConfig(root=str(tmp_path / "c")), Origins.from_env()) as cache,
        pytest.raises(StoreUnavailableError) as err,
    ):
        cache.info("s3://fleet/mcap/ep.mcap")
    assert err.value.url == "s3://fleet/mcap/ep.mcap"
    assert "timeout" in err.value.reason.lower()
    assert str(err.value).startswith("store s3://fleet/mcap/ep.mcap is unavailable: ")
    n = int(attempts or 3)
    assert err.value.reason.endswith(f"(gave up after {n} attempt(s), 3 s connect and 0.3 s read timeout each)")
    assert hung_endpoint.requests == ["HEAD /fleet/mcap/ep.mcap HTTP/1.1"] * n


def test_s3_limits_from_the_environment(monkeypatch):
    from dyna_resources.storage.stores import S3Limits

    for name in ("DYNA_S3_CONNECT_TIMEOUT_S", "DYNA_S3_READ_TIMEOUT_S", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    assert S3Limits.from_env() == S3Limits(
        connect_timeout_s=3.0, read_timeout_s=10.0, max_attempts=3, retry_mode="standard"
    )
    monkeypatch.setenv("DYNA_S3_CONNECT_TIMEOUT_S", "1.5")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    assert S3Limits.from_env() == S3Limits(
        connect_timeout_s=1.5, read_timeout_s=10.0, max_attempts=5, retry_mode="adaptive"
    )
    monkeypatch.setenv("DYNA_S3_READ_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="S3 request limits"):
        S3Limits.from_env()


def test_refused_s3_origin_error_names_the_store_and_the_limits(s3_unreachable_endpoint, monkeypatch):
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "DYNA_S3_CONNECT_TIMEOUT_S", "DYNA_S3_READ_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    store = Store.from_url("s3://bucket/prefix", endpoint_url=s3_unreachable_endpoint)
    with pytest.raises(StoreUnavailableError) as err:
        store.info("k")
    assert str(err.value) == (
        f"store s3://bucket/prefix/k is unavailable: EndpointConnectionError: Could not "
        f'connect to the endpoint URL: "{s3_unreachable_endpoint}/bucket/prefix/k" '
        f"(gave up after 3 attempt(s), 3 s connect and 10 s read timeout each)"
    )
