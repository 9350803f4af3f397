"""The deployment as a user's tools run it, for the tests: the real ``dagster-webserver`` and
``dagster-daemon`` (and the code server the daemon starts) on 127.0.0.1, in temporary
DYNA_HOME / DAGSTER_HOME folders, on the project's own instance config.

Every wait here is a bounded polling loop that fails with the services' log tails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import yaml
from dagster import DagsterInstance

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv's bin: dagster, dagster-webserver, dagster-daemon
INSTANCE_CONFIG = ROOT / "infra/dagster/dagster.yaml"

# localhost only, never through a proxy from the environment
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 60) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(lines[-n:])


def write_instance_config(dagster_home: Path, overrides: Mapping[str, Mapping] | None = None) -> dict:
    """The project's ``infra/dagster/dagster.yaml`` in ``dagster_home``; ``overrides`` replace single
    keys of its top-level sections (each test says why it needs one)."""
    cfg = yaml.safe_load(INSTANCE_CONFIG.read_text())
    for section, values in (overrides or {}).items():
        cfg.setdefault(section, {}).update(values)
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    # The instance's SQLite databases made here, once: the daemon, its code server and a test's own
    # instance otherwise race to make them on first use, and two alembic stamps in schedules.db leave the
    # code location unloadable ("Version table 'alembic_version' has more than one head present"; seen
    # under a loaded full run: the sensors never ticked).
    DagsterInstance.from_config(str(dagster_home)).dispose()
    return cfg


def service_env(dyna_home: Path, dagster_home: Path, code_root: Path = ROOT, **extra: str) -> dict[str, str]:
    """The environment of the webserver / daemon / CLI: the embedded defaults in temporary homes."""
    env = {k: v for k, v in os.environ.items() if k not in ("DYNA_REGISTRY_URL", "DYNA_ENV")}
    env.update(
        PYTHONPATH=str(code_root),
        DYNA_HOME=str(dyna_home),
        DAGSTER_HOME=str(dagster_home),
        CI="1",
        DAGSTER_DISABLE_TELEMETRY="1",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def copy_code(dst: Path) -> Path:
    """A throwaway copy of the project's code (what a deployment of a changed revision runs)."""
    for name in ("dyna_assets", "dyna_resources", "trainer", "infra"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("workspace.yaml", "pyproject.toml"):
        shutil.copyfile(ROOT / name, dst / name)
    return dst


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    deadline_s: float,
    every_s: float = 1.0,
    check: Callable[[], None] | None = None,
    state: Callable[[], object] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy (returned); after ``deadline_s`` fail naming
    ``what`` and the last ``state()``. ``check`` runs on every round (e.g. the services are alive)."""
    deadline = time.monotonic() + deadline_s
    while True:
        if check:
            check()
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {deadline_s:.0f} s; last state: {state() if state else got!r}")
        time.sleep(every_s)


class Services:
    """The webserver and the daemon as subprocesses, each in its own process group (their code
    servers, run workers and transcode pools go with them at teardown)."""

    def __init__(self, tmp: Path, env: dict[str, str], cwd: Path = ROOT):
        self.tmp, self.env, self.cwd = tmp, env, cwd
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.port = free_port()

    def start(self, name: str, argv: list[str]) -> None:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        with open(log, "wb") as f:
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def start_webserver(self) -> None:
        self.start(
            "webserver",
            [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(self.port), "-w", "workspace.yaml"],
        )

    def start_daemon(self) -> None:
        self.start("daemon", [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"])

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """``dagster ARGS`` in the services' environment; a non-zero exit fails with its output."""
        done = subprocess.run(
            [str(BIN / "dagster"), *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert done.returncode == 0, (
            f"dagster {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            assert p.poll() is None, f"{name} exited with {p.returncode}:\n{tail(self.logs[name])}"

    def diagnostics(self) -> str:
        return "\n".join(f"----- {name} log tail -----\n{tail(log)}" for name, log in self.logs.items())

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever is left of the group (code servers, run workers, pool workers)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)

    # -- GraphQL --------------------------------------------------------------------------------
    def gql(self, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with _HTTP.open(req, timeout=timeout) as r:
            out = json.load(r)
        assert not out.get("errors"), f"GraphQL errors: {out['errors']}"
        return out["data"]

    def wait_until_serving(self, deadline_s: float = 120) -> list[dict]:
        """Wait until the webserver answers and the code location loaded; returns the locations."""
        last: list = []

        def loaded():
            try:
                data = self.gql(WORKSPACE, timeout=10)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                last[:] = [repr(e)]
                return None
            ws = data["workspaceOrError"]
            assert ws["__typename"] == "Workspace", ws
            entries = ws["locationEntries"]
            last[:] = entries
            if not entries or not all(e["loadStatus"] == "LOADED" for e in entries):
                return None
            for e in entries:
                loc = e["locationOrLoadError"]
                assert loc["__typename"] == "RepositoryLocation", f"code location {e['name']}: {loc}"
            return entries

        return wait_for(
            "webserver serving the workspace",
            loaded,
            deadline_s=deadline_s,
            every_s=0.5,
            check=self.check_alive,
            state=lambda: last,
        )


WORKSPACE = """
{ workspaceOrError { __typename
    ... on Workspace { locationEntries { name loadStatus
        locationOrLoadError { __typename
          ... on RepositoryLocation { name repositories { name } }
          ... on PythonError { message stack } } } }
    ... on PythonError { message } } }
"""
