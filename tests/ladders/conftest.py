from tests.ingest.conftest import stores  # noqa: F401  (fixture: ingest stores on SQLite and a real PostgreSQL)
