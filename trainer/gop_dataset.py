"""GOP-aware training samples: each decode unit decoded once, every sample anchored in it emitted
from that one decode.

Long GOPs make random access expensive: a frame in the middle of a 150-frame GOP costs ~75 decodes.
A world-action model reads long continuous stretches anyway, so this loader plans its work as
decode units (one episode, a window of GOPs, the cameras read; ``trainer.sampling``), decodes each
unit's cameras once, sequentially, on threads (libavcodec and libswscale release the GIL), converts
and resizes only the frames the unit's samples use, and emits the samples from that decode. The
randomness the model sees comes from the unit permutation and the bounded mix of ``mix_units``
units in flight per lane; ``mix_units`` is the knob between randomness and decoded frames held in
memory (docs/benchmarks.md, `loader`: its measured effect).

Every batch carries what it cost: ``decoded_frames`` (through the decoder), ``delivered_frames``
(frames in the batch's samples), ``bytes_read`` (MCAP bytes fetched) and ``skipped`` (samples
dropped with ``bad_samples="skip"``), so the trainer reports decodes per delivered frame.

Failures stay with their samples: a frame that is missing or whose GOP does not decode fails only
the samples that read it, with a ``WindowError`` naming the episode, camera and time
(``bad_samples="raise"``, the default) or by leaving them out of their batch (``"skip"``, counted).

No Dagster import: every DataLoader worker imports this module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from dyna_resources.episodes.errors import EpisodeError, WindowError
from dyna_resources.episodes.gop_decode import CameraFrames, DecoderBackend, decode_at, swscale_rgb
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.storage.origins import ObjectChangedError
from dyna_resources.storage.stores import StoreUnavailableError

from .dataset import EDGE_PAD_NS, ManifestDataset, SampleTimes, _fsspec_open, _ns, open_episode
from .sampling import LaneOrder, lane_orders, unit_of, usable_samples

BAD_SAMPLES = ("raise", "skip")
READ_ATTEMPTS = 3  # decodes of a unit whose read-through met the store down (as the origin prefetch's pieces)
READ_RETRY_WAIT_S = 0.5  # doubled after each


@dataclass
class GopDataset(ManifestDataset):
    """Batches of samples from this rank's slice, read unit by unit (see the module doc). Same
    position, ``state_dict`` and resume contract as :class:`ManifestDataset`; worker counts must
    divide ``lanes``."""

    unit_s: float = 20.0  # decode unit: a window of this many seconds of one episode (whole GOPs: 4 at 5 s)
    mix_units: float = 3.0  # units mixed in flight per lane (1: none; more: more random, more memory)
    lanes: int = 4  # independent unit streams; DataLoader worker counts must divide it
    decode_threads: int = 0  # threads decoding a unit's cameras; 0: one per camera, at most 4
    decoder: str = "cpu"  # "cpu", "cuda" (NVDEC) or "auto" (cuda when a GPU answers)
    bad_samples: str = "raise"  # a sample whose frame or stream fails: "raise" WindowError, or "skip" it
    _lane_memo: tuple | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {self.lanes}")
        if self.bad_samples not in BAD_SAMPLES:
            raise ValueError(f"bad_samples {self.bad_samples!r}: expected one of {BAD_SAMPLES}")
        if not 0.01 <= self.unit_s <= 3600:
            raise ValueError(f"unit_s {self.unit_s} outside [0.01, 3600] s")
        super().__post_init__()
        self._units = unit_of(self.plan, int(self.spec.all_frame_offsets_ns().min()), _ns(self.unit_s))
        self._pool: ThreadPoolExecutor | None = None
        self._backend: DecoderBackend | None = None

    def _usable_samples(self, per_rank: int) -> int:
        n, self.lanes = usable_samples(self._rank_sample_counts(per_rank), self.lanes, self.batch_size)
        return n

    @property
    def batches_per_epoch(self) -> int:
        return self.rows // self.batch_size

    def lanes_of(self, epoch: int) -> list[LaneOrder]:
        # The epochs used last are kept (3): the prefetch looks into the next ones while one is read.
        # (lane_orders' keyword call is alike in shape only to generate_fleet's in sim/fleet.py and
        # transcode_batch's in ingest/partitions.py)
        memo = dict(self._lane_memo or ())
        lanes = memo.pop(epoch, None)
        if lanes is None:
            lanes = lane_orders(
                self.plan,
                self._units,
                self.rows,
                lanes=self.lanes,
                mix_units=self.mix_units,
                seed=self.seed,
                epoch=epoch,
                rank=self.rank,
            )
        memo[epoch] = lanes  # the most recent last
        self._lane_memo = tuple(memo.items())[-3:]
        return lanes

    def batch_samples(self, epoch: int, j: int) -> np.ndarray:
        """The sample indices of batch ``j`` of ``epoch`` (what any worker count delivers there)."""
        lane = self.lanes_of(epoch)[j % self.lanes]
        i = j // self.lanes
        return lane.samples[i * self.batch_size : (i + 1) * self.batch_size]

    # ---- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        worker, workers, epoch, start = self._pass_start()
        if self.lanes % workers:
            raise ValueError(
                f"{workers} DataLoader workers do not divide lanes={self.lanes}: a unit would be "
                "decoded by several workers; choose a worker count that divides lanes (or set lanes)"
            )
        per_epoch = self.batches_per_epoch
        first = epoch * per_epoch + start
        last = None if self.continuous else (epoch + 1) * per_epoch
        lanes: dict[tuple[int, int], _LaneReader] = {}
        g = first + worker
        while last is None or g < last:
            e, j = divmod(g, per_epoch)
            key = (e, j % self.lanes)
            if key not in lanes:
                for old in [k for k in lanes if k[0] < e]:
                    del lanes[old]
                lanes[key] = _LaneReader(self, self.lanes_of(e)[j % self.lanes], j // self.lanes)
            yield lanes[key].batch(j // self.lanes)
            g += workers

    # ---- decoding one unit --------------------------------------------------------------------
    def _threads(self, cameras: int) -> ThreadPoolExecutor | None:
        n = self.decode_threads or min(cameras, 4)
        if n <= 1:
            return None
        if self._pool is None or self._readers_pid != os.getpid():
            self._pool = ThreadPoolExecutor(n, thread_name_prefix="gop-decode")
        return self._pool

    def _open(self, uri: str) -> EpisodeReader:
        if self._readers_pid != os.getpid():  # a forked worker must not share the parent's open files
            self._readers.clear()
            self._pool = None
            self._readers_pid = os.getpid()
        r = self._readers.get(uri)
        if r is not None:
            self._readers.move_to_end(uri)
            return r
        if len(self._readers) >= self.readers_per_worker:
            self._readers.popitem(last=False)[1].close()
        r = self._readers[uri] = open_episode(self.open_file or _fsspec_open, uri)
        return r

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def unit_reads(self, samples: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
        """(episode URL, window starts, window ends): the spans of one unit's samples (of one episode) its
        decode reads, padded as ``decode_unit`` pads its chunk reads: what the origin prefetch fetches."""
        spec, plan = self.spec, self.plan
        offsets = np.concatenate(
            [spec.all_frame_offsets_ns(), spec.proprio_offsets_ns(), spec.action_offsets_ns()]
        ).astype(np.int64)
        pad = _ns(0.1) + _ns(spec.tolerance_s)
        anchors = plan.anchor_ns[samples].astype(np.int64)
        return (
            self._uri_names[int(plan.code[samples[0]])],
            anchors + int(offsets.min()) - pad,
            anchors + int(offsets.max()) + pad,
        )

    def decode_unit(self, samples: np.ndarray) -> _Unit:
        """Every frame and stream value the samples (of one episode) read, decoded once."""
        spec, plan = self.spec, self.plan
        if self._backend is None:
            self._backend = DecoderBackend(self.decoder)  # type: ignore[arg-type]  # a str, checked by DecoderBackend
        backend = self._backend
        uri = self._uri_names[int(plan.code[samples[0]])]
        r = self._open(uri)
        bytes_before = r.log.bytes
        code = int(plan.code[samples[0]])
        lo, hi = int(plan.lo_ns[code]), int(plan.hi_ns[code])
        anchors = plan.anchor_ns[samples][:, None]
        frame_wanted = anchors + spec.all_frame_offsets_ns()[None, :]
        frame_t = np.clip(frame_wanted, lo, hi)
        # near the episode's edge a camera may end (start) a little before (after) the span: the edge frame
        # stands in within EDGE_PAD_NS there, as the streams' edge samples do (dataset._on_grid)
        frame_pad = (frame_t >= hi - EDGE_PAD_NS) | (frame_t <= lo + EDGE_PAD_NS)
        del frame_wanted
        proprio_t = np.clip(anchors + spec.proprio_offsets_ns()[None, :], lo, hi)
        action_t = np.clip(anchors + spec.action_offsets_ns()[None, :], lo, hi)
        cams = list(spec.cameras) if spec.cameras is not None else r.cameras
        memo: dict = {}
        # Load the unit's camera chunks here, once, so the camera threads only parse what is loaded.
        topic = r.video_topic(cams[0], spec.stream) if spec.stream else None
        for cam in cams[:1]:
            cid = r._channel(topic or f"/camera/{cam}", "camera")
            for j in r._chunk_range(cid, int(frame_t.min()) - _ns(0.1), int(frame_t.max()) + _ns(0.1)):
                r._load_chunk(r._chunks_of[cid][j], memo)
        transform = swscale_rgb(*spec.image_size)

        def one(cam: str) -> CameraFrames:
            cid = r._channel(r.video_topic(cam, spec.stream) if spec.stream else f"/camera/{cam}", "camera")
            rate = float(r.channels[cid].metadata.get("rate_hz", 0) or 0)
            period = int(1e9 / rate) if rate > 0 else 0
            tolerance = np.where(frame_pad.ravel(), max(period, EDGE_PAD_NS), period)
            return decode_at(
                r,
                cam,
                frame_t.ravel(),
                transform=transform,
                stream=spec.stream,
                memo=memo,
                backend=backend,
                tolerance_ns=tolerance,  # type: ignore[arg-type]  # decode_at takes one per request too, annotated int
            )

        pool = self._threads(len(cams))
        frames = list(pool.map(one, cams)) if pool is not None else [one(c) for c in cams]
        tol = _ns(spec.tolerance_s)
        streams_error = None
        try:
            streams = r.read_streams(
                spec.stream_names(), int(proprio_t.min()) - tol, int(action_t.max()) + tol, memo=memo
            )
        except EpisodeError as e:  # a damaged proprio chunk fails the unit's samples, not the run
            streams, streams_error = {}, e
        return _Unit(
            samples,
            frames,
            streams,
            streams_error,
            frame_t,
            proprio_t,
            action_t,
            lo,
            hi,
            r.path,
            decoded=sum(f.decoded for f in frames),
            bytes_read=r.log.bytes - bytes_before,
        )

    def unit_sample(self, unit: _Unit, k: int) -> dict:
        """Sample ``k`` of ``unit`` (its position in ``unit.samples``), from the unit's decode."""
        spec = self.spec
        i = int(unit.samples[k])
        width = unit.frame_t.shape[1]
        rows = slice(k * width, (k + 1) * width)  # a view of each camera's frames, copied once by the stack
        for f in unit.frames:
            reason = f.error_for(range(rows.start, rows.stop)) if f.errors else None
            if reason is not None:
                raise WindowError(unit.path, reason, f.topic)
        if unit.streams_error is not None:
            raise unit.streams_error
        images = np.stack([f.images[rows] for f in unit.frames])  # (C, K+1, 3, h, w)
        t = int(self.plan.anchor_ns[i])
        times = SampleTimes(
            t,
            unit.frame_t[k],
            unit.proprio_t[k],
            unit.action_t[k],
            t + spec.proprio_offsets_ns() < unit.lo,
            t + spec.action_offsets_ns() > unit.hi,
            unit.lo,
            unit.hi,
        )
        return self.assemble(i, images, unit.streams, times, unit.path)


