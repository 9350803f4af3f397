"""A throwaway PostgreSQL server for tests and benchmarks: a fresh cluster on a temporary folder,
listening on a free loopback port, with logical decoding on (the warehouse's CDC), stopped and
deleted on exit. Uses Debian's server binaries (/usr/lib/postgresql/<version>/bin, the newest);
as root, the server runs as the ``postgres`` user (initdb refuses root).

``durable=False`` (the tests) turns fsync off; the benchmarks keep PostgreSQL's defaults, so a
commit costs what it costs in production.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

USER = "dyna"
DATABASE = "dyna_test"


class PostgresUnavailable(RuntimeError):
    """The server cannot be started here (no binaries, no user to run it as): the reason says why."""


def bindir() -> Path | None:
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


def admin_connect(port: int, dbname: str = "postgres"):
    """An autocommit psycopg2 connection as the cluster's superuser."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=USER, dbname=dbname, connect_timeout=10)
    conn.autocommit = True
    return conn


@contextmanager
def throwaway_postgres(*, durable: bool = True, parent: str | None = None) -> Iterator[str]:
    """Start a cluster, create database ``dyna_test``, yield its SQLAlchemy URL; stop and delete it on exit."""
    bins = bindir()
    if bins is None:
        raise PostgresUnavailable(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (install postgresql-15)"
        )
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:
        import pwd

        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailable("running as root and there is no 'postgres' user to run the server as") from None
        runuser = shutil.which("runuser")
        if runuser is None:
            raise PostgresUnavailable("running as root and runuser is not available to drop to the 'postgres' user")
        prefix = [runuser, "-u", "postgres", "--"]

    tmp = Path(tempfile.mkdtemp(prefix="dyna-pg-", dir=parent))
    data, sock, log = tmp / "data", tmp / "sock", tmp / "server.log"
    data.mkdir()
    sock.mkdir()
    if as_root:
        for p in (tmp, data, sock):
            os.chown(p, pg.pw_uid, pg.pw_gid)
    # subprocess.run's keyword arguments; the tools must be able to stat their cwd
    run: dict[str, Any] = dict(cwd=tmp, capture_output=True, text=True, timeout=120)

    def pg_ctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, str(bins / "pg_ctl"), "-D", str(data), *args], **run)

    started = False
    try:
        r = subprocess.run(
            [*prefix, str(bins / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8"],
            **run,
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        for _attempt in range(3):  # another process may grab the free port before the server binds it
            port = _free_port()
            opts = (
                f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} "
                + ("" if durable else "-c fsync=off -c full_page_writes=off ")
                + "-c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=8"
            )  # CDC
            r = pg_ctl("-o", opts, "-l", str(log), "-w", "-t", "60", "start")
            if r.returncode == 0:
                started = True
                break
        if not started:
            server_log = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed ({r.returncode}):\n{r.stdout}\n{r.stderr}\n{server_log}")
        conn = admin_connect(port)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {DATABASE}")
        finally:
            conn.close()
        yield f"postgresql+psycopg2://{USER}@127.0.0.1:{port}/{DATABASE}"
    finally:
        if started:
            pg_ctl("stop", "-m", "immediate", "-w")
        shutil.rmtree(tmp, ignore_errors=True)
