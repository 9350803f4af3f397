"""Dagster resources: thin ConfigurableResources over the engines, kept apart from them.

Importing an engine never imports Dagster (the trainer loads the MCAP reader on every
DataLoader worker); only this module and ``dyna_assets`` do. Every resource that needs the
home folder holds a :class:`HomeResource` (nested: bound once, shared by all). No resource reads
the environment: ``dyna_assets.deployment`` resolves every setting, embedded or production, once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource

from trainer.launch import TrainerSettings, TrainingRun, launch_command, plan_run, prepare_run

from .catalog.registry import Registry
from .catalog.warehouse import Warehouse
from .episodes.codec import VideoSettings
from .episodes.read_profile import ReadProfile
from .episodes.read_profiles import resolve as resolve_read_profile
from .episodes.transcode import CRF_BY_SITE, TranscodeSettings
from .home import DEFAULT_ROOT, DynaHome
from .ingest.batches import IngestStores
from .ingest.gates import GateConfig
from .ingest.landing import LandingZone
from .ingest.object_landing import landing_zone
from .ingest.ray_units import UnitResources
from .ingest.tick import EMBEDDED_LANDING, LandingSettings
from .ladders.config import LadderConfig
from .sources import topic_map
from .storage.alluxio import AlluxioConfig, AlluxioFront
from .storage.origins import Origins
from .storage.page_cache import CacheConfig, PageCache
from .storage.prewarm import ReadSet
from .storage.stores import Store

_REGISTRIES: dict[str, Registry] = {}  # one engine (connection pool) per process and URL


class HomeResource(ConfigurableResource):
    """Where a deployment keeps things: the home folder (landing zone, MCAP store, quarantine, curation
    specs, and every embedded default: :class:`~dyna_resources.home.DynaHome`), and the places that
    production moves out of it (registry, manifests, released models)."""

    root: str = DEFAULT_ROOT
    # where manifests go, an fsspec URL (gs://bucket/manifests); empty: <home>/manifests
    manifest_store: str = ""
    # the system of record, a SQLAlchemy URL (postgresql+psycopg2://...); empty: SQLite in the home folder
    registry_url: str = ""
    # where released models go (models/ below it), an fsspec URL; empty: the home folder
    model_store: str = ""
    # The read profile (episodes/read_profiles.py): the training streams transcode writes, what prewarm
    # warms and what the trainer reads, all from this one name. Embedded, or in <home>/read_profiles.yaml.
    read_profile: str = "archive"

    def home(self) -> DynaHome:
        return DynaHome(Path(self.root).resolve()).ensure()

    def manifests_url(self) -> str:
        return self.manifest_store or str(self.home().manifests)

    def manifest_url(self, name: str, suffix: str = ".arrow") -> str:
        """Manifest ``name``'s file with ``suffix`` (``.arrow``: the copy ranks and prewarm load;
        ``.parquet``; ``.json``: its sidecar)."""
        return f"{self.manifests_url().rstrip('/')}/{name}{suffix}"

    def manifest_arrow_url(self, name: str) -> str:
        return self.manifest_url(name, ".arrow")

    def resolved_registry_url(self) -> str:
        return self.registry_url or self.home().registry_url

    def registry(self) -> Registry:
        url = self.resolved_registry_url()
        if url not in _REGISTRIES:
            _REGISTRIES[url] = Registry(url)
        return _REGISTRIES[url]

    def model_store_url(self) -> str:
        return self.model_store or self.home().root.as_uri()

    def profile(self) -> ReadProfile:
        return resolve_read_profile(self.read_profile, Path(self.root).resolve() / "read_profiles.yaml")


class IngestResource(ConfigurableResource):
    """Where ingest reads and writes, and how the landing sensor packs what arrives into work units
    and ingest partitions (the embedded defaults; a deployment's come from ``dyna_assets.deployment``)."""

    home: HomeResource
    target_batch_bytes: int = EMBEDDED_LANDING.target_batch_bytes  # one work unit
    tolerance: float = EMBEDDED_LANDING.tolerance
    max_wait_s: float = EMBEDDED_LANDING.max_wait_s
    max_runs_per_tick: int = EMBEDDED_LANDING.max_runs_per_tick
    scan_limit: int = EMBEDDED_LANDING.scan_limit
    reconcile_every: int = EMBEDDED_LANDING.reconcile_every
    partition_bytes: int = EMBEDDED_LANDING.partition_bytes  # one ingest partition (Dagster partition)
    reconcile_window: int = EMBEDDED_LANDING.reconcile_window
    settle_s: float = EMBEDDED_LANDING.settle_s  # a local/NFS landing zone: seconds a file must stand still
    relook_per_tick: int = EMBEDDED_LANDING.relook_per_tick
    # where a partition's work units run: "ray" (each a Ray task: the embedded default and production) or
    # "process" (one after another in the step's process: engine-level tests)
    units_on: str = "ray"
    # A step whose work units failed only for the machine's sake (a full disk, a store down, workers killed:
    # ingest/faults.py) is run again in the same run after a back-off, doubling from infra_retry_wait_s, up to
    # infra_retries times; then the run fails naming the episodes (still pending) and the instance's run
    # retries take over. Data faults never retry: they are verdicts.
    infra_retries: int = 3
    infra_retry_wait_s: float = 30.0

    @classmethod
    def with_landing(cls, settings: LandingSettings, **fields: Any) -> IngestResource:
        """This resource with every landing setting taken from ``settings``."""
        return cls(**dataclasses.asdict(settings), **fields)

    # Object stores (production, no shared volume): the fleet's bucket and where MCAPs go; local scratch
    # for files being written and raw files being staged. Empty: the home folder's landing/ and mcap/.
    landing_url: str = ""  # gs://fleet-uploads/raw, s3://bucket/raw
    mcap_store: str = ""  # gs://dyna-episodes/mcap, s3://bucket/mcap
    endpoint_url: str = ""  # an S3-compatible landing zone and MCAP store
    scratch_dir: str = ""  # local NVMe; default <home>/scratch

    def stores(self) -> IngestStores:
        home = self.home.home()
        registry = self.home.registry()
        endpoint = self.endpoint_url or None
        landing = landing_zone(self.landing_url, endpoint) if self.landing_url else LandingZone(home.landing)
        topics = topic_map.load(home.root)
        if not self.mcap_store:
            return IngestStores(registry, landing, home.mcap, home.quarantine, topics=topics)
        scratch = Path(self.scratch_dir) if self.scratch_dir else home.scratch
        return IngestStores(
            registry,
            landing,
            scratch / "mcap",
            scratch / "quarantine",
            mcap_store=self.mcap_store,
            endpoint_url=endpoint,
            topics=topics,
        )

    def landing_settings(self) -> LandingSettings:
        return LandingSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LandingSettings)})

    def units_on_ray(self) -> bool:
        if self.units_on not in ("ray", "process"):
            raise ValueError(f"IngestResource.units_on={self.units_on!r}: expected 'ray' or 'process'")
        return self.units_on == "ray"


