"""Alluxio as the cluster-scale front of an object store, behind the same fsspec interface as the
node page cache, with the origin as the fallback.

``AlluxioFront(config).filesystem()`` is a read-only fsspec filesystem over the objects under one
origin root (``config.origin``: ``gs://bucket/prefix``, ``s3://…``, ``file:///…``). Reads
(``cat_file(path, start, end)``, ``open(path).read()``) go through the Alluxio workers with
`alluxiofs <https://github.com/fsspec/alluxiofs>`_ (pinned 1.1.17, fsspec protocol ``alluxio``);
when no worker answers, reads go to the origin and ``front.fallbacks`` counts them. An unreachable,
refusing or stalled cluster never raises into the training loop: a TCP probe with a short timeout
decides whether to try the cluster at all, every call into alluxiofs runs under a deadline
(``request_timeout_s``), and after a failure the origin serves everything for ``retry_after_s``
before the cluster is probed again. Errors of the origin itself are the origin's
(``FileNotFoundError``, ``stores.StoreUnavailableError``).

``AlluxioFront.load(plan)`` is the cluster form of prewarm: Alluxio loads whole files, so the plan's
distinct object URLs become one Alluxio load job each (``AlluxioClient.submit_load``), optionally
waited for (``load_progress``). A cluster that does not answer raises ``AlluxioUnreachableError``
(a ``StoreUnavailableError``) naming the worker addresses.

Why the front does its own fallback instead of alluxiofs' (``AlluxioFileSystem(fs=origin)``), as
found in alluxiofs 1.1.17's source: its fallback covers ``cat_file`` but not ``open().read()``
(``AlluxioFile._fetch_range`` raises ``OSError``); it turns the origin's ``FileNotFoundError`` into
a bare ``Exception("fallback to ufs is failed")``; its HTTP calls have no timeout (a stalled worker
blocks forever); and it logs two warnings per failed read. Workers are given as ``host:port`` (its
``etcd_hosts`` is documented but unused in 1.1.17: there is no etcd discovery) or by a DNS
``load_balance_domain``.

Configuration from the environment (``AlluxioConfig.from_env``; nothing set: no Alluxio front):

- ``DYNA_ALLUXIO_WORKER_HOSTS``: ``host[:port],…`` (port default ``DYNA_ALLUXIO_WORKER_HTTP_PORT``,
  else 28080), or ``DYNA_ALLUXIO_LOAD_BALANCE_DOMAIN``: one DNS name resolving to the workers;
- ``DYNA_ALLUXIO_ORIGIN``: the under-store root the cluster caches (required);
  ``DYNA_ALLUXIO_ORIGIN_ENDPOINT_URL`` (else ``DYNA_S3_ENDPOINT_URL`` for an s3:// origin);
- ``DYNA_ALLUXIO_OPTIONS``: a JSON object of alluxiofs client options (``concurrency``,
  ``mcap_enabled``, ``use_local_disk_cache``, …);
- ``DYNA_ALLUXIO_PROBE_TIMEOUT_S`` (0.5), ``DYNA_ALLUXIO_REQUEST_TIMEOUT_S`` (30),
  ``DYNA_ALLUXIO_RETRY_AFTER_S`` (30), ``DYNA_ALLUXIO_POLL_INTERVAL_S`` (2).

Plain Python, no Dagster import; alluxiofs is imported only when a front is used
(``pip install "dyna-pipeline[alluxio]"``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from .stores import Store, StoreUnavailableError, check_key, redact

ALLUXIOFS_REQUIREMENT = "alluxiofs==1.1.17"
INSTALL_COMMAND = 'pip install "dyna-pipeline[alluxio]"  (or: pip install alluxiofs==1.1.17)'
DEFAULT_WORKER_HTTP_PORT = 28080  # alluxiofs 1.1.17 client/const.py: ALLUXIO_WORKER_HTTP_SERVER_PORT_DEFAULT_VALUE
DEFAULT_BLOCK_SIZE = 4 << 20  # read-ahead block of open() files: one page of the node cache
ALLUXIO_MAX_RANGE = 16 << 20  # bytes per alluxiofs range request (1.1.17 caps a response at 20 MiB)

# Keyword options of alluxiofs 1.1.17's AlluxioClientConfig (client/config.py) that may be passed
# through; the worker addresses, logger and under filesystem are set by the front itself.
CLIENT_OPTIONS = frozenset(
    {
        "concurrency",
        "use_mem_cache",
        "mem_map_capacity",
        "use_local_disk_cache",
        "local_disk_cache_dir",
        "local_cache_dir",
        "mcap_enabled",
        "mcap_prefetch_ahead_blocks",
        "mcap_prefetch_concurrency",
        "local_cache_size_gb",
        "local_cache_block_size_mb",
        "use_memory_cache",
        "memory_cache_size_mb",
        "http_max_retries",
        "http_timeouts",
        "read_buffer_size_mb",
        "mcap_max_prefetch_blocks",
        "mcap_prefetch_policy",
    }
)
ENV_PREFIX = "DYNA_ALLUXIO_"
_ENV_NAMES = frozenset(
    {
        "WORKER_HOSTS",
        "WORKER_HTTP_PORT",
        "LOAD_BALANCE_DOMAIN",
        "ORIGIN",
        "ORIGIN_ENDPOINT_URL",
        "OPTIONS",
        "PROBE_TIMEOUT_S",
        "REQUEST_TIMEOUT_S",
        "RETRY_AFTER_S",
        "POLL_INTERVAL_S",
        "ETCD_HOSTS",
        "ETCD_PORT",
    }
)
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_TERMINAL_FAILED = ("FAILED", "STOPPED")

log = logging.getLogger(__name__)


class AlluxioNotInstalledError(ImportError):
    """The ``alluxiofs`` package is not installed in this environment."""

    def __init__(self, cause: BaseException | None = None):
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        super().__init__(
            f"the Alluxio front needs the package {ALLUXIOFS_REQUIREMENT}, which is not "
            f"importable here{detail}; install it with: {INSTALL_COMMAND}"
        )


class AlluxioConfigError(ValueError):
    """An Alluxio front configuration that cannot work (malformed address, missing origin, …)."""


class AlluxioUnreachableError(StoreUnavailableError):
    """No Alluxio worker answered: names the addresses tried (credentials redacted)."""

    def __init__(self, hosts: Sequence[str], reason: str):
        self.hosts = tuple(redact(h) for h in hosts)
        super().__init__("alluxio://" + ",".join(self.hosts), reason)


# ---- configuration ----------------------------------------------------------------------------
def _mask(entry: str) -> str:
    """``entry`` for an error message: URL credentials and anything before an ``@`` masked."""
    entry = redact(entry)
    return re.sub(r"^[^/@]*@", "***@", entry)


def parse_worker_hosts(
    value: str | Sequence[str], default_port: int = DEFAULT_WORKER_HTTP_PORT, *, source: str = "worker_hosts"
) -> tuple[str, ...]:
    """``host[:port]`` entries (a comma-separated string or a sequence) as ``host:port`` strings,
    in order, duplicates dropped; ``AlluxioConfigError`` naming the malformed entry otherwise."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise AlluxioConfigError(f"{source}: a worker address is a 'host:port' string, got {raw!r}")
        entry = raw.strip()
        shown = _mask(entry)
        if not entry:
            raise AlluxioConfigError(f"{source}: empty worker address in {_mask(str(value))!r}")
        if "@" in entry:
            raise AlluxioConfigError(f"{source}: malformed worker address {shown!r}: no user info allowed")
        if "://" in entry or "/" in entry:
            raise AlluxioConfigError(f"{source}: malformed worker address {shown!r}: give host:port, not a URL")
        if entry.startswith("[") or entry.count(":") > 1:
            raise AlluxioConfigError(
                f"{source}: malformed worker address {shown!r}: IPv6 literals are not supported "
                "(alluxiofs splits addresses on ':'); use a host name"
            )
        host, sep, port_text = entry.partition(":")
        if not _HOSTNAME.fullmatch(host):
            raise AlluxioConfigError(f"{source}: malformed worker address {shown!r}: invalid host name")
        if sep:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise AlluxioConfigError(
                    f"{source}: malformed worker address {shown!r}: the port must be an integer in 1-65535"
                )
            port = int(port_text)
        else:
            port = default_port
        address = f"{host}:{port}"
        if address not in out:
            out.append(address)
    if not out:
        raise AlluxioConfigError(f"{source}: no worker address given")
    return tuple(out)


