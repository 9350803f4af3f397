"""How a training run is prepared and launched: its data resolved and checked, its config written,
its run folder keyed, its command built. No Dagster import: ``checkpoints`` (Dagster) and the tests
call :func:`prepare_run`; what it returns says what to run, where, and whether it resumes.

The run folder is keyed by the manifest's hash and the config, so preparing again with the same
inputs finds the same folder (the run resumes, or is found finished), and any change starts anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from dyna_resources import versions
from dyna_resources.catalog.datasets import ManifestIntegrityError, resolve_manifest_url
from dyna_resources.episodes.read_profile import ReadProfile
from dyna_resources.episodes.read_profiles import EMBEDDED
from dyna_resources.home import DynaHome

from .dataset import SampleSpec
from .gop_dataset import BAD_SAMPLES
from .manifest_loader import local_copy
from .model import ModelConfig
from .train import LoaderConfig, TrainConfig

Launcher = Literal["torchrun", "slurm"]
REPO = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE_SIZE = (64, 64)  # a profile that names no output size
BACKFILL_ASSET = "training_streams"  # the Dagster asset that adds a profile's streams to episodes


class MissingStreamError(ValueError):
    """A manifest holds episodes without the training stream the read profile reads."""

    def __init__(self, manifest: str, profile: ReadProfile, episodes: list[str], total: int):
        self.episodes, self.total = episodes, total
        shown = ", ".join(episodes[:10]) + (f" and {total - 10} more" if total > 10 else "")
        super().__init__(
            f"manifest {manifest}: {total} episode(s) lack training stream {profile.stream_token()} of read "
            f"profile {profile.name!r}: {shown}. Materialize the {BACKFILL_ASSET!r} asset for their ingest "
            f"partitions (a backfill in the Dagster UI, or `dyna training-streams`), then the manifest again"
        )


def check_manifest_streams(arrow: Path, profile: ReadProfile, manifest_url: str) -> None:
    """Refuse a manifest some of whose episodes lack the profile's read stream (its registry column
    ``training_streams``, carried by the manifest), before any rank starts. Dictionary-encoded, so the
    check is over the few distinct values, then the rows of those that lack it."""
    token = profile.stream_token()
    if token is None:
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    with pa.memory_map(str(arrow)) as source:
        table = pa.ipc.open_file(source).read_all()
    if "training_streams" not in table.column_names:
        lacking = table.column("episode_id")
    else:
        column = table.column("training_streams")
        values = pc.fill_null(pc.cast(column, pa.string()), "")
        has = pc.match_substring_regex(values, f"(^|,){re.escape(token)}(,|$)")
        lacking = table.column("episode_id").filter(pc.invert(has))
    episodes = sorted(set(pc.cast(lacking, pa.string()).to_pylist()))
    if episodes:
        raise MissingStreamError(manifest_url, profile, episodes, len(episodes))


class LayoutMismatchError(ValueError):
    """A manifest holds episodes the run's model cannot read (``episodes.layout``): ``problems`` maps what
    an episode lacks, in words, to the episodes that lack it."""

    def __init__(self, manifest: str, problems: dict[str, list[str]]):
        self.problems = problems
        total = sum(len(v) for v in problems.values())
        lines = []
        for reason, episodes in sorted(problems.items()):
            shown = ", ".join(episodes[:10]) + (f" and {len(episodes) - 10} more" if len(episodes) > 10 else "")
            lines.append(f"  {reason}: {shown}")
        super().__init__(
            f"manifest {manifest}: {total} episode(s) the model cannot read:\n" + "\n".join(lines) + "\nNarrow the "
            "curation spec's where (e.g. on source_format or robot_model), or train a model of their layout"
        )


def check_manifest_layout(arrow: Path, sample: SampleSpec, model: ModelConfig, manifest_url: str) -> None:
    """Refuse a manifest some of whose episodes the model cannot read: another number of cameras (or not
    the ones named), a proprio or action stream field missing or of another width (their registry column
    ``stream_layout``, carried by the manifest), before any rank starts; else such an episode fails the run
    when its first sample is drawn. Dictionary-encoded: each distinct layout is judged once. An episode
    registered before its layout was recorded (NULL), or a manifest built before the column, is not
    judged."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dyna_resources.episodes.layout import Layout

    with pa.memory_map(str(arrow)) as source:
        table = pa.ipc.open_file(source).read_all()
    if "stream_layout" not in table.column_names:
        return
    values = pc.cast(table.column("stream_layout"), pa.string())
    problems: dict[str, list[str]] = {}
    for text in pc.unique(values).drop_null().to_pylist():
        reason = Layout.parse(text).lacks(
            cameras=sample.cameras,
            camera_count=model.cameras,
            proprio=sample.proprio_streams,
            proprio_width=model.proprio_dim,
            action=sample.action_stream,
            action_width=model.action_dim,
        )
        if reason:
            episodes = table.column("episode_id").filter(pc.equal(values, text))
            problems.setdefault(reason, []).extend(pc.cast(episodes, pa.string()).to_pylist())
    if problems:
        raise LayoutMismatchError(manifest_url, {r: sorted(set(e)) for r, e in problems.items()})


