"""Warehouse: the registry synced into DuckDB by change-data-capture."""
