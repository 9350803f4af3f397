"""Checkpoints: sharded, asynchronous, local first, then uploaded; keep the last K; verified resume.

A checkpoint is a folder ``step-000000123/`` written by ``torch.distributed.checkpoint`` (DCP):
every rank writes its own shards (``__<rank>_<i>.distcp``) and rank 0 the ``.metadata``. The
same layout lives under ``local_dir`` and, once uploaded, under the store root::

    step-000000123/.metadata, __0_0.distcp, __1_0.distcp, ..., COMPLETE.json (always written last)
    latest       (local dir)   {"step": 123, "dir": "step-000000123"}   atomic pointer
    latest.json  (store root)  the same, uploaded after everything else

``COMPLETE.json`` lists every file with its size and SHA-256, plus ``extra`` (manifest data
version, pipeline versions, code commit...). A folder without it (a save killed mid-write) or
whose files do not match it is never loaded.

``CheckpointManager.save`` blocks only while DCP copies the state to CPU memory (staging); a
background thread then waits for DCP's write, hashes the files, writes ``COMPLETE.json`` and
the local pointer, uploads (shards, then ``COMPLETE.json``, then ``latest.json``) and prunes
to the last ``keep`` checkpoints, locally and in the store. One save is in flight at a time.
Errors of that background part are kept and raised by the next ``save``/``wait``.

``latest()`` takes the newest step every rank can get (complete here, or in the store), checks
every file's size and SHA-256 against ``COMPLETE.json``, downloads what this node lacks or has
damaged (under a file lock, so ranks on a node do not download concurrently) and skips, with a
warning, checkpoints that cannot be made whole. An unreachable store is an error, not a reason
to fall back: a run must not quietly restart from an older checkpoint, or from scratch. Neither
may it when every checkpoint it found is damaged: ``NoIntactCheckpointError`` lists each one and
why (the caller decides whether starting over is allowed).

Every ``latest()`` hashes the files again: file metadata is no evidence (a flipped bit, or a
rewrite with ``os.utime`` putting the mtime back, keeps size, mtime and inode). Within one call
the first rank of a node hashes and leaves a ``.verified.json`` stamp naming that call, so the
other ranks of the node trust it instead of hashing the same files again. The cost is reading
the checkpoint once per node at SHA-256 speed (files hashed in parallel, one thread per file).

What DCP does and does not do here (PyTorch 2.13):

- Without an initialized process group DCP saves and loads in the single process (it warns
  about that each time; the manager silences that warning).
- ``async_save``'s future completes only after DCP's "finish" step, which is collective: the
  coordinator writes ``.metadata`` after gathering every rank's write results. So when the
  future is done on rank 0, every rank's shards are on disk (fsynced by FileSystemWriter).
- Values that are not tensors (ints, tuples, numpy arrays) are pickled with ``torch.save``
  into the shard files and loaded with ``weights_only=False``; on load a plain dict in the
  state is replaced by the loaded dict, a ``Stateful`` gets ``load_state_dict``. Tensors are
  loaded in place, so the target must already have the saved shape.
- Non-tensor values and tensors that are not DTensors are deduplicated across ranks by key:
  per-rank values (RNG state) must be stored under per-rank keys (``RNGState`` does that).
- DCP has no notion of a completed checkpoint beyond ``.metadata``, no checksums, no upload,
  no retention and no "latest": that is what this module adds.
- The background thread's collectives run on a gloo group of their own, so they never
  interleave with the training loop's collectives on the default group.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from dyna_resources.storage.stores import Store, redact

MARKER = "COMPLETE.json"
LOCAL_POINTER = "latest"
REMOTE_POINTER = "latest.json"
_VERIFIED = ".verified.json"  # files hashed in this latest() call, so ranks sharing a node hash once
_LOCK = ".lock"
_STEP_DIR = re.compile(r"step-(\d{9,})")


def step_dir(step: int) -> str:
    return f"step-{step:09d}"


class CheckpointError(RuntimeError):
    pass


class NoIntactCheckpointError(CheckpointError):
    """Checkpoints were found, but none of them can be loaded by every rank: ``skipped`` says, per
    checkpoint, what is wrong (damaged files are named)."""

    def __init__(self, where: str, skipped: list[str]):
        self.skipped = list(skipped)
        super().__init__(f"no intact checkpoint to resume from in {where}: " + "; ".join(self.skipped))


class _Damaged(CheckpointError):
    """This checkpoint cannot be used (missing, incomplete, not matching its COMPLETE.json): skip it.
    Any other error while looking for one (e.g. the store is unreachable) is raised instead, so
    that a run never silently starts over from an older checkpoint, or from scratch."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path  # the local folder, verified against COMPLETE.json
    extra: dict
    files: dict[str, dict]  # name -> {"size": int, "sha256": str}
    time: float
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over, each with the reason