@dataclass
class _Unit:
    samples: np.ndarray
    frames: list[CameraFrames]
    streams: dict
    streams_error: Exception | None
    frame_t: np.ndarray
    proprio_t: np.ndarray
    action_t: np.ndarray
    lo: int
    hi: int
    path: str
    decoded: int = 0
    bytes_read: int = 0
    position: dict = field(default_factory=dict)  # sample index -> k
    error: EpisodeError | None = None  # every sample of the unit fails with it (its bytes could not be read)


class _LaneReader:
    """One lane of one epoch in a worker: decodes each unit when its first sample is due, drops it
    after its last (a resume mid-lane decodes only what is still to come)."""

    def __init__(
        self,
        ds: GopDataset,
        order: LaneOrder,
        first_batch: int,
        visits: np.ndarray | None = None,
        fetch_error: Callable[[int], str | None] | None = None,
    ):
        """``visits``: the lane's batches this reader will serve (default: every one from ``first_batch``);
        a unit is decoded for, and dropped after, the samples of those batches only. ``fetch_error(unit)``:
        why the origin prefetch could not fetch the unit's bytes (None: it could, or there is none)."""
        self.ds, self.order, self.fetch_error = ds, order, fetch_error
        bs = ds.batch_size
        served = np.zeros(len(order.unit), bool)
        if visits is None:
            served[first_batch * bs :] = True
        else:
            for k in np.asarray(visits, np.int64).tolist():
                served[k * bs : (k + 1) * bs] = True
        self.served = served
        n_units = int(order.unit.max()) + 1 if len(order.unit) else 0
        self.left = np.bincount(order.unit[served], minlength=n_units)
        by_unit = np.argsort(order.unit, kind="stable")
        self._by_unit = by_unit
        self._bounds = np.searchsorted(order.unit[by_unit], np.arange(n_units + 1))
        self.live: dict[int, _Unit] = {}
        self.last_good: list[dict] = []

    def _members(self, u: int) -> np.ndarray:
        positions = self._by_unit[self._bounds[u] : self._bounds[u + 1]]
        positions = np.sort(positions[self.served[positions]])
        return self.order.samples[positions]

    def _decode(self, u: int, members: np.ndarray) -> _Unit:
        """The unit decoded; or, when its bytes cannot be had from the origin (the prefetch failed after its
        retries, or a read-through failed), a unit whose every sample fails naming the object."""
        why = self.fetch_error(u) if self.fetch_error is not None else None
        for attempt in range(READ_ATTEMPTS if why is None else 0):
            try:
                return self.ds.decode_unit(members)
            except StoreUnavailableError as e:  # a read-through met the store down: tried again, then failed
                why = str(e)
                if attempt + 1 < READ_ATTEMPTS:
                    time.sleep(READ_RETRY_WAIT_S * 2**attempt)
            except ObjectChangedError as e:  # another version now: no retry helps
                why = str(e)
                break
        uri = self.ds._uri_names[int(self.ds.plan.code[members[0]])]
        failed = _Unit(members, [], {}, None, *(np.empty((0, 0), np.int64),) * 3, 0, 0, uri)
        failed.error = WindowError(uri, f"its bytes could not be read from the origin: {why}")
        return failed

    def batch(self, i: int) -> dict:
        ds = self.ds
        lo, hi = i * ds.batch_size, (i + 1) * ds.batch_size
        decoded = bytes_read = 0
        out, skipped = [], 0
        for s, u in zip(self.order.samples[lo:hi].tolist(), self.order.unit[lo:hi].tolist(), strict=True):
            unit = self.live.get(u)
            if unit is None:
                members = self._members(u)
                unit = self.live[u] = self._decode(u, members)
                unit.position = {int(m): k for k, m in enumerate(members.tolist())}
                decoded += unit.decoded
                bytes_read += unit.bytes_read
            try:
                if unit.error is not None:
                    raise unit.error
                out.append(ds.unit_sample(unit, unit.position[s]))
            except EpisodeError:
                if ds.bad_samples == "raise":
                    raise
                skipped += 1
            self.left[u] -= 1
            if self.left[u] == 0:
                del self.live[u]
        if not out:  # every sample failed: repeat the lane's last good ones rather than stall the collectives
            if not self.last_good:
                raise WindowError("", f"every sample of batch {i} failed (bad_samples='skip') and none came before")
            out = self.last_good
        self.last_good = out
        batch = ds.collate(out)
        k1 = len(ds.spec.all_frame_offsets_ns())
        cams = out[0]["frames"].shape[0]
        batch["decoded_frames"] = torch.tensor(decoded)
        batch["delivered_frames"] = torch.tensor(len(out) * cams * k1)
        batch["bytes_read"] = torch.tensor(bytes_read)
        batch["skipped"] = torch.tensor(skipped)
        return batch


__all__ = ["GopDataset"]
