"""The Alluxio front without an Alluxio cluster: configuration, reads that fall back to the origin
(no worker listening, a worker that accepts connections and never answers, a worker that answers
metadata but serves no data), load jobs against an unreachable cluster and against a fake worker
speaking the REST calls alluxiofs 1.1.17 makes (/v1/node, /v1/load). alluxiofs itself is real: it
is a dev dependency, so these tests run it rather than skip."""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import pytest

from dyna_resources.storage.alluxio import (
    AlluxioConfig,
    AlluxioConfigError,
    AlluxioFront,
    AlluxioNotInstalledError,
    AlluxioUnreachableError,
    parse_worker_hosts,
)
from dyna_resources.storage.stores import StoreUnavailableError

DATA = os.urandom(3 * 1024 * 1024 + 12345)  # spans several 1 MiB read-ahead blocks
FAST = {"probe_timeout_s": 0.2, "request_timeout_s": 1.0, "retry_after_s": 60.0, "poll_interval_s": 0.05}


def closed_port() -> int:
    """A loopback port nobody listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def origin(tmp_path):
    root = tmp_path / "origin"
    (root / "episodes").mkdir(parents=True)
    (root / "episodes" / "ep-1.mcap").write_bytes(DATA)
    (root / "episodes" / "ep-2.mcap").write_bytes(DATA[::-1][:5000])
    return root


def within(seconds: float, fn, *args):
    """``fn(*args)``, failing the test (not hanging it) if it has not returned after ``seconds``."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} still blocked after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def count_probes(front: AlluxioFront) -> list[int]:
    """A one-item list holding how many times ``front`` probes its workers from now on."""
    calls, probe = [0], front._probe

    def counted():
        calls[0] += 1
        return probe()

    front._probe = counted
    return calls


def front_at(origin, port: int, **overrides) -> AlluxioFront:
    return AlluxioFront(AlluxioConfig(worker_hosts=f"127.0.0.1:{port}", origin=str(origin), **{**FAST, **overrides}))


# ---- configuration ------------------------------------------------------------------------------
def test_worker_hosts_are_normalized_with_explicit_ports():
    assert parse_worker_hosts(" w1:19999, w2 ,w1:19999,10.0.0.7:28080", 28080) == (
        "w1:19999",
        "w2:28080",
        "10.0.0.7:28080",
    )
    cfg = AlluxioConfig(
        worker_hosts=["alluxio-w-0.svc:28080", "alluxio-w-1"], worker_http_port=1234, origin="gs://fleet/mcap/"
    )
    assert cfg.worker_hosts == ("alluxio-w-0.svc:28080", "alluxio-w-1:1234")
    assert cfg.origin == "gs://fleet/mcap" and cfg.addresses == cfg.worker_hosts
    dns = AlluxioConfig(load_balance_domain="alluxio-workers.svc", origin="s3://b/p")
    assert dns.addresses == ("alluxio-workers.svc:28080",) and dns.worker_hosts == ()


@pytest.mark.parametrize(
    "hosts, why",
    [
        ("w1:0", "1-65535"),
        ("w1:65536", "1-65535"),
        ("w1:http", "1-65535"),
        ("w1:", "1-65535"),
        ("w1,,w2", "empty worker address"),
        ("", "no Alluxio workers"),
        ("[::1]:28080", "IPv6"),
        ("fe80::1", "IPv6"),
        ("http://w1:28080", "not a URL"),
        ("bad_host!:80", "invalid host name"),
        ("admin:hunter2@w1:28080", "no user info"),
    ],
)
def test_malformed_worker_addresses_are_refused_clearly(hosts, why):
    with pytest.raises(AlluxioConfigError, match=why) as e:
        AlluxioConfig(worker_hosts=hosts, origin="gs://b")
    assert "hunter2" not in str(e.value)