@dataclass(frozen=True)
class TrainerSettings:
    """What a ``checkpoints`` partition trains and how the trainer is launched."""

    # -- launch --
    nproc_per_node: int = 1  # trainer processes on the node (torchrun)
    max_restarts: int = 2  # torchrun's in-place restarts, each resuming from the latest complete checkpoint
    launcher: Launcher = "torchrun"  # torchrun (local) | slurm (sbatch --wait of infra/slurm/train.sbatch.j2)
    slurm_partition: str = ""
    slurm_nodes: int = 1
    slurm_gpus_per_node: int = 8
    slurm_time_limit: str = ""
    slurm_max_attempts: int = 3  # whole-job requeues, each resuming from the latest checkpoint
    omp_num_threads: int = 0  # OMP_NUM_THREADS of the trainer; 0: half this machine's cores
    # -- training --
    steps: int = 60
    batch_size: int = 8
    workers: int = 1  # DataLoader workers per rank
    checkpoint_every: int = 20
    keep_checkpoints: int = 3
    checkpoint_store: str = ""  # a store URL checkpoints are uploaded to; empty: they stay in the run folder
    # checkpoints exist but none is intact: "error" fails the run naming the damaged files, "start_fresh"
    # trains the same run folder from step 0 (TrainConfig.all_checkpoints_damaged; not part of the run's key)
    all_checkpoints_damaged: str = "error"
    optimizer_mode: str = "auto"  # auto | global | node_local (Muon's sharding, by node count when auto)
    # How samples are read: "gop" (each GOP window decoded once for every sample in it) or "random"
    # (fully random, live GOP decoders per episode); where they sit: "end" (one per segment) or "every"
    # (one every anchor_every_s inside each segment).
    loader: str = "gop"
    anchors: str = "end"
    anchor_every_s: float = 0.1
    mix_units: float = 3.0
    # a sample whose frame or stream does not read: "raise" stops the run naming the episode (a fault no
    # restart mends, so torchrun does not retry it); "skip" leaves it out of its batch, counted
    bad_samples: str = "raise"
    # Slices of the one global sample order (trainer/elastic.py): fixed per run, so a requeue onto another
    # number of ranks resumes exactly; ranks x workers dividing it decode each unit once.
    shards: int = 64
    # Which video the run reads and at what size (the deployment's read profile, episodes/read_profiles.py).
    read_profile: ReadProfile = EMBEDDED["archive"]
    seed: int = 0
    dataset: str = ""  # name@version from the dataset registry; empty: the partition's current manifest

    def __post_init__(self):
        if self.launcher not in get_args(Launcher):
            raise ValueError(f"launcher {self.launcher!r}: expected one of {', '.join(map(repr, get_args(Launcher)))}")
        if self.bad_samples not in BAD_SAMPLES:
            raise ValueError(f"bad_samples {self.bad_samples!r}: expected one of {', '.join(map(repr, BAD_SAMPLES))}")


@dataclass(frozen=True)
class TrainingRun:
    """A prepared run: its folder (holding ``config.json``), the command and environment to launch it."""

    run_dir: Path
    config: dict
    command: list[str]
    env: dict[str, str]
    resuming: bool  # the folder holds a checkpoint: the launch resumes from it

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.json"


def launch_command(settings: TrainerSettings, config_path: Path) -> list[str]:
    """The command that runs the trainer on ``config_path``: ``torchrun`` on this node (plain Python
    for one process and no restarts), or ``sbatch --wait`` of the Slurm template."""
    if settings.launcher == "slurm":
        from infra.slurm.launcher import SlurmLauncher
        from infra.slurm.launcher import launch_command as slurm_command

        slurm = SlurmLauncher(
            partition=settings.slurm_partition,
            nodes=settings.slurm_nodes,
            gpus_per_node=settings.slurm_gpus_per_node,
            time_limit=settings.slurm_time_limit,
            max_attempts=settings.slurm_max_attempts,
            in_place_restarts=settings.max_restarts,
            workdir=str(REPO),
        )
        return slurm_command(config_path, config_path.parent, slurm)
    train = ["-m", "trainer.train", "--config", str(config_path)]
    if settings.nproc_per_node == 1 and settings.max_restarts == 0:
        return [sys.executable, *train]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={settings.nproc_per_node}",
        f"--max-restarts={settings.max_restarts}",
        *train,
    ]