class WarehouseResource(ConfigurableResource):
    """The DuckDB warehouse file (default ``<home>/warehouse.duckdb``); one writer at a time."""

    home: HomeResource
    path: str = ""

    def open(self, read_only: bool = False) -> Warehouse:
        return Warehouse(self.path or str(self.home.home().warehouse), read_only=read_only)


class GatesResource(ConfigurableResource):
    """Which quality gates run and what they do, chosen at launch: a gates file (default
    ``<home>/gates.yaml`` when present) with run-config overrides on top, e.g.
    ``{dead_camera: false, min_duration: {params: {min_s: 5}}, frame_drops: {action: quarantine}}``."""

    home: HomeResource
    file: str = ""
    gates: dict[str, Any] = {}

    def config(self) -> GateConfig:
        if self.file:  # named explicitly: it must exist
            return GateConfig.load(self.file, self.gates, required=True)
        return GateConfig.load(self.home.home().gates_file, self.gates)


class LadderResource(ConfigurableResource):
    """The step-ladder segmenter's configuration: a file (default ``<home>/step_ladders.yaml``
    when present) over the embedded defaults, and how many ladders per batch are drawn."""

    home: HomeResource
    file: str = ""
    pictures: int = 3

    def config(self) -> LadderConfig:
        if self.file and not Path(self.file).is_file():
            raise FileNotFoundError(f"step ladder config {self.file} does not exist")
        return LadderConfig.load(self.file or self.home.home().ladders_file)


