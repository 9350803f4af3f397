"""Load a manifest on many ranks: one download per node, memory-mapped, zero-copy 1/N slices.

Every rank on a node calls :func:`local_copy`; whichever takes the node-local lock first
downloads (the others block on the lock, then find the copy), verifies the SHA-256 from
the manifest's sidecar and renames the file into place. Then every rank memory-maps the
same Arrow IPC file: its pages are shared through the page cache, and a rank's slice is
a view, never a copy (``table.slice``). No Dagster, no network client here: the source is
anything with ``open(path, "rb")`` semantics; object stores come through fsspec.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc


class ManifestError(RuntimeError):
    pass


def local_copy(arrow_src: str | Path, cache_dir: str | Path, *, opener=open) -> Path:
    """The node-local copy of a manifest's Arrow IPC file, downloaded at most once per node."""
    src = str(arrow_src)
    sidecar = json.loads(_read_all(opener, src[: -len(".arrow")] + ".json"))
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    dst = cache / f"{sidecar['sha256']}.arrow"  # content-addressed: a new manifest never reuses a stale copy
    if dst.exists():
        return dst
    with open(cache / f".{dst.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one downloader per node; the rest wait here
        if dst.exists():
            return dst
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        h = hashlib.sha256()
        with opener(src, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(16 << 20):
                h.update(chunk)
                fout.write(chunk)
        if h.hexdigest() != sidecar["sha256"]:
            tmp.unlink(missing_ok=True)
            raise ManifestError(f"{src}: checksum mismatch (got {h.hexdigest()[:12]}…, "
                                f"sidecar says {sidecar['sha256'][:12]}…): download corrupt or manifest replaced")
        os.replace(tmp, dst)
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


def _read_all(opener, path: str) -> bytes:
    try:
        with opener(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest sidecar missing (manifest not written, or not completely)") from None

