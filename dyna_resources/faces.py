"""Dagster faces of the engines: thin ConfigurableResources, kept apart from the engines.

Importing an engine never imports Dagster (the trainer loads the MCAP reader on every
DataLoader worker); only this module and ``dyna_assets`` do. Every field has an embedded
default; production switches by environment variables (``DYNA_HOME``, ``DYNA_REGISTRY_URL``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource

from .catalog.registry import Registry, registry_url_from_env
from .catalog.warehouse import Warehouse
from .episodes.codec import VideoSettings
from .episodes.transcode import TranscodeSettings
from .home import DynaHome
from .ingest.batches import IngestStores
from .ingest.gates import GateConfig
from .ingest.landing import LandingZone
from .ingest.tick import LandingSettings
from .storage.origins import Origins
from .storage.page_cache import CacheConfig, PageCache
from .storage.prewarm import ReadSet
from .storage.stores import Store

_REGISTRIES: dict[str, Registry] = {}  # one engine (connection pool) per process and URL


class HomeResource(ConfigurableResource):
    """The embedded defaults' folder (landing zone, MCAP store, quarantine, registry)."""

    root: str = ""  # empty: $DYNA_HOME, else ./.dyna
    # where manifests go, an fsspec URL (gs://bucket/manifests); empty: $DYNA_MANIFEST_STORE, else <home>/manifests
    manifest_store: str = ""

    def home(self) -> DynaHome:
        return (DynaHome(Path(self.root).resolve()) if self.root else DynaHome.from_env()).ensure()

    def manifests_url(self) -> str:
        return self.manifest_store or os.environ.get("DYNA_MANIFEST_STORE") or str(self.home().manifests)

    def manifest_arrow_url(self, name: str) -> str:
        """The Arrow IPC copy of manifest ``name`` (what ranks and prewarm load)."""
        return f"{self.manifests_url().rstrip('/')}/{name}.arrow"


class RegistryResource(ConfigurableResource):
    """The system of record. Empty url: ``$DYNA_REGISTRY_URL``, else SQLite in the home folder."""

    url: str = ""
    home_root: str = ""

    def registry(self) -> Registry:
        url = self.url or registry_url_from_env(HomeResource(root=self.home_root).home().root)
        if url not in _REGISTRIES:
            _REGISTRIES[url] = Registry(url)
        return _REGISTRIES[url]


class IngestResource(ConfigurableResource):
    """Where ingest reads and writes, and how the landing sensor batches what arrives."""

    home_root: str = ""
    registry_url: str = ""
    target_batch_bytes: int = LandingSettings.target_batch_bytes
    tolerance: float = LandingSettings.tolerance
    max_wait_s: float = LandingSettings.max_wait_s
    max_runs_per_tick: int = LandingSettings.max_runs_per_tick
    scan_limit: int = LandingSettings.scan_limit
    reconcile_every: int = LandingSettings.reconcile_every

    def stores(self) -> IngestStores:
        home = HomeResource(root=self.home_root).home()
        registry = RegistryResource(url=self.registry_url, home_root=self.home_root).registry()
        return IngestStores(registry, LandingZone(home.landing), home.mcap, home.quarantine)

    def landing_settings(self) -> LandingSettings:
        return LandingSettings(self.target_batch_bytes, self.tolerance, self.max_wait_s, self.max_runs_per_tick,
                               self.scan_limit, self.reconcile_every)


class WarehouseResource(ConfigurableResource):
    """The DuckDB warehouse file (default ``$DYNA_HOME/warehouse.duckdb``); one writer at a time."""

    path: str = ""
    home_root: str = ""

    def open(self, read_only: bool = False) -> Warehouse:
        path = self.path or str(HomeResource(root=self.home_root).home().root / "warehouse.duckdb")
        return Warehouse(path, read_only=read_only)


