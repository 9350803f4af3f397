"""Training samples from a manifest: this rank's slice, split across DataLoader workers, resumable.

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
row moves fewer than ``shuffle_buffer`` places) mixes the stream; blocks keep reads of one file together (its chunks are reused), the buffer mixes
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
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dyna_resources.episodes.codec import resized_rgb
from dyna_resources.episodes.errors import WindowError
from dyna_resources.episodes.mcap_reader import EpisodeReader, FrameCache


@dataclass(frozen=True)
class SampleSpec:
    cameras: tuple[str, ...] | None = None  # None: every camera of the episode, sorted
    frame_offsets_s: tuple[float, ...] = (-0.5, 0.0)
    future_frame_s: float = 0.5
    image_size: tuple[int, int] = (64, 64)  # (H, W) after an area resize
    proprio_streams: tuple[tuple[str, str], ...] = (("joint_states", "position"), ("joint_states", "velocity"),
                                                      ("gripper", "position"))
    proprio_steps: int = 40
    proprio_hz: float = 50.0
    action_stream: tuple[str, str] = ("action", "command")
    action_chunk: int = 25
    action_hz: float = 50.0
    tolerance_s: float = 0.02  # nearest recorded sample must be this close to a grid point

    @property
    def action_horizon_ns(self) -> int:
        return int(round(self.action_chunk / self.action_hz * 1e9))

    def anchor_ns(self, start_ns: int, end_ns: int) -> int:
        """``t_now`` of a segment: its end minus the action chunk."""
        return end_ns - self.action_horizon_ns


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
        self._uri_codes = rank_of[uris.indices.to_numpy(zero_copy_only=False)]
        self._start = self.manifest.column("start_ns").slice(self.first_row, per_rank).to_numpy()
        self._end = self.manifest.column("end_ns").slice(self.first_row, per_rank).to_numpy()
        self._passes = 0  # full passes this process's copy started (persistent DataLoader workers)
        self._readers: OrderedDict = OrderedDict()
        self._readers_pid = os.getpid()

    # ---- position (the data part of a checkpoint) ---------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        return -(-self.rows // self.batch_size)

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "batches": self.position.batches, "seed": self.seed,
                "rows": self.rows, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        if (state["rows"], state["batch_size"]) != (self.rows, self.batch_size):
            raise ValueError(f"data position is for {state['rows']} rows in batches of {state['batch_size']}, this "
                             f"slice has {self.rows} rows in batches of {self.batch_size}: not the same run")
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
        local = np.argsort(self._uri_codes, kind="stable")  # by episode, then time (manifest order)
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
        return [order[j * self.batch_size:(j + 1) * self.batch_size]
                for j in range(start_batch, self.batches_per_epoch) if (j - start_batch) % workers == worker]

    # ---- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        if info is None:  # in the training process: its position is the truth
            worker, workers = 0, 1
            epoch, start = self.position.epoch, self.position.batches
        else:
            # A persistent worker's copy never sees the training process's advance(): it counts its own
            # passes from the position it was created with (the DataLoader is built after a resume).
            worker, workers = info.id, info.num_workers
            passes, self._passes = self._passes, self._passes + 1
            epoch = self.position.epoch + passes
            start = self.position.batches if passes == 0 else 0
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
            rows = self.order_cache(e)[j * self.batch_size:(j + 1) * self.batch_size]
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
            readers.popitem(last=False)[1][0].close()  # (reader, frames, chunks) of the oldest episode
        opener = self.open_file or _fsspec_open
        entry = readers[uri] = (EpisodeReader(opener(uri)),
                                FrameCache(resized_rgb(*self.spec.image_size), max_frames=self.frames_per_reader),
                                ChunkMemo(self.chunks_per_reader))
        return entry

    def sample_uri(self, local_row: int) -> str:
        return self._uri_names[self._uri_codes[local_row]]

    def sample(self, local_row: int, readers: OrderedDict | None = None) -> dict:
        readers = OrderedDict() if readers is None else readers
        spec = self.spec
        uri = self.sample_uri(local_row)
        start, end = int(self._start[local_row]), int(self._end[local_row])
        r, frame_cache, memo = self._reader(uri, readers)
        t_now = spec.anchor_ns(start, end)
        cams = list(spec.cameras) if spec.cameras is not None else r.cameras
        times = [t_now + int(round(o * 1e9)) for o in spec.frame_offsets_s]
        future_t = t_now + int(round(spec.future_frame_s * 1e9))
        proprio_t = t_now - np.arange(spec.proprio_steps - 1, -1, -1) * int(round(1e9 / spec.proprio_hz))
        action_t = t_now + np.arange(1, spec.action_chunk + 1) * int(round(1e9 / spec.action_hz))
        names = sorted({s for s, _ in spec.proprio_streams} | {spec.action_stream[0]})
        frames = r.read_frames(cams, [*times, future_t], memo=memo, cache=frame_cache)
        streams = r.read_streams(names, int(proprio_t[0]) - _ns(spec.tolerance_s),
                                 int(action_t[-1]) + _ns(spec.tolerance_s), memo=memo)
        images = torch.from_numpy(np.stack([frames[c].images for c in cams]))  # (C, K+1, 3, h, w) uint8
        proprio = np.concatenate([_on_grid(streams[s], f, proprio_t, spec.tolerance_s, r.path)
                                  for s, f in spec.proprio_streams], axis=1)
        actions = _on_grid(streams[spec.action_stream[0]], spec.action_stream[1], action_t, spec.tolerance_s, r.path)
        return {"frames": images[:, :-1], "future": images[:, -1], "proprio": torch.from_numpy(proprio),
                "actions": torch.from_numpy(actions), "row": self.first_row + local_row}

    @staticmethod
    def collate(samples: list[dict]) -> dict:
        return {"frames": torch.stack([s["frames"] for s in samples]),
                "future": torch.stack([s["future"] for s in samples]),
                "proprio": torch.stack([s["proprio"] for s in samples]),
                "actions": torch.stack([s["actions"] for s in samples]),
                "row": torch.tensor([s["row"] for s in samples], dtype=torch.int64)}


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


def _on_grid(stream, field_name: str, grid_ns: np.ndarray, tolerance_s: float, path: str) -> np.ndarray:
    """The recorded values nearest each grid time, each within the tolerance (else WindowError)."""
    ts = stream.timestamps_ns
    if field_name not in stream.fields:
        raise WindowError(path, f"stream {stream.name} has no field {field_name!r} (has {sorted(stream.fields)})",
                          stream.name)
    values = stream.fields[field_name]
    if len(ts) == 0:
        raise WindowError(path, f"no {stream.name} samples near {int(grid_ns[0])}..{int(grid_ns[-1])}", stream.name)
    right = np.clip(np.searchsorted(ts, grid_ns), 1, len(ts) - 1) if len(ts) > 1 else np.zeros(len(grid_ns), int)
    left = np.maximum(right - 1, 0)
    nearest = np.where(np.abs(ts[left] - grid_ns) <= np.abs(ts[right] - grid_ns), left, right)
    gap = np.abs(ts[nearest] - grid_ns)
    bad = np.flatnonzero(gap > _ns(tolerance_s))
    if len(bad):
        i = int(bad[0])
        raise WindowError(path, f"{stream.name}.{field_name}: no sample within {tolerance_s * 1e3:.0f} ms of "
                                f"{int(grid_ns[i])} (nearest {gap[i] / 1e6:.1f} ms away; {len(bad)} of {len(grid_ns)} "
                                f"grid points)", stream.name)
    out = np.asarray(values[nearest], dtype=np.float32)
    return out.reshape(len(grid_ns), -1)


def _fsspec_open(uri: str):
    import fsspec

    return fsspec.open(uri, "rb").open()


def worker_init_threads(_worker_id: int) -> None:
    """DataLoader workers decode video on one thread each: the cores belong to the workers."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


__all__ = ["LoaderPosition", "ManifestDataset", "SampleSpec", "worker_init_threads"]
