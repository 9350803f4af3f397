"""Load a manifest on many ranks: one download per node, memory-mapped, zero-copy 1/N slices.

Every rank on a node calls :func:`local_copy` with the manifest's ``.arrow`` URL (a plain
path, ``file://…``, ``gs://bucket/…``: anything fsspec resolves). Whichever rank takes the
node-local lock first downloads; the others block on the lock, then find the copy.

The download asks the store for the object's size once, then fetches fixed-size byte
ranges concurrently from a thread pool and writes each with ``os.pwrite`` into a
preallocated temp file. The SHA-256 is fed in file order as parts arrive (overlapped with
the download, no second pass), compared with the sidecar the writer put next to the
``.arrow`` file (same name, ``.json``, written last), and only then is the temp file
renamed to its content-addressed name ``<sha256>.arrow``. A checksum mismatch, an object
that changed during the download, a missing sidecar or an unreachable store raise
:class:`ManifestError` and leave no temp file behind.

Then every rank memory-maps the same Arrow IPC file: its pages are shared through the page
cache, and a rank's slice is a view, never a copy (``table.slice``). No Dagster here.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc

from dyna_resources.storage.stores import redact as _redact  # no credential reaches a log through an error

DEFAULT_PARALLEL = 8
# Large enough that per-request latency is small next to the transfer, small enough that
# the parts buffered while waiting to be hashed in order (2 x parallel) stay ~256 MiB.
DEFAULT_PART_BYTES = 16 << 20
# info() keys that change when an object is rewritten, where the store has no generation (S3/HTTP, local files)
_VERSION_KEYS = ("etag", "ETag", "VersionId", "mtime", "ino")


class ManifestError(RuntimeError):
    pass


def local_copy(
    arrow_url: str | Path,
    cache_dir: str | Path,
    *,
    fs: fsspec.AbstractFileSystem | None = None,
    parallel: int = DEFAULT_PARALLEL,
    part_bytes: int = DEFAULT_PART_BYTES,
) -> Path:
    """The node-local copy of a manifest's Arrow IPC file, downloaded at most once per node."""
    if parallel < 1 or part_bytes < 1:
        raise ValueError(f"parallel ({parallel}) and part_bytes ({part_bytes}) must be positive")
    url = str(arrow_url)
    fs, path = _resolve(url, fs)
    sidecar = _read_sidecar(fs, path, url)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    dst = cache / f"{sidecar['sha256']}.arrow"  # content-addressed: a new manifest never reuses a stale copy
    if dst.exists():
        return dst
    with open(cache / f".{dst.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one downloader per node; the rest wait here
        if dst.exists():
            return dst
        _remove_stale_temps(dst)
        _download(fs, path, url, dst, sidecar, parallel=parallel, part_bytes=part_bytes)
    return dst


def open_manifest(path: str | Path) -> pa.Table:
    """The whole manifest as a table over a memory map: no heap copy of the rows."""
    source = pa.memory_map(str(path), "r")
    return ipc.open_file(source).read_all()


def rank_slice(table: pa.Table, rank: int, world: int, *, strided: bool = False) -> pa.Table:
    """Rows for ``rank`` of ``world``: contiguous 1/N (a zero-copy view) or every N-th row
    (strided: mixes the order across ranks, at the cost of copying this rank's rows)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world size {world}")
    n = table.num_rows
    if strided:
        import numpy as np

        return table.take(pa.array(np.arange(rank, n, world, dtype=np.int64)))
    start, stop = n * rank // world, n * (rank + 1) // world
    return table.slice(start, stop - start)


# --- locating and reading the store -------------------------------------------------------


def _resolve(url: str, fs: fsspec.AbstractFileSystem | None) -> tuple[fsspec.AbstractFileSystem, str]:
    if fs is None:
        fs, path = fsspec.core.url_to_fs(url)
    else:
        path = fs._strip_protocol(url)
    if not path.endswith(".arrow"):
        raise ManifestError(f"{_redact(url)}: not a manifest's .arrow file")
    return fs, path


def _read_sidecar(fs, path: str, url: str) -> dict:
    sidecar_path = path[: -len(".arrow")] + ".json"
    try:
        raw = fs.cat_file(sidecar_path)
    except FileNotFoundError:
        raise ManifestError(
            f"{_redact(url)}: manifest sidecar missing ({Path(sidecar_path).name}: "
            "manifest not written, or not completely)"
        ) from None
    except Exception as e:
        raise _store_error(url, "reading the sidecar", e) from e
    try:
        sidecar = json.loads(raw)
    except ValueError as e:
        raise ManifestError(f"{_redact(url)}: manifest sidecar is not JSON ({e})") from None
    # the digest becomes a file name: accept nothing but a SHA-256 in hex
    if not isinstance(sidecar, dict) or not re.fullmatch(r"[0-9a-f]{64}", str(sidecar.get("sha256"))):
        raise ManifestError(f"{_redact(url)}: manifest sidecar has no valid sha256")
    return sidecar


def _stat(fs, path: str, url: str) -> tuple[int, tuple]:
    """Size and version of the object, uncached: ``(size, ((key, value), ...))``."""
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise ManifestError(f"{_redact(url)}: manifest data missing although its sidecar exists") from None
    except Exception as e:
        raise _store_error(url, "asking for the object's size", e) from e
    return int(info["size"]), _version(info)


def _version(info: dict) -> tuple:
    if info.get("generation") is not None:  # GCS: its etag and mtime also move on metadata-only updates
        return (("generation", info["generation"]),)
    return tuple((k, info[k]) for k in _VERSION_KEYS if k in info)


def _store_error(url: str, doing: str, e: BaseException) -> ManifestError:
    return ManifestError(
        f"{_redact(url)}: object store unreachable or refused the request while {doing} "
        f"({type(e).__name__}: {_redact(str(e))})"
    )


# --- the download -------------------------------------------------------------------------


def _download(fs, path: str, url: str, dst: Path, sidecar: dict, *, parallel: int, part_bytes: int) -> None:
    size, version = _stat(fs, path, url)
    expected = sidecar.get("arrow_bytes")
    if expected is not None and size != expected:
        raise ManifestError(
            f"{_redact(url)}: size mismatch (store has {size} bytes, sidecar says {expected}): "
            "manifest replaced or being rewritten"
        )
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _preallocate(fd, size)
            digest = _fetch_parts(fs, path, url, fd, size, version, parallel=parallel, part_bytes=part_bytes)
            os.fsync(fd)  # the name says "verified": it must not point at unwritten blocks after a crash
        finally:
            os.close(fd)  # only after _fetch_parts' pool has stopped: no worker writes to a closed fd
        if _stat(fs, path, url) != (size, version):
            raise ManifestError(f"{_redact(url)}: object changed during download (size or generation differs)")
        if digest != sidecar["sha256"]:
            raise ManifestError(
                f"{_redact(url)}: checksum mismatch (got {digest[:12]}…, sidecar says "
                f"{sidecar['sha256'][:12]}…): download corrupt or manifest replaced"
            )
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fetch_parts(fs, path: str, url: str, fd: int, size: int, version: tuple, *, parallel: int, part_bytes: int) -> str:
    """Fetch every part concurrently, pwrite it into ``fd``; hash in file order; return the hex digest.

    At most 2 x parallel parts are in flight or waiting to be hashed, which bounds memory
    while a slow part holds up the in-order hash."""
    pin = _generation_pin(fs, version)
    parts = iter(_ranges(size, part_bytes))
    h = hashlib.sha256()
    with ThreadPoolExecutor(parallel, thread_name_prefix="manifest-part") as pool:
        submit = lambda rng: pool.submit(_fetch_part, fs, path, url, fd, rng, pin)
        window = deque(submit(rng) for rng in islice(parts, 2 * parallel))
        try:
            while window:
                h.update(window.popleft().result())  # hashlib releases the GIL: fetches continue meanwhile
                if (rng := next(parts, None)) is not None:
                    window.append(submit(rng))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return h.hexdigest()


def _fetch_part(fs, path: str, url: str, fd: int, rng: tuple[int, int], pin: dict) -> bytes:
    start, end = rng
    try:
        data = fs.cat_file(path, start, end, **pin)
    except FileNotFoundError:
        raise ManifestError(
            f"{_redact(url)}: object changed during download (gone, or its generation was replaced)"
        ) from None
    except Exception as e:
        raise _store_error(url, f"fetching bytes {start}-{end}", e) from e
    if len(data) != end - start:
        raise ManifestError(
            f"{_redact(url)}: object changed during download (bytes {start}-{end} returned {len(data)} bytes)"
        )
    view = memoryview(data)
    while view:
        view = view[os.pwrite(fd, view, start + len(data) - len(view)) :]
    return data


def _generation_pin(fs, version: tuple) -> dict:
    """On GCS, ask every range for the generation seen by info(): a rewrite mid-download then
    gives 404 instead of a silent mix of two objects. (The emulator ignores the pin.)"""
    generation = dict(version).get("generation")
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return {"generation": generation} if generation is not None and "gs" in protocols else {}


def _ranges(size: int, part_bytes: int) -> list[tuple[int, int]]:
    return [(start, min(start + part_bytes, size)) for start in range(0, size, part_bytes)]


def _preallocate(fd: int, size: int) -> None:
    """Reserve the blocks up front: a full disk fails now, not after most of the download."""
    if size == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # a filesystem without fallocate: a sparse file still takes the pwrites


def _remove_stale_temps(dst: Path) -> None:
    """Temp files of a downloader that died: only the lock holder writes one, and that is us now."""
    for stale in dst.parent.glob(f".{dst.name}.*.tmp"):
        stale.unlink(missing_ok=True)