class GatesResource(ConfigurableResource):
    """Which quality gates run and what they do, chosen at launch: a gates file (default
    ``$DYNA_HOME/gates.yaml`` when present) with run-config overrides on top, e.g.
    ``{dead_camera: false, min_duration: {params: {min_s: 5}}, frame_drops: {action: quarantine}}``."""

    file: str = ""
    gates: dict[str, Any] = {}

    def config(self) -> GateConfig:
        if self.file:  # named explicitly: it must exist
            return GateConfig.load(self.file, self.gates, required=True)
        return GateConfig.load(DynaHome.from_env().root / "gates.yaml", self.gates)


class TranscodeResource(ConfigurableResource):
    """Transcode settings and the worker pool size (0: one worker per core)."""

    gop_frames: int = VideoSettings.gop_frames
    crf: float = VideoSettings.crf
    preset: str = VideoSettings.preset
    workers: int = 0

    def settings(self) -> TranscodeSettings:
        return TranscodeSettings(video=VideoSettings(gop_frames=self.gop_frames, crf=self.crf, preset=self.preset))

    def pool_size(self) -> int:
        return self.workers or os.cpu_count() or 1


class CacheResource(ConfigurableResource):
    """The node-local page cache and how a run's working set is read. Empty fields fall back to
    ``$DYNA_CACHE_DIR`` (else ``<home>/page-cache``), ``$DYNA_CACHE_CAPACITY_GB`` (else 16),
    ``$DYNA_ORIGIN_ROUTES`` and ``$DYNA_S3_ENDPOINT_URL`` (reading another origin, see
    ``storage.origins``). At cluster scale, ``$DYNA_ALLUXIO_*`` makes prewarm an Alluxio load job."""

    root: str = ""
    home_root: str = ""
    capacity_gb: float = 0.0
    page_mb: float = 4.0
    quotas_gb: dict[str, float] = {}
    ttl_s: float = 0.0  # 0: pages do not expire
    groups: list[str] = ["cameras", "proprio"]  # topic groups a training sample reads
    parallel: int = 16

    def cache(self) -> PageCache:
        home = HomeResource(root=self.home_root).home()
        overrides: dict[str, Any] = {"page_size": int(self.page_mb * (1 << 20)),
                                     "quotas": {k: int(v * (1 << 30)) for k, v in self.quotas_gb.items()}}
        if self.root:
            overrides["root"] = self.root
        if self.capacity_gb:
            overrides["capacity_bytes"] = int(self.capacity_gb * (1 << 30))
        if self.ttl_s:
            overrides["ttl_s"] = self.ttl_s
        return PageCache(CacheConfig.from_env(home.root / "page-cache", **overrides), Origins.from_env())

    def read_set(self) -> ReadSet:
        return ReadSet(groups=tuple(self.groups))

    def alluxio(self):
        """An ``AlluxioFront`` when ``$DYNA_ALLUXIO_*`` configures a cluster, else None."""
        from .storage.alluxio import AlluxioConfig, AlluxioFront

        config = AlluxioConfig.from_env()
        return AlluxioFront(config) if config else None


class ReplicaResource(ConfigurableResource):
    """The second, neutral origin (S3-compatible) that datasets are copied to. Empty ``target``:
    ``$DYNA_REPLICA_STORE``, else ``<home>/replica`` (a local stand-in for the embedded defaults);
    empty ``endpoint_url``: ``$DYNA_S3_ENDPOINT_URL``; empty ``source_prefix``: the home's MCAP store."""

    target: str = ""
    endpoint_url: str = ""
    source_prefix: str = ""
    home_root: str = ""

    def store(self) -> Store:
        home = HomeResource(root=self.home_root).home()
        target = self.target or os.environ.get("DYNA_REPLICA_STORE") or str(home.root / "replica")
        endpoint = self.endpoint_url or os.environ.get("DYNA_S3_ENDPOINT_URL") or None
        return Store.from_url(target, endpoint_url=endpoint if target.startswith("s3://") else None)

    def source(self) -> str:
        return self.source_prefix or HomeResource(root=self.home_root).home().mcap.resolve().as_uri()