class TranscodeResource(ConfigurableResource):
    """Transcode settings and the worker pool size (0: one worker per core)."""

    gop_frames: int = VideoSettings.gop_frames
    crf: float = VideoSettings.crf
    crf_by_site: dict[str, float] = dict(CRF_BY_SITE)  # already-compressed sources (LeRobot imports) need a lower CRF
    preset: str = VideoSettings.preset
    x264_options: str = VideoSettings.x264_options  # extra x264-params after the preset's (benchmarks encode)
    workers: int = 0  # episode processes at once when units run in the step's process
    max_cpu_s: float = 0.0  # CPU seconds one episode may take before its worker is stopped (0: no limit)
    stall_s: float = TranscodeSettings.stall_s  # seconds of no CPU at all after which a worker is killed as stuck
    # on Ray, what each work unit asks for: its CPUs (= its episode processes at once) and memory
    unit_cpus: int = 1
    unit_memory_gb: float = 4.0

    def settings(self, profile: ReadProfile) -> TranscodeSettings:
        """The transcode of episodes laid out as ``profile`` says (HomeResource.profile)."""
        return TranscodeSettings(
            video=VideoSettings(
                gop_frames=self.gop_frames, crf=self.crf, preset=self.preset, x264_options=self.x264_options
            ),
            profile=profile,
            crf_by_site=tuple(sorted(self.crf_by_site.items())),
            max_cpu_s=self.max_cpu_s,
            stall_s=self.stall_s,
        )

    def pool_size(self) -> int:
        return self.workers or os.cpu_count() or 1

    def unit_resources(self) -> UnitResources:
        return UnitResources(num_cpus=self.unit_cpus, memory=int(self.unit_memory_gb * (1 << 30)))


class CacheResource(ConfigurableResource):
    """The node-local page cache and how a run's working set is read. Empty ``root``: ``<home>/page-cache``;
    ``capacity_gb`` 0: 16 GiB. ``origin_routes`` and ``s3_endpoint_url`` say where other origins are
    read (``storage.origins``); ``alluxio`` (the ``DYNA_ALLUXIO_*`` settings, ``storage.alluxio``) makes
    prewarm an Alluxio load job at cluster scale."""

    home: HomeResource
    root: str = ""
    capacity_gb: float = 0.0
    page_mb: float = 4.0
    quotas_gb: dict[str, float] = {}
    ttl_s: float = 0.0  # 0: pages do not expire
    parallel: int = 16
    origin_routes: str = ""  # logical=physical[,logical=physical...]
    s3_endpoint_url: str = ""  # every s3:// origin is at this S3-compatible endpoint
    alluxio: dict[str, str] = {}  # DYNA_ALLUXIO_<NAME> settings by their full variable names

    def root_dir(self) -> str:
        return self.root or str(self.home.home().page_cache)

    def cache(self) -> PageCache:
        config: dict[str, Any] = {
            "root": self.root_dir(),
            "page_size": int(self.page_mb * (1 << 20)),
            "quotas": {k: int(v * (1 << 30)) for k, v in self.quotas_gb.items()},
        }
        if self.capacity_gb:
            config["capacity_bytes"] = int(self.capacity_gb * (1 << 30))
        if self.ttl_s:
            config["ttl_s"] = self.ttl_s
        return PageCache(CacheConfig(**config), Origins.from_settings(self.origin_routes, self.s3_endpoint_url))

    def read_set(self) -> ReadSet:
        """What a training run reads of each segment: the topic groups and video of the read profile."""
        profile = self.home.profile()
        return ReadSet(groups=profile.reads, profile=profile, video_stream=profile.read_stream)

    def alluxio_front(self) -> AlluxioFront | None:
        """An ``AlluxioFront`` when ``alluxio`` configures a cluster, else None."""
        config = AlluxioConfig.from_env({**self.alluxio, "DYNA_S3_ENDPOINT_URL": self.s3_endpoint_url})
        return AlluxioFront(config) if config else None


