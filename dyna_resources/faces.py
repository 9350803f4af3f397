"""Dagster faces of the engines: thin ConfigurableResources, kept apart from the engines.

Importing an engine never imports Dagster (the trainer loads the MCAP reader on every
DataLoader worker); only this module and ``dyna_assets`` do. Every field has an embedded
default; production switches by environment variables (``DYNA_HOME``, ``DYNA_REGISTRY_URL``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource

from .catalog.registry import Registry, registry_url_from_env
from .catalog.warehouse import Warehouse
from .episodes.codec import VideoSettings
from .episodes.transcode import CRF_BY_SITE, TranscodeSettings
from .home import DynaHome
from .ingest.batches import IngestStores
from .ingest.gates import GateConfig
from .ingest.landing import LandingZone
from .ingest.object_landing import landing_zone
from .ingest.ray_units import UnitResources
from .ingest.tick import EMBEDDED_LANDING, LandingSettings
from .ladders.config import LadderConfig
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
    """Where ingest reads and writes, and how the landing sensor packs what arrives into work units
    and ingest partitions (the embedded defaults; a deployment's come from ``dyna_assets.deployment``)."""

    home_root: str = ""
    registry_url: str = ""
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
        home = HomeResource(root=self.home_root).home()
        registry = RegistryResource(url=self.registry_url, home_root=self.home_root).registry()
        endpoint = self.endpoint_url or None
        landing = landing_zone(self.landing_url, endpoint) if self.landing_url else LandingZone(home.landing)
        if not self.mcap_store:
            return IngestStores(registry, landing, home.mcap, home.quarantine)
        scratch = Path(self.scratch_dir) if self.scratch_dir else home.root / "scratch"
        return IngestStores(registry, landing, scratch / "mcap", scratch / "quarantine", mcap_store=self.mcap_store,
                            endpoint_url=endpoint)

    def landing_settings(self) -> LandingSettings:
        return LandingSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LandingSettings)})

    def units_on_ray(self) -> bool:
        if self.units_on not in ("ray", "process"):
            raise ValueError(f"IngestResource.units_on={self.units_on!r}: expected 'ray' or 'process'")
        return self.units_on == "ray"


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


class LadderResource(ConfigurableResource):
    """The step-ladder segmenter's configuration: a file (default ``$DYNA_HOME/step_ladders.yaml``
    when present) over the embedded defaults, and how many ladders per batch are drawn."""

    file: str = ""
    pictures: int = 3

    def config(self) -> LadderConfig:
        if self.file and not Path(self.file).is_file():
            raise FileNotFoundError(f"step ladder config {self.file} does not exist")
        return LadderConfig.load(self.file or DynaHome.from_env().root / "step_ladders.yaml")


class TranscodeResource(ConfigurableResource):
    """Transcode settings and the worker pool size (0: one worker per core)."""

    gop_frames: int = VideoSettings.gop_frames
    crf: float = VideoSettings.crf
    crf_by_site: dict[str, float] = dict(CRF_BY_SITE)  # already-compressed sources (LeRobot imports) need a lower CRF
    preset: str = VideoSettings.preset
    x264_options: str = VideoSettings.x264_options  # extra x264-params after the preset's (benchmarks encode)
    workers: int = 0  # episode processes at once when units run in the step's process
    max_cpu_s: float = 0.0  # CPU seconds one episode may take before its worker is stopped (0: no limit)
    # on Ray, what each work unit asks for: its CPUs (= its episode processes at once) and memory
    unit_cpus: int = 1
    unit_memory_gb: float = 4.0

    def settings(self) -> TranscodeSettings:
        return TranscodeSettings(video=VideoSettings(gop_frames=self.gop_frames, crf=self.crf, preset=self.preset,
                                                     x264_options=self.x264_options),
                                 crf_by_site=tuple(sorted(self.crf_by_site.items())), max_cpu_s=self.max_cpu_s)

    def pool_size(self) -> int:
        return self.workers or os.cpu_count() or 1

    def unit_resources(self) -> UnitResources:
        return UnitResources(num_cpus=self.unit_cpus, memory=int(self.unit_memory_gb * (1 << 30)))


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
    video_stream: str = ""  # the video training reads: "" the archive cameras, else a training stream's name
    # (TrainerResource.read_stream: set both to the same name)
    parallel: int = 16

    def root_dir(self) -> str:
        if self.root:
            return self.root
        return CacheConfig.from_env(HomeResource(root=self.home_root).home().root / "page-cache").root

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
        return ReadSet(groups=tuple(self.groups), video_stream=self.video_stream or None)

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


@dataclass
class TrainingRun:
    run_dir: Path
    config: dict
    command: list[str]
    env: dict[str, str]
    resuming: bool