def plan_run(
    settings: TrainerSettings, home: DynaHome, spec: str, manifest_url: str, registry_url: str, cache_dir: str
) -> TrainConfig:
    """The run's config, its ``run_dir`` the keyed run folder (nothing written there: ``prepare_run`` does;
    ``evaluations`` and ``released_models`` use this to find the run ``checkpoints`` trained).

    :param settings: what to train and how to launch it.
    :param home: the home folder: the node's manifest copies and the run folders live there.
    :param spec: the curation spec (the ``checkpoints`` partition) the run trains on.
    :param manifest_url: the spec's current manifest (Arrow IPC); not read when ``settings.dataset``
        names a published dataset version instead.
    :param registry_url: the registry holding published datasets.
    :param cache_dir: the node page cache the trainer reads through.
    :raises ManifestIntegrityError: the dataset's manifest is not the bytes that were published.
    """
    dataset = ""
    if settings.dataset:  # training names data by name@version, never by path
        # The download below hashes the Arrow file anyway: check that hash against the one recorded
        # at publish instead of reading the file twice.
        manifest_url, published_sha = resolve_manifest_url(settings.dataset, registry_url, verify=False)
        dataset = settings.dataset
    manifest_sha = local_copy(manifest_url, home.node_cache).stem
    if dataset and manifest_sha != published_sha:
        raise ManifestIntegrityError(
            f"dataset {dataset}: {manifest_url} has SHA-256 {manifest_sha}, published as {published_sha}"
        )
    profile = settings.read_profile
    check_manifest_streams(home.node_cache / f"{manifest_sha}.arrow", profile, manifest_url)
    size = profile.output_size or DEFAULT_IMAGE_SIZE
    cfg = TrainConfig(
        manifest=manifest_url,
        run_dir="",
        steps=settings.steps,
        batch_size=settings.batch_size,
        seed=settings.seed,
        optimizer_mode=settings.optimizer_mode,
        workers=settings.workers,
        checkpoint_every=settings.checkpoint_every,
        keep_checkpoints=settings.keep_checkpoints,
        checkpoint_store=settings.checkpoint_store,
        all_checkpoints_damaged=settings.all_checkpoints_damaged,  # type: ignore[arg-type]
        cache_dir=cache_dir,
        model=ModelConfig(image_size=size),
        sample=SampleSpec(
            image_size=size,
            anchors=settings.anchors,
            anchor_every_s=settings.anchor_every_s,
            stream=profile.read_stream,
        ),
        loader=LoaderConfig(
            kind=settings.loader,  # type: ignore[arg-type]  # checked by LoaderConfig
            mix_units=settings.mix_units,
            shards=settings.shards,
            bad_samples=settings.bad_samples,
        ),
        lineage={
            "curation_spec": spec,
            "dataset": dataset or f"manifest:{manifest_sha[:16]}",
            "manifest": manifest_url,
            "manifest_sha256": manifest_sha,
            "schema_version": versions.SCHEMA_VERSION,
            "pipeline_version": versions.PIPELINE_VERSION,
            "code_commit": code_commit(),
            "read_profile": {"name": profile.name, "digest": profile.digest},
        },
    )
    check_manifest_layout(home.node_cache / f"{manifest_sha}.arrow", cfg.sample, cfg.model, manifest_url)
    cfg.run_dir = str(home.run_dir(spec, run_key(cfg)))
    return cfg


def prepare_run(
    settings: TrainerSettings, home: DynaHome, spec: str, manifest_url: str, registry_url: str, cache_dir: str
) -> TrainingRun:
    """Resolve the run's data (:func:`plan_run`), write its config into its keyed run folder and build its
    command."""
    cfg = plan_run(settings, home, spec, manifest_url=manifest_url, registry_url=registry_url, cache_dir=cache_dir)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    config_path.write_text(cfg.to_json())
    threads = settings.omp_num_threads or max(1, (os.cpu_count() or 1) // 2)
    env = {
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # torchrun's restarts hang without it
        "OMP_NUM_THREADS": str(threads),
    }
    return TrainingRun(
        run_dir=run_dir,
        config=json.loads(cfg.to_json()),
        command=launch_command(settings, config_path),
        env=env,
        resuming=(run_dir / "checkpoints" / "latest").exists(),
    )


def run_key(cfg: TrainConfig) -> str:
    """The run folder's name: a hash of what the run trains (not of how it is launched)."""
    return hashlib.sha256(cfg.identity_json().encode()).hexdigest()[:12]


def code_commit() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes), or ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
