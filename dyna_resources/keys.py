"""Names that become file names and object keys: partition keys (ingest batches such as
``20261129T14-000123``, curation specs such as ``pick-place-real``), manifest names, release names.

A partition key can be added by anyone with access to the Dagster API, so every asset checks
its key where it uses it, not only the sensor that normally adds it: a key such as
``/../../elsewhere/x`` would otherwise be joined into ``$DYNA_HOME/curation/<key>.yaml`` and
``<manifests>/<key>.parquet`` and reach outside the home. A safe key is 1 to 128 letters,
digits, ``.``, ``_`` and ``-``, starting with a letter or digit and holding no ``..``: a
single path segment on every filesystem and object store, never a hidden file.
"""

from __future__ import annotations

import re
from typing import TypeGuard

MAX_KEY_LENGTH = 128
# \A..\Z, not ^..$: "$" also matches before a trailing newline.
SAFE_KEY = re.compile(rf"\A[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_KEY_LENGTH - 1}}}\Z")
RULE = f"1 to {MAX_KEY_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit, no '..'"


class UnsafeKeyError(ValueError):
    """A key that is not a safe identifier; ``key`` and ``reason`` say which and why."""

    def __init__(self, key: object, reason: str, what: str = "partition key"):
        super().__init__(f"{what} {_show(key)} refused: {reason} (a key is {RULE})")
        self.key, self.reason, self.what = key, reason, what


def is_safe_key(key: object) -> TypeGuard[str]:
    return isinstance(key, str) and SAFE_KEY.match(key) is not None and ".." not in key


def check_key(key: object, what: str = "partition key") -> str:
    """``key`` if it is a safe identifier, else :class:`UnsafeKeyError` naming it and the reason.

    :param key: the partition key or name to check.
    :param what: what the key is, for the message (``"curation spec"``, ``"manifest name"``).
    """
    if is_safe_key(key):
        return key
    raise UnsafeKeyError(key, _reason(key), what)


def _reason(key: object) -> str:
    if not isinstance(key, str):
        return f"not a string ({type(key).__name__})"
    if not key:
        return "empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"{len(key)} characters, more than {MAX_KEY_LENGTH}"
    if "\0" in key:
        return "contains a NUL byte"
    if "/" in key or "\\" in key:
        return "contains a path separator"
    if ".." in key:
        return "contains '..'"
    if key.startswith("."):
        return "starts with '.' (a hidden file)"
    bad = sorted({c for c in key if not (c.isascii() and (c.isalnum() or c in "._-"))})
    if bad:
        return f"contains {', '.join(repr(c) for c in bad)}"
    return "must start with a letter or digit"


def _show(key: object, limit: int = 80) -> str:
    text = repr(key)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(key) if isinstance(key, str) else '?'} chars)"
