"""The loopback S3 server for benchmarks (benchmarks/object_server.py), driven through the
project's Store (s3fs underneath) and through raw http.client requests."""

from __future__ import annotations

import base64
import hashlib
import http.client
import math
import os
import random
import xml.etree.ElementTree as ET
import zlib
from email.utils import parsedate_to_datetime

import pytest
import s3fs

from benchmarks.object_server import (
    BLOCK,
    ObjectServer,
    RangeNotSatisfiable,
    parse_range,
)
from dyna_resources.storage.stores import Store

BUCKET = "bench"
DATA = random.Random(7).randbytes((1 << 20) + 12345)
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@pytest.fixture(autouse=True)
def aws_env(monkeypatch):
    """Dummy credentials: the server checks none, botocore wants some."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "dummy",
        "AWS_SECRET_ACCESS_KEY": "dummy",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def root(tmp_path):
    (tmp_path / "root" / BUCKET).mkdir(parents=True)
    return tmp_path / "root"


@pytest.fixture
def server(root):
    with ObjectServer(root, latency_s=0, bandwidth_Bps=None) as srv:
        yield srv


@pytest.fixture
def store(server) -> Store:
    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": server.endpoint_url})
    return Store.from_url(f"s3://{BUCKET}/data", endpoint_url=server.endpoint_url, fs=fs)


def put_local(root, key: str, data: bytes):
    path = root / BUCKET / "data" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def connect(server) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)


def request(conn, method: str, path: str, body=None, headers=None) -> tuple[http.client.HTTPResponse, bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp, resp.read()


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


# ---- reads --------------------------------------------------------------------------------------


def test_random_ranges_round_trip_through_store(root, store):
    put_local(root, "blob.bin", DATA)
    n = len(DATA)
    rng = random.Random(1)
    for _ in range(40):
        start = rng.randrange(n)
        end = rng.randrange(start + 1, n + 1)
        assert store.cat("blob.bin", start, end) == DATA[start:end], (start, end)
    assert store.cat("blob.bin") == DATA
    assert store.cat("blob.bin", n - 10, n + 100) == DATA[n - 10 :]
    with store.open("blob.bin") as f:  # s3fs's file object: HEAD, then ranged GETs with If-Match
        f.seek(5000)
        assert f.read(70000) == DATA[5000:75000]


def test_raw_ranges_on_one_keep_alive_connection(root, server):
    put_local(root, "blob.bin", DATA)
    n, path = len(DATA), f"/{BUCKET}/data/blob.bin"
    conn = connect(server)
    resp, body = request(conn, "GET", path)
    sock = conn.sock
    assert resp.status == 200 and body == DATA and int(resp.headers["Content-Length"]) == n
    cases = [
        ("bytes=0-0", 0, 0),
        ("bytes=100-199", 100, 199),
        ("bytes=1000-", 1000, n - 1),
        ("bytes=-500", n - 500, n - 1),
        ("bytes=-99999999", 0, n - 1),
        ("bytes=5-99999999", 5, n - 1),
    ]
    for header, first, last in cases:
        resp, body = request(conn, "GET", path, headers={"Range": header})
        assert resp.status == 206, header
        assert resp.headers["Content-Range"] == f"bytes {first}-{last}/{n}"
        assert int(resp.headers["Content-Length"]) == last - first + 1
        assert body == DATA[first : last + 1], header
    resp, body = request(conn, "GET", path, headers={"Range": "bytes=20-10"})  # invalid: ignored, as S3 does
    assert resp.status == 200 and body == DATA
    for header in (f"bytes={n}-", f"bytes={n + 5}-{n + 10}", "bytes=-0"):
        resp, body = request(conn, "GET", path, headers={"Range": header})
        assert resp.status == 416, header
        assert resp.headers["Content-Range"] == f"bytes */{n}"
        assert b"<Code>InvalidRange</Code>" in body
    assert conn.sock is sock  # every response kept the connection open
    conn.close()


def test_conditional_gets(root, server):
    put_local(root, "obj.bin", b"payload")
    path, etag = f"/{BUCKET}/data/obj.bin", md5_etag(b"payload")
    conn = connect(server)
    resp, body = request(conn, "GET", path, headers={"If-Match": etag, "Range": "bytes=1-3"})
    assert resp.status == 206 and body == b"ayl"
    resp, body = request(conn, "GET", path, headers={"If-Match": '"0123"'})  # the object changed since
    assert resp.status == 412 and ET.fromstring(body).findtext("Code") == "PreconditionFailed"
    resp, body = request(conn, "GET", path, headers={"If-None-Match": etag})
    assert resp.status == 304 and body == b""
    conn.close()


def test_parse_range():
    assert parse_range(None, 10) is None
    assert parse_range("bytes=2-4", 10) == (2, 4)
    assert parse_range("bytes=2-", 10) == (2, 9)
    assert parse_range("bytes=-3", 10) == (7, 9)
    assert parse_range("bytes=0-100", 10) == (0, 9)
    assert parse_range("bytes=1-2,4-5", 10) is None  # several ranges: the whole object
    assert parse_range("items=1-2", 10) is None
    for header, size in [("bytes=10-", 10), ("bytes=-1", 0), ("bytes=0-0", 0), ("bytes=-0", 10)]:
        with pytest.raises(RangeNotSatisfiable):
            parse_range(header, size)


def test_head_size_etag_and_store_info(root, server, store):
    path = put_local(root, "obj.bin", DATA)
    conn = connect(server)
    resp, body = request(conn, "HEAD", f"/{BUCKET}/data/obj.bin")
    assert resp.status == 200 and body == b""
    assert int(resp.headers["Content-Length"]) == len(DATA)
    assert resp.headers["ETag"] == md5_etag(DATA)
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert parsedate_to_datetime(resp.headers["Last-Modified"]).timestamp() == int(path.stat().st_mtime)
    info = store.info("obj.bin")
    assert info.size == len(DATA) and info.version == "e" + hashlib.md5(DATA).hexdigest()
    assert store.exists("obj.bin")

    other = DATA[::-1]  # same size, other bytes, rewritten in place: the cached ETag must not be served
    path.write_bytes(other)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    resp, _ = request(conn, "HEAD", f"/{BUCKET}/data/obj.bin")
    assert resp.headers["ETag"] == md5_etag(other)
    assert store.info("obj.bin").version == "e" + hashlib.md5(other).hexdigest()
    conn.close()


def test_missing_objects_and_buckets(server, store):
    with pytest.raises(FileNotFoundError):
        store.info("nope.bin")
    with pytest.raises(FileNotFoundError):
        store.cat("nope.bin", 0, 10)
    assert not store.exists("nope.bin")
    with pytest.raises(FileNotFoundError):
        Store.from_url("s3://no-such-bucket/x", endpoint_url=server.endpoint_url, fs=store.filesystem).cat("k")

    conn = connect(server)
    resp, body = request(conn, "GET", f"/{BUCKET}/data/nope.bin")
    assert resp.status == 404 and resp.headers["Content-Type"] == "application/xml"
    error = ET.fromstring(body)
    assert error.tag == "Error" and error.findtext("Code") == "NoSuchKey" and error.findtext("Key") == "data/nope.bin"
    resp, body = request(conn, "HEAD", f"/{BUCKET}/data/nope.bin")
    assert resp.status == 404 and body == b""
    resp, body = request(conn, "GET", "/no-such-bucket/k")
    assert resp.status == 404 and ET.fromstring(body).findtext("Code") == "NoSuchBucket"
    resp, _ = request(conn, "HEAD", "/no-such-bucket")
    assert resp.status == 404
    resp, _ = request(conn, "HEAD", f"/{BUCKET}")
    assert resp.status == 200
    resp, _ = request(conn, "GET", f"/{BUCKET}/data")  # a folder is not an object
    assert resp.status == 404
    conn.close()


def test_path_traversal_is_refused(tmp_path, root, server):
    secret = b"top-secret-7f3a"
    (tmp_path / "secret.txt").write_bytes(secret)
    (root / "secret.txt").write_bytes(secret)
    (root / BUCKET / "link").symlink_to(tmp_path / "secret.txt")
    (root / BUCKET / "dirlink").symlink_to(tmp_path)
    attempts = [
        f"/{BUCKET}/../secret.txt",
        f"/{BUCKET}/../../secret.txt",
        f"/{BUCKET}/%2e%2e/%2E%2E/secret.txt",
        f"/{BUCKET}/data/../../../secret.txt",
        f"/{BUCKET}/./link",
        "/../secret.txt",
        "/..%2Fsecret.txt",
        f"/{BUCKET}//secret.txt",
        f"/{BUCKET}/%2Fsecret.txt",
        f"/{BUCKET}/link",
        f"/{BUCKET}/dirlink/secret.txt",
        f"/{BUCKET}/dirlink%2Fsecret.txt",
        f"/{BUCKET}/a%00b",
    ]
    conn = connect(server)
    for path in attempts:
        for method in ("GET", "HEAD"):
            resp, body = request(conn, method, path)
            assert resp.status in (400, 403), (method, path, resp.status)
            assert secret not in body
    resp, body = request(conn, "GET", "//secret.txt")  # http.server reads it as "/secret.txt": a bucket
    assert resp.status == 501 and secret not in body
    conn.close()

    for path in (f"/{BUCKET}/../evil.txt", f"/{BUCKET}/dirlink/evil.txt"):
        conn = connect(server)  # a refused upload's body is not read: the server closes the connection
        resp, _ = request(conn, "PUT", path, body=b"evil")
        assert resp.status in (400, 403), path
        conn.close()
    assert not (root / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()

    (root / "outside-bucket").symlink_to(tmp_path, target_is_directory=True)
    conn = connect(server)
    for method, path in [
        ("HEAD", "/outside-bucket"),
        ("GET", "/outside-bucket?list-type=2"),
        ("GET", "/outside-bucket/secret.txt"),
    ]:
        resp, body = request(conn, method, path)
        assert resp.status == 403 and secret not in body and b"<Contents>" not in body, (method, path)
    conn.close()

    conn = connect(server)  # a listing does not show symlinks leading out
    resp, body = request(conn, "GET", f"/{BUCKET}?list-type=2")
    assert resp.status == 200
    assert [e.text for e in ET.fromstring(body).iter(f"{NS}Key")] == []
    conn.close()


# ---- listings -----------------------------------------------------------------------------------


def test_list_prefix_through_store_and_s3fs(root, store):
    keys = ["a/1.bin", "a/2.bin", "a/sub/3.bin", "ab.bin", "b/4.bin", "sp ace+plus%.bin"]
    for key in keys:
        put_local(root, key, key.encode())
    (root / BUCKET / "data" / "empty-folder").mkdir()  # no object below it: not a prefix
    assert store.ls("a") == ["a/1.bin", "a/2.bin", "a/sub/3.bin"]
    assert store.ls("") == sorted(keys)
    assert store.ls("b") == ["b/4.bin"]
    assert store.ls("nothing") == []
    fs = store.filesystem
    fs.invalidate_cache()
    assert fs.ls(f"{BUCKET}/data", detail=False) == [
        f"{BUCKET}/data/{name}" for name in ("a", "ab.bin", "b", "sp ace+plus%.bin")
    ]
    entries = {e["name"]: e for e in fs.ls(f"{BUCKET}/data/a", detail=True)}
    assert entries[f"{BUCKET}/data/a/sub"]["type"] == "directory"
    assert entries[f"{BUCKET}/data/a/1.bin"]["size"] == len(b"a/1.bin")
    assert entries[f"{BUCKET}/data/a/1.bin"]["ETag"] == md5_etag(b"a/1.bin")
    assert fs.info(f"{BUCKET}/data/a")["type"] == "directory"
    assert store.cat("sp ace+plus%.bin") == b"sp ace+plus%.bin"


def test_list_pages_with_continuation_tokens(root, server):
    keys = [f"k/{i:03d}.bin" for i in range(7)] + ["k/d/x.bin", "k/e/y.bin"]
    for key in keys:
        put_local(root, key, b"x")
    conn = connect(server)
    seen, prefixes, token, pages = [], [], None, 0
    while True:
        query = "list-type=2&prefix=data%2Fk%2F&delimiter=%2F&max-keys=3"
        if token:
            query += "&continuation-token=" + token
        resp, body = request(conn, "GET", f"/{BUCKET}?{query}")
        assert resp.status == 200
        result = ET.fromstring(body)
        page = [e.text for e in result.iter(f"{NS}Key")]
        page_prefixes = [e.findtext(f"{NS}Prefix") for e in result.iter(f"{NS}CommonPrefixes")]
        assert int(result.findtext(f"{NS}KeyCount")) == len(page) + len(page_prefixes) <= 3
        seen += page
        prefixes += page_prefixes
        pages += 1
        if result.findtext(f"{NS}IsTruncated") == "false":
            break
        token = result.findtext(f"{NS}NextContinuationToken")
    assert seen == [f"data/k/{i:03d}.bin" for i in range(7)]
    assert prefixes == ["data/k/d/", "data/k/e/"]
    assert pages == 3
    resp, body = request(conn, "GET", f"/{BUCKET}?list-type=2&prefix=data%2Fk%2F&start-after=data%2Fk%2F005.bin")
    assert [e.text for e in ET.fromstring(body).iter(f"{NS}Key")] == [
        "data/k/006.bin",
        "data/k/d/x.bin",
        "data/k/e/y.bin",
    ]
    conn.close()


# ---- counters -----------------------------------------------------------------------------------


def test_counters_count_exactly_the_body_bytes_of_a_ranged_get(root, server, store):
    put_local(root, "blob.bin", DATA)
    store.info("blob.bin")
    server.reset_counters()
    assert store.cat("blob.bin", 1000, 1000 + 4321) == DATA[1000:5321]
    snap = server.counters.snapshot()
    assert snap["bytes_served"] == 4321
    assert snap["bytes_by_object"] == {f"{BUCKET}/data/blob.bin": 4321}
    assert snap["requests"] == {"GET": 1} and snap["operations"] == {"GetObject": 1}
    store.info("blob.bin")  # a HEAD serves no body bytes
    snap = server.counters.snapshot()
    assert snap["bytes_served"] == 4321 and snap["requests"] == {"GET": 1, "HEAD": 1}
    server.reset_counters()
    assert server.counters.snapshot()["bytes_served"] == 0 and server.counters.snapshot()["requests"] == {}


# ---- writes -------------------------------------------------------------------------------------


def test_put_then_get_through_store(root, server, store, tmp_path):
    store.put_bytes("up/small.bin", b"hello")
    assert (root / BUCKET / "data" / "up" / "small.bin").read_bytes() == b"hello"
    assert store.cat("up/small.bin") == b"hello"
    src = tmp_path / "src.bin"
    src.write_bytes(DATA * 3)
    store.put_file(src, "up/big.bin")
    assert store.cat("up/big.bin") == DATA * 3
    assert store.info("up/big.bin").version == "e" + hashlib.md5(DATA * 3).hexdigest()
    store.put_bytes("up/small.bin", b"replaced")
    assert store.cat("up/small.bin") == b"replaced"
    assert sorted(os.listdir(root / BUCKET / "data" / "up")) == ["big.bin", "small.bin"]  # no temp files left
    assert server.counters.snapshot()["bytes_received"] == 5 + len(DATA) * 3 + 8
    store.delete("up/small.bin")
    assert not store.exists("up/small.bin")

    # Store built from the URL alone: s3fs takes the (dummy) credentials from the environment.
    plain = Store.from_url(f"s3://{BUCKET}/data", endpoint_url=server.endpoint_url)
    plain.put_bytes("up/env.bin", b"env")
    assert plain.cat("up/env.bin") == b"env"


def test_raw_put_bodies_and_checksum(root, server):
    target = root / BUCKET / "raw.bin"
    conn = connect(server)
    resp, _ = request(conn, "PUT", f"/{BUCKET}/raw.bin", body=DATA)
    assert resp.status == 200 and resp.headers["ETag"] == md5_etag(DATA) and target.read_bytes() == DATA

    conn.putrequest("PUT", f"/{BUCKET}/raw.bin")  # Transfer-Encoding: chunked
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for piece in (b"abc", b"defgh", b""):
        conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200 and target.read_bytes() == b"abcdefgh"

    framed = b"5;chunk-signature=0\r\nhello\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"  # aws-chunked
    resp, _ = request(
        conn,
        "PUT",
        f"/{BUCKET}/raw.bin",
        body=framed,
        headers={"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": "5"},
    )
    assert resp.status == 200 and target.read_bytes() == b"hello"

    good = base64.b64encode(zlib.crc32(b"checked").to_bytes(4, "big")).decode()
    resp, _ = request(conn, "PUT", f"/{BUCKET}/raw.bin", body=b"checked", headers={"x-amz-checksum-crc32": good})
    assert resp.status == 200 and target.read_bytes() == b"checked"
    resp, body = request(conn, "PUT", f"/{BUCKET}/raw.bin", body=b"corrupt", headers={"x-amz-checksum-crc32": good})
    assert resp.status == 400 and b"BadDigest" in body
    assert target.read_bytes() == b"checked"
    assert sorted(os.listdir(root / BUCKET)) == ["raw.bin"]
    conn.close()


def test_multipart_upload_is_refused_clearly(server):
    conn = connect(server)
    resp, body = request(conn, "POST", f"/{BUCKET}/big.bin?uploads")
    assert resp.status == 501 and ET.fromstring(body).findtext("Code") == "NotImplemented"
    conn.close()


# ---- performance model --------------------------------------------------------------------------


class FakeClock:
    """A clock that only moves when slept on: sleeps are recorded, none takes time."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_latency_and_bandwidth_are_applied(root):
    put_local(root, "blob.bin", DATA)
    latency, bandwidth = 0.05, 1e6
    with ObjectServer(root, latency_s=latency, bandwidth_Bps=bandwidth) as server:
        clock = FakeClock()
        server.clock, server.sleep = clock, clock.sleep
        conn = connect(server)

        resp, body = request(conn, "GET", f"/{BUCKET}/data/blob.bin")
        assert body == DATA
        assert clock.sleeps[0] == pytest.approx(latency)
        assert len(clock.sleeps) == 1 + math.ceil(len(DATA) / BLOCK)  # one wait per 256 KiB block
        assert sum(clock.sleeps) == pytest.approx(latency + len(DATA) / bandwidth)

        clock.sleeps.clear()
        resp, body = request(conn, "GET", f"/{BUCKET}/data/blob.bin", headers={"Range": "bytes=10-100009"})
        assert resp.status == 206 and body == DATA[10:100010]
        assert sum(clock.sleeps) == pytest.approx(latency + 100000 / bandwidth)

        clock.sleeps.clear()
        request(conn, "HEAD", f"/{BUCKET}/data/blob.bin")
        request(conn, "GET", f"/{BUCKET}/data/missing")
        assert clock.sleeps == pytest.approx([latency, latency])  # every request waits for its first byte
        conn.close()

    with ObjectServer(root, latency_s=0, bandwidth_Bps=None) as server:
        clock = FakeClock()
        server.clock, server.sleep = clock, clock.sleep
        conn = connect(server)
        assert request(conn, "GET", f"/{BUCKET}/data/blob.bin")[1] == DATA
        assert clock.sleeps == []
        conn.close()


def test_defaults_and_endpoint(root):
    with ObjectServer(root) as server:
        assert server.latency_s == 0.02 and server.bandwidth_Bps == 200e6
        assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
    with pytest.raises(ValueError):
        ObjectServer(root, bandwidth_Bps=0)


def test_python_m_benchmarks_does_not_offer_the_server(capsys):
    from benchmarks.__main__ import main

    assert main([]) == 2
    usage = capsys.readouterr().err
    assert "storage" in usage and "object_server" not in usage
    assert main(["object_server"]) == 2