class TrainerResource(ConfigurableResource):
    """How a ``checkpoints`` partition trains, and how the trainer is launched: a local ``torchrun``
    (``nproc_per_node`` processes, ``max_restarts`` in-place restarts) by default. Production
    launchers (Slurm, Kubernetes) replace ``launch_command``; the trainer is the same. The run folder
    is keyed by the manifest's hash and the config, so materializing again with the same inputs
    resumes (or finds finished) the same run, and any change starts a new one."""

    nproc_per_node: int = 1
    max_restarts: int = 2
    launcher: str = "torchrun"  # torchrun (local) | slurm (sbatch --wait of infra/slurm/train.sbatch.j2)
    slurm_partition: str = ""
    slurm_nodes: int = 1
    slurm_gpus_per_node: int = 8
    slurm_time_limit: str = ""
    slurm_max_attempts: int = 3  # whole-job requeues, each resuming from the latest checkpoint
    steps: int = 60
    batch_size: int = 8
    workers: int = 1
    checkpoint_every: int = 20
    keep_checkpoints: int = 3
    checkpoint_store: str = ""  # empty: $DYNA_CHECKPOINT_STORE, else checkpoints stay in the run folder
    # checkpoints exist but none is intact: "error" fails the run naming the damaged files, "start_fresh"
    # trains the same run folder from step 0 (TrainConfig.all_checkpoints_damaged; not part of the run's key)
    all_checkpoints_damaged: str = "error"
    optimizer_mode: str = "auto"
    image_size: int = 64
    # How samples are read: "gop" (each GOP window decoded once for every sample in it) or "random"
    # (fully random, live GOP decoders per episode); where they sit: "end" (one per segment) or "every"
    # (one every anchor_every_s inside each segment); read_stream: a training stream's name ("" = archive).
    loader: str = "gop"
    anchors: str = "end"
    anchor_every_s: float = 0.1
    mix_units: float = 3.0
    read_stream: str = ""
    seed: int = 0
    dataset: str = ""  # name@version from the dataset registry; empty: the partition's current manifest

    def launch_command(self, config_path: Path) -> list[str]:
        if self.launcher == "slurm":
            from infra.slurm.launcher import SlurmLauncher, launch_command

            slurm = SlurmLauncher(partition=self.slurm_partition, nodes=self.slurm_nodes,
                                  gpus_per_node=self.slurm_gpus_per_node, time_limit=self.slurm_time_limit,
                                  max_attempts=self.slurm_max_attempts, in_place_restarts=self.max_restarts,
                                  workdir=str(Path(__file__).resolve().parent.parent))
            return launch_command(config_path, config_path.parent, slurm)
        if self.launcher != "torchrun":
            raise ValueError(f"launcher {self.launcher!r}: expected 'torchrun' or 'slurm'")
        train = ["-m", "trainer.train", "--config", str(config_path)]
        if self.nproc_per_node == 1 and self.max_restarts == 0:
            return [sys.executable, *train]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.nproc_per_node}",
                f"--max-restarts={self.max_restarts}", *train]

    def prepare(self, home: HomeResource, cache: CacheResource, partition: str) -> TrainingRun:
        from trainer.dataset import SampleSpec
        from trainer.manifest_loader import local_copy
        from trainer.model import ModelConfig
        from trainer.train import LoaderConfig, TrainConfig

        from . import versions

        h = home.home()
        dataset = ""
        if self.dataset:  # training names data by name@version, never by path
            from .catalog.datasets import ManifestIntegrityError, resolve_manifest_url
            from .catalog.registry import registry_url_from_env

            # The download below hashes the Arrow file anyway: check that hash against the one
            # recorded at publish instead of reading the file twice.
            manifest_url, published_sha = resolve_manifest_url(self.dataset, registry_url_from_env(h.root),
                                                               verify=False)
            dataset = self.dataset
        else:
            manifest_url = home.manifest_arrow_url(partition)
        manifest_sha = local_copy(manifest_url, h.root / "node-cache").stem
        if dataset and manifest_sha != published_sha:
            raise ManifestIntegrityError(f"dataset {dataset}: {manifest_url} has SHA-256 {manifest_sha}, "
                                         f"published as {published_sha}")
        size = (self.image_size, self.image_size)
        cfg = TrainConfig(
            manifest=manifest_url, run_dir="", steps=self.steps, batch_size=self.batch_size, seed=self.seed,
            optimizer_mode=self.optimizer_mode, workers=self.workers, checkpoint_every=self.checkpoint_every,
            keep_checkpoints=self.keep_checkpoints,
            checkpoint_store=self.checkpoint_store or os.environ.get("DYNA_CHECKPOINT_STORE", ""),
            all_checkpoints_damaged=self.all_checkpoints_damaged,
            cache_dir=cache.root_dir(), model=ModelConfig(image_size=size),
            sample=SampleSpec(image_size=size, anchors=self.anchors, anchor_every_s=self.anchor_every_s,
                              stream=self.read_stream or None),
            loader=LoaderConfig(kind=self.loader, mix_units=self.mix_units),  # type: ignore[arg-type]
            lineage={"curation_spec": partition, "dataset": dataset or f"manifest:{manifest_sha[:16]}",
                     "manifest": manifest_url, "manifest_sha256": manifest_sha,
                     "schema_version": versions.SCHEMA_VERSION, "pipeline_version": versions.PIPELINE_VERSION,
                     "code_commit": _code_commit()})
        key = hashlib.sha256(cfg.identity_json().encode()).hexdigest()[:12]
        run_dir = h.root / "runs" / partition / key
        cfg.run_dir = str(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = run_dir / "config.json"
        config_path.write_text(cfg.to_json())
        env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # torchrun restarts hang without it (DESIGN.md)
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))}
        return TrainingRun(run_dir=run_dir, config=json.loads(cfg.to_json()), command=self.launch_command(config_path),
                           env=env, resuming=(run_dir / "checkpoints" / "latest").exists())


def _code_commit() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes), or ``unknown`` outside git."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
