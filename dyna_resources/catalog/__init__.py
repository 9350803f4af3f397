"""The catalog: the registry (system of record), its CDC into the DuckDB warehouse, curation specs and
manifests, the dataset registry and run leases (docs/catalog.md)."""
