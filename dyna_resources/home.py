"""Where the embedded defaults keep their files: one local home folder.

``DYNA_HOME`` (default ``.dyna`` in the current directory; ignored by git) holds::

    landing/     raw episodes as they arrive (legacy HDF5)
    mcap/        transcoded episodes, one MCAP file each
    curation/    curation specs (YAML), one per training set: one manifests partition each
    manifests/   manifests written from them (Parquet + Arrow IPC + JSON sidecar)
    quarantine/  MCAPs held back by a post-transform gate (reasons are in the registry)
    registry.sqlite  the registry (system of record) of the embedded default
    dagster/     DAGSTER_HOME of the embedded Dagster instance (runs, event log, storage)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .keys import check_key


@dataclass(frozen=True)
class DynaHome:
    root: Path

    @classmethod
    def from_env(cls) -> DynaHome:
        return cls(Path(os.environ.get("DYNA_HOME", ".dyna")).resolve())

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
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def dagster(self) -> Path:
        return self.root / "dagster"

    def ensure(self) -> DynaHome:
        for p in (self.landing, self.mcap, self.quarantine, self.curation, self.manifests, self.dagster):
            p.mkdir(parents=True, exist_ok=True)
        return self
