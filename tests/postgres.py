"""Fixtures shared by the registry and ingest tests: the same tests run against SQLite and a real PostgreSQL.

``postgres_url`` starts a throwaway PostgreSQL cluster once per test session (per xdist
worker, ``dyna_resources/catalog/pg_server.py``); ``registry`` hands
every test a fresh, empty registry on each backend (a new SQLite file, or a new database
on that cluster).
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.engine import make_url

from dyna_resources.catalog import pg_server
from dyna_resources.catalog.registry import Registry

PG_USER = pg_server.USER
_admin_connect = pg_server.admin_connect


@pytest.fixture(scope="session")
def postgres_url():
    try:
        with pg_server.throwaway_postgres(durable=False) as url:  # fsync off: tests assert results, not speed
            yield url
    except pg_server.PostgresUnavailable as e:
        pytest.skip(f"{e}: the registry tests run against SQLite only")


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
                cur.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", (name,)
                )  # a database with a slot cannot be dropped
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        conn.close()