def _positive(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AlluxioConfigError(f"{name} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise AlluxioConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    return number


def _port(name: str, value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise AlluxioConfigError(f"{name} must be an integer in 1-65535, got {value!r}")
    return int(text)


@dataclass(frozen=True)
class AlluxioConfig:
    """Where the Alluxio workers are and which origin they cache.

    ``worker_hosts``: ``host[:port]`` addresses of the workers' HTTP servers (a comma-separated
    string or a sequence; normalized to ``host:port``), or ``load_balance_domain``: a DNS name
    resolving to them (exactly one of the two). ``origin``: the under-store root the cluster caches
    (normalized with ``Store.from_url``); paths outside it are refused. ``client_options``: extra
    alluxiofs client options (``CLIENT_OPTIONS``). ``probe_timeout_s``: TCP connect timeout of the
    reachability probe; ``request_timeout_s``: deadline of one call into alluxiofs;
    ``retry_after_s``: how long the origin serves alone after a failure; ``poll_interval_s``:
    between load-progress polls."""

    worker_hosts: tuple[str, ...] | str = ()
    origin: str = ""
    load_balance_domain: str | None = None
    worker_http_port: int = DEFAULT_WORKER_HTTP_PORT
    origin_endpoint_url: str | None = None
    client_options: Mapping[str, Any] = field(default_factory=dict, hash=False)  # a private copy
    probe_timeout_s: float = 0.5
    request_timeout_s: float = 30.0
    retry_after_s: float = 30.0
    poll_interval_s: float = 2.0

    def __post_init__(self):
        def set_(name: str, value: Any) -> None:  # the dataclass is frozen
            object.__setattr__(self, name, value)

        set_("worker_http_port", _port("worker_http_port", self.worker_http_port))
        for name in ("probe_timeout_s", "request_timeout_s", "retry_after_s", "poll_interval_s"):
            set_(name, _positive(name, getattr(self, name)))
        domain = (self.load_balance_domain or "").strip() or None
        if domain is not None and not _HOSTNAME.fullmatch(domain):
            raise AlluxioConfigError(f"load_balance_domain: {_mask(domain)!r} is not a host name")
        set_("load_balance_domain", domain)
        has_hosts = bool(self.worker_hosts.strip() if isinstance(self.worker_hosts, str) else self.worker_hosts)
        if has_hosts and domain:
            raise AlluxioConfigError("give either worker_hosts or load_balance_domain, not both")
        if not has_hosts and not domain:
            raise AlluxioConfigError(
                "no Alluxio workers configured: give worker_hosts (host:port,…) or load_balance_domain"
            )
        set_("worker_hosts", parse_worker_hosts(self.worker_hosts, self.worker_http_port) if has_hosts else ())
        if not self.origin:
            raise AlluxioConfigError("origin: the under-store root URL this Alluxio front serves is required")
        try:
            store = Store.from_url(self.origin, endpoint_url=self.origin_endpoint_url)
        except ValueError as e:
            raise AlluxioConfigError(f"origin: {e}") from None
        set_("origin", store.root)
        set_("origin_endpoint_url", store.endpoint_url)
        options = dict(self.client_options or {})
        unknown = sorted(set(options) - CLIENT_OPTIONS)
        if unknown:
            raise AlluxioConfigError(
                f"client_options: unknown alluxiofs option(s) {unknown}; known: {sorted(CLIENT_OPTIONS)}"
            )
        set_("client_options", options)

    def __repr__(self) -> str:  # an endpoint URL may carry user info: never print it
        target = ",".join(self.worker_hosts) if self.worker_hosts else f"dns:{self.load_balance_domain}"
        return f"AlluxioConfig({target!r}, origin={self.origin!r})"

    @property
    def addresses(self) -> tuple[str, ...]:
        """``host:port`` of every worker address the client talks to (the DNS name for a domain)."""
        assert isinstance(self.worker_hosts, tuple)  # __post_init__ parses a string into host:port addresses
        return self.worker_hosts or (f"{self.load_balance_domain}:{self.worker_http_port}",)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AlluxioConfig | None:
        """The configuration in ``DYNA_ALLUXIO_*`` (see the module doc); ``None`` if none is set."""
        env = os.environ if environ is None else environ
        given = {k[len(ENV_PREFIX) :]: v for k, v in env.items() if k.startswith(ENV_PREFIX) and v.strip()}
        if not given:
            return None
        unknown = sorted(set(given) - _ENV_NAMES)
        if unknown:
            raise AlluxioConfigError(
                f"unknown variable(s) {[ENV_PREFIX + n for n in unknown]}; "
                f"known: {sorted(ENV_PREFIX + n for n in _ENV_NAMES)}"
            )
        if "ETCD_HOSTS" in given or "ETCD_PORT" in given:
            raise AlluxioConfigError(
                f"{ENV_PREFIX}ETCD_HOSTS: alluxiofs 1.1.17 has no etcd discovery (its etcd_hosts argument is "
                f"ignored); list the workers in {ENV_PREFIX}WORKER_HOSTS=host:port,… or give a DNS name in "
                f"{ENV_PREFIX}LOAD_BALANCE_DOMAIN"
            )
        kwargs: dict[str, Any] = {}
        if "WORKER_HTTP_PORT" in given:
            kwargs["worker_http_port"] = _port(ENV_PREFIX + "WORKER_HTTP_PORT", given["WORKER_HTTP_PORT"])
        if "WORKER_HOSTS" in given:
            kwargs["worker_hosts"] = parse_worker_hosts(
                given["WORKER_HOSTS"],
                kwargs.get("worker_http_port", DEFAULT_WORKER_HTTP_PORT),
                source=ENV_PREFIX + "WORKER_HOSTS",
            )
        if "LOAD_BALANCE_DOMAIN" in given:
            kwargs["load_balance_domain"] = given["LOAD_BALANCE_DOMAIN"]
        if "WORKER_HOSTS" not in given and "LOAD_BALANCE_DOMAIN" not in given:
            raise AlluxioConfigError(
                f"{ENV_PREFIX}* is set but names no workers: set {ENV_PREFIX}WORKER_HOSTS=host:port,… "
                f"or {ENV_PREFIX}LOAD_BALANCE_DOMAIN"
            )
        if "ORIGIN" not in given:
            raise AlluxioConfigError(
                f"{ENV_PREFIX}ORIGIN is required: the under-store root the Alluxio cluster "
                "caches (gs://bucket/prefix, s3://…, file:///…)"
            )
        kwargs["origin"] = given["ORIGIN"].strip()
        endpoint = given.get("ORIGIN_ENDPOINT_URL")
        if endpoint is None and kwargs["origin"].startswith(("s3://", "s3a://")):
            endpoint = env.get("DYNA_S3_ENDPOINT_URL") or None
        kwargs["origin_endpoint_url"] = endpoint
        if "OPTIONS" in given:
            try:
                options = json.loads(given["OPTIONS"])
            except json.JSONDecodeError as e:
                raise AlluxioConfigError(f"{ENV_PREFIX}OPTIONS is not valid JSON: {e}") from None
            if not isinstance(options, dict):
                raise AlluxioConfigError(f"{ENV_PREFIX}OPTIONS must be a JSON object, got {type(options).__name__}")
            kwargs["client_options"] = options
        for name in ("PROBE_TIMEOUT_S", "REQUEST_TIMEOUT_S", "RETRY_AFTER_S", "POLL_INTERVAL_S"):
            if name in given:
                kwargs[name.lower()] = _positive(ENV_PREFIX + name, given[name])
        try:
            return cls(**kwargs)
        except AlluxioConfigError as e:
            raise AlluxioConfigError(f"{ENV_PREFIX}*: {e}") from None


# ---- the load report --------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadReport:
    """What ``AlluxioFront.load`` did: one Alluxio load job per distinct object URL.

    ``states``: the last known job state per submitted URL (``SUBMITTED`` when not waited for,
    else Alluxio's ``RUNNING``/``VERIFYING``/``SUCCEEDED``/``FAILED``/``STOPPED``);
    ``failed``: URL → reason, for jobs the cluster refused, errors and failed or stopped jobs."""

    requested: tuple[str, ...] = ()
    submitted: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    states: Mapping[str, str] = field(default_factory=dict)

    @property
    def loaded(self) -> tuple[str, ...]:
        return tuple(u for u in self.submitted if self.states.get(u) == "SUCCEEDED")

    @property
    def pending(self) -> tuple[str, ...]:
        """Submitted jobs not known to have finished (all of them when not waited for)."""
        return tuple(
            u
            for u in self.submitted
            if u not in self.failed and self.states.get(u) not in ("SUCCEEDED", *_TERMINAL_FAILED)
        )

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_metadata(self) -> dict[str, int]:
        return {
            "requested": len(self.requested),
            "submitted": len(self.submitted),
            "loaded": len(self.loaded),
            "pending": len(self.pending),
            "failed": len(self.failed),
        }


# ---- the front --------------------------------------------------------------------------------
def _import_alluxiofs():
    try:
        import alluxiofs
    except ImportError as e:
        raise AlluxioNotInstalledError(e) from e
    return alluxiofs


def _describe(e: BaseException) -> str:
    msg = str(e).strip()
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return redact(text if len(text) <= 500 else text[:497] + "...")


_NORMAL_SCHEMES = {"gcs": "gs", "s3a": "s3", "local": "file"}


class AlluxioFront:
    """Reads of the objects under ``config.origin`` through Alluxio, the origin as fallback.

    ``origin_fs``: a ready fsspec filesystem for the origin (tests, emulators). Thread-safe; after a
    fork (DataLoader workers) or unpickling, the alluxiofs clients and the thread pool are rebuilt
    and the counters start at zero. ``clock``: the monotonic clock of the ``retry_after_s`` window
    (tests pass one they advance)."""

    def __init__(self, config: AlluxioConfig, *, origin_fs: Any = None, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.origin = Store.from_url(config.origin, endpoint_url=config.origin_endpoint_url, fs=origin_fs)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._fs = None  # alluxiofs.AlluxioFileSystem
        self._client = None  # alluxiofs.AlluxioClient (load jobs)
        self._down_until: float | None = None  # None: not probed yet; 0: up; >0: origin only until then
        self._fallbacks = 0
        self.last_error: str | None = None

    def __getstate__(self):
        return {"config": self.config, "origin": self.origin, "clock": self.clock}

    def __setstate__(self, state):
        self.config = state["config"]
        self.origin = state["origin"]
        self.clock = state.get("clock", time.monotonic)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"AlluxioFront({','.join(self.config.addresses)!r}, origin={self.origin!r})"

    # ---- state ----------------------------------------------------------------------------------
    @property
    def fallbacks(self) -> int:
        """Reads (and metadata look-ups) the origin served because Alluxio did not."""
        return self._fallbacks

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.config.addresses

    def available(self) -> bool:
        """Whether a worker accepts a TCP connection now (within ``probe_timeout_s``)."""
        return self._probe() is None

    def _probe(self) -> str | None:
        """``None`` if some worker accepts a connection, else why none did."""
        errors = []
        for address in self.config.addresses:
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=self.config.probe_timeout_s):
                    return None
            except OSError as e:
                errors.append(f"{address}: {_describe(e)}")
        return "; ".join(errors)

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # a forked child: threads and sockets of the parent are not ours
            self._init_runtime()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="alluxio-front")
            return self._pool

    def _call(self, fn, *args):
        """``fn(*args)`` under the ``request_timeout_s`` deadline (alluxiofs sets no HTTP timeouts:
        a stalled worker would block the caller forever; the stuck call is left to its thread)."""
        future = self._executor().submit(fn, *args)
        try:
            return future.result(timeout=self.config.request_timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from Alluxio within {self.config.request_timeout_s:g} s") from None

    def _alluxiofs_kwargs(self) -> dict[str, Any]:
        cfg = self.config
        kwargs: dict[str, Any] = {"http_timeouts": max(1, math.ceil(cfg.request_timeout_s))}
        kwargs.update(cfg.client_options)
        if cfg.worker_hosts:  # always with explicit ports: 1.1.17 crashes on a host without one
            kwargs["worker_hosts"] = ",".join(cfg.worker_hosts)
        else:
            kwargs["load_balance_domain"] = cfg.load_balance_domain
        kwargs["worker_http_port"] = cfg.worker_http_port
        return kwargs

    def _alluxiofs_object(self, cls):
        """An alluxiofs ``cls`` (AlluxioFileSystem, AlluxioClient) over this configuration; a
        configuration it refuses raises AlluxioConfigError."""
        try:
            return cls(logger=logging.getLogger(f"{__name__}.alluxiofs"), **self._alluxiofs_kwargs())
        except (AssertionError, ValueError, TypeError, AttributeError) as e:
            raise AlluxioConfigError(f"alluxiofs refused the configuration {self.config!r}: {_describe(e)}") from None

    def _alluxio_fs(self):
        self._check_fork()
        with self._lock:
            if self._fs is None:
                # no under filesystem: the front falls back itself (see the module doc)
                self._fs = self._alluxiofs_object(_import_alluxiofs().AlluxioFileSystem)
            return self._fs

    def _load_client(self):
        self._check_fork()
        with self._lock:
            if self._client is None:
                self._client = self._alluxiofs_object(_import_alluxiofs().AlluxioClient)
            return self._client

    def _cluster_ready(self) -> bool:
        """Whether to try the cluster for the next read (probes when due, never more than once per
        ``retry_after_s`` while it is down)."""
        with self._lock:
            down_until = self._down_until
        if down_until == 0:
            return True
        if down_until is not None and self.clock() < down_until:
            return False
        reason = self._probe()
        if reason is None:
            with self._lock:
                self._down_until = 0
            if down_until is not None:
                log.info("Alluxio front: workers %s answer again; reads go through Alluxio", ",".join(self.hosts))
            return True
        self._mark_down(f"no worker answered the probe ({reason})")
        return False

    def _mark_down(self, reason: str) -> None:
        with self._lock:
            was_up = self._down_until in (None, 0)
            self._down_until = self.clock() + self.config.retry_after_s
            self.last_error = redact(reason)
        if was_up:
            log.warning(
                "Alluxio front %s: reads go to the origin %s for %g s: %s",
                ",".join(self.hosts),
                self.origin.root,
                self.config.retry_after_s,
                self.last_error,
            )

    def _via(self, alluxio_op, origin_op):
        """``alluxio_op(alluxio_fs)`` if the cluster is up and answers, else ``origin_op()``."""
        fs = self._alluxio_fs()
        if self._cluster_ready():
            try:
                return self._call(alluxio_op, fs)
            except FileNotFoundError as e:  # alluxiofs says so for any HTTP 500 of /v1/info: ask the origin
                self.last_error = _describe(e)
            except Exception as e:
                self._mark_down(_describe(e))
        with self._lock:
            self._fallbacks += 1
        return origin_op()

    # ---- addressing -----------------------------------------------------------------------------
    def key_of(self, path: str | os.PathLike[str]) -> str:
        """The origin key of ``path``: a full URL under the origin root, or the origin filesystem's
        path form of one (``bucket/prefix/key``, ``/abs/path``); ``ValueError`` outside the root."""
        text = os.fspath(path)
        if "://" in text:
            scheme, rest = text.split("://", 1)
            scheme = scheme.lower()
            url = f"{_NORMAL_SCHEMES.get(scheme, scheme)}://{rest}"
        elif self.origin.protocol == "file":
            url = "file://" + text
        else:
            url = f"{self.origin.protocol}://{text.lstrip('/')}"
        url = url.rstrip("/")
        root = self.origin.root
        if not url.startswith(root + "/"):
            raise ValueError(f"{redact(text)!r} is not under the origin {root} this Alluxio front serves")
        return check_key(url[len(root) + 1 :])

    def url(self, path: str | os.PathLike[str]) -> str:
        """The full origin URL of ``path`` (what Alluxio is asked for)."""
        return self.origin.url(self.key_of(path))

    # ---- reads ----------------------------------------------------------------------------------
    def info(self, path: str) -> dict[str, Any]:
        """``{"name": url, "size": int, "type": "file"|"directory"}``."""
        key = self.key_of(path)
        url = self.origin.url(key)

        def from_alluxio(fs):
            raw = dict(fs.info(url))
            return {
                "name": url,
                "size": int(raw["size"]),
                "type": "directory" if raw.get("type") == "directory" else "file",
            }

        def from_origin():
            info = self.origin.info(key)
            return {"name": url, "size": info.size, "type": "file", "version": info.version}

        return self._via(from_alluxio, from_origin)

    def read_range(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object at ``path`` (``None``: from the start / to the end;
        negative: from the end), through Alluxio or, when it does not answer, from the origin."""
        key = self.key_of(path)
        url = self.origin.url(key)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.info(url)["size"]
            start = None if start is None else max(0, size + start if start < 0 else start)
            end = None if end is None else max(0, size + end if end < 0 else end)
        start = start or 0
        if end is not None and end <= start:
            return b""

        def from_alluxio(fs):
            # Never an open end (alluxiofs 1.1.17 sends "Range: bytes=s-(s-2)" for it) nor more than
            # its 20 MiB response limit at once; every piece must come back whole.
            size = int(fs.info(url)["size"])
            stop = size if end is None else min(end, size)
            pieces = []
            for pos in range(start, stop, ALLUXIO_MAX_RANGE):
                want = min(ALLUXIO_MAX_RANGE, stop - pos)
                piece = fs.cat_file(url, pos, pos + want)
                if len(piece) != want:
                    raise OSError(
                        f"Alluxio returned {len(piece)} bytes for [{pos}, {pos + want}) of {url} (size {size})"
                    )
                pieces.append(piece)
            return b"".join(pieces)

        return self._via(from_alluxio, lambda: self.origin.cat(key, start, end))

    def filesystem(self) -> AlluxioFrontFileSystem:
        """A read-only fsspec filesystem reading through this front (fails now, not mid-training,
        if alluxiofs is missing or refuses the configuration; contacts no worker)."""
        self._alluxio_fs()
        return AlluxioFrontFileSystem(front=self)

    # ---- prewarm --------------------------------------------------------------------------------
    def load(self, plan: Any, *, wait: bool = False, timeout_s: float | None = None) -> LoadReport:
        """One Alluxio load job per distinct object of ``plan``: URLs, ``(url, ranges)`` pairs, items
        with a ``url`` attribute, or an object whose ``files`` are such items (``prewarm.Plan``).
        Alluxio loads whole files, so the ranges only name the object.

        ``wait``: poll the jobs every ``poll_interval_s`` until they finish or ``timeout_s`` passes.
        Raises ``ValueError`` for a URL outside the origin (before any I/O) and
        ``AlluxioUnreachableError`` when no worker answers."""
        requested: list[str] = []
        for item in getattr(plan, "files", plan):
            if isinstance(item, str | os.PathLike):
                url = self.url(item)
            else:
                url = self.url(item.url if hasattr(item, "url") else item[0])
            if url not in requested:
                requested.append(url)
        if not requested:
            return LoadReport()
        client = self._load_client()
        reason = self._probe()
        if reason is not None:
            raise self._unreachable(
                f"no worker answered within {self.config.probe_timeout_s:g} s ({reason}); "
                f"none of {len(requested)} load job(s) was submitted"
            )
        submitted: list[str] = []
        failed: dict[str, str] = {}
        for url in requested:
            try:
                accepted = self._call(client.submit_load, url)
            except Exception as e:
                self._raise_if_unreachable(e, f"after {len(submitted)} of {len(requested)} load job(s) were submitted")
                failed[url] = _describe(e)
                continue
            if accepted:
                submitted.append(url)
            else:
                failed[url] = "the cluster did not accept the load job (success=false)"
        states = {u: "SUBMITTED" for u in submitted}
        if wait and submitted:
            self._wait(client, submitted, states, failed, timeout_s)
        return LoadReport(requested=tuple(requested), submitted=tuple(submitted), failed=failed, states=states)

    def _wait(self, client, submitted, states, failed, timeout_s) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(submitted)
        while pending:
            for url in list(pending):
                try:
                    result = self._call(client.load_progress, url)
                except Exception as e:
                    self._raise_if_unreachable(e, "while waiting for the load jobs")
                    failed[url] = f"load progress unknown: {_describe(e)}"
                    pending.remove(url)
                    continue
                state = result[0] if isinstance(result, tuple) else result  # 1.1.17 returns (LoadState, content)
                name = str(getattr(state, "value", state))
                states[url] = name
                if name == "SUCCEEDED":
                    pending.remove(url)
                elif name in _TERMINAL_FAILED:
                    failed[url] = (
                        f"load job {name}: {redact(str(result[1] if isinstance(result, tuple) else ''))[:300]}"
                    )
                    pending.remove(url)
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(
                self.config.poll_interval_s
                if deadline is None
                else max(0.0, min(self.config.poll_interval_s, deadline - time.monotonic()))
            )

    def _unreachable(self, reason: str) -> AlluxioUnreachableError:
        return AlluxioUnreachableError(self.hosts, f"{reason} (origin {self.origin!r})")

    def _raise_if_unreachable(self, error: Exception, when: str) -> None:
        """A timed-out call, or a failure after which no worker accepts connections, is the cluster's."""
        if isinstance(error, TimeoutError):
            raise self._unreachable(f"{_describe(error)} {when}") from None
        reason = self._probe()
        if reason is not None:
            raise self._unreachable(f"{_describe(error)} {when}; now no worker answers ({reason})") from None


# ---- the fsspec face ----------------------------------------------------------------------------
class AlluxioFrontFile(AbstractBufferedFile):
    """A read-only file whose ranges come from ``AlluxioFront.read_range`` (each with its fallback)."""

    def _fetch_range(self, start, end):
        return self.fs.front.read_range(self.path, start, end)


class AlluxioFrontFileSystem(AbstractFileSystem):
    """Read-only fsspec filesystem over an ``AlluxioFront``: paths are origin URLs
    (``gs://bucket/prefix/key``) or the origin's path form of them."""

    protocol = "dyna-alluxio"  # not registered with fsspec: built by AlluxioFront.filesystem()
    cachable = False

    def __init__(self, front: AlluxioFront, **kwargs):
        super().__init__(**kwargs)
        self.front = front

    @property
    def fallbacks(self) -> int:
        return self.front.fallbacks

    def info(self, path, **kwargs):
        return self.front.info(path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        return self.front.read_range(path, start, end)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise NotImplementedError(f"the Alluxio front is read-only (mode {mode!r}); write to the origin store")
        info = self.front.info(path)
        if info["type"] == "directory":
            raise IsADirectoryError(info["name"])
        return AlluxioFrontFile(
            self,
            info["name"],
            mode="rb",
            block_size=block_size or DEFAULT_BLOCK_SIZE,
            autocommit=autocommit,
            cache_options=cache_options,
            size=info["size"],
            cache_type=kwargs.get("cache_type", "readahead"),
        )

    def ls(self, path, detail=True, **kwargs):
        raise NotImplementedError("the Alluxio front reads objects; list them with the origin store (Store.ls)")

    def _rm(self, path):
        raise NotImplementedError("the Alluxio front is read-only")

    def pipe_file(self, path, value, **kwargs):
        raise NotImplementedError("the Alluxio front is read-only")


__all__ = [
    "ALLUXIOFS_REQUIREMENT",
    "CLIENT_OPTIONS",
    "INSTALL_COMMAND",
    "AlluxioConfig",
    "AlluxioConfigError",
    "AlluxioFront",
    "AlluxioFrontFile",
    "AlluxioFrontFileSystem",
    "AlluxioNotInstalledError",
    "AlluxioUnreachableError",
    "LoadReport",
    "parse_worker_hosts",
]
