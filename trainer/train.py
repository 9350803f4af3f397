"""The training entry point: one process or many under torchrun, restartable, resumable.

    python -m trainer.train --config run.json                       # one process (the CPU demo)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 2 --max-restarts 2 \\
        -m trainer.train --config run.json                          # many; a dead worker restarts all

Each attempt (torchrun's TORCHELASTIC_RESTART_COUNT) writes its diagnostics into
``<run_dir>/attempts/<n>/`` (one log per rank, and torchrun's error file when a rank fails), and
starts from the latest complete checkpoint whose files all match their SHA-256 (hashed on every
resume): model, optimizer, data position and RNG, so a resumed run continues with the losses it
would have had. Damaged checkpoints are skipped, each named with its damaged files in the rank log
and in ``result.json`` (``skipped_checkpoints``); if checkpoints exist and none is intact, the run
stops with that list unless ``all_checkpoints_damaged`` is ``"start_fresh"``. Checkpoints are written asynchronously to
``<run_dir>/checkpoints`` and uploaded to ``checkpoint_store`` when one is set; each records the
manifest it trained on and the versions and code commit (``lineage``).

Reads go through the node page cache when ``cache_dir`` is set. Metrics (loss, samples/s, the
fraction of step time spent waiting for data, checkpoint timings) go to ``<run_dir>/metrics.jsonl``
and, when Dagster launched the run through Pipes, to Dagster as they happen (rank 0 only).

No Dagster import: Pipes is the separate ``dagster-pipes`` package, opened only when present.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader

from dyna_resources.episodes.errors import EpisodeError

from .checkpoint import (
    AppState,
    CheckpointError,
    CheckpointInfo,
    CheckpointManager,
    NoIntactCheckpointError,
    RNGState,
)
from .dataset import MissingDataError, SampleSpec, gone_object, worker_init_threads
from .elastic import ElasticStream
from .faults import ENV as FAULT_ENV
from .faults import Fault
from .manifest_loader import local_copy, open_manifest
from .model import ModelConfig, WorldActionModel
from .summary import FinalCheckpoint, TrainSummary

log = logging.getLogger("dyna.train")

OnAllDamaged = Literal["error", "start_fresh"]
LoaderKind = Literal["gop", "random"]


@dataclass
class LoaderConfig:
    """How samples are read (``trainer.gop_dataset`` and ``trainer.dataset``)."""

    # "gop": decode units, each GOP window decoded once for every sample anchored in it (the default);
    # "random": fully random samples, each worker keeping live GOP decoders and recent frames per episode.
    kind: LoaderKind = "gop"
    unit_s: float = 20.0  # gop: seconds of one episode decoded as one unit (whole GOPs: 4 of the fleet's 5 s)
    mix_units: float = 3.0  # gop: units mixed in flight per lane: more is more random and holds more frames
    # Contiguous manifest slices of the one global order (trainer/elastic.py): fixed by the run, never by the
    # world size, so a run resumed on other ranks continues exactly; ranks x workers dividing it decode each
    # unit once. A manifest too small for as many shards of 8 batches runs on fewer (a divisor).
    shards: int = 64
    decode_threads: int = 0  # gop: threads decoding a unit's cameras (0: one per camera, at most 4)
    decoder: str = "auto"  # gop: "cpu", "cuda" (NVDEC) or "auto" (cuda when the trainer has a GPU that answers)
    bad_samples: str = "raise"  # gop: a sample whose frame or stream fails: "raise" (naming it) or "skip" (counted)
    # gop, with a node page cache: the decode units of this many batches ahead have their chunks fetched from
    # the origin into the cache while the current ones decode (trainer/prefetch.py); 0: read through only
    prefetch_batches: int = 16

    def __post_init__(self):
        if self.kind not in get_args(LoaderKind):
            raise ValueError(f"loader.kind {self.kind!r}: expected one of {get_args(LoaderKind)}")


@dataclass
class TrainConfig:
    manifest: str  # the manifest's Arrow IPC URL (path, file://, gs://)
    run_dir: str
    steps: int = 60
    batch_size: int = 8
    seed: int = 0
    lr: float = 2e-3  # AdamW (everything but hidden matrices)
    muon_lr: float = 0.02
    weight_decay: float = 0.01
    optimizer_mode: str = "auto"  # auto | global | node_local
    node_local_min_nodes: int = 2
    workers: int = 1  # DataLoader workers per rank
    threads: int = 0  # torch threads of the step; 0: this rank's share of the cores minus its workers
    prefetch: int = 4  # batches each worker keeps ready
    checkpoint_every: int = 20
    keep_checkpoints: int = 3
    checkpoint_store: str = ""  # a store URL to upload checkpoints to ("" keeps them local)
    # When checkpoints exist but none is intact (each misses files or fails its SHA-256 check, here
    # and in the store): "error" stops the run, naming every damaged file; "start_fresh" trains from
    # step 0 (the new run's checkpoints replace the damaged ones step by step). Not part of the run's
    # identity (``identity_json``): switching it resumes the same run folder.
    all_checkpoints_damaged: OnAllDamaged = "error"
    # Provenance: each rank appends the samples of every step, (manifest row, anchor time), to
    # attempts/<attempt>/samples.rank<r>.jsonl: which data a step trained on, e.g. across a requeue
    # onto another world size. Like all_checkpoints_damaged, not part of the run's identity.
    sample_log: bool = False
    cache_dir: str = ""  # the node page cache ("" reads the origin directly)
    log_every: int = 5
    lineage: dict = field(default_factory=dict)  # manifest data version, pipeline versions, code commit
    model: ModelConfig = field(default_factory=ModelConfig)
    sample: SampleSpec = field(default_factory=SampleSpec)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    # No test hooks here: fault injection is trainer/faults.py's, from the environment (DYNA_TRAIN_FAULT).

    def __post_init__(self):
        if self.all_checkpoints_damaged not in get_args(OnAllDamaged):
            raise ValueError(
                f"all_checkpoints_damaged: {self.all_checkpoints_damaged!r} is not one of "
                f"{', '.join(map(repr, get_args(OnAllDamaged)))}"
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def identity_json(self) -> str:
        """``to_json`` without the fields that say how to run rather than what (a run folder's key)."""
        d = dataclasses.asdict(self)
        del d["all_checkpoints_damaged"], d["sample_log"]
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        d = json.loads(text)
        # Configs written before fault injection left the config (trainer/faults.py) carry "fault": {}
        # (they load as they were); one that asks for a fault would silently train without it: refused.
        fault = d.pop("fault", None)
        if fault:
            raise ValueError(
                f'this config asks for fault injection ("fault": {json.dumps(fault)}), which is no '
                f"longer a config field: set {FAULT_ENV} in the trainer's environment instead (test-only)"
            )
        d["model"] = ModelConfig.from_dict(d.get("model", {}))
        sample = dict(d.get("sample", {}))
        for k in ("cameras", "frame_offsets_s", "image_size", "action_stream"):
            if sample.get(k) is not None:
                sample[k] = tuple(sample[k])
        if "proprio_streams" in sample:
            sample["proprio_streams"] = tuple(tuple(x) for x in sample["proprio_streams"])
        d["sample"] = SampleSpec(**sample)
        loader = dict(d.get("loader", {}))
        loader.pop("lanes", None)  # configs written before the elastic stream: lanes became shards
        d["loader"] = LoaderConfig(**loader)
        return cls(**d)


@dataclass
class StepTimes:
    """Wall time of the step loop split into waiting for data and the rest, over a window."""

    wait_s: float = 0.0
    total_s: float = 0.0
    samples: int = 0

    def fraction(self) -> float:
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0


class DataPosition:
    """The stream's position as a checkpointable state (``Stateful``): the same on every rank (global
    batches consumed), under one key, so any world size resumes from it."""

    def __init__(self, ds: ElasticStream):
        self.ds = ds

    def state_dict(self) -> dict:
        return {"stream": self.ds.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ds.load_state_dict(state["stream"])


class StepCounter:
    def __init__(self):
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def run(cfg: TrainConfig) -> TrainSummary:
    """Train until ``cfg.steps``; returns the summary (also written to ``run_dir/result.json``)."""
    from .muon import DistributedMuon, MuonConfig
    from .topology import Topology

    fault = Fault.from_env()  # test-only (trainer/faults.py); None in every real launch
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun counts in-place restarts from 0 again in every Slurm requeue: name attempts by both
    slurm_attempt = os.environ.get("SLURM_RESTART_COUNT")
    attempt_name = f"{slurm_attempt}.{attempt}" if slurm_attempt is not None else str(attempt)
    run_dir = Path(cfg.run_dir)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    topo = Topology.from_env() if distributed else Topology.single()
    attempt_dir = run_dir / "attempts" / attempt_name
    attempt_dir.mkdir(parents=True, exist_ok=True)
    if topo.rank == 0 and not (run_dir / "config.json").exists():  # what evaluations and releases read back
        (run_dir / "config.json").write_text(cfg.to_json())
    _log_to(attempt_dir / f"rank{topo.rank}.log")
    log.info(
        "attempt %d, rank %d of %d (node %d of %d)", attempt, topo.rank, topo.world_size, topo.node, topo.num_nodes
    )

    # The step and the DataLoader workers share the node's cores: oversubscribing them makes the step
    # slower and the batch hand-off late (measured on 2 cores: data wait 3.6% -> 1.2%).
    cores = max(1, (os.cpu_count() or 1) // topo.local_world_size)
    torch.set_num_threads(cfg.threads or max(1, cores - cfg.workers))
    if cfg.workers:
        sys.setswitchinterval(0.0005)  # the prefetch thread hands batches over without a 5 ms GIL wait

    manifest = open_manifest(local_copy(cfg.manifest, run_dir / "node-cache"))
    open_file, cache = None, None
    if cfg.cache_dir:
        from dyna_resources.storage.cache_fs import CachedFileSystem
        from dyna_resources.storage.origins import Origins
        from dyna_resources.storage.page_cache import CacheConfig, PageCache

        cache = PageCache(CacheConfig.from_env(cfg.cache_dir, root=cfg.cache_dir), Origins.from_env())
        open_file = CachedFileSystem(cache).open
    lc = cfg.loader
    options: dict[str, Any] = {"open_file": open_file}
    if lc.kind == "gop":
        options.update(
            unit_s=lc.unit_s,
            mix_units=lc.mix_units,
            decode_threads=lc.decode_threads,
            decoder=lc.decoder if lc.decoder != "auto" or torch.cuda.is_available() else "cpu",
            bad_samples=lc.bad_samples,
        )
    ds = ElasticStream(
        manifest,
        cfg.sample,
        loader=lc.kind,
        batch_size=cfg.batch_size,
        rank=topo.rank,
        world=topo.world_size,
        seed=cfg.seed,
        shards=lc.shards,
        continuous=True,
        options=options,
        prefetch_batches=lc.prefetch_batches,
        page_cache=cache,
    )
    log.info(
        "loader %s: %d samples per epoch (all ranks), %d batches of %d over %d shards",
        lc.kind,
        ds.rows,
        ds.batches_per_epoch,
        cfg.batch_size,
        ds.n_shards,
    )

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = WorldActionModel(cfg.model)
    optimizer = DistributedMuon(
        model,
        MuonConfig(
            lr=cfg.muon_lr,
            weight_decay=cfg.weight_decay,
            adamw_lr=cfg.lr,
            adamw_weight_decay=cfg.weight_decay,
            mode=cfg.optimizer_mode,
            node_local_min_nodes=cfg.node_local_min_nodes,
        ),
        topo,
    )
    counter = StepCounter()
    rng = RNGState(topo.rank)
    state = {"app": AppState(model, optimizer), "data": DataPosition(ds), "rng": rng, "step": counter}
    summary = TrainSummary(
        attempt=attempt,
        attempt_name=attempt_name,
        world_size=topo.world_size,
        optimizer_mode=optimizer.mode,
        loader=cfg.loader.kind,
    )
    with ExitStack() as stack:
        endpoint = os.environ.get("DYNA_S3_ENDPOINT_URL") if cfg.checkpoint_store.startswith("s3://") else None
        ckpt = stack.enter_context(
            CheckpointManager(
                run_dir / "checkpoints",
                store_url=cfg.checkpoint_store or None,
                endpoint_url=endpoint,
                keep=cfg.keep_checkpoints,
            )
        )
        latest = _resume_point(ckpt, cfg, summary)
        if latest is not None:
            saved_world = int(latest.extra.get("world_size", topo.world_size))
            if saved_world != topo.world_size:
                # the data position is global; model and optimizer state are the same for any world size
                # (muon.py); a rank the saving run did not have takes the RNG of rank (its rank mod that size)
                log.info("resuming a %d-rank checkpoint on %d ranks", saved_world, topo.world_size)
            rng.source = topo.rank % saved_world
            ckpt.load(latest, state)
            rng.source = None
            log.info("resumed from step %d (%s)", counter.step, latest.path)
            summary.resumed_from = counter.step
        pipes = stack.enter_context(_pipes()) if topo.rank == 0 else None
        metrics = open(run_dir / "metrics.jsonl", "a") if topo.rank == 0 else None
        if metrics is not None:
            stack.callback(metrics.close)
        _loop(cfg, model, optimizer, ds, ckpt, counter, state, topo, attempt, metrics, pipes, summary, fault)
        ckpt.wait()
        summary.checkpoints = [h.timings() for h in ckpt.history]
        final = ckpt.latest()  # collective; verified
        if final is not None:
            marker = (final.path / "COMPLETE.json").read_bytes()
            summary.checkpoint = FinalCheckpoint(final.step, str(final.path), hashlib.sha256(marker).hexdigest())
        if topo.rank == 0:
            summary.write(run_dir)
            if pipes is not None:
                pipes.report_asset_materialization(
                    metadata=summary.as_metadata(cfg.run_dir, cfg.lineage), data_version=summary.data_version
                )
    if distributed:
        dist.destroy_process_group()
    return summary


def _resume_point(ckpt: CheckpointManager, cfg: TrainConfig, summary: TrainSummary) -> CheckpointInfo | None:
    """The verified checkpoint to resume from (None: start at step 0); what was skipped goes to the
    log and to ``summary``."""
    try:
        latest = ckpt.latest()
    except NoIntactCheckpointError as e:
        if cfg.all_checkpoints_damaged != "start_fresh":
            raise CheckpointError(
                f"{e}. To train from step 0 instead, set all_checkpoints_damaged to 'start_fresh' in the trainer config"
            ) from e
        for reason in e.skipped:
            log.warning("damaged checkpoint skipped: %s", reason)
        log.warning("no intact checkpoint: starting from step 0 (all_checkpoints_damaged = 'start_fresh')")
        summary.skipped_checkpoints = list(e.skipped)
        summary.started_fresh = True
        return None
    if latest is not None and latest.skipped:
        for reason in latest.skipped:
            log.warning("damaged checkpoint skipped: %s", reason)
        summary.skipped_checkpoints = list(latest.skipped)
    return latest


def _loop(
    cfg,
    model,
    optimizer,
    ds,
    ckpt,
    counter,
    state,
    topo,
    attempt,
    metrics,
    pipes,
    summary: TrainSummary,
    fault: Fault | None = None,
) -> None:
    """Steps until ``cfg.steps``; what they measured goes into ``summary``."""
    losses: dict[int, float] = {}
    window, total = StepTimes(), StepTimes()
    blocking: list[float] = []
    compute: list[float] = []  # per step: the step itself, without waiting for data
    waits: list[float] = []  # per step: waiting for the batch
    first_epoch = StepTimes()  # steps of epoch 0: the cold pass, every GOP decoded for the first time
    first_epoch_steps = 0
    io = {"decoded_frames": 0, "delivered_frames": 0, "bytes_read": 0, "skipped": 0}
    # Persistent workers keep their open episodes and decoded frames from one epoch to the next.
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=cfg.workers,
        worker_init_fn=worker_init_threads,
        prefetch_factor=cfg.prefetch if cfg.workers else None,
        persistent_workers=cfg.workers > 0,
    )
    it = None
    samples_log = None
    if cfg.sample_log:
        path = Path(cfg.run_dir) / "attempts" / summary.attempt_name / f"samples.rank{topo.rank}.jsonl"
        samples_log = open(path, "a")  # closed after the loop (a failed step: with the process)
    t_start = time.perf_counter()
    while counter.step < cfg.steps:
        if it is None:
            it = Prefetcher(iter(loader)) if cfg.workers else iter(loader)
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # the epoch is over: ds.advance() already moved the position on
            it = None
            continue
        t1 = time.perf_counter()
        loss, parts = model.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        model.update_target()
        in_first_epoch = ds.position.epoch == 0
        first_epoch_steps += in_first_epoch
        ds.advance()
        counter.step += 1
        if samples_log is not None:
            record = {"step": counter.step, "rows": batch["row"].tolist(), "anchor_ns": batch["anchor_ns"].tolist()}
            samples_log.write(json.dumps(record) + "\n")
            samples_log.flush()
        for k in io:
            if k in batch:
                io[k] += int(batch[k])
        step = counter.step
        parts = _mean_across_ranks(parts)
        losses[step] = parts["loss"]
        t2 = time.perf_counter()
        compute.append(t2 - t1)
        waits.append(t1 - t0)
        n = len(batch["row"]) * topo.world_size
        for w in (window, total, *((first_epoch,) if in_first_epoch else ())):
            w.wait_s += t1 - t0
            w.total_s += t2 - t0
            w.samples += n
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            tc = time.perf_counter()
            ckpt.save(
                step,
                state,
                extra={
                    "lineage": cfg.lineage,
                    "loss": parts["loss"],
                    "attempt": attempt,
                    "world_size": topo.world_size,
                },
            )
            blocking.append(time.perf_counter() - tc)
        if step % cfg.log_every == 0 or step == cfg.steps:
            record_ = {
                "step": step,
                "attempt": attempt,
                **{k: round(v, 6) for k, v in parts.items()},
                "samples_per_s": round(window.samples / window.total_s, 2) if window.total_s else 0.0,
                "data_wait_fraction": round(window.fraction(), 4),
            }
            log.info("%s", record_)
            if metrics is not None:
                metrics.write(json.dumps(record_) + "\n")
                metrics.flush()
            if pipes is not None:  # live in the Dagster run's log; the curve also lands in the metadata
                pipes.log.info(json.dumps(record_))
                pipes.report_custom_message(record_)
            window = StepTimes()
        if fault is not None:
            fault.after_step(step, topo.rank, attempt, ckpt)
    if samples_log is not None:
        samples_log.close()
    first = min(losses) if losses else None
    summary.steps = counter.step
    summary.losses = losses
    summary.loss_first = losses.get(first) if first else None
    summary.loss_last = losses.get(counter.step)
    summary.samples_per_s = total.samples / total.total_s if total.total_s else 0.0
    summary.data_wait_fraction = total.fraction()
    summary.checkpoint_blocking_s = blocking
    summary.step_compute_s = compute
    summary.step_wait_s = waits
    summary.data_wait_first_epoch = first_epoch.fraction() if first_epoch.total_s else None
    summary.first_epoch_steps = first_epoch_steps
    summary.decoded_frames, summary.delivered_frames = io["decoded_frames"], io["delivered_frames"]
    summary.decodes_per_frame = io["decoded_frames"] / io["delivered_frames"] if io["delivered_frames"] else None
    summary.bytes_read, summary.skipped = io["bytes_read"], io["skipped"]
    summary.samples_per_epoch = ds.rows
    summary.wall_s = time.perf_counter() - t_start


class Prefetcher:
    """Takes batches off the DataLoader on a thread, so receiving one from a worker (unpickling, mapping
    its shared memory: a few ms per batch) overlaps the step instead of adding to the data wait."""

    _END = object()

    def __init__(self, it, depth: int = 2):
        import queue
        import threading

        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._pump, args=(it,), name="batch-prefetch", daemon=True)
        self._thread.start()

    def _pump(self, it) -> None:
        try:
            for batch in it:
                self._q.put(batch)
            self._q.put(self._END)
        except BaseException as e:
            self._q.put(e)

    def __iter__(self):
        return self

    def __next__(self):
        item = self._q.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item


def _mean_across_ranks(parts: dict[str, float]) -> dict[str, float]:
    if not dist.is_initialized():
        return parts
    keys = sorted(parts)
    t = torch.tensor([parts[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, t.tolist(), strict=True)}


def _pipes():
    """Dagster Pipes when this process was launched by Dagster, else nothing."""
    from contextlib import nullcontext

    if "DAGSTER_PIPES_CONTEXT" not in os.environ:
        return nullcontext(None)
    from dagster_pipes import open_dagster_pipes

    return open_dagster_pipes()


def _log_to(path: Path) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


# A fault no restart mends (an object of the manifest is gone), written by the rank that met it: torchrun's
# next attempts stop at once naming it instead of reading again, and the launcher reports it by name.
FATAL_FILE = "fatal.json"


class FatalDataFault(RuntimeError):
    """An earlier attempt of this launch met a fault that will not go away (``FATAL_FILE``)."""


def _record_fatal(fatal: Path, fault: str, obj: str | None, message: str) -> None:
    tmp = fatal.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fault": fault, "object": obj, "message": message}))
    tmp.replace(fatal)
    log.error(message)


@record
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="a TrainConfig as JSON")
    args = ap.parse_args(argv)
    cfg = TrainConfig.from_json(Path(args.config).read_text())
    fatal = Path(cfg.run_dir) / FATAL_FILE
    if fatal.exists():
        raise FatalDataFault(f"not restarted: {json.loads(fatal.read_text())['message']}")
    try:
        summary = run(cfg)
    except MissingDataError as e:
        gone = gone_object(e)
        _record_fatal(
            fatal,
            "missing_object",
            gone,
            f"{gone} is gone from its store: the manifest names an object that no longer exists",
        )
        raise
    except EpisodeError as e:  # bytes that do not read (bad_samples="raise"): every restart would meet them again
        what = str(e).strip().splitlines()[-1]  # a DataLoader worker's error arrives as its whole traceback
        what = what.split(": ", 1)[1] if what.startswith(type(e).__name__ + ": ") else what
        _record_fatal(
            fatal, "damaged_episode", e.path or None, f"{what} (the manifest names an episode that does not read)"
        )
        raise
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: v for k, v in summary.as_record().items() if k != "losses"}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
