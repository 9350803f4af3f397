"""Hostile HDF5 episodes for the reader and ingest tests, and a watch that proves a file was never opened.

Each maker copies a valid episode and edits it with h5py so that one dataset reaches outside
the file (or carries a bad attribute/shape); ``REACH_OUT`` maps the kind to the HDF5 path the
quarantine reason must name.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import h5py
import numpy as np

# kind -> the dataset / link path the refusal names
REACH_OUT = {
    "external_storage": "/observations/qpos",  # raw data stored in another file (e.g. /etc/passwd)
    "external_link": "/observations/qvel",  # an ExternalLink to a dataset of another HDF5 file
    "virtual_dataset": "/action",  # a VDS mapping another file's dataset
    "dangling_soft_link": "/observations/effort",  # a SoftLink to a path the file does not have
    "soft_link_out": "/observations/effort",  # a SoftLink whose target goes through an ExternalLink
    "unused_external_link": "/extras/calibration",  # an ExternalLink the reader would never read
}


def make_reach_out(kind: str, base: Path, dst: Path, outside: Path, episode_id: str | None = None) -> list[Path]:
    """Copy ``base`` to ``dst`` and make its REACH_OUT[kind] dataset point at new files under
    ``outside`` (outside any landing zone); returns those files. ``episode_id`` renames the copy
    (so that a reader that follows the reference would land it as an episode of its own).

    The outside data has the shape of the dataset it replaces and recognisable finite values
    (1234.5678...), so a reader that follows the reference transcodes it as joint data.
    """
    shutil.copyfile(base, dst)
    outside.mkdir(parents=True, exist_ok=True)
    target = REACH_OUT[kind]
    with h5py.File(dst, "a") as f:
        if episode_id is not None:
            f.attrs["episode_id"] = episode_id
        like = target if target in f else "/observations/qpos"
        shape = f[like].shape
        data = np.full(shape, 1234.5678, np.float64)
        other = outside / f"{dst.stem}-{kind}.h5"
        if kind == "external_storage":
            secret = outside / f"{dst.stem}-secret.bin"
            secret.write_bytes(data.tobytes())
            del f[target]
            f.create_dataset(target, shape=shape, dtype="f8", external=[(str(secret), 0, data.nbytes)])
            return [secret]
        with h5py.File(other, "w") as o:
            o.create_dataset("data", data=data)
        if kind == "external_link":
            del f[target]
            f[target] = h5py.ExternalLink(str(other), "/data")
        elif kind == "virtual_dataset":
            del f[target]
            layout = h5py.VirtualLayout(shape=shape, dtype="f8")
            layout[...] = h5py.VirtualSource(str(other), "data", shape=shape)
            f.create_virtual_dataset(target, layout)
        elif kind == "dangling_soft_link":
            del f[target]
            f[target] = h5py.SoftLink("/observations/nowhere")
        elif kind == "soft_link_out":
            del f[target]
            f["outside"] = h5py.ExternalLink(str(other), "/")
            f[target] = h5py.SoftLink("/outside/data")
        elif kind == "unused_external_link":
            f[target] = h5py.ExternalLink(str(other), "/data")
        else:
            raise ValueError(f"unknown kind {kind!r}")
    return [other]


class FileWatch:
    """inotify on some files: ``touched()`` says whether any process opened or read one of them since.

    HDF5 reads external storage and virtual sources with plain open()/read() calls, so a
    refusal that happens "before any byte is read" leaves no event behind.
    """

    IN_ACCESS, IN_OPEN = 0x001, 0x020

    def __init__(self, *paths: Path):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        for p in paths:
            if self._libc.inotify_add_watch(self._fd, str(p).encode(), self.IN_OPEN | self.IN_ACCESS) < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch failed for {p}")

    def touched(self) -> bool:
        try:
            return len(os.read(self._fd, 1 << 16)) > 0
        except BlockingIOError:
            return False

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