@dataclass(eq=False)
class SaveHandle:
    """One save: timings fill in as the background part progresses (``None`` until then)."""

    step: int
    path: Path
    blocking_s: float = 0.0  # how long save() held the caller, waited_s included
    waited_s: float = 0.0  # part of blocking_s spent waiting for the previous save
    write_s: float | None = None  # save() start -> every rank's shards on local disk
    upload_s: float | None = None
    total_s: float | None = None  # save() start -> uploaded and pruned
    _future: Future | None = field(default=None, repr=False)

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self) -> None:
        if self._future is not None:
            self._future.result()

    def timings(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "blocking_s": self.blocking_s,
            "waited_s": self.waited_s,
            "write_s": self.write_s,
            "upload_s": self.upload_s,
            "total_s": self.total_s,
        }


class CheckpointManager:
    """Saves and finds checkpoints under ``local_dir`` and (optionally) a store root.

    With a process group, construct it on every rank (it creates a gloo group collectively)
    and call ``save``/``latest``/``load`` on every rank. ``local_dir`` is per node (ranks on
    one host share it); the store is the exchange between nodes."""

    def __init__(
        self,
        local_dir: str | os.PathLike,
        *,
        store_url: str | Store | None = None,
        endpoint_url: str | None = None,
        keep: int = 3,
    ):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.local_dir = Path(local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        # DCP warns on every single-process save/load; that is this manager's intended mode
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        if isinstance(store_url, Store):
            self.store: Store | None = store_url
        else:
            self.store = Store.from_url(store_url, endpoint_url=endpoint_url) if store_url else None
        self._pg = None
        self.rank, self.world = 0, 1
        self._node_leader = True
        if dist.is_available() and dist.is_initialized():
            self._pg = dist.new_group(backend="gloo")
            self.rank, self.world = dist.get_rank(self._pg), dist.get_world_size(self._pg)
            hosts = self._all_gather(socket.gethostname())
            self._node_leader = hosts.index(hosts[self.rank]) == self.rank
        # Reused across saves: DCP's stager then keeps its CPU (pinned, with CUDA) buffers and
        # only copies into them. Safe because one save is in flight at a time.
        cuda = torch.cuda.is_available()
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
            )
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._inflight: SaveHandle | None = None
        self._closed = False
        self.history: list[SaveHandle] = []

    # ---- saving ---------------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any], *, extra: dict | None = None) -> SaveHandle:
        """Start saving ``state`` (values: ``Stateful`` objects, dicts of tensors, plain values) as
        checkpoint ``step``; returns once the state is staged. ``extra`` (JSON) goes into
        COMPLETE.json and comes back from ``load``."""
        t0 = time.perf_counter()
        self._wait_inflight()
        waited = time.perf_counter() - t0
        extra = dict(extra or {})
        json.dumps(extra)  # fail here, not in the background
        path = self.local_dir / step_dir(step)
        if self._node_leader:  # a folder left by an earlier attempt at this step: never "complete" meanwhile
            (path / MARKER).unlink(missing_ok=True)
            (path / _VERIFIED).unlink(missing_ok=True)
        future = dcp.async_save(
            state,
            storage_writer=dcp.FileSystemWriter(path),
            process_group=self._pg,
            async_stager=self._stager,
            no_dist=self._pg is None,
        )
        # use_async_staging=False: the stager hands back the state dict, not a Future, so async_save
        # returns the upload's Future (an AsyncSaveResponse comes only with async staging)
        assert isinstance(future, Future), type(future)
        handle = SaveHandle(step=step, path=path, waited_s=waited)
        handle.blocking_s = time.perf_counter() - t0
        handle._future = self._executor.submit(self._finish, handle, future, t0, extra)
        self._inflight = handle
        self.history.append(handle)
        return handle

    def wait(self) -> None:
        """Block until the save in flight is written, uploaded and pruned; raise its error if any."""
        self._wait_inflight()

    def close(self) -> None:
        """``wait()``, then release the background thread and the staging buffers."""
        try:
            self._wait_inflight()
        finally:
            if not self._closed:
                self._closed = True
                self._executor.shutdown(wait=True)
                self._stager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait_inflight(self) -> None:
        handle, self._inflight = self._inflight, None
        if handle is not None:
            handle.wait()

    def _finish(self, handle: SaveHandle, future: Future, t0: float, extra: dict) -> None:
        """The background part. Every rank runs the same collectives in the same order, and an
        error on any rank is raised on all of them (``_agree``), so the next save never
        finds some ranks in a collective and others gone."""
        name = step_dir(handle.step)
        own: dict[str, dict] = {}
        err = None
        try:
            metadata = future.result()
            handle.write_s = time.perf_counter() - t0
            written = {info.relative_path for info in metadata.storage_data.values()}
            mine = [f for f in written if f.startswith(f"__{self.rank}_")]
            if self.rank == 0:
                mine.append(".metadata")
            own = _hash_files(handle.path, mine)
        except Exception as e:
            err = e
        parts = self._all_gather((own, time.time(), extra, _describe(err)))
        self._agree([p[3] for p in parts], f"writing {name} to {self.local_dir}", err)
        files = {n: meta for p in parts for n, meta in p[0].items()}
        record = {"step": handle.step, "time": parts[0][1], "files": dict(sorted(files.items())), "extra": parts[0][2]}
        pointer = {"step": handle.step, "dir": name}

        err = None
        try:
            if self._node_leader:
                _write_json(handle.path / MARKER, record)
                _write_json(self.local_dir / LOCAL_POINTER, pointer)
            t_up = time.perf_counter()
            if self.store is not None:
                if self.rank == 0:  # a marker left by an earlier attempt at this step
                    self.store.delete(f"{name}/{MARKER}")
                for f in own:
                    self.store.put_file(handle.path / f, f"{name}/{f}")
        except Exception as e:
            err = e
        where = f"uploading {name} to {self._store_name()}" if self.store else f"finishing {name}"
        self._agree(self._all_gather(_describe(err)), where, err)

        err = None
        try:
            if self.store is not None and self.rank == 0:
                self.store.put_file(handle.path / MARKER, f"{name}/{MARKER}")
                self.store.put_bytes(REMOTE_POINTER, json.dumps(pointer).encode())
            if self.store is not None:
                handle.upload_s = time.perf_counter() - t_up
            if self.store is not None and self.rank == 0:
                self._prune_remote()
            if self._node_leader:
                self._prune_local()
        except Exception as e:
            err = e
        self._agree(self._all_gather(_describe(err)), f"publishing {name} to {self._store_name()}", err)
        handle.total_s = time.perf_counter() - t0

    def _agree(self, errors: list[str | None], doing: str, own: BaseException | None) -> None:
        failed = [(r, e) for r, e in enumerate(errors) if e]
        if failed:
            detail = "; ".join(f"rank {r}: {e}" for r, e in failed)
            raise CheckpointError(f"checkpoint failed while {doing}: {redact(detail)}") from own

    # ---- retention ------------------------------------------------------------------------------
    def _prune_local(self) -> None:
        with self._lock():
            steps = _local_steps(self.local_dir)
            complete = sorted(s for s in steps if (self.local_dir / step_dir(s) / MARKER).exists())
            pointed = _read_json(self.local_dir / LOCAL_POINTER)
            for s in _to_prune(steps, complete, self.keep, pointed.get("step") if pointed else None):
                folder = self.local_dir / step_dir(s)
                (folder / MARKER).unlink(missing_ok=True)  # first: a half-deleted folder is incomplete
                shutil.rmtree(folder, ignore_errors=True)

    def _prune_remote(self) -> None:
        assert self.store is not None, "only called with a store"
        by_step = _remote_steps(self.store)
        complete = sorted(s for s, keys in by_step.items() if f"{step_dir(s)}/{MARKER}" in keys)
        try:
            pointed = json.loads(self.store.cat(REMOTE_POINTER)).get("step")
        except (FileNotFoundError, ValueError):
            pointed = None
        for s in _to_prune(set(by_step), complete, self.keep, pointed):
            keys = by_step[s]
            marker = f"{step_dir(s)}/{MARKER}"
            for key in sorted(keys, key=lambda k: k != marker):  # the marker first
                self.store.delete(key)
            if self.store.protocol == "file":  # object stores have no folders; a file:// root does
                shutil.rmtree(Path(self.store.root.removeprefix("file://")) / step_dir(s), ignore_errors=True)

    # ---- finding and loading ------------------------------------------------------------------
    def latest(self) -> CheckpointInfo | None:
        """The newest complete checkpoint every rank can load, verified (sizes and SHA-256 of
        every file, hashed now), made local (downloaded from the store when this node lacks or has
        damaged files); ``None`` if there is none at all. Incomplete or damaged ones are skipped
        with a warning naming them and listed in ``skipped``; ``NoIntactCheckpointError`` if every
        one found was skipped. Collective with a process group: all ranks get the same step."""
        self._wait_inflight()
        session = self._all_gather(uuid.uuid4().hex)[0]  # names this call in the nodes' stamps
        excluded: set[int] = set()
        skipped: list[str] = []
        while True:
            mine, err = set(), None
            try:
                mine = self._candidates() - excluded
            except Exception as e:
                err = e
            parts = self._all_gather((mine, _describe(err)))
            self._agree([p[1] for p in parts], "looking for the latest checkpoint", err)
            found = [p[0] for p in parts]
            common = set.intersection(*found)
            if not common:
                for s in sorted(set().union(*found), reverse=True):  # on some ranks only
                    missing = [r for r, f in enumerate(found) if s not in f]
                    skipped.append(f"{step_dir(s)}: not found by rank(s) {', '.join(map(str, missing))}")
                if skipped:
                    raise NoIntactCheckpointError(self._where(), skipped)
                return None
            step = max(common)
            info, damaged, err = None, None, None
            try:
                info = self._materialize(step, session)
            except _Damaged as e:
                damaged = str(e)
            except Exception as e:
                err = e
            parts = self._all_gather((damaged, _describe(err)))
            self._agree([p[1] for p in parts], f"restoring {step_dir(step)}", err)
            if not any(p[0] for p in parts) and info is not None:
                return replace(info, skipped=tuple(skipped))
            for r, (problem, _) in enumerate(parts):
                if not problem:
                    continue
                skipped.append(f"{step_dir(step)} (rank {r}): {problem}")
                if r == self.rank or self.rank == 0:
                    warnings.warn(f"skipping checkpoint {step_dir(step)} (rank {r}): {problem}", stacklevel=2)
            excluded.add(step)

    def load(self, info: CheckpointInfo, state: dict[str, Any]) -> dict:
        """Load checkpoint ``info`` into ``state`` in place (as ``dcp.load``); returns its ``extra``."""
        dcp.load(state, checkpoint_id=info.path, process_group=self._pg, no_dist=self._pg is None)
        return info.extra

    def _candidates(self) -> set[int]:
        """Steps with a COMPLETE.json here or in the store (verified later, in ``_materialize``)."""
        found = set()
        for s in _local_steps(self.local_dir):
            if _read_json(self.local_dir / step_dir(s) / MARKER) is not None:
                found.add(s)
            elif self.rank == 0:
                warnings.warn(
                    f"ignoring incomplete checkpoint {self.local_dir / step_dir(s)}: no {MARKER} (killed mid-write?)",
                    stacklevel=3,
                )
        if self.store is not None:
            for s, keys in _remote_steps(self.store).items():
                if f"{step_dir(s)}/{MARKER}" in keys:
                    found.add(s)
        return found

    def _materialize(self, step: int, session: str | None = None) -> CheckpointInfo:
        """Make checkpoint ``step`` whole and verified in the local folder, downloading what is
        missing or damaged from the store; ``CheckpointError`` saying what is wrong otherwise.
        Under the node's lock: ranks on a node download and hash one after the other, and the
        ones after the first find the ``.verified.json`` stamp of this ``session`` (this
        ``latest()`` call) and hash nothing. Without a session every file is hashed."""
        session = session or uuid.uuid4().hex
        name = step_dir(step)
        folder = self.local_dir / name
        with self._lock():
            record = _read_json(folder / MARKER)
            from_store = record is None
            if record is None:
                record = self._remote_record(name)
            files = record["files"]
            if not _stamp_matches(folder, files, session):
                bad = [n for n, h in _hash_files(folder, list(files), missing_ok=True).items() if h != files[n]]
                bad += [n for n in files if not (folder / n).is_file()]
                if bad and self.store is None:
                    raise _Damaged(
                        f"{folder}: files missing or not matching {MARKER} (size/sha256): {', '.join(sorted(set(bad)))}"
                    )
                for n in sorted(set(bad)):
                    self._download(f"{name}/{n}", folder / n, files[n])
                if from_store:
                    _write_json(folder / MARKER, record)
                _write_json(folder / _VERIFIED, {"session": session, "files": _stat_files(folder, files)})
        return CheckpointInfo(
            step=record["step"], path=folder, extra=record.get("extra", {}), files=files, time=record["time"]
        )

    def _remote_record(self, name: str) -> dict:
        if self.store is None:
            raise _Damaged(f"{self.local_dir / name}: no {MARKER}")
        try:
            return json.loads(self.store.cat(f"{name}/{MARKER}"))
        except (FileNotFoundError, ValueError) as e:  # pruned meanwhile, or not JSON
            raise _Damaged(f"{self._store_name()}/{name}/{MARKER}: {_describe(e)}") from e

    def _download(self, key: str, dest: Path, expect: dict) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        assert self.store is not None, "only called with a store: without one a damaged file raises _Damaged"
        tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex}")
        try:
            h, size = hashlib.sha256(), 0
            if self.store.info(key).size != expect["size"]:  # refuse before downloading anything
                raise _Damaged(f"{self._store_name()}/{key} does not match {MARKER} (size)")
            with self.store.open(key, "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(8 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if {"size": size, "sha256": h.hexdigest()} != expect:
                raise _Damaged(f"{self._store_name()}/{key} does not match {MARKER} (size/sha256)")
            os.replace(tmp, dest)
        except FileNotFoundError as e:
            raise _Damaged(f"{self._store_name()}/{key} is missing") from e
        except _Damaged:
            raise
        except Exception as e:
            raise CheckpointError(f"downloading {key} from {self._store_name()} failed: {_describe(e)}") from e
        finally:
            tmp.unlink(missing_ok=True)

    # ---- helpers --------------------------------------------------------------------------------
    def _where(self) -> str:
        return str(self.local_dir) + (f" and {self._store_name()}" if self.store is not None else "")

    def _store_name(self) -> str:
        return redact(self.store.root) if self.store is not None else "(no store)"

    def _all_gather(self, obj: Any) -> list[Any]:
        if self._pg is None:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._pg)
        return out

    @contextmanager
    def _lock(self) -> Iterator[None]:
        with open(self.local_dir / _LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


# ---- state helpers ----------------------------------------------------------------------------
class AppState(Stateful):
    """Model (+ optimizer) through DCP's ``get_state_dict``/``set_state_dict``, which handle FSDP2
    / DTensor sharding, wrapped or compiled modules and optimizer state keyed by parameter FQN
    (the "Getting Started with Distributed Checkpoint" recipe)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        options: StateDictOptions | None = None,
    ):
        self.model, self.optimizer, self.options = model, optimizer, options

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict["model"], options=self.options)
            return
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=self.options,
        )


def rng_state() -> dict[str, Any]:
    """Python ``random``, numpy's global generator, torch CPU (and the current CUDA device)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class RNGState(Stateful):
    """This rank's RNG state under a per-rank key (DCP keeps one copy of same-named non-DTensor
    values across ranks). The torch states are uint8 tensors; python's and numpy's are pickled
    by DCP. ``source``, while set, is the rank whose state a load reads (a resume on another world
    size: a rank the saving run did not have reads an existing rank's)."""

    def __init__(self, rank: int | None = None):
        self.rank = rank
        self.source: int | None = None

    def _key(self) -> str:
        if self.source is not None:
            return f"rank{self.source}"
        rank = self.rank if self.rank is not None else (dist.get_rank() if dist.is_initialized() else 0)
        return f"rank{rank}"

    def state_dict(self) -> dict[str, Any]:
        return {self._key(): rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_rng_state(state_dict[self._key()])


# ---- files ------------------------------------------------------------------------------------
def _hash_files(folder: Path, names: list[str], *, missing_ok: bool = False) -> dict[str, dict]:
    """{name: {"size", "sha256"}}, hashed in parallel (hashlib releases the GIL)."""

    def one(name: str) -> tuple[str, dict | None]:
        try:
            with open(folder / name, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
                return name, {"size": os.fstat(f.fileno()).st_size, "sha256": digest}
        except FileNotFoundError:
            if missing_ok:
                return name, None
            raise

    with ThreadPoolExecutor(max(1, min(8, len(names)))) as pool:
        return {n: h for n, h in pool.map(one, names) if h is not None}


def _stat_files(folder: Path, files: dict[str, dict]) -> dict[str, list[int]]:
    out = {}
    for n in [*sorted(files), MARKER]:
        st = os.stat(folder / n)
        out[n] = [st.st_size, st.st_mtime_ns, st.st_ino]
    return out


def _stamp_matches(folder: Path, files: dict[str, dict], session: str) -> bool:
    """Whether another rank of this node hashed these very files in this ``latest()`` call."""
    stamp = _read_json(folder / _VERIFIED)
    if not isinstance(stamp, dict) or stamp.get("session") != session:
        return False
    try:
        return stamp.get("files") == _stat_files(folder, files)
    except FileNotFoundError:
        return False


def _write_json(path: Path, obj: Any) -> None:
    """Atomically: a temp file, fsynced, renamed over ``path``, then the folder fsynced."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def _local_steps(root: Path) -> set[int]:
    return {int(m[1]) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.fullmatch(p.name))}


def _remote_steps(store: Store) -> dict[int, list[str]]:
    by_step: dict[int, list[str]] = {}
    for key in store.ls():
        head, sep, _ = key.partition("/")
        if sep and (m := _STEP_DIR.fullmatch(head)):
            by_step.setdefault(int(m[1]), []).append(key)
    return by_step


def _to_prune(steps: set[int], complete: list[int], keep: int, pointed: int | None) -> list[int]:
    """Complete ones beyond the newest ``keep`` and incomplete ones older than the newest complete
    one (the one the pointer names is always kept; newer incomplete ones may be in flight)."""
    if not complete:
        return []
    kept = set(complete[-keep:]) | ({pointed} if pointed is not None else set())
    return sorted(s for s in steps if s not in kept and (s in complete or s < complete[-1]))


def _describe(e: BaseException | None) -> str | None:
    if e is None:
        return None
    msg = str(e).strip()
    return redact(f"{type(e).__name__}: {msg}" if msg else type(e).__name__)


__all__ = [
    "AppState",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "NoIntactCheckpointError",
    "RNGState",
    "SaveHandle",
    "rng_state",
    "set_rng_state",
    "step_dir",
]
