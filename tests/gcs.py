"""Fixtures for tests against a real GCS API: ``gcp-storage-emulator`` on 127.0.0.1.

``gcs_emulator`` starts the emulator once per test session (per xdist worker), in memory,
on a free port, with one bucket, and records every HTTP request it serves so a test can
count, e.g., the range GETs that hit one object. ``gcs`` hands a test a ``gcsfs``
filesystem configured for it (anonymous, the emulator's endpoint) plus the bucket name.
``gcs_unreachable`` is a gcsfs filesystem aimed at a closed port that fails at once.

Environment: ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` must be set before gcsfs is
imported (otherwise gcsfs asks a storage-control API the emulator lacks about every
bucket, and waits ~60 s each time); ``STORAGE_EMULATOR_HOST`` is set for the session so
google-cloud-storage clients and default gcsfs instances find the emulator too.
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # must precede `import gcsfs`

import re
import socket
import sys
import threading
from dataclasses import dataclass
from functools import partial
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import gcsfs
import gcsfs.core
import pytest
from gcp_storage_emulator import server as emulator
from gcsfs.retry import retry_request

BUCKET = "dyna-test"

# /download/storage/v1/b/B/o/O (media), /storage/v1/b/B/o/O (metadata, or media with alt=media)
_OBJECT_PATH = re.compile(r"^(?P<download>/download)?(?:/storage/v1)?/b/(?P<bucket>[-.\w]+)/o/(?P<object>.+)$")


@dataclass(frozen=True)
class Hit:
    """One HTTP request the emulator served."""

    method: str
    object: str | None  # "bucket/key" for object requests, else None
    media: bool  # a download of the object's bytes (as opposed to its metadata)
    range: str | None  # the Range header, e.g. "bytes=0-1048575"


class _CountingServer(ThreadingHTTPServer):
    daemon_threads = True  # parallel range GETs are served in parallel, as by the real thing
    request_queue_size = 64

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.hits: list[Hit] = []
        self.hits_lock = threading.Lock()

    def record(self, method: str, raw_path: str, range_header: str | None) -> None:
        parts = urlsplit(raw_path)
        m = _OBJECT_PATH.match(parts.path)
        media = bool(m and (m["download"] or parse_qs(parts.query).get("alt") == ["media"]))
        obj = f"{m['bucket']}/{unquote(m['object'])}" if m else None
        with self.hits_lock:
            self.hits.append(Hit(method, obj, media, range_header))

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # a client gone: no news
            super().handle_error(request, client_address)


class _CountingHandler(emulator.RequestHandler):
    def do_GET(self):
        self.server.record("GET", self.path, self.headers.get("Range"))
        super().do_GET()


class _CountingAPIThread(emulator.APIThread):
    """The emulator's server thread, on a threading HTTP server that records requests.

    Binds port 0 at construction (a free port, no race between choosing and binding)."""

    def __init__(self, storage):
        super().__init__("127.0.0.1", 0, storage, daemon=True)
        self._httpd = _CountingServer(("127.0.0.1", 0), partial(_CountingHandler, storage))
        self.port = self._httpd.server_address[1]

    def run(self):
        self.is_running.set()
        self._httpd.serve_forever()


@dataclass
class GcsEmulator:
    endpoint: str
    bucket: str
    _server: _CountingServer

    def hits(self) -> list[Hit]:
        with self._server.hits_lock:
            return list(self._server.hits)

    def media_gets(self, path: str) -> list[str | None]:
        """Range headers of the downloads of ``path`` ("bucket/key" or "gs://bucket/key"), in arrival order."""
        key = path.removeprefix("gs://")
        return [h.range for h in self.hits() if h.object == key and h.media and h.method == "GET"]

    def clear(self) -> None:
        with self._server.hits_lock:
            self._server.hits.clear()


@dataclass
class Gcs:
    fs: gcsfs.GCSFileSystem
    bucket: str
    emulator: GcsEmulator

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key.lstrip('/')}"


@pytest.fixture(scope="session")
def gcs_emulator():
    if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
        pytest.fail(
            "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set "
            "(import tests.gcs earlier): its experimental client hangs on the emulator"
        )
    srv = emulator.create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
    # Private attributes of gcp-storage-emulator's Server: swap in the recording server thread.
    api = srv._api = _CountingAPIThread(srv._storage)
    srv.start()
    endpoint = f"http://127.0.0.1:{api.port}"
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("STORAGE_EMULATOR_HOST", endpoint)
            yield GcsEmulator(endpoint=endpoint, bucket=BUCKET, _server=api._httpd)
    finally:
        srv.stop()


@pytest.fixture
def gcs(gcs_emulator):
    """A gcsfs filesystem on the emulator (anonymous), its bucket, and the emulator's request log."""
    fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=gcs_emulator.endpoint, project="test")
    fs.invalidate_cache()
    return Gcs(fs=fs, bucket=gcs_emulator.bucket, emulator=gcs_emulator)


class _OneAttemptGCSFileSystem(gcsfs.core.GCSFileSystem):
    """gcsfs with one attempt per request: it otherwise retries a refused connection 6 times
    with exponential backoff (~30 s) before raising."""

    _request = retry_request(retries=1)(gcsfs.core.GCSFileSystem._request.__wrapped__)


@pytest.fixture
def gcs_unreachable():
    """A gcsfs filesystem whose endpoint is a closed port on 127.0.0.1: every request is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on leaving the block: nothing listens there
    return _OneAttemptGCSFileSystem(
        token="anon", endpoint_url=f"http://127.0.0.1:{port}", project="test", skip_instance_cache=True
    )
