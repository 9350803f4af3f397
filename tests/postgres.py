"""Fixtures shared by the registry and ingest tests: the same tests run against SQLite and a real PostgreSQL.

``postgres_url`` starts a throwaway PostgreSQL cluster once per test session (per xdist
worker) from the server binaries in /usr/lib/postgresql/<version>/bin; ``registry`` hands
every test a fresh, empty registry on each backend (a new SQLite file, or a new database
on that cluster).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from dyna_resources.catalog.registry import Registry

PG_USER = "dyna"
PG_DB = "dyna_test"


def _pg_bindir() -> Path | None:
    """The bin folder of the newest PostgreSQL installed under /usr/lib/postgresql, if any."""
    found = []
    for d in glob.glob("/usr/lib/postgresql/*/bin"):
        ver = Path(d).parent.name
        if not re.fullmatch(r"\d+(\.\d+)*", ver):
            continue
        if os.access(Path(d) / "initdb", os.X_OK) and os.access(Path(d) / "pg_ctl", os.X_OK):
            found.append((tuple(int(x) for x in ver.split(".")), Path(d)))
    return max(found)[1] if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _admin_connect(port: int, dbname: str = "postgres"):
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, dbname=dbname, connect_timeout=10)
    conn.autocommit = True
    return conn


@pytest.fixture(scope="session")
def postgres_url():
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                    "(install postgresql-15 to run the registry tests against PostgreSQL)")
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:  # initdb refuses to run as root: run the server as the postgres user
        import pwd

        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root and runuser is not available to drop to the 'postgres' user")
        prefix = [runuser, "-u", "postgres", "--"]

    tmp = Path(tempfile.mkdtemp(prefix="dyna-pg-"))
    data, sock, log = tmp / "data", tmp / "sock", tmp / "server.log"
    data.mkdir()
    sock.mkdir()
    if as_root:
        for p in (tmp, data, sock):
            os.chown(p, pg.pw_uid, pg.pw_gid)
    # The server (and its tools) must be able to stat their working directory.
    run = dict(cwd=tmp, capture_output=True, text=True, timeout=120)

    def pg_ctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), *args], **run)

    started = False
    try:
        r = subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", PG_USER,
                            "--no-sync", "-E", "UTF8"], **run)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        for _attempt in range(3):  # another process may grab the free port before the server binds it
            port = _free_port()
            opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} "
                    f"-c fsync=off -c full_page_writes=off "
                    f"-c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=8")  # CDC
            r = pg_ctl("-o", opts, "-l", str(log), "-w", "-t", "60", "start")
            if r.returncode == 0:
                started = True
                break
        if not started:
            server_log = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed ({r.returncode}):\n{r.stdout}\n{r.stderr}\n{server_log}")
        conn = _admin_connect(port)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {PG_DB}")
        finally:
            conn.close()
        yield f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{port}/{PG_DB}"
    finally:
        if started:
            pg_ctl("stop", "-m", "immediate", "-w")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    """A fresh, empty Registry on each backend."""
    if request.param == "sqlite":
        reg = Registry(f"sqlite:///{tmp_path / 'registry.sqlite'}")
        try:
            yield reg
        finally:
            reg.close()
        return

    url = make_url(request.getfixturevalue("postgres_url"))
    name = f"dyna_t_{uuid.uuid4().hex[:16]}"
    conn = _admin_connect(url.port)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")  # name is generated here, never from input
        reg = Registry(url.set(database=name).render_as_string(hide_password=False))
        try:
            yield reg
        finally:
            reg.close()
            with conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE database = %s", (name,))  # a database with a slot cannot be dropped
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        conn.close()
