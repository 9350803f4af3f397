"""A large write built part by part while the database runs the part before.

One connection runs its statements one after another, and while the server works the client
waits; building the next statements' rows (merging outcomes, checking values, encoding COPY text)
is as long again on PostgreSQL. :func:`built_ahead` overlaps the two: a worker thread builds part
k + 1 while the caller runs part k (psycopg2 releases the GIL while it waits on the server).
:func:`parts` cuts a call so that parts are independent: everything that shares a key (a file, an
episode) lies in one part, so applying the parts in turn leaves what applying the whole would.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
B = TypeVar("B")

# While a part is built, the caller's thread wakes at each reply of the server and needs the GIL
# back; the builder drops it only at the interpreter's switch interval (5 ms by default), which
# would add up to one interval to every round trip. Shortened for the call, then put back.
SWITCH_INTERVAL_S = 0.0002
_shortened = {"calls": 0, "interval": 0.0}  # calls in flight (any thread), the interval to put back
_lock = threading.Lock()


def parts(items: Sequence[T], keys_of: Callable[[T], Iterable[Hashable]], size: int) -> list[list[T]]:
    """``items`` in parts of about ``size``, in order within each part, every item in the part of
    any earlier item it shares a key with. One part when the items are fewer than two parts, or
    when an item's keys already lie in two parts (it would join them: seldom, and one part is
    always right)."""
    if len(items) < 2 * size:
        return [list(items)]
    part_of: dict[Hashable, int] = {}
    out: list[list[T]] = [[]]
    for item in items:
        keys = tuple(keys_of(item))
        found = {part_of[k] for k in keys if k in part_of}
        if len(found) > 1:
            return [list(items)]
        if found:
            p = found.pop()
        else:
            if len(out[-1]) >= size:
                out.append([])
            p = len(out) - 1
        out[p].append(item)
        for k in keys:
            part_of[k] = p
    return out


def built_ahead(work: Sequence[T], build: Callable[[T], B]) -> Iterator[B]:
    """``build(w)`` of each item of ``work``, in order, the next one built by a worker thread while
    the caller uses the one yielded. An error of a build is raised where its result is taken."""
    if len(work) <= 1:
        yield from map(build, work)
        return
    _shorten_switch_interval(+1)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="dyna-build-ahead") as pool:
            pending = pool.submit(build, work[0])
            for k in range(len(work)):
                ready = pending.result()
                if k + 1 < len(work):
                    pending = pool.submit(build, work[k + 1])
                yield ready
    finally:
        _shorten_switch_interval(-1)


def _shorten_switch_interval(step: int) -> None:
    """The first call in flight shortens the interval, the last one out puts it back."""
    with _lock:
        if step > 0 and _shortened["calls"] == 0:
            _shortened["interval"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_shortened["interval"], SWITCH_INTERVAL_S))
        _shortened["calls"] += step
        if step < 0 and _shortened["calls"] == 0:
            sys.setswitchinterval(_shortened["interval"])
