"""One global sample order for any number of ranks and DataLoader workers (elastic determinism).

When preflight drains a node and a job is requeued on fewer (or more) nodes, the epoch must go on
where it stopped: no sample repeated, none skipped. So an epoch's order is a function of (seed,
epoch) only, and the position is one number, the batches consumed by all ranks together.

The manifest is cut into ``shards`` contiguous slices, a count fixed by the run's config and never by
the world size. Each shard is a loader of its own (:class:`~.gop_dataset.GopDataset` or
:class:`~.dataset.ManifestDataset` with ``rank=shard, world=shards``: one lane, its order a pure
function of (seed, epoch, shard)), and every shard holds the same number of batches ``b`` per epoch.
Global batch ``g`` of the stream (numbered through the epochs, ``B = shards * b`` per epoch) is batch
``(g mod B) // shards`` of shard ``g mod shards``.

Rank ``r`` of ``W`` resuming at position ``P`` reads ``g = P + r + W*i`` (``i = 0, 1, ...``), and its
DataLoader worker ``w`` of ``K`` serves ``i = w (mod K)``: worker (r, w) reads ``g = P + r + W*w (mod
W*K)``. When ``W*K`` divides ``shards`` every shard is read by exactly one worker, so a decode unit is
still decoded once, by one worker. Otherwise the stream is still exact (each batch delivered once)
but a shard is shared by workers, each decoding the units of the batches it serves (a warning says
so). A manifest too small for ``shards`` shards of at least ``MIN_SHARD_BATCHES`` batches runs on the
largest divisor of ``shards`` that fits (the same on every rank, whatever the world size).

The guarantee MosaicML Streaming calls "elastic determinism". What it costs here: every shard keeps
the samples of the smallest one in whole batches, so up to ``shards * batch`` samples an epoch plus
the shards' imbalance are left out (the same ones every epoch, as ``DistributedSampler(drop_last=True)``
leaves rows out); each process plans only the shards it reads (about 1/W of the manifest).

**Origin prefetch** (``prefetch_batches`` > 0 and a ``page_cache``): before each batch, the decode
units of this process's next ``prefetch_batches`` batches are handed to a :class:`~.prefetch.
OriginPrefetcher`, which fetches their chunks into the node page cache (``trainer.prefetch``), so a
cold epoch needs no prewarm; a unit whose bytes it could not fetch fails its samples only.

No Dagster import: every DataLoader worker imports this module.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from torch.utils.data import IterableDataset, get_worker_info

from .dataset import LoaderPosition, ManifestDataset, SampleSpec
from .gop_dataset import GopDataset, _LaneReader
from .sampling import samples_per_row

log = logging.getLogger(__name__)
MIN_SHARD_BATCHES = 8  # a shard smaller than this many batches: fewer shards (less data left out)


def shard_count(
    counts_per_row: np.ndarray, shards: int, batch_size: int, whole_batches: bool = True
) -> tuple[int, np.ndarray]:
    """(shards used, samples in each): the largest divisor of ``shards`` whose slices each hold at least
    ``MIN_SHARD_BATCHES`` batches; else one shard, of at least one batch (``whole_batches``: the GOP-aware
    loader's) or of at least one sample (random access ends an epoch on a short batch)."""
    rows = len(counts_per_row)
    for d in sorted((d for d in range(1, shards + 1) if shards % d == 0), reverse=True):
        per = rows // d
        if per == 0:
            continue
        slices = counts_per_row[: per * d].reshape(d, per).sum(axis=1)
        floor = batch_size if whole_batches else 1
        if int(slices.min()) >= MIN_SHARD_BATCHES * batch_size or (d == 1 and int(slices.min()) >= floor):
            return d, slices
    raise ValueError(f"a manifest of {rows} rows holds too few samples for one batch of {batch_size}")


@dataclass
class ElasticStream(IterableDataset):
    """This rank's batches of the one global stream (see the module doc). ``loader`` is ``"gop"`` or
    ``"random"``; ``options`` go to every shard's loader (``unit_s``, ``mix_units``, ``open_file``...)."""

    manifest: pa.Table
    spec: SampleSpec = field(default_factory=SampleSpec)
    loader: str = "gop"
    batch_size: int = 8
    rank: int = 0
    world: int = 1
    seed: int = 0
    shards: int = 64
    continuous: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    position: LoaderPosition = field(default_factory=LoaderPosition)
    # Origin prefetch (the module doc): batches looked ahead, and the node page cache it fills (a
    # PageCache; options' open_file must read through it). 0 or no cache: none.
    prefetch_batches: int = 0
    page_cache: Any = None

    def __post_init__(self):
        super().__init__()
        if self.loader not in ("gop", "random"):
            raise ValueError(f"loader {self.loader!r}: expected 'gop' or 'random'")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside world size {self.world}")
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        counts = samples_per_row(
            self.manifest.column("start_ns").to_numpy(),
            self.manifest.column("end_ns").to_numpy(),
            self.spec.anchors,
            self.spec.anchor_every_ns,
        )
        self.n_shards, self._slice_samples = shard_count(counts, self.shards, self.batch_size, self.loader == "gop")
        self._shards: dict[int, ManifestDataset] = {}
        self._readers: OrderedDict = OrderedDict()  # the open episodes, shared by this process's shards
        self._readers_pid = os.getpid()
        self._passes = 0
        self._shared: dict[str, Any] = {}  # a GOP worker's decode thread pool and decoder, shared by its shards
        self._prefetcher: Any = None  # this process's OriginPrefetcher (made on first use: threads do not fork)
        self._unit_index: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        first = self.shard(0)
        self.shard_batches = first.batches_per_epoch  # the same in every shard
        self.rows = first.rows * self.n_shards  # samples per epoch, all ranks together

    # ---- shards -------------------------------------------------------------------------------
    def shard(self, v: int) -> ManifestDataset:
        """Shard ``v``'s loader, planned on first use (each process plans only the shards it reads)."""
        ds = self._shards.get(v)
        if ds is None:
            common = dict(
                spec=self.spec,
                batch_size=self.batch_size,
                rank=v,
                world=self.n_shards,
                seed=self.seed,
                slice_samples=self._slice_samples,
                **self.options,
            )
            if self.loader == "gop":
                ds = GopDataset(self.manifest, lanes=1, **common)
            else:
                ds = ManifestDataset(self.manifest, **common)
            self._shards[v] = ds
        return ds

    # ---- position (the data part of a checkpoint) ---------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        """Global batches per epoch (all ranks together)."""
        return self.n_shards * self.shard_batches

    def state_dict(self) -> dict:
        return {
            "epoch": self.position.epoch,
            "batches": self.position.batches,
            "seed": self.seed,
            "rows": self.rows,
            "batch_size": self.batch_size,
            "shards": self.n_shards,
        }

    def load_state_dict(self, state: dict) -> None:
        mine = (self.rows, self.batch_size, self.n_shards)
        theirs = (state["rows"], state["batch_size"], state.get("shards"))
        if theirs != mine:
            raise ValueError(
                f"data position is for {theirs[0]} samples in batches of {theirs[1]} over {theirs[2]} shards; "
                f"this stream has {mine[0]} in batches of {mine[1]} over {mine[2]}: not the same run"
            )
        self.seed = state["seed"]
        self.position = LoaderPosition(state["epoch"], state["batches"])

    def advance(self, batches: int | None = None) -> None:
        """One step consumed ``batches`` global batches (default: one per rank)."""
        self.position.batches += self.world if batches is None else batches
        while self.position.batches >= self.batches_per_epoch:
            self.position = LoaderPosition(self.position.epoch + 1, self.position.batches - self.batches_per_epoch)

    # ---- which batches ------------------------------------------------------------------------
    def locate(self, g: int) -> tuple[int, int, int]:
        """(epoch, shard, batch within the shard's epoch) of global batch ``g``."""
        e, j = divmod(g, self.batches_per_epoch)
        return e, j % self.n_shards, j // self.n_shards

    def rank_batches(self, start: int, count: int) -> list[int]:
        """The global batches this rank reads next, from position ``start``: what the training loop gets."""
        return [start + self.rank + self.world * i for i in range(count)]

    def _pass_start(self) -> tuple[int, int, int]:
        """(worker, workers, first global batch of this pass) in this process."""
        info = get_worker_info()
        start = self.position.epoch * self.batches_per_epoch + self.position.batches
        if info is None:
            return 0, 1, start
        # A persistent worker's copy never sees the training process's advance(): it counts its own
        # passes from the position it was created with (the DataLoader is built after a resume).
        passes, self._passes = self._passes, self._passes + 1
        if passes:
            start = (self.position.epoch + passes) * self.batches_per_epoch
        return info.id, info.num_workers, start

    def __iter__(self) -> Iterator[dict]:
        if self._readers_pid != os.getpid():  # a forked worker must not share the parent's open files
            self._readers.clear()
            self._shared.clear()
            self._prefetcher = None
            self._readers_pid = os.getpid()
        worker, workers, start = self._pass_start()
        if self.n_shards % (self.world * workers) and worker == 0 and self.rank == 0:
            log.warning(
                "%d ranks x %d DataLoader workers do not divide %d shards: shards are shared by workers "
                "and some decode units are decoded twice (the sample stream is exact all the same)",
                self.world,
                workers,
                self.n_shards,
            )
        step = self.world * workers
        g = start + self.rank + self.world * worker
        last = None if self.continuous else (start // self.batches_per_epoch + 1) * self.batches_per_epoch
        lanes: dict[tuple[int, int], _LaneReader] = {}
        prefetch = self._prefetch()
        ahead = g  # the next batch whose units are handed to the prefetch
        while last is None or g < last:
            e, v, k = self.locate(g)
            ds = self.shard(v)
            if prefetch is not None:
                while ahead <= g + step * self.prefetch_batches and (last is None or ahead < last):
                    self._fetch_ahead(prefetch, ahead)
                    ahead += step
            if isinstance(ds, GopDataset):
                self._share(ds)
                key = (e, v)
                if key not in lanes:
                    for old in [x for x in lanes if x[0] < e]:
                        del lanes[old]
                    lanes[key] = _LaneReader(
                        ds,
                        ds.lanes_of(e)[0],
                        k,
                        visits=self._visits(g, step, v),
                        fetch_error=None if prefetch is None else self._fetch_error(prefetch, e, v),
                    )
                batch = lanes[key].batch(k)
                self._shared.setdefault("pool", ds._pool)
                self._shared.setdefault("backend", ds._backend)
                yield batch
            else:
                rows = ds.order_cache(e)[k * self.batch_size : (k + 1) * self.batch_size]
                yield ds.collate([ds.sample(int(r), self._readers) for r in rows])
            g += step

    def _prefetch(self):
        """This process's origin prefetcher, or None (off, or the random-access loader's)."""
        if self.prefetch_batches <= 0 or self.page_cache is None or self.loader != "gop":
            return None
        if self._prefetcher is None:
            from dyna_resources.storage.cache_fs import CachedFileSystem
            from dyna_resources.storage.prewarm import ReadSet

            from .prefetch import OriginPrefetcher

            cameras = tuple(self.spec.cameras) if self.spec.cameras is not None else None
            self._prefetcher = OriginPrefetcher(
                self.page_cache,
                self.options.get("open_file") or CachedFileSystem(self.page_cache).open,
                ReadSet(cameras=cameras, video_stream=self.spec.stream),
            )
        return self._prefetcher

    @staticmethod
    def _fetch_error(prefetch, e: int, v: int) -> Callable[[int], str | None]:
        return lambda u: prefetch.error((e, v, u))

    def _fetch_ahead(self, prefetch, g: int) -> None:
        """Hand the decode units of global batch ``g`` to the prefetch (each unit once)."""
        e, v, k = self.locate(g)
        ds = self.shard(v)
        assert isinstance(ds, GopDataset)
        order = ds.lanes_of(e)[0]
        index = self._unit_index.get((e, v))
        if index is None:
            for old in [x for x in self._unit_index if x[0] < e]:
                del self._unit_index[old]
            by_unit = np.argsort(order.unit, kind="stable")
            n_units = int(order.unit.max()) + 1 if len(order.unit) else 0
            index = self._unit_index[(e, v)] = (by_unit, np.searchsorted(order.unit[by_unit], np.arange(n_units + 1)))
        by_unit, bounds = index
        units = order.unit[k * self.batch_size : (k + 1) * self.batch_size]
        for u in dict.fromkeys(units.tolist()):  # in the order the batch first needs them
            if prefetch.unit((e, v, u)) is not None:
                continue
            members = order.samples[np.sort(by_unit[bounds[u] : bounds[u + 1]])]
            url, starts, ends = ds.unit_reads(members)
            prefetch.add((e, v, u), url, starts, ends)

    def _share(self, ds: GopDataset) -> None:
        """One LRU of open episodes, one decode thread pool and one decoder for every shard this process reads."""
        ds._readers, ds._readers_pid = self._readers, self._readers_pid
        if ds._pool is None and self._shared.get("pool") is not None:
            ds._pool = self._shared["pool"]
        if ds._backend is None and self._shared.get("backend") is not None:
            ds._backend = self._shared["backend"]

    def _visits(self, g: int, step: int, v: int) -> np.ndarray:
        """The batches of shard ``v`` this process serves in ``g``'s epoch, from ``g`` on."""
        end = (g // self.batches_per_epoch + 1) * self.batches_per_epoch
        mine = np.arange(g, end, step)
        mine = mine[(mine % self.batches_per_epoch) % self.n_shards == v]
        return (mine % self.batches_per_epoch) // self.n_shards

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        for ds in self._shards.values():
            ds.close()
        for r, *_ in (e if isinstance(e, tuple) else (e,) for e in self._readers.values()):
            r.close()
        self._readers.clear()
