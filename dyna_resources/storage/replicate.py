"""Copy a dataset's objects from the primary origin to a second (neutral, S3-compatible) origin.

Only what is missing is copied: an object whose replica already records the primary's current
version (user metadata ``dyna-version``) is skipped. Each copy is staged in a local temp file while
its SHA-256 is computed, uploaded with ``dyna-version`` and ``dyna-sha256`` metadata, then read
back from the replica and hashed again: a copy that does not match is deleted and reported.

Because the replica carries the primary's version, ``Origins`` routed to it hand the page cache
the same (URL, version) keys as the primary: a cluster switching origins keeps its warm cache and
its training config.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .origins import VERSION_METADATA, Origins, _replica_version, normalize_url
from .stores import Store, StoreUnavailableError, redact

SHA_METADATA = "dyna-sha256"
_PART = 8 << 20


@dataclass
class ReplicaReport:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already current on the replica
    failed: dict[str, str] = field(default_factory=dict)  # url -> reason
    bytes_copied: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "copied": len(self.copied),
            "skipped": len(self.skipped),
            "failed": dict(self.failed),
            "bytes_copied": self.bytes_copied,
            "seconds": round(self.seconds, 3),
        }


def replicate(
    urls: Iterable[str], source_prefix: str, replica: Store, *, origins: Origins | None = None, parallel: int = 4
) -> ReplicaReport:
    """Replicate every ``url`` below ``source_prefix`` to the same relative key under ``replica``."""
    origins = origins or Origins()
    prefix = normalize_url(source_prefix).rstrip("/")
    report = ReplicaReport()
    t0 = time.perf_counter()
    todo = []
    for url in dict.fromkeys(normalize_url(u) for u in urls):
        if not url.startswith(prefix + "/"):
            report.failed[url] = f"not below the replicated prefix {redact(prefix)}"
        else:
            todo.append(url)

    def one(url: str):
        return url, _copy_one(url, url[len(prefix) + 1 :], replica, origins)

    with ThreadPoolExecutor(max(1, parallel)) as pool:
        for url, (status, n) in pool.map(one, todo):
            if status == "copied":
                report.copied.append(url)
                report.bytes_copied += n
            elif status == "skipped":
                report.skipped.append(url)
            else:
                report.failed[url] = status
    report.seconds = time.perf_counter() - t0
    return report


def _copy_one(url: str, key: str, replica: Store, origins: Origins) -> tuple[str, int]:
    try:
        info = origins.info(url)
        if (
            replica.exists(key)
            and replica.info(key).size == info.size
            and _replica_version(replica, key) == info.version
        ):
            return "skipped", 0
        with tempfile.TemporaryDirectory(prefix="dyna-replica-") as tmp:
            staged = os.path.join(tmp, "object")
            digest = hashlib.sha256()
            with open(staged, "wb") as out:
                for start in range(0, info.size, _PART):
                    data = origins.read(url, start, min(info.size, start + _PART), info.version)
                    digest.update(data)
                    out.write(data)
            sha = digest.hexdigest()
            _upload(replica, key, staged, {VERSION_METADATA: info.version, SHA_METADATA: sha})
        check = hashlib.sha256()
        size = replica.info(key).size
        for start in range(0, size, _PART):
            check.update(replica.cat(key, start, min(size, start + _PART)))
        if size != info.size or check.hexdigest() != sha:
            replica.delete(key)
            return f"checksum mismatch after upload (sha256 {check.hexdigest()[:12]} != {sha[:12]}): removed", 0
        return "copied", info.size
    except FileNotFoundError:
        return "object not found at the primary origin", 0
    except (StoreUnavailableError, OSError, RuntimeError) as e:
        return redact(str(e)), 0


def _upload(store: Store, key: str, local_path: str, metadata: dict[str, str]) -> None:
    """``put_file`` plus user metadata, in each store's own way."""
    if store.protocol == "file":
        store.put_file(local_path, key)
        path = store._path(key)
        for k, v in metadata.items():
            os.setxattr(path, "user." + k, v.encode())  # OSError if the file system keeps no xattrs
        return
    path = store._path(key)
    with store._guard(key):
        if store.protocol == "s3":
            store.filesystem.put_file(local_path, path, Metadata=metadata)
        else:
            store.filesystem.put_file(local_path, path, metadata=metadata)


__all__ = ["SHA_METADATA", "ReplicaReport", "replicate"]
