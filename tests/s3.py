"""Fixtures for tests against a real S3 API: a ``moto`` server on 127.0.0.1.

``s3_server`` starts ``moto.server.ThreadedMotoServer`` once per test session (per xdist
worker), in memory, on a free port, and creates one bucket. ``s3`` hands a test an
``s3fs`` filesystem configured for it (static test credentials, the server's endpoint)
plus the bucket name and endpoint. ``s3_unreachable_endpoint`` is a closed port on
127.0.0.1: every request to it is refused.

moto answers CreateBucket with InvalidLocationConstraint when s3fs's ``mkdir`` sends a
location constraint, so the bucket is created with a plain ``create_bucket`` call.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

import pytest
import s3fs

BUCKET = "dyna-test-s3"
KEY, SECRET, REGION = "testing", "testing", "us-east-1"


@dataclass
class S3:
    fs: s3fs.S3FileSystem
    bucket: str
    endpoint: str

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key.lstrip('/')}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on leaving the block


@pytest.fixture(scope="session")
def s3_server():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    fs = s3fs.S3FileSystem(
        key=KEY,
        secret=SECRET,
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": endpoint, "region_name": REGION},
    )
    fs.call_s3("create_bucket", Bucket=BUCKET)
    try:
        yield S3(fs=fs, bucket=BUCKET, endpoint=endpoint)
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server):
    """An s3fs filesystem on the moto server (static test credentials), its bucket and endpoint."""
    s3_server.fs.invalidate_cache()
    return s3_server


@pytest.fixture
def s3_unreachable_endpoint() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens."""
    return f"http://127.0.0.1:{_free_port()}"
