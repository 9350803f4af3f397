"""A forked child sets aside the libswscale context its parent's thread left behind.

PyAV keeps one ``VideoReformatter`` per thread (``av.video.frame._thread_local``) and reuses it for
every ``frame.reformat`` and ``to_ndarray(format=...)`` on that thread. Its libswscale context keeps
slice worker threads when it was made with ``threads`` other than 1 (PyAV's default, 0, is one per
core). A forked child inherits the context but not those threads, so its first conversion waits for
them forever, and freeing the context would join them and hang too. This happens for every fork in
which the parent thread had converted a frame first: the ingest workers (``ingest/workers.py``), the
backfill's, and the DataLoader's. So after each fork the child keeps the inherited context, never
uses it and never frees it (a few hundred kB), and its next conversion makes a new context. PyAV has
no hook for this.
"""

from __future__ import annotations

import ctypes
import os

import av.video.frame


def set_aside_inherited_reformatter() -> None:
    local = getattr(av.video.frame, "_thread_local", None)
    inherited = getattr(local, "reformatter", None)
    if inherited is not None:
        # A reference nobody holds, so that not even the interpreter's exit frees it.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(inherited))
        local.reformatter = None  # type: ignore[union-attr]  # PyAV makes a new one when this is None


os.register_at_fork(after_in_child=set_aside_inherited_reformatter)
