"""Training samples from a manifest, read at random: this rank's slice, split across DataLoader
workers, resumable. (The trainer's default loader is ``gop_dataset.GopDataset``, which reads the
same samples unit by unit; this one is its random-access mode, and defines the samples both use.)

One sample of a segment ``[start_ns, end_ns]`` (a manifest row) is anchored at ``t_now``, the
segment's end minus the action chunk:

- ``frames``: k frames per camera at ``t_now + frame_offsets_s`` (uint8, resized), and ``future``:
  one frame per camera at ``t_now + future_frame_s`` (the target of the future-latent head);
- ``proprio``: the proprio streams on a fixed grid of ``proprio_steps`` at ``proprio_hz`` ending
  at ``t_now``; ``actions``: the action stream on a grid of ``action_chunk`` steps after ``t_now``.

Every timestamp query has an explicit tolerance: a grid point takes the nearest recorded sample
only if it lies within ``tolerance_s`` (frames: within one frame period, the reader's default),
otherwise the sample fails with a ``WindowError`` naming the episode, stream and time, instead of
silently repeating a distant value.

Order, deterministic from (seed, epoch): the rank's rows (sorted by episode and time) are cut into
blocks of ``block`` consecutive segments, the blocks are permuted, and a bounded shuffle (each
row moves fewer than ``shuffle_buffer`` places) mixes the stream; blocks keep reads of one file together (its
chunks are reused), the buffer mixes
episodes. The stream is cut into batches of ``batch_size`` and batch ``j`` goes to worker
``j % num_workers``: the DataLoader's round-robin then hands the training loop batches 0, 1, 2, …
in order, so the position in an epoch is one number (batches consumed) and resuming skips exactly
those batches without reading them. Ranks take equal contiguous slices (the last ``rows % world``
rows are dropped, as DistributedSampler(drop_last=True) does), so every rank has the same number
of batches and collective steps never hang at an epoch's end.

Why not torchdata's StatefulDataLoader: it snapshots each worker's iterator state, which needs the
checkpoint to hold per-worker states and the same worker count on resume; a pure function of
(seed, epoch, batches consumed) resumes under any worker count and costs nothing to save.

No Dagster import: every DataLoader worker imports this module.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dyna_resources.episodes.errors import WindowError
from dyna_resources.episodes.gop_decode import swscale_rgb
from dyna_resources.episodes.mcap_reader import EpisodeReader, FrameCache

from .sampling import plan_samples, samples_per_row


@dataclass(frozen=True)
class SampleSpec:
    cameras: tuple[str, ...] | None = None  # None: every camera of the episode, sorted
    frame_offsets_s: tuple[float, ...] = (-0.5, 0.0)
    future_frame_s: float = 0.5
    image_size: tuple[int, int] = (64, 64)  # (H, W) after an area resize
    proprio_streams: tuple[tuple[str, str], ...] = (
        ("joint_states", "position"),
        ("joint_states", "velocity"),
        ("gripper", "position"),
    )
    proprio_steps: int = 40
    proprio_hz: float = 50.0
    action_stream: tuple[str, str] = ("action", "command")
    action_chunk: int = 25
    action_hz: float = 50.0
    tolerance_s: float = 0.02  # nearest recorded sample must be this close to a grid point
    # Where samples sit in a segment: "end", one per segment at its end minus the action chunk (sparse);
    # "every", one every anchor_every_s from the segment's start (dense: 0.1 s is every 3rd frame at 30 Hz).
    anchors: str = "end"
    anchor_every_s: float = 0.1
    # A clip instead of frame_offsets_s: clip_frames frames per camera at clip_hz, ending at the anchor
    # (e.g. 16 frames at 10 Hz); 0 keeps frame_offsets_s.
    clip_frames: int = 0
    clip_hz: float = 10.0
    # Read a training stream (``dyna training-streams``: a small, short-GOP copy of each camera) by name
    # instead of the archive video; None reads the archive stream.
    stream: str | None = None

    def __post_init__(self):
        if self.anchors not in ("end", "every"):
            raise ValueError(f"sample spec: anchors {self.anchors!r}: expected 'end' or 'every'")
        if not 1e-3 <= self.anchor_every_s <= 3600:
            raise ValueError(f"sample spec: anchor_every_s {self.anchor_every_s} outside [0.001, 3600] s")
        if self.clip_frames < 0 or (self.clip_frames and not 0 < self.clip_hz <= 1000):
            raise ValueError(
                f"sample spec: clip_frames {self.clip_frames} at clip_hz {self.clip_hz}: "
                "expected clip_frames >= 0 and 0 < clip_hz <= 1000"
            )

    @property
    def action_horizon_ns(self) -> int:
        return int(round(self.action_chunk / self.action_hz * 1e9))

    def anchor_ns(self, start_ns: int, end_ns: int) -> int:
        """``t_now`` of a segment in ``anchors="end"``: its end minus the action chunk."""
        return end_ns - self.action_horizon_ns

    @property
    def anchor_every_ns(self) -> int:
        return _ns(self.anchor_every_s)

    def frame_offsets_ns(self) -> np.ndarray:
        """Offsets from the anchor of the frames each camera gives (the clip's, or frame_offsets_s)."""
        if self.clip_frames:
            step = 1e9 / self.clip_hz
            return np.array([-int(round((self.clip_frames - 1 - i) * step)) for i in range(self.clip_frames)], np.int64)
        return np.array([_ns(o) for o in self.frame_offsets_s], np.int64)

    def all_frame_offsets_ns(self) -> np.ndarray:
        """The frame offsets, then the future frame's: every frame a sample reads per camera."""
        return np.append(self.frame_offsets_ns(), _ns(self.future_frame_s))

    def proprio_offsets_ns(self) -> np.ndarray:
        return -np.arange(self.proprio_steps - 1, -1, -1, dtype=np.int64) * int(round(1e9 / self.proprio_hz))

    def action_offsets_ns(self) -> np.ndarray:
        return np.arange(1, self.action_chunk + 1, dtype=np.int64) * int(round(1e9 / self.action_hz))

    def stream_names(self) -> list[str]:
        return sorted({s for s, _ in self.proprio_streams} | {self.action_stream[0]})


@dataclass
class LoaderPosition:
    epoch: int = 0
    batches: int = 0  # batches of this epoch already handed to the training loop


@dataclass
class ManifestDataset(IterableDataset):
    """Batches of samples from this rank's slice of ``manifest`` (a table with ``uri``,
    ``start_ns``, ``end_ns``). ``open_file(uri)`` returns a seekable binary file (default:
    fsspec; the trainer passes the page cache's ``CachedFileSystem.open``)."""

    manifest: pa.Table
    spec: SampleSpec = field(default_factory=SampleSpec)
    batch_size: int = 8
    rank: int = 0
    world: int = 1
    seed: int = 0
    block: int = 16
    shuffle_buffer: int = 64
    open_file: object = None
    readers_per_worker: int = 8
    frames_per_reader: int = 4096  # decoded frames kept per open episode (at 64x64: 48 MiB)
    continuous: bool = False  # one iterator runs through every epoch: no DataLoader restart between epochs
    chunks_per_reader: int = 16  # parsed chunks kept per open episode (a proprio chunk serves many samples)
    position: LoaderPosition = field(default_factory=LoaderPosition)
    # Samples in each of the ``world`` slices, when the caller counted them already (the elastic stream
    # counts once for all its shards; counting is a pass over the whole manifest)
    slice_samples: object = None

    def __post_init__(self):
        super().__init__()
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside world size {self.world}")
        missing = {"uri", "start_ns", "end_ns"} - set(self.manifest.column_names)
        if missing:
            raise ValueError(f"manifest lacks column(s) {sorted(missing)}")
        per_rank = self.manifest.num_rows // self.world
        if per_rank == 0:
            raise ValueError(f"manifest of {self.manifest.num_rows} rows cannot feed {self.world} ranks")
        self.first_row = self.rank * per_rank
        self.rows = per_rank  # this rank's slice: manifest rows [first_row, first_row + rows)
        uris = self.manifest.column("uri").slice(self.first_row, per_rank).combine_chunks()
        if not pa.types.is_dictionary(uris.type):
            uris = uris.dictionary_encode()
        # One Python string per episode, a small int per row: a str per row costs ~85-450 B and a
        # million-row slice is copied into every DataLoader worker.
        names = uris.dictionary.to_pylist()
        by_name = np.argsort(np.array(names, dtype=object), kind="stable")
        rank_of = np.empty(len(names), np.int64)
        rank_of[by_name] = np.arange(len(names))
        self._uri_names = [names[i] for i in by_name]  # sorted, so codes order rows by episode
        row_codes = rank_of[uris.indices.to_numpy(zero_copy_only=False)]
        self._start = self.manifest.column("start_ns").slice(self.first_row, per_rank).to_numpy()
        self._end = self.manifest.column("end_ns").slice(self.first_row, per_rank).to_numpy()
        self.plan = plan_samples(
            self._start,
            self._end,
            row_codes,
            len(names),
            anchors=self.spec.anchors,
            every_ns=self.spec.anchor_every_ns,
            end_offset_ns=self.spec.action_horizon_ns,
        )
        self.rows = self._usable_samples(per_rank)  # samples per epoch (rows, with one sample per segment)
        self._uri_codes = self.plan.code
        self._passes = 0  # full passes this process's copy started (persistent DataLoader workers)
        self._readers: OrderedDict = OrderedDict()
        self._readers_pid = os.getpid()
        self._evicted_decodes = 0

    def _usable_samples(self, per_rank: int) -> int:
        """Samples per epoch on every rank (equal, so collective steps never wait on a rank whose
        epoch ended): the fewest any rank's slice holds."""
        return int(self._rank_sample_counts(per_rank).min())

    def _rank_sample_counts(self, per_rank: int) -> np.ndarray:
        """The samples each rank's slice of ``per_rank`` rows holds, one count a rank."""
        if self.slice_samples is not None:
            return np.asarray(self.slice_samples)
        if self.spec.anchors == "end":
            return np.full(self.world, per_rank)
        counts = samples_per_row(
            self.manifest.column("start_ns").to_numpy(),
            self.manifest.column("end_ns").to_numpy(),
            self.spec.anchors,
            self.spec.anchor_every_ns,
        )[: per_rank * self.world]
        return counts.reshape(self.world, per_rank).sum(axis=1)

    # ---- position (the data part of a checkpoint) ---------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        return -(-self.rows // self.batch_size)

    def state_dict(self) -> dict:
        return {
            "epoch": self.position.epoch,
            "batches": self.position.batches,
            "seed": self.seed,
            "rows": self.rows,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        if (state["rows"], state["batch_size"]) != (self.rows, self.batch_size):
            raise ValueError(
                f"data position is for {state['rows']} rows in batches of {state['batch_size']}, this "
                f"slice has {self.rows} rows in batches of {self.batch_size}: not the same run"
            )
        self.seed = state["seed"]
        self.position = LoaderPosition(state["epoch"], state["batches"])

    def advance(self, batches: int = 1) -> None:
        """The training loop consumed ``batches`` more (call after each step)."""
        self.position.batches += batches
        if self.position.batches >= self.batches_per_epoch:
            self.position = LoaderPosition(self.position.epoch + 1, 0)

    # ---- order --------------------------------------------------------------------------------
    def order(self, epoch: int) -> np.ndarray:
        """This rank's local row indices in the order of ``epoch`` (a pure function of seed, epoch)."""
        rng = np.random.default_rng([self.seed, epoch, self.rank])
        local = np.argsort(self._uri_codes[: self.rows], kind="stable")  # by episode, then time (manifest order)
        n_blocks = -(-self.rows // self.block)
        block_order = rng.permutation(n_blocks)
        # Blocks in permuted order: row r of the stream is row (block_order[r // block] * block + r % block),
        # computed for all rows at once (the last block may be short, so go through a padded index).
        padded = (block_order[:, None] * self.block + np.arange(self.block)[None, :]).ravel()
        stream = local[padded[padded < self.rows]]
        if self.shuffle_buffer <= 1:
            return stream
        # A bounded shuffle: every row moves by less than shuffle_buffer places (key = position +
        # uniform[0, buffer)), the locality a streaming shuffle buffer gives, computed in one sort.
        keys = np.arange(len(stream)) + rng.random(len(stream)) * self.shuffle_buffer
        return stream[np.argsort(keys, kind="stable")]

    def worker_batches(self, epoch: int, start_batch: int, worker: int, workers: int) -> list[np.ndarray]:
        """The batches (local row indices) worker ``worker`` produces, from ``start_batch`` on."""
        order = self.order(epoch)
        return [
            order[j * self.batch_size : (j + 1) * self.batch_size]
            for j in range(start_batch, self.batches_per_epoch)
            if (j - start_batch) % workers == worker
        ]

    # ---- iteration ----------------------------------------------------------------------------
    def _pass_start(self) -> tuple[int, int, int, int]:
        """(worker, workers, epoch, first batch) of the pass this process starts now."""
        info = get_worker_info()
        if info is None:  # in the training process: its position is the truth
            return 0, 1, self.position.epoch, self.position.batches
        # A persistent worker's copy never sees the training process's advance(): it counts its own
        # passes from the position it was created with (the DataLoader is built after a resume).
        passes, self._passes = self._passes, self._passes + 1
        return (info.id, info.num_workers, self.position.epoch + passes, self.position.batches if passes == 0 else 0)

    def __iter__(self) -> Iterator[dict]:
        worker, workers, epoch, start = self._pass_start()
        # Rotate the worker assignment so batch `start` comes from worker 0: the DataLoader always
        # asks worker 0 first, and the round-robin then matches the batch order exactly. Batches are
        # numbered through the epochs (every epoch has the same count), so a continuous stream just
        # keeps counting into the next epoch without the DataLoader stopping and restarting.
        per_epoch = self.batches_per_epoch
        first = epoch * per_epoch + start
        last = None if self.continuous else (epoch + 1) * per_epoch
        g = first + worker
        while last is None or g < last:
            e, j = divmod(g, per_epoch)
            rows = self.order_cache(e)[j * self.batch_size : (j + 1) * self.batch_size]
            yield self.collate([self.sample(int(r), self._readers) for r in rows])
            g += workers

    def close(self) -> None:
        """Close this process's open episodes (their decoded frames go with them)."""
        for r, *_ in self._readers.values():
            r.close()
        self._readers.clear()

    def order_cache(self, epoch: int) -> np.ndarray:
        cached = getattr(self, "_order_memo", None)
        if cached is None or cached[0] != epoch:
            self._order_memo = (epoch, self.order(epoch))
        return self._order_memo[1]

    # ---- one sample ---------------------------------------------------------------------------
    def _reader(self, uri: str, readers: OrderedDict) -> tuple[EpisodeReader, FrameCache, ChunkMemo]:
        """An open reader per episode, with its decoded-frame cache (a worker's readers are LRU)."""
        if readers is self._readers and self._readers_pid != os.getpid():
            # A forked worker must not share the parent's open files (their offsets are shared).
            readers.clear()
            self._readers_pid = os.getpid()
        entry = readers.get(uri)
        if entry is not None:
            readers.move_to_end(uri)
            return entry
        if len(readers) >= self.readers_per_worker:
            _, (old, frames, _) = readers.popitem(last=False)  # (reader, frames, chunks) of the oldest episode
            old.close()
            self._evicted_decodes += frames.decoded
        opener = self.open_file or _fsspec_open
        entry = readers[uri] = (
            open_episode(opener, uri),
            FrameCache(swscale_rgb(*self.spec.image_size), max_frames=self.frames_per_reader),
            ChunkMemo(self.chunks_per_reader),
        )
        return entry

    def decoded_frames(self, readers: OrderedDict | None = None) -> int:
        """Frames this process decoded in random access (open episodes and those already closed)."""
        readers = self._readers if readers is None else readers
        return self._evicted_decodes + sum(frames.decoded for _, frames, _ in readers.values())

    def sample_uri(self, i: int) -> str:
        return self._uri_names[self.plan.code[i]]

    def sample_times(self, i: int) -> SampleTimes:
        """Every time sample ``i`` reads, clamped to its episode's span (see ``trainer.sampling``)."""
        spec, plan = self.spec, self.plan
        t, code = int(plan.anchor_ns[i]), int(plan.code[i])
        lo, hi = int(plan.lo_ns[code]), int(plan.hi_ns[code])
        proprio, actions = t + spec.proprio_offsets_ns(), t + spec.action_offsets_ns()
        return SampleTimes(
            t,
            np.clip(t + spec.all_frame_offsets_ns(), lo, hi),
            np.clip(proprio, lo, hi),
            np.clip(actions, lo, hi),
            proprio < lo,
            actions > hi,
            lo,
            hi,
        )

    def sample(self, i: int, readers: OrderedDict | None = None) -> dict:
        """Sample ``i`` of this rank's plan, read at random (a worker's open episodes keep their decoded
        frames and live GOP decoders, ``FrameCache``, so nearby samples do not decode from the keyframe)."""
        readers = OrderedDict() if readers is None else readers
        spec = self.spec
        r, frame_cache, memo = self._reader(self.sample_uri(i), readers)
        times = self.sample_times(i)
        cams = list(spec.cameras) if spec.cameras is not None else r.cameras
        frames = r.read_frames(
            cams,
            times.frames,  # type: ignore[arg-type]  # read_frames takes any int array (np.asarray), annotated Sequence[int]
            memo=memo,
            cache=frame_cache,
            stream=spec.stream or None,
        )
        streams = r.read_streams(
            spec.stream_names(),
            int(times.proprio[0]) - _ns(spec.tolerance_s),
            int(times.actions[-1]) + _ns(spec.tolerance_s),
            memo=memo,
        )
        images = np.stack([frames[c].images for c in cams])  # (C, K+1, 3, h, w) uint8
        return self.assemble(i, images, streams, times, r.path)

    def assemble(self, i: int, images: np.ndarray, streams: dict, times: SampleTimes, path: str) -> dict:
        """One sample's tensors from its frames (C, K+1, 3, h, w) and the streams around it."""
        spec = self.spec
        span = (times.lo_ns, times.hi_ns)
        proprio = np.concatenate(
            [
                _on_grid(streams[s], f, times.proprio, spec.tolerance_s, path, span, times.proprio_pad)
                for s, f in spec.proprio_streams
            ],
            axis=1,
        )
        actions = _on_grid(
            streams[spec.action_stream[0]],
            spec.action_stream[1],
            times.actions,
            spec.tolerance_s,
            path,
            span,
            times.actions_pad,
        )
        pixels = torch.from_numpy(images)
        return {
            "frames": pixels[:, :-1],
            "future": pixels[:, -1],
            "proprio": torch.from_numpy(proprio),
            "actions": torch.from_numpy(actions),
            "proprio_is_pad": torch.from_numpy(times.proprio_pad),
            "actions_is_pad": torch.from_numpy(times.actions_pad),
            "row": self.first_row + int(self.plan.row[i]),
            "anchor_ns": times.anchor_ns,
        }

    @staticmethod
    def collate(samples: list[dict]) -> dict:
        out = {
            k: torch.stack([s[k] for s in samples])
            for k in ("frames", "future", "proprio", "actions", "proprio_is_pad", "actions_is_pad")
        }
        out["row"] = torch.tensor([s["row"] for s in samples], dtype=torch.int64)
        out["anchor_ns"] = torch.tensor([s["anchor_ns"] for s in samples], dtype=torch.int64)
        return out


@dataclass(frozen=True)
class SampleTimes:
    """The times one sample reads, clamped to its episode's span; ``*_pad`` marks grid points that
    fell outside it (they repeat the edge value, as LeRobot pads)."""

    anchor_ns: int
    frames: np.ndarray  # the frame offsets' times, then the future frame's
    proprio: np.ndarray
    actions: np.ndarray
    proprio_pad: np.ndarray
    actions_pad: np.ndarray
    lo_ns: int = 0  # the episode's span (the union of its segments in this slice)
    hi_ns: int = 0


class ChunkMemo(OrderedDict):
    """The reader's chunk memo kept across samples, bounded: oldest parsed chunk out first."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        while len(self) > self.limit:
            self.popitem(last=False)


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


# The streams of one episode end up to a sample period or so apart, so a grid point in the last (first)
# EDGE_PAD_NS of the episode's span, past its stream's last (before its first) sample, takes that edge
# sample and is marked padded, as LeRobot pads; a gap anywhere else still fails.
EDGE_PAD_NS = 100_000_000


def _on_grid(
    stream,
    field_name: str,
    grid_ns: np.ndarray,
    tolerance_s: float,
    path: str,
    span: tuple[int, int] | None = None,
    pad: np.ndarray | None = None,
) -> np.ndarray:
    """The recorded values nearest each grid time, each within the tolerance (else WindowError).
    With the episode's ``span``, edge points (see ``EDGE_PAD_NS``) take the edge sample and are set in
    ``pad``."""
    ts = stream.timestamps_ns
    if field_name not in stream.fields:
        raise WindowError(
            path, f"stream {stream.name} has no field {field_name!r} (has {sorted(stream.fields)})", stream.name
        )
    values = stream.fields[field_name]
    if len(ts) == 0:
        raise WindowError(path, f"no {stream.name} samples near {int(grid_ns[0])}..{int(grid_ns[-1])}", stream.name)
    right = np.clip(np.searchsorted(ts, grid_ns), 1, len(ts) - 1) if len(ts) > 1 else np.zeros(len(grid_ns), int)
    left = np.maximum(right - 1, 0)
    nearest = np.where(np.abs(ts[left] - grid_ns) <= np.abs(ts[right] - grid_ns), left, right)
    gap = np.abs(ts[nearest] - grid_ns)
    allowed = np.full(len(grid_ns), _ns(tolerance_s))
    if span is not None:
        edge = ((grid_ns > ts[-1]) & (grid_ns >= span[1] - EDGE_PAD_NS)) | (
            (grid_ns < ts[0]) & (grid_ns <= span[0] + EDGE_PAD_NS)
        )
        allowed[edge] = max(_ns(tolerance_s), EDGE_PAD_NS)
        if pad is not None:
            pad |= edge & (gap > _ns(tolerance_s))
    bad = np.flatnonzero(gap > allowed)
    if len(bad):
        i = int(bad[0])
        raise WindowError(
            path,
            f"{stream.name}.{field_name}: no sample within {tolerance_s * 1e3:.0f} ms of "
            f"{int(grid_ns[i])} (nearest {gap[i] / 1e6:.1f} ms away; {len(bad)} of {len(grid_ns)} "
            f"grid points)",
            stream.name,
        )
    out = np.asarray(values[nearest], dtype=np.float32)
    return out.reshape(len(grid_ns), -1)


GONE = "manifest object gone: "  # how MissingDataError names its object, kept through DataLoader's re-raise


class MissingDataError(FileNotFoundError):
    """An object the manifest names is gone from its store: a fault no retry mends (the manifest must be
    rebuilt once mcap_episodes.mcaps_present has marked it). One message argument, so DataLoader
    re-raises it in the main process as this type; :func:`gone_object` reads the object back."""


def open_episode(opener, uri: str) -> EpisodeReader:
    """The episode's reader; an object that is gone raises :class:`MissingDataError` naming it."""
    try:
        return EpisodeReader(opener(uri))
    except FileNotFoundError as e:
        raise MissingDataError(f"{GONE}{uri} ({e})") from None


def gone_object(error: BaseException) -> str | None:
    """The object a :class:`MissingDataError` (or its re-raise from a DataLoader worker) names."""
    m = re.search(re.escape(GONE) + r"(\S+)", str(error))
    return m.group(1) if m else None


def _fsspec_open(uri: str):
    import fsspec

    return fsspec.open(uri, "rb").open()


def worker_init_threads(_worker_id: int) -> None:
    """DataLoader workers decode video on one thread each: the cores belong to the workers."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


__all__ = ["LoaderPosition", "ManifestDataset", "SampleSpec", "worker_init_threads"]