def test_config_needs_one_worker_source_an_origin_and_sane_numbers():
    with pytest.raises(AlluxioConfigError, match="not both"):
        AlluxioConfig(worker_hosts="w1:1", load_balance_domain="d.svc", origin="gs://b")
    with pytest.raises(AlluxioConfigError, match="origin"):
        AlluxioConfig(worker_hosts="w1:1")
    with pytest.raises(AlluxioConfigError, match="unsupported store URL"):
        AlluxioConfig(worker_hosts="w1:1", origin="ftp://b/x")
    with pytest.raises(AlluxioConfigError, match="unknown alluxiofs option"):
        AlluxioConfig(worker_hosts="w1:1", origin="gs://b", client_options={"etcd_hosts": "e1"})
    with pytest.raises(AlluxioConfigError, match="request_timeout_s"):
        AlluxioConfig(worker_hosts="w1:1", origin="gs://b", request_timeout_s=0)
    with pytest.raises(AlluxioConfigError, match="worker_http_port"):
        AlluxioConfig(worker_hosts="w1", origin="gs://b", worker_http_port=70000)
    cfg = AlluxioConfig(worker_hosts="w1:1", origin="s3://b", origin_endpoint_url="http://key:s3cret@minio:9000")
    assert "s3cret" not in repr(cfg)


def test_from_env():
    assert AlluxioConfig.from_env({"HOME": "/root", "DYNA_ALLUXIO_WORKER_HOSTS": "  "}) is None
    cfg = AlluxioConfig.from_env(
        {
            "DYNA_ALLUXIO_WORKER_HOSTS": "w1:19999,w2",
            "DYNA_ALLUXIO_WORKER_HTTP_PORT": "28081",
            "DYNA_ALLUXIO_ORIGIN": "s3://fleet/mcap",
            "DYNA_S3_ENDPOINT_URL": "http://minio:9000",
            "DYNA_ALLUXIO_OPTIONS": '{"concurrency": 16, "mcap_enabled": true}',
            "DYNA_ALLUXIO_REQUEST_TIMEOUT_S": "5",
            "DYNA_ALLUXIO_RETRY_AFTER_S": "10",
        }
    )
    assert cfg.worker_hosts == ("w1:19999", "w2:28081") and cfg.worker_http_port == 28081
    assert cfg.origin == "s3://fleet/mcap" and cfg.origin_endpoint_url == "http://minio:9000"
    assert dict(cfg.client_options) == {"concurrency": 16, "mcap_enabled": True}
    assert (cfg.request_timeout_s, cfg.retry_after_s, cfg.probe_timeout_s) == (5.0, 10.0, 0.5)
    dns = AlluxioConfig.from_env({"DYNA_ALLUXIO_LOAD_BALANCE_DOMAIN": "w.svc", "DYNA_ALLUXIO_ORIGIN": "gs://b"})
    assert dns.load_balance_domain == "w.svc"


@pytest.mark.parametrize(
    "env, why",
    [
        ({"DYNA_ALLUXIO_ETCD_HOSTS": "etcd-0:2379", "DYNA_ALLUXIO_ORIGIN": "gs://b"}, "no etcd discovery"),
        ({"DYNA_ALLUXIO_WORKERS": "w1:1", "DYNA_ALLUXIO_ORIGIN": "gs://b"}, "unknown variable"),
        ({"DYNA_ALLUXIO_ORIGIN": "gs://b"}, "names no workers"),
        ({"DYNA_ALLUXIO_WORKER_HOSTS": "w1:1"}, "DYNA_ALLUXIO_ORIGIN is required"),
        ({"DYNA_ALLUXIO_WORKER_HOSTS": "w1:99999", "DYNA_ALLUXIO_ORIGIN": "gs://b"}, "WORKER_HOSTS.*1-65535"),
        (
            {"DYNA_ALLUXIO_WORKER_HOSTS": "w1:1", "DYNA_ALLUXIO_ORIGIN": "gs://b", "DYNA_ALLUXIO_OPTIONS": "{"},
            "not valid JSON",
        ),
        (
            {"DYNA_ALLUXIO_WORKER_HOSTS": "w1:1", "DYNA_ALLUXIO_ORIGIN": "gs://b", "DYNA_ALLUXIO_OPTIONS": "[1]"},
            "JSON object",
        ),
        (
            {
                "DYNA_ALLUXIO_WORKER_HOSTS": "w1:1",
                "DYNA_ALLUXIO_ORIGIN": "gs://b",
                "DYNA_ALLUXIO_PROBE_TIMEOUT_S": "-1",
            },
            "PROBE_TIMEOUT_S",
        ),
    ],
)
def test_from_env_errors_name_the_variable(env, why):
    with pytest.raises(AlluxioConfigError, match=why):
        AlluxioConfig.from_env(env)


