"""A loopback S3-compatible object server for benchmarks: a local folder served with the latency
and the per-connection bandwidth of a cloud object store.

    with ObjectServer(root, latency_s=0.02, bandwidth_Bps=200e6) as server:  # 127.0.0.1, free port
        store = Store.from_url("s3://bucket/prefix", endpoint_url=server.endpoint_url)
        store.cat("key", 0, 4 << 20)
        server.counters.snapshot()  # requests, body bytes served, per object

    python -m benchmarks.object_server ROOT [--port 9000] [--latency-ms 20] [--bandwidth-MBps 200]

A helper for benchmarks, not a benchmark itself (``python -m benchmarks`` does not list it).

Layout: each folder directly under ``root`` is a bucket, and ``/<bucket>/<key>`` is the file
``<root>/<bucket>/<key>``; folders are not objects. Path-style addressing only (what botocore uses
for an IP endpoint). A key that resolves outside ``root`` (``..``/``.``/empty segments: 400; a
symlink leading out: 403) is refused. No authentication: any credentials, or none, are accepted
and signatures are not checked.

Operations (enough for s3fs/botocore reads and small writes):

- HeadBucket, CreateBucket (a folder), ListObjectsV2 (prefix, delimiter, max-keys,
  continuation-token, start-after, encoding-type=url);
- HeadObject, GetObject (one range: ``bytes=a-b``, ``bytes=a-``, ``bytes=-n`` -> 206, or 416 when
  unsatisfiable; If-Match -> 412, If-None-Match -> 304), DeleteObject;
- PutObject: streamed to a hidden temp file next to the target and renamed onto it, so a reader
  sees the old object or the whole new one (plain, chunked and aws-chunked bodies; a CRC32
  checksum header, which botocore sends, is verified).

Multipart upload is not supported (501 NotImplemented). s3fs uses it for ``put_file``/``pipe_file``
of 100 MiB or more and for files written through ``open("wb")`` beyond the block size (50 MiB):
write large objects into the folder directly instead.

ETag: the quoted md5 hex of the content, computed on first use (HEAD, GET, a listing or the PUT
itself) and cached per (path, inode, mtime_ns, size). The first request that needs the ETag of a
large object reads it whole, so touch objects once (``Store.info``) before timing.

Performance model, per request (configurable; ``latency_s=0`` / ``bandwidth_Bps=None`` turn a
part off):

- ``latency_s`` (default 0.02 s): time to first byte. Every response's status line leaves no
  earlier than ``latency_s`` after the request was read (after its body, for a PUT); work the
  server does meanwhile (stat, listing, md5) is absorbed into that time.
- ``bandwidth_Bps`` (default 200e6, the published single-reader figure of a cloud object store):
  object bodies are sent in 256 KiB blocks, each no earlier than ``start + bytes_through_it /
  bandwidth_Bps``, so the bytes sent since the body began never exceed ``bandwidth_Bps * elapsed``.
  The clock starts at the body's first byte, per request; requests on one keep-alive connection
  are sequential, so this is also the connection's bandwidth. Error and XML bodies are not throttled.

So a ranged GET of ``n`` bytes costs at least ``latency_s + n / bandwidth_Bps`` (4 MiB: 20 ms +
21 ms, about 102 MB/s for one reader issuing them one after another).

Counters (thread-safe, ``counters.snapshot()``, ``reset_counters()``): requests by HTTP method and
by S3 operation, object body bytes served (GET bodies only, as sent), the same per
``bucket/key``, and request body bytes received by PutObject.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import socket
import stat
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from datetime import UTC, datetime
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import parse_qs, quote, unquote
from xml.sax.saxutils import escape

BLOCK = 256 << 10  # throttled body block
FAST_BLOCK = 1 << 20  # body block when unthrottled
_TMP_MARKER = ".objsrv-tmp-"  # temp files of PUTs in flight; never listed
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"


class S3Error(Exception):
    """An S3 error response: HTTP status, S3 error code, message."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None, **fields: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.fields = status, code, message, fields
        self.headers = headers or {}


