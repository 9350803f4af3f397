"""Where the embedded defaults keep their files: one local home folder.

``DYNA_HOME`` (default ``.dyna`` in the current directory; ignored by git) holds::

    landing/     raw episodes as they arrive (legacy HDF5)
    mcap/        transcoded episodes, one MCAP file each
    curation/    curation specs (YAML), one per training set: one manifests partition each
      datasets/  dataset declarations (name, version, notes), one per curation spec
    manifests/   manifests written from them (Parquet + Arrow IPC + JSON sidecar)
    quarantine/  MCAPs held back by a post-transform gate (reasons are in the registry)
    page-cache/  the node-local page cache (cache_sets prewarms it, training reads through it)
    node-cache/  each node's verified local copy of the manifests its ranks map
    runs/        training runs: runs/<curation spec>/<run key>/ (config, checkpoints, attempts)
    replica/     the second origin's local stand-in (mcap_replica)
    scratch/     files being written and raw files being staged, when MCAPs go to an object store
    models/      released model weights, when no model store is configured
    gates.yaml, step_ladders.yaml   optional overrides of the quality gates and the ladder segmenter
    read_profiles.yaml   optional read profiles beside the embedded ones (episodes/read_profiles.py)
    registry.sqlite   the registry (system of record) of the embedded default
    warehouse.duckdb  the analytic warehouse (DuckDB), kept in sync with the registry by CDC
    dagster/     DAGSTER_HOME of the embedded Dagster instance (runs, event log, storage)

Every path under the home folder is a property here: nothing else spells these names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .keys import check_key

DEFAULT_ROOT = ".dyna"


@dataclass(frozen=True)
class DynaHome:
    root: Path

    @classmethod
    def from_env(cls) -> DynaHome:
        """``$DYNA_HOME``, else ``./.dyna``: for entry points outside Dagster (the CLI, the demo's set-up).
        The Dagster layer gets its home from ``dyna_assets.deployment``."""
        return cls(Path(os.environ.get("DYNA_HOME", DEFAULT_ROOT)).resolve())

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def mcap(self) -> Path:
        return self.root / "mcap"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def curation(self) -> Path:
        return self.root / "curation"

    def curation_spec(self, name: str) -> Path:
        """The file of curation spec ``name`` (a manifests partition key), refused unless a safe key."""
        return self.curation / f"{check_key(name, 'curation spec')}.yaml"

    @property
    def dataset_declarations(self) -> Path:
        return self.curation / "datasets"

    def dataset_declaration(self, spec: str) -> Path:
        """The dataset declaration of curation spec ``spec`` (a manifests partition key)."""
        return self.dataset_declarations / f"{check_key(spec, 'curation spec')}.yaml"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def registry_sqlite(self) -> Path:
        return self.root / "registry.sqlite"

    @property
    def registry_url(self) -> str:
        """The embedded registry's SQLAlchemy URL."""
        return f"sqlite:///{self.registry_sqlite}"

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    @property
    def page_cache(self) -> Path:
        return self.root / "page-cache"

    @property
    def node_cache(self) -> Path:
        return self.root / "node-cache"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_dir(self, spec: str, key: str) -> Path:
        """The folder of training run ``key`` of curation spec ``spec``."""
        return self.runs / check_key(spec, "curation spec") / check_key(key, "run key")

    @property
    def replica(self) -> Path:
        return self.root / "replica"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def gates_file(self) -> Path:
        return self.root / "gates.yaml"

    @property
    def ladders_file(self) -> Path:
        return self.root / "step_ladders.yaml"

    @property
    def read_profiles_file(self) -> Path:
        return self.root / "read_profiles.yaml"

    @property
    def dagster(self) -> Path:
        return self.root / "dagster"

    def ensure(self) -> DynaHome:
        for p in (self.landing, self.mcap, self.quarantine, self.curation, self.manifests, self.dagster):
            p.mkdir(parents=True, exist_ok=True)
        return self