class ReplicaResource(ConfigurableResource):
    """The second, neutral origin (S3-compatible) that datasets are copied to. Empty ``target``:
    ``<home>/replica`` (a local stand-in for the embedded defaults); empty ``source_prefix``: the
    home's MCAP store."""

    home: HomeResource
    target: str = ""
    endpoint_url: str = ""
    source_prefix: str = ""

    def store(self) -> Store:
        target = self.target or str(self.home.home().replica)
        endpoint = self.endpoint_url or None
        return Store.from_url(target, endpoint_url=endpoint if target.startswith("s3://") else None)

    def source(self) -> str:
        return self.source_prefix or self.home.home().mcap.resolve().as_uri()


class TrainerResource(ConfigurableResource):
    """How a ``checkpoints`` partition trains and how the trainer is launched (``trainer.launch``):
    a local ``torchrun`` (``nproc_per_node`` processes, ``max_restarts`` in-place restarts) by default,
    or Slurm. Every field is a :class:`~trainer.launch.TrainerSettings` field, documented there."""

    nproc_per_node: int = TrainerSettings.nproc_per_node
    max_restarts: int = TrainerSettings.max_restarts
    launcher: str = TrainerSettings.launcher
    slurm_partition: str = TrainerSettings.slurm_partition
    slurm_nodes: int = TrainerSettings.slurm_nodes
    slurm_gpus_per_node: int = TrainerSettings.slurm_gpus_per_node
    slurm_time_limit: str = TrainerSettings.slurm_time_limit
    slurm_max_attempts: int = TrainerSettings.slurm_max_attempts
    omp_num_threads: int = TrainerSettings.omp_num_threads
    steps: int = TrainerSettings.steps
    batch_size: int = TrainerSettings.batch_size
    workers: int = TrainerSettings.workers
    checkpoint_every: int = TrainerSettings.checkpoint_every
    keep_checkpoints: int = TrainerSettings.keep_checkpoints
    checkpoint_store: str = TrainerSettings.checkpoint_store
    all_checkpoints_damaged: str = TrainerSettings.all_checkpoints_damaged
    optimizer_mode: str = TrainerSettings.optimizer_mode
    loader: str = TrainerSettings.loader
    anchors: str = TrainerSettings.anchors
    anchor_every_s: float = TrainerSettings.anchor_every_s
    mix_units: float = TrainerSettings.mix_units
    bad_samples: str = TrainerSettings.bad_samples
    shards: int = TrainerSettings.shards
    seed: int = TrainerSettings.seed
    dataset: str = TrainerSettings.dataset

    def settings(self, profile: ReadProfile | None = None) -> TrainerSettings:
        """The trainer's settings; what it reads (stream, output size) from ``profile`` (HomeResource.profile)."""
        fields = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(TrainerSettings) if f.name != "read_profile"
        }
        return TrainerSettings(**fields, read_profile=profile or TrainerSettings.read_profile)

    def launch_command(self, config_path: Path) -> list[str]:
        return launch_command(self.settings(), config_path)

    def prepare(self, home: HomeResource, cache: CacheResource, partition: str) -> TrainingRun:
        """The run of curation spec ``partition`` on its current manifest (or on ``dataset``), ready to launch."""
        return prepare_run(*self._run_of(home, cache, partition))

    def run_dir(self, home: HomeResource, cache: CacheResource, partition: str) -> Path:
        """The run folder ``prepare`` would use for ``partition`` now (nothing written)."""
        return Path(plan_run(*self._run_of(home, cache, partition)).run_dir)

    def _run_of(self, home: HomeResource, cache: CacheResource, partition: str) -> tuple:
        """The arguments of ``plan_run``/``prepare_run`` for ``partition`` in this deployment."""
        return (
            self.settings(home.profile()),
            home.home(),
            partition,
            home.manifest_arrow_url(partition),
            home.resolved_registry_url(),
            cache.root_dir(),
        )