# ---- reads: no worker listening ---------------------------------------------------------------
def test_reads_fall_back_to_the_origin_when_no_worker_listens(origin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # alluxiofs' default logger would create ./logs/user.log: we pass ours
    front = front_at(origin, closed_port())
    fs = front.filesystem()
    url = f"file://{origin}/episodes/ep-1.mcap"
    probes = count_probes(front)
    assert fs.cat_file(url, 100, 200_000) == DATA[100:200_000]
    assert front.fallbacks == 1 and "refused" in front.last_error.lower()
    assert fs.cat_file(url) == DATA
    assert fs.cat_file(f"{origin}/episodes/ep-1.mcap", -10) == DATA[-10:]  # path form, from the end
    with fs.open(url) as f:
        f.seek(len(DATA) - 1_500_000)
        assert f.read(1_000_000) == DATA[-1_500_000:-500_000]
        f.seek(7)
        assert f.read() == DATA[7:]
    assert fs.info(url)["size"] == len(DATA) and fs.size(url) == len(DATA) and fs.exists(url)
    assert fs.cat_file(url, 10, 10) == b""
    assert front.fallbacks >= 6
    assert probes == [1]  # one probe for all those reads: the cluster stays marked down for retry_after_s
    assert fs.fallbacks == front.fallbacks and not front.available()
    assert not (tmp_path / "logs").exists()


def test_missing_object_and_outside_paths_are_the_callers_errors(origin):
    front = front_at(origin, closed_port())
    fs = front.filesystem()
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"file://{origin}/episodes/nope.mcap", 0, 10)
    with pytest.raises(FileNotFoundError):
        fs.open(f"file://{origin}/episodes/nope.mcap")
    for outside in (f"file://{origin.parent}/other/x", "gs://fleet/mcap/ep.mcap", f"file://{origin}/../x"):
        with pytest.raises(ValueError):
            fs.cat_file(outside)
    with pytest.raises(NotImplementedError):
        fs.open(f"file://{origin}/episodes/new", "wb")