class RangeNotSatisfiable(Exception):
    pass


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(first, last)`` byte (inclusive) that a ``Range`` header selects from ``size`` bytes; ``None``
    (serve the whole object) for no header, a malformed one or several ranges, as S3 does;
    ``RangeNotSatisfiable`` when the range starts at or past the end."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header or "")
    if not m or not (m[1] or m[2]):
        return None
    if m[1]:
        first, last = int(m[1]), int(m[2]) if m[2] else size - 1
        if last < first and m[2]:  # malformed
            return None
        if first >= size:
            raise RangeNotSatisfiable
        return first, min(last, size - 1)
    suffix = int(m[2])
    if suffix == 0 or size == 0:
        raise RangeNotSatisfiable
    return max(0, size - suffix), size - 1


class Counters:
    """Request and byte counts; every update and ``snapshot()`` holds one lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests: Counter[str] = Counter()  # by HTTP method
            self.operations: Counter[str] = Counter()  # by S3 operation
            self.bytes_served = 0  # object body bytes sent by GetObject
            self.bytes_by_object: Counter[str] = Counter()  # the same per "bucket/key"
            self.bytes_received = 0  # object bytes stored by PutObject

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "operations": dict(self.operations),
                "bytes_served": self.bytes_served,
                "bytes_by_object": dict(self.bytes_by_object),
                "bytes_received": self.bytes_received,
            }

    def _request(self, method: str, operation: str) -> None:
        with self._lock:
            self.requests[method] += 1
            self.operations[operation] += 1

    def _served(self, name: str, n: int) -> None:
        with self._lock:
            self.bytes_served += n
            self.bytes_by_object[name] += n

    def _received(self, n: int) -> None:
        with self._lock:
            self.bytes_received += n


class ObjectServer:
    """Serves ``root`` over S3's HTTP API on ``host`` (default 127.0.0.1), ``port`` 0: a free one.

    Starts at once, in a daemon thread; ``stop()`` (or leaving the ``with`` block) shuts it down
    and closes open keep-alive connections. ``clock`` and ``sleep`` drive the performance model;
    a test may replace them on the instance."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        latency_s: float = 0.02,
        bandwidth_Bps: float | None = 200e6,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        if latency_s < 0:
            raise ValueError("latency_s must be >= 0")
        if bandwidth_Bps is not None and bandwidth_Bps <= 0:
            raise ValueError("bandwidth_Bps must be > 0, or None for no throttle")
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise NotADirectoryError(self.root)
        self.latency_s = latency_s
        self.bandwidth_Bps = bandwidth_Bps
        self.counters = Counters()
        self.clock = time.monotonic
        self.sleep = time.sleep
        self._etags: dict[str, tuple[tuple[int, int, int], str]] = {}
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.object_server = self
        self._thread: threading.Thread | None = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"object-server-{self.port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def endpoint_url(self) -> str:
        host = self._httpd.server_address[0]
        assert isinstance(host, str)  # an AF_INET server: typeshed allows bytes for AF_UNIX ones
        return f"http://{host}:{self.port}"

    def reset_counters(self) -> None:
        self.counters.reset()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._httpd.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # idle keep-alive handlers would otherwise wait for their clients
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        self._thread.join()
        self._thread = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ObjectServer({self.root!r}, endpoint_url={self.endpoint_url!r})"

    # ---- addressing and ETags -----------------------------------------------------------------
    def bucket_dir(self, bucket: str) -> str:
        if not _BUCKET.fullmatch(bucket) or bucket in (".", ".."):
            raise S3Error(400, "InvalidBucketName", "The specified bucket is not valid.", BucketName=bucket)
        return os.path.join(self.root, bucket)

    def object_path(self, bucket: str, key: str) -> str:
        """The file of ``key`` (a trailing ``/``, a folder marker, names no file: it never exists)."""
        parts = key[:-1].split("/") if key.endswith("/") else key.split("/")
        if not key or "\0" in key or any(p in ("", ".", "..") for p in parts):
            raise S3Error(400, "InvalidArgument", "Keys with empty, '.' or '..' segments are refused.", Key=key)
        path = os.path.join(self.bucket_dir(bucket), *parts)
        if not self._inside(path):
            raise S3Error(403, "AccessDenied", "The key resolves outside the served folder.", Key=key)
        return path

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real.startswith(self.root + os.sep) and real != self.root

    def etag(self, path: str, fd: int, st: os.stat_result) -> str:
        """The quoted md5 of the open file ``fd`` (``st``: its fstat), cached per version."""
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._etags.get(path)
        if cached and cached[0] == version:
            return cached[1]
        md5 = hashlib.md5(usedforsecurity=False)
        buf = bytearray(FAST_BLOCK)
        view = memoryview(buf)
        offset = 0
        while n := os.preadv(fd, [buf], offset):
            md5.update(view[:n])
            offset += n
        etag = f'"{md5.hexdigest()}"'
        self._remember(path, st, etag)
        return etag

    def _remember(self, path: str, st: os.stat_result, etag: str) -> None:
        with self._lock:
            self._etags[path] = ((st.st_ino, st.st_mtime_ns, st.st_size), etag)

    # ---- listing ------------------------------------------------------------------------------
    def _objects(self, folder: str, base: str):
        """``(key, path)`` of every object below ``folder``, keys starting with ``base``; unordered.
        Symlinked folders are not followed; symlinked files are, when they stay inside root."""
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        for e in entries:
            if _TMP_MARKER in e.name:
                continue
            if e.is_dir(follow_symlinks=False):
                yield from self._objects(e.path, f"{base}{e.name}/")
            elif e.is_file() and (not e.is_symlink() or self._inside(e.path)):
                yield base + e.name, e.path

    def list_entries(self, bucket_dir: str, prefix: str, delimiter: str) -> list[tuple[str, str | None]]:
        """Sorted ``(key, path)`` of the objects under ``prefix`` and ``(common_prefix, None)``."""
        head = prefix.rpartition("/")[0]
        parts = head.split("/") if head else []
        folder = os.path.join(bucket_dir, *parts)
        if "\0" in prefix or any(p in ("", ".", "..") for p in parts) or not self._inside(folder):
            return []
        base = f"{head}/" if head else ""
        keys: list[tuple[str, str | None]] = []
        prefixes: set[str] = set()

        def add(key: str, path: str) -> None:
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                prefixes.add(key[: cut + len(delimiter)])
            else:
                keys.append((key, path))

        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        for e in entries:
            name = base + e.name
            if not name.startswith(prefix) or _TMP_MARKER in e.name:
                continue
            if e.is_dir(follow_symlinks=False):
                if delimiter == "/":  # one object below it makes it a common prefix: stop at the first
                    if next(self._objects(e.path, name + "/"), None):
                        prefixes.add(name + "/")
                else:
                    for key, path in self._objects(e.path, name + "/"):
                        add(key, path)
            elif e.is_file() and (not e.is_symlink() or self._inside(e.path)):
                add(name, e.path)
        return sorted(keys + [(p, None) for p in prefixes])


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    object_server: ObjectServer

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is no error
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    server_version = "dyna-object-server"
    sys_version = ""
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    timeout = 300  # an idle keep-alive connection is closed after this
    server: _HTTPServer

    def setup(self):
        super().setup()
        srv = self.server.object_server
        with srv._lock:
            srv._connections.add(self.connection)

    def finish(self):
        srv = self.server.object_server
        with srv._lock:
            srv._connections.discard(self.connection)
        super().finish()

    def log_message(self, format, *args):
        pass

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_GET(self):
        self._dispatch("GET")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_POST(self):
        self._dispatch("POST")

    # ---- routing ------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        self.srv = self.server.object_server
        self.t0 = self.srv.clock()
        self.started = False
        self.request_id = uuid.uuid4().hex[:16].upper()
        self.body_pending = method in ("PUT", "POST") and bool(
            self.headers.get("Content-Length", "0") != "0" or self.headers.get("Transfer-Encoding")
        )
        target, _, query = self.path.partition("?")  # not urlsplit: it reads "//x/..." as a host
        self.query = parse_qs(query, keep_blank_values=True)
        path = unquote(target)
        bucket, _, key = path[1:].partition("/") if path.startswith("/") else ("", "", "")
        self.bucket, self.key = bucket, key
        operation, handler = self._route(method, bool(key))
        self.srv.counters._request(method, operation)
        try:
            if handler is None:
                raise S3Error(501, "NotImplemented", f"{method} {self.path} is not supported by this server.")
            handler()
        except S3Error as e:
            self._error(e)
        except (FileNotFoundError, NotADirectoryError):
            self._error(S3Error(404, "NoSuchKey", "The specified key does not exist.", Key=key))
        except ConnectionError:
            self.close_connection = True
        except Exception as e:  # a bug or an unreadable file: answer 500, then let http.server log it
            if not self.started:
                self.body_pending = True  # closes the connection
                self._error(S3Error(500, "InternalError", f"{type(e).__name__}: {e}"))
            raise

    def _route(self, method: str, has_key: bool):
        q = self.query
        if not has_key:
            if method == "HEAD":
                return "HeadBucket", self._head_bucket
            if method == "GET" and q.get("list-type") == ["2"]:
                return "ListObjectsV2", self._list_objects_v2
            if method == "PUT" and not set(q) - {"x-id"}:
                return "CreateBucket", self._create_bucket
            return f"Unsupported{method}Bucket", None
        if set(q) - {"x-id", "versionId"}:  # uploads, uploadId, partNumber, acl, tagging, ...
            return f"Unsupported{method}Object", None
        return {
            "HEAD": ("HeadObject", self._get_object),
            "GET": ("GetObject", self._get_object),
            "PUT": ("PutObject", self._put_object),
            "DELETE": ("DeleteObject", self._delete_object),
        }.get(method, (f"Unsupported{method}Object", None))

    # ---- responses ----------------------------------------------------------------------------
    def _wait_first_byte(self) -> None:
        delay = self.t0 + self.srv.latency_s - self.srv.clock()
        if delay > 0:
            self.srv.sleep(delay)

    def _start(self, status: int, headers: dict[str, str | int]) -> None:
        """Waits out the latency, then sends the status line and headers."""
        self._wait_first_byte()
        self.started = True
        self.send_response(status)
        self.send_header("x-amz-request-id", self.request_id)
        for name, value in headers.items():
            self.send_header(name, str(value))
        if self.body_pending:  # a request body we did not read: the connection cannot be reused
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self._start(status, {**(headers or {}), "Content-Type": "application/xml", "Content-Length": len(body)})
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, e: S3Error) -> None:
        fields = {"Resource": self.path.split("?", 1)[0], "RequestId": self.request_id, **e.fields}
        xml = "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in fields.items())
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{e.code}</Code>'
            f"<Message>{escape(e.message)}</Message>{xml}</Error>"
        ).encode()
        self._send(e.status, body, e.headers)

    # ---- buckets ------------------------------------------------------------------------------
    def _existing_bucket(self) -> str:
        folder = self.srv.bucket_dir(self.bucket)
        if not self.srv._inside(folder):
            raise S3Error(403, "AccessDenied", "The bucket resolves outside the served folder.", BucketName=self.bucket)
        if not os.path.isdir(folder):
            raise S3Error(404, "NoSuchBucket", "The specified bucket does not exist.", BucketName=self.bucket)
        return folder

    def _head_bucket(self) -> None:
        self._existing_bucket()
        self._send(200)

    def _create_bucket(self) -> None:
        self._read_body(None)  # an optional CreateBucketConfiguration
        os.makedirs(self.srv.bucket_dir(self.bucket), exist_ok=True)
        self._start(200, {"Location": f"/{self.bucket}", "Content-Length": 0})

    def _list_objects_v2(self) -> None:
        folder = self._existing_bucket()
        arg = {name: values[0] for name, values in self.query.items()}
        prefix, delimiter = arg.get("prefix", ""), arg.get("delimiter", "")
        try:
            max_keys = min(int(arg.get("max-keys", 1000)), 1000)
            token = arg.get("continuation-token")
            after = base64.urlsafe_b64decode(token.encode()).decode() if token is not None else ""
        except ValueError:
            raise S3Error(400, "InvalidArgument", "Invalid max-keys or continuation-token.") from None
        if max_keys < 0:
            raise S3Error(400, "InvalidArgument", "max-keys must be >= 0.")
        after = max(after, arg.get("start-after", ""))
        entries = [e for e in self.srv.list_entries(folder, prefix, delimiter) if e[0] > after]
        page, truncated = entries[:max_keys], len(entries) > max_keys
        url = arg.get("encoding-type") == "url"

        def text(tag: str, value: str, *, encode: bool = False) -> str:
            return f"<{tag}>{escape(quote(value, safe='/') if encode and url else value)}</{tag}>"

        out = [
            f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_XMLNS}">',
            text("Name", self.bucket),
            text("Prefix", prefix, encode=True),
        ]
        if delimiter:
            out.append(text("Delimiter", delimiter, encode=True))
        out += [
            text("MaxKeys", str(max_keys)),
            text("KeyCount", str(len(page))),
            text("IsTruncated", "true" if truncated and page else "false"),
        ]
        if url:
            out.append(text("EncodingType", "url"))
        if token is not None:
            out.append(text("ContinuationToken", token))
        if truncated and page:
            out.append(text("NextContinuationToken", base64.urlsafe_b64encode(page[-1][0].encode()).decode()))
        if "start-after" in arg:
            out.append(text("StartAfter", arg["start-after"], encode=True))
        for name, path in page:
            if path is None:
                out.append(f"<CommonPrefixes>{text('Prefix', name, encode=True)}</CommonPrefixes>")
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:  # removed since the scan
                continue
            try:
                st = os.fstat(fd)
                etag = self.srv.etag(os.path.realpath(path), fd, st)
            finally:
                os.close(fd)
            modified = datetime.fromtimestamp(st.st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
            out.append(
                f"<Contents>{text('Key', name, encode=True)}<LastModified>{modified}Z</LastModified>"
                f"{text('ETag', etag)}<Size>{st.st_size}</Size><StorageClass>STANDARD</StorageClass>"
                "</Contents>"
            )
        out.append("</ListBucketResult>")
        self._send(200, "".join(out).encode())

    # ---- objects ------------------------------------------------------------------------------
    def _no_such_key(self) -> S3Error:
        return S3Error(404, "NoSuchKey", "The specified key does not exist.", Key=self.key)

    def _get_object(self) -> None:
        path = self.srv.object_path(self.bucket, self.key)
        self._existing_bucket()
        if self.key.endswith("/"):
            raise self._no_such_key()
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise self._no_such_key() from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._no_such_key()
            self._serve(fd, st, os.path.realpath(path))
        finally:
            os.close(fd)

    def _serve(self, fd: int, st: os.stat_result, real: str) -> None:
        size = st.st_size
        etag = self.srv.etag(real, fd, st)
        headers = {
            "ETag": etag,
            "Last-Modified": formatdate(st.st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
            "Content-Type": "binary/octet-stream",
        }
        if_match, if_none_match = self.headers.get("If-Match"), self.headers.get("If-None-Match")
        if if_match and not _etag_matches(if_match, etag):
            raise S3Error(
                412,
                "PreconditionFailed",
                "At least one of the preconditions you specified did not hold.",
                Condition="If-Match",
            )
        if if_none_match and _etag_matches(if_none_match, etag):
            self._start(304, {**headers, "Content-Length": 0})
            return
        try:
            byte_range = parse_range(self.headers.get("Range"), size)
        except RangeNotSatisfiable:
            raise S3Error(
                416,
                "InvalidRange",
                "The requested range is not satisfiable.",
                headers={"Content-Range": f"bytes */{size}"},
                RangeRequested=self.headers.get("Range", ""),
                ActualObjectSize=str(size),
            ) from None
        if byte_range is None:
            first, length, status = 0, size, 200
        else:
            first, length, status = byte_range[0], byte_range[1] - byte_range[0] + 1, 206
            headers["Content-Range"] = f"bytes {byte_range[0]}-{byte_range[1]}/{size}"
        self._start(status, {**headers, "Content-Length": length})
        if self.command == "GET":
            self._send_body(fd, first, length)

    def _send_body(self, fd: int, offset: int, length: int) -> None:
        """``length`` bytes of ``fd`` from ``offset``, throttled to ``bandwidth_Bps`` (see the module doc)."""
        srv, name = self.srv, f"{self.bucket}/{self.key}"
        bandwidth = srv.bandwidth_Bps
        buf = bytearray(min(BLOCK if bandwidth else FAST_BLOCK, max(length, 1)))
        view = memoryview(buf)
        start, sent = srv.clock(), 0
        while sent < length:
            n = os.preadv(fd, [view[: min(len(buf), length - sent)]], offset + sent)
            if n <= 0:  # the file shrank under us: Content-Length cannot be kept
                self.close_connection = True
                return
            if bandwidth:
                delay = start + (sent + n) / bandwidth - srv.clock()
                if delay > 0:
                    srv.sleep(delay)
            srv.counters._served(name, n)  # before the write: a client that has the bytes sees them counted
            try:
                self.wfile.write(view[:n])
            except BaseException:
                srv.counters._served(name, -n)
                raise
            sent += n

    def _put_object(self) -> None:
        path = self.srv.object_path(self.bucket, self.key)
        self._existing_bucket()
        if self.key.endswith("/"):
            raise S3Error(
                400, "InvalidArgument", "Folder markers (keys ending in '/') are not supported.", Key=self.key
            )
        folder, name = os.path.split(path)
        try:
            os.makedirs(folder, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise S3Error(
                409, "KeyConflict", "A parent of this key is an object here (a file).", Key=self.key
            ) from None
        if os.path.isdir(path):
            raise S3Error(409, "KeyConflict", "This key is a prefix of other objects here (a folder).", Key=self.key)
        tmp = os.path.join(folder, f".{name}{_TMP_MARKER}{uuid.uuid4().hex}")
        md5, crc = hashlib.md5(usedforsecurity=False), 0
        try:
            with open(tmp, "xb") as f:

                def sink(chunk: bytes) -> None:
                    nonlocal crc
                    f.write(chunk)
                    md5.update(chunk)
                    crc = zlib.crc32(chunk, crc)

                self._read_body(sink)
                f.flush()
                st = os.fstat(f.fileno())
            expected = self.headers.get("x-amz-checksum-crc32")  # botocore sends it with every PutObject
            if expected and expected != base64.b64encode(crc.to_bytes(4, "big")).decode():
                raise S3Error(400, "BadDigest", "The CRC32 you specified did not match the calculated checksum.")
            etag = f'"{md5.hexdigest()}"'
            os.replace(tmp, path)  # keeps inode and mtime: the cached ETag stays valid
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.srv._remember(os.path.realpath(path), st, etag)
        self.srv.counters._received(st.st_size)
        self.t0 = self.srv.clock()  # time to first byte counts from the end of the upload
        self._start(200, {"ETag": etag, "Content-Length": 0})

    def _delete_object(self) -> None:
        path = self.srv.object_path(self.bucket, self.key)
        self._existing_bucket()
        if not self.key.endswith("/"):
            try:
                if stat.S_ISREG(os.lstat(path).st_mode) or os.path.islink(path):
                    os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                pass
        self._start(204, {})

    # ---- request bodies -----------------------------------------------------------------------
    def _read_body(self, sink) -> None:
        """Feeds the request body to ``sink`` (``None``: discard): Content-Length framed or chunked,
        with botocore's aws-chunked encoding (checksum trailers) removed."""
        te = self.headers.get("Transfer-Encoding", "").lower()
        aws_chunked = "aws-chunked" in self.headers.get("Content-Encoding", "").lower()
        if te and te != "chunked" or te and aws_chunked:
            raise S3Error(501, "NotImplemented", f"Transfer-Encoding {te!r} is not supported here.")
        if te:
            chunks = _dechunk(self.rfile)
        else:
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                raise S3Error(400, "InvalidArgument", "Invalid Content-Length.") from None
            body = _Limited(self.rfile, length)
            chunks = _dechunk(body) if aws_chunked else body.chunks()
        for chunk in chunks:
            if sink is not None:
                sink(chunk)
        self.body_pending = False


def _etag_matches(header: str, etag: str) -> bool:
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or etag in tags or etag.strip('"') in tags


class _Limited:
    """The next ``length`` bytes of ``stream``; a short body raises ``ConnectionError``."""

    def __init__(self, stream, length: int):
        self.stream, self.left = stream, length

    def read(self, n: int) -> bytes:
        data = self.stream.read(min(n, self.left)) if self.left else b""
        if n and self.left and not data:
            raise ConnectionError("request body ended early")
        self.left -= len(data)
        return data

    def readline(self, limit: int = 65537) -> bytes:
        line = self.stream.readline(min(limit, self.left)) if self.left else b""
        self.left -= len(line)
        return line

    def chunks(self):
        while self.left:
            yield self.read(FAST_BLOCK)


def _dechunk(stream):
    """The payload of a chunked body (``<hex size>[;ext]\\r\\n<data>\\r\\n`` ... ``0\\r\\n<trailers>\\r\\n``)."""
    while True:
        line = stream.readline(65537)
        if not line:
            raise ConnectionError("chunked body ended early")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise S3Error(400, "IncompleteBody", "Malformed chunked body.") from None
        if size == 0:
            while stream.readline(65537) not in (b"\r\n", b"\n", b""):  # trailers: checksums we do not check
                pass
            return
        while size:
            data = stream.read(min(size, FAST_BLOCK))
            if not data:
                raise ConnectionError("chunked body ended early")
            size -= len(data)
            yield data
        stream.readline(65537)


def main(argv: list[str] | None = None) -> int:
    # its flags look like encode.py's main() (argparse declarations); each command line its own
    parser = argparse.ArgumentParser(prog="python -m benchmarks.object_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="folder to serve: each subfolder is a bucket")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (default)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="time to first byte (default 20)")
    parser.add_argument(
        "--bandwidth-MBps",
        type=float,
        default=200.0,
        help="per-connection bandwidth, 1 MB = 1e6 bytes; 0: unthrottled (default 200)",
    )
    args = parser.parse_args(argv)
    server = ObjectServer(
        args.root,
        latency_s=args.latency_ms / 1000,
        host=args.host,
        port=args.port,
        bandwidth_Bps=args.bandwidth_MBps * 1e6 if args.bandwidth_MBps > 0 else None,
    )
    print(f"serving {server.root} at {server.endpoint_url} (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        print(server.counters.snapshot())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