class FakeClock:
    """A monotonic clock the test advances."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cluster_is_probed_again_only_after_retry_after(origin):
    port = closed_port()
    clock = FakeClock()
    front = AlluxioFront(
        AlluxioConfig(worker_hosts=f"127.0.0.1:{port}", origin=str(origin), **{**FAST, "retry_after_s": 30.0}),
        clock=clock,
    )
    fs = front.filesystem()
    url = f"file://{origin}/episodes/ep-2.mcap"
    assert fs.cat_file(url) == DATA[::-1][:5000]
    with FakeWorker(port=port) as worker:  # a worker appears; the front keeps to the origin for a while
        assert fs.cat_file(url, 0, 10) == DATA[::-1][:10]
        clock.now += 29.9
        assert fs.cat_file(url, 0, 10) == DATA[::-1][:10]
        assert worker.requests == []
        clock.now += 0.2
        assert fs.cat_file(url, 0, 10) == DATA[::-1][:10]
        assert any(r.startswith("/v1/") for r in worker.requests)  # probed, then asked


# ---- reads: a worker that does not answer, or serves no data ----------------------------------
def test_a_stalled_worker_costs_one_deadline_then_the_origin_serves(origin):
    with socket.socket() as silent:  # accepts connections (kernel backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        front = front_at(origin, silent.getsockname()[1], request_timeout_s=0.5)
        fs = front.filesystem()
        url = f"file://{origin}/episodes/ep-1.mcap"
        assert within(5, fs.cat_file, url, 5, 50) == DATA[5:50]
        assert front.fallbacks == 1 and "within 0.5 s" in front.last_error
        probes = count_probes(front)
        assert within(5, lambda: fs.open(url).read()) == DATA
        assert probes == [0] and not front._cluster_ready()  # marked down: no second deadline, not even a probe
        assert front.fallbacks >= 2


def test_a_worker_without_its_data_port_falls_back_per_read(origin):
    # alluxiofs 1.1.17 reads data ranges from http://<worker host>:29998<mPath of /v1/info> (port
    # hard-coded), not from the REST port; with only the REST port answering, every data read must
    # come from the origin.
    if _listening(29998):
        pytest.skip("something listens on 127.0.0.1:29998")
    with FakeWorker(sizes={f"file://{origin}/episodes/ep-2.mcap": 5000}) as worker:
        front = front_at(origin, worker.port)
        fs = front.filesystem()
        url = f"file://{origin}/episodes/ep-2.mcap"
        assert fs.info(url) == {"name": url, "size": 5000, "type": "file"}  # metadata from "Alluxio"
        assert front.fallbacks == 0
        assert fs.cat_file(url, 1, 4000) == DATA[::-1][1:4000]
        assert front.fallbacks == 1 and "29998" in front.last_error
        assert any(r.startswith("/v1/info") for r in worker.requests)


def test_reads_come_from_alluxio_when_it_serves_them(origin, monkeypatch):
    # The data path of alluxiofs 1.1.17 end to end: /v1/info on the REST port, then ranged GETs of
    # http://<worker>:29998<mPath>; here a fake serves them from the origin folder.
    if _listening(29998):
        pytest.skip("something listens on 127.0.0.1:29998")
    monkeypatch.setattr("dyna_resources.storage.alluxio.ALLUXIO_MAX_RANGE", 1 << 20)
    url = f"file://{origin}/episodes/ep-1.mcap"
    with FakeWorker(sizes={url: len(DATA)}, data_root=origin) as worker:
        front = front_at(origin, worker.port)
        fs = front.filesystem()
        assert fs.cat_file(url, 10, 2_500_000) == DATA[10:2_500_000]
        assert fs.cat_file(url) == DATA
        assert fs.cat_file(url, len(DATA) - 5, len(DATA) + 100) == DATA[-5:]
        with fs.open(url) as f:
            f.seek(123_456)
            assert f.read(2_000_000) == DATA[123_456:2_123_456]
        assert front.fallbacks == 0, front.last_error
        spans = [tuple(map(int, r.split("=")[1].split("-"))) for r in worker.ranges]
        assert spans and all(0 <= a <= b < len(DATA) and b - a < (1 << 20) for a, b in spans)


# ---- load jobs ----------------------------------------------------------------------------------
def test_load_against_an_unreachable_cluster_names_the_hosts(origin):
    port = closed_port()
    front = front_at(origin, port)
    with pytest.raises(AlluxioUnreachableError) as e:
        within(5, front.load, [f"file://{origin}/episodes/ep-1.mcap"])
    assert isinstance(e.value, StoreUnavailableError)
    assert f"127.0.0.1:{port}" in str(e.value) and e.value.hosts == (f"127.0.0.1:{port}",)
    assert "none of 1 load job" in str(e.value)
    s3_front = AlluxioFront(
        AlluxioConfig(
            worker_hosts=f"127.0.0.1:{port},localhost:{closed_port()}",
            origin="s3://fleet/mcap",
            origin_endpoint_url="http://key:s3cret@127.0.0.1:9",
            **FAST,
        )
    )
    with pytest.raises(AlluxioUnreachableError) as e:
        s3_front.load([("s3://fleet/mcap/ep.mcap", [(0, 10)])])
    assert "s3cret" not in str(e.value) and "localhost:" in str(e.value)
    assert front.load([]).as_metadata()["requested"] == 0


def test_load_submits_one_job_per_distinct_object_and_waits(origin):
    base = f"file://{origin}/episodes"
    with FakeWorker(refuse={f"{base}/refused.mcap"}, fail={f"{base}/broken.mcap"}) as worker:
        front = front_at(origin, worker.port)
        plan = [
            (f"{base}/ep-1.mcap", [(0, 4096), (1 << 20, 2 << 20)]),
            (f"{base}/ep-2.mcap", [(0, 10)]),
            f"{base}/ep-1.mcap",
            (f"{origin}/episodes/ep-2.mcap", [(5, 9)]),
            (f"{base}/refused.mcap", []),
            (f"{base}/broken.mcap", []),
        ]
        report = front.load(plan)
        assert report.requested == (
            f"{base}/ep-1.mcap",
            f"{base}/ep-2.mcap",
            f"{base}/refused.mcap",
            f"{base}/broken.mcap",
        )
        assert [p for op, p in worker.loads if op == "submit"] == list(report.requested)
        assert report.submitted == (f"{base}/ep-1.mcap", f"{base}/ep-2.mcap", f"{base}/broken.mcap")
        assert "success=false" in report.failed[f"{base}/refused.mcap"]
        assert report.pending == report.submitted and not report.ok

        waited = front.load(plan, wait=True, timeout_s=5)
        assert waited.loaded == (f"{base}/ep-1.mcap", f"{base}/ep-2.mcap")
        assert waited.states[f"{base}/broken.mcap"] == "FAILED" and "FAILED" in waited.failed[f"{base}/broken.mcap"]
        assert waited.as_metadata() == {"requested": 4, "submitted": 3, "loaded": 2, "pending": 0, "failed": 2}
        with pytest.raises(ValueError, match="not under the origin"):
            front.load(["gs://elsewhere/x.mcap"])
        # the shape of prewarm.Plan: .files of items with .url (and .ranges)
        as_plan = SimpleNamespace(
            files=[
                SimpleNamespace(url=f"{base}/ep-2.mcap", ranges=[(0, 9)]),
                SimpleNamespace(url=f"{base}/ep-2.mcap", ranges=[(20, 30)]),
            ]
        )
        assert front.load(as_plan).submitted == (f"{base}/ep-2.mcap",)


def test_load_against_a_stalled_worker_is_unreachable_not_a_hang(origin):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        front = front_at(origin, silent.getsockname()[1], request_timeout_s=0.5)
        with pytest.raises(AlluxioUnreachableError, match="after 0 of 2 load job"):
            within(5, front.load, [f"file://{origin}/episodes/ep-1.mcap", f"file://{origin}/episodes/ep-2.mcap"])


# ---- packaging and processes ---------------------------------------------------------------------
def test_alluxiofs_is_installed_as_the_pinned_version():
    from importlib.metadata import version

    import fsspec

    assert version("alluxiofs") == "1.1.17"
    assert fsspec.get_filesystem_class("alluxio").__name__ == "AlluxioFileSystem"


def test_missing_alluxiofs_is_a_clear_error(origin, monkeypatch):
    monkeypatch.setitem(sys.modules, "alluxiofs", None)  # import alluxiofs -> ImportError
    front = front_at(origin, closed_port())
    with pytest.raises(AlluxioNotInstalledError, match=r"alluxiofs==1\.1\.17.*pip install"):
        front.filesystem()
    with pytest.raises(AlluxioNotInstalledError):
        front.load([f"file://{origin}/episodes/ep-1.mcap"])


def test_a_front_survives_pickling_for_dataloader_workers(origin):
    front = front_at(origin, closed_port())
    url = f"file://{origin}/episodes/ep-2.mcap"
    front.filesystem().cat_file(url)
    clone = pickle.loads(pickle.dumps(front))
    assert clone.fallbacks == 0 and clone.config == front.config
    assert clone.filesystem().cat_file(url, 0, 3) == DATA[::-1][:3] and clone.fallbacks == 1


# ---- a fake Alluxio worker: the REST calls alluxiofs 1.1.17 makes (client/core.py) ----------------
def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class FakeWorker:
    """Answers /v1/node (the worker for a path: itself), /v1/info (sizes given), /v1/load
    (submit: success unless refused; progress: SUCCEEDED unless failed); records request paths."""

    def __init__(self, port: int = 0, sizes=None, refuse=(), fail=(), data_root=None):
        self.requests: list[str] = []
        self.loads: list[tuple[str, str]] = []
        self.ranges: list[str] = []
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                worker.requests.append(self.path)
                parsed = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
                path = query.get("path", "")
                if parsed.path == "/v1/node":
                    return self._json({"Host": "127.0.0.1", "HttpServerPort": worker.port})
                if parsed.path == "/v1/info" and path in (sizes or {}):
                    alluxio_path = "/" + path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1]  # namespace path
                    return self._json(
                        [{"mType": "file", "mPath": alluxio_path, "mUfsPath": path, "mLength": sizes[path]}]
                    )
                if parsed.path == "/v1/load":
                    worker.loads.append((query.get("opType"), path))
                    if query.get("opType") == "submit":
                        return self._json({"success": path not in refuse})
                    if query.get("opType") == "progress":
                        return self._json({"jobState": "FAILED" if path in fail else "SUCCEEDED"})
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"not served by the fake worker")

            def _json(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class DataHandler(BaseHTTPRequestHandler):  # the data port: GET <mPath> with a closed Range
            def do_GET(self):
                spec = self.headers.get("Range", "")
                worker.ranges.append(spec)
                first, _, last = spec.removeprefix("bytes=").partition("-")
                blob = (data_root / self.path.lstrip("/")).read_bytes()
                if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
                    self.send_response(416)
                    self.end_headers()
                    return
                body = blob[int(first) : int(last) + 1]
                self.send_response(206)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.servers = [self.server]
        if data_root is not None:
            self.servers.append(ThreadingHTTPServer(("127.0.0.1", 29998), DataHandler))

    def __enter__(self):
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        for server in self.servers:
            server.shutdown()
            server.server_close()
