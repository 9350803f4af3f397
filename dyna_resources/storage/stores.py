"""The object-store layer: every byte is addressed by an fsspec URL under a store root.

A ``Store`` is a root URL plus (lazily) the fsspec filesystem that serves it:

- ``file:///abs/path`` (or a plain local path): the default; writes are atomic (temp file, rename).
- ``gs://bucket/prefix``: gcsfs (credentials the way gcsfs finds them: ``GOOGLE_APPLICATION_CREDENTIALS``,
  gcloud, the metadata server; ``STORAGE_EMULATOR_HOST`` for an emulator).
- ``s3://bucket/prefix``: s3fs, optionally an S3-compatible origin at ``endpoint_url`` (credentials,
  region and retry settings from the standard ``AWS_*`` variables, which botocore reads itself).
  Every request is bounded (``S3Limits``): a 3 s connect and a 10 s read timeout
  (``DYNA_S3_CONNECT_TIMEOUT_S``, ``DYNA_S3_READ_TIMEOUT_S``) and 3 attempts in botocore's
  ``standard`` retry mode (``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``); s3fs' own retry loop, which
  multiplies botocore's attempts (5 x 5 with 15 s read timeouts: minutes for one ``info`` against a
  hung endpoint), is switched off. So a request to a down endpoint fails within
  attempts x (connect + read timeout) + backoff (at most 1 s + 2 s): about 3 s when connections are
  refused, 12 s when they time out, 33 s when the endpoint accepts and never answers.

Objects are named by *keys*: relative ``/``-separated paths below the root. A key can never leave
the root: absolute keys, ``..``/``.``/empty segments, backslashes, NUL and the characters fsspec
reads as version selectors (``?``, ``#``) are refused with ``StoreKeyError`` before any I/O.

``info(key)`` returns the size and a *version token* that changes whenever the object's bytes may
have changed (GCS generation, S3 VersionId or ETag, ``local_version`` for local files), so a cache can
key pages by object version. A store that cannot be reached (refused connection, timeout, missing
credentials, permission denied) raises ``StoreUnavailableError`` naming the URL and the reason;
user info and query strings in URLs are redacted from such errors, and secrets never appear in them.

Plain Python, no Dagster import; fsspec, gcsfs and s3fs are imported only when a store needs them.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

_TMP_MARKER = ".stores-tmp-"  # temporary files of atomic local writes carry this; listings hide them
_SCHEMES = {"file": "file", "local": "file", "gs": "gs", "gcs": "gs", "s3": "s3", "s3a": "s3"}


class StoreKeyError(ValueError):
    """A key that is not a safe relative path below the store root."""

    def __init__(self, key: object, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"invalid store key {key!r}: {reason}")


class StoreUnavailableError(RuntimeError):
    """The store cannot be reached, authenticated against, listed or written: the operation failed
    for a reason that is not about one object (a missing object raises ``FileNotFoundError``)."""

    def __init__(self, url: str, reason: str):
        self.url = redact(url)
        self.reason = redact(reason)
        super().__init__(f"store {self.url} is unavailable: {self.reason}")


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']*@")
_SECRET_QUERY = re.compile(
    r"(?i)(?P<name>[?&;](?:x-amz-[a-z-]+|x-goog-[a-z-]+|signature|sig|token|access_token|key|secret"
    r"|password|awsaccesskeyid|credential|googleaccessid))=[^&\s\"']*"
)


def redact(text: str) -> str:
    """``text`` with URL user info (``scheme://user:pw@``) and credential-like query values masked."""
    text = _USERINFO.sub(lambda m: m["scheme"] + "***@", str(text))
    return _SECRET_QUERY.sub(lambda m: m["name"] + "=***", text)


def check_key(key: object, *, allow_empty: bool = False) -> str:
    """``key`` if it is a safe relative key, else ``StoreKeyError`` saying why."""
    if not isinstance(key, str):
        raise StoreKeyError(key, "a key is a string")
    if key == "":
        if allow_empty:
            return key
        raise StoreKeyError(key, "empty key")
    if "\0" in key:
        raise StoreKeyError(key, "NUL character")
    if "\\" in key:
        raise StoreKeyError(key, "backslash (keys use '/' separators)")
    if key.startswith("/"):
        raise StoreKeyError(key, "absolute key (keys are relative to the store root)")
    if "?" in key or "#" in key:
        raise StoreKeyError(key, "'?' and '#' select object versions in fsspec URLs")
    for part in key.split("/"):
        if part == "":
            raise StoreKeyError(key, "empty path segment")
        if part in (".", ".."):
            raise StoreKeyError(key, f"'{part}' segment")
    return key


@dataclass(frozen=True)
class S3Limits:
    """How long one S3 request may take: timeouts in seconds, total attempts (first one included)."""

    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0  # between bytes of a response, not for the whole body
    max_attempts: int = 3
    retry_mode: str = "standard"  # botocore's: exponential backoff with jitter, at most 20 s a wait

    @classmethod
    def from_env(cls) -> S3Limits:
        """``DYNA_S3_CONNECT_TIMEOUT_S``, ``DYNA_S3_READ_TIMEOUT_S``, ``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``."""
        env, d = os.environ, cls()
        try:
            return cls(
                connect_timeout_s=float(env.get("DYNA_S3_CONNECT_TIMEOUT_S") or d.connect_timeout_s),
                read_timeout_s=float(env.get("DYNA_S3_READ_TIMEOUT_S") or d.read_timeout_s),
                max_attempts=int(env.get("AWS_MAX_ATTEMPTS") or d.max_attempts),
                retry_mode=env.get("AWS_RETRY_MODE") or d.retry_mode,
            )
        except ValueError as e:
            raise ValueError(f"S3 request limits from the environment: {e}") from None

    def describe(self) -> str:
        return (
            f"{self.max_attempts} attempt(s), {self.connect_timeout_s:g} s connect and "
            f"{self.read_timeout_s:g} s read timeout each"
        )

    def botocore_config(self) -> dict:
        """``config_kwargs`` of ``s3fs.S3FileSystem`` (the arguments of ``botocore.config.Config``)."""
        return {
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.read_timeout_s,
            "retries": {"total_max_attempts": self.max_attempts, "mode": self.retry_mode},
        }


def local_version(st: os.stat_result) -> str:
    """The version token of a local file: size, mtime, ctime and inode.

    ctime is in it because mtime is not evidence: ``os.utime`` (``touch -d``, ``cp -p``, rsync
    ``--times``) sets it back after an in-place rewrite, whereas the kernel sets ctime to the current
    time on every write, truncate, rename, chmod or utime and no system call sets it to a chosen value.
    Hashing the content would be the only stronger token, and it reads the whole file on every
    ``info``; this costs one ``stat``. What it still trusts: the clock (a rewrite within one tick of
    the file system's timestamp granularity after the version was taken keeps every field), and file
    systems that maintain ctime (NFS clients may serve cached attributes for ``actimeo`` seconds)."""
    return f"{st.st_mtime_ns}-{st.st_ctime_ns}-{st.st_ino}-{st.st_size}"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    version: str  # changes whenever the object's bytes may have changed


@dataclass(frozen=True)
class Store:
    """An object store rooted at ``root`` (``file:///abs``, ``gs://bucket/prefix``, ``s3://bucket/prefix``).

    ``fs``: a ready fsspec filesystem (tests, emulators); default: built from the URL on first use.
    ``endpoint_url``: an S3-compatible origin (or a GCS endpoint) instead of the cloud's own."""

    root: str
    endpoint_url: str | None = None
    fs: Any = field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:  # an endpoint URL may carry user info: never print it
        endpoint = f", endpoint_url={redact(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"Store({self.root!r}{endpoint})"

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_url(cls, url: str | os.PathLike, *, endpoint_url: str | None = None, fs: Any = None) -> Store:
        text = os.fspath(url)
        scheme, sep, rest = text.partition("://")
        if not sep:  # a plain local path
            scheme, rest = "file", str(Path(text).expanduser().resolve())
        protocol = _SCHEMES.get(scheme.lower())
        if protocol is None:
            raise ValueError(f"unsupported store URL {redact(text)!r}: use file://, gs:// or s3://")
        if protocol == "file":
            if rest and not rest.startswith("/"):
                raise ValueError(f"a file:// store URL needs an absolute path: {redact(text)!r}")
            if endpoint_url:
                raise ValueError("endpoint_url is for object stores, not file://")
            path = os.path.normpath(rest or "/")
            return cls(root="file://" + (path if path != "/" else ""), fs=fs)
        bucket, _, prefix = rest.strip("/").partition("/")
        if not bucket or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", bucket):
            raise ValueError(f"store URL {redact(text)!r} names no valid bucket")
        if prefix:
            try:
                check_key(prefix)
            except StoreKeyError as e:
                raise ValueError(f"store URL {redact(text)!r} has an unsafe prefix: {e.reason}") from None
        root = f"{protocol}://{bucket}" + (f"/{prefix}" if prefix else "")
        return cls(root=root, endpoint_url=endpoint_url or None, fs=fs)

    @property
    def protocol(self) -> str:
        return self.root.split("://", 1)[0]

    @property
    def _base(self) -> str:
        """The root as the filesystem's path (no protocol, no trailing slash)."""
        rest = self.root.split("://", 1)[1]
        return rest if self.protocol != "file" else (rest or "/")

    @cached_property
    def filesystem(self):
        if self.fs is not None:
            return self.fs
        with self._guard(None):
            if self.protocol == "file":
                from fsspec.implementations.local import LocalFileSystem

                return LocalFileSystem()
            if self.protocol == "gs":
                import gcsfs

                return gcsfs.GCSFileSystem(**({"endpoint_url": self.endpoint_url} if self.endpoint_url else {}))
            import s3fs

            fs = s3fs.S3FileSystem(
                client_kwargs={"endpoint_url": self.endpoint_url} if self.endpoint_url else {},
                config_kwargs=self._s3_limits.botocore_config(),
            )
            fs.retries = 1  # one try per s3fs call: botocore retries, and the two loops would multiply
            return fs

    @cached_property
    def _s3_limits(self) -> S3Limits:
        return S3Limits.from_env()

    # ---- addressing ---------------------------------------------------------------------------
    def url(self, key: str) -> str:
        """The full fsspec URL of ``key``."""
        return f"{self.root}/{check_key(key)}"

    def _path(self, key: str) -> str:
        check_key(key)
        path = f"{self._base.rstrip('/')}/{key}"
        if self.protocol == "file":  # a symlink inside the root must not lead out of it either
            root = os.path.realpath(self._base)
            real = os.path.realpath(path)
            if real != root and not real.startswith(root.rstrip("/") + "/"):
                raise StoreKeyError(key, "resolves outside the store root (symlink)")
        return path

    @contextmanager
    def _guard(self, key: str | None) -> Iterator[None]:
        """Maps failures that are not about one object to ``StoreUnavailableError``."""
        url = self.root if key is None else f"{self.root}/{key}"
        try:
            yield
        except (StoreKeyError, FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError):
            raise
        except PermissionError as e:
            raise StoreUnavailableError(url, f"permission denied ({_describe(e)})") from None
        except _unavailable_errors() as e:
            reason = _describe(e)
            if self.protocol == "s3" and self.fs is None:  # built here, with these limits
                reason += f" (gave up after {self._s3_limits.describe()})"
            raise StoreUnavailableError(url, reason) from None

    # ---- reads --------------------------------------------------------------------------------
    def open(self, key: str, mode: str = "rb") -> BinaryIO:
        """A binary file object; ``"wb"`` on a local store writes a temp file renamed on close."""
        if mode not in ("rb", "wb"):
            raise ValueError(f"mode {mode!r}: stores open files as 'rb' or 'wb'")
        path = self._path(key)
        with self._guard(key):
            if mode == "wb" and self.protocol == "file":
                return _AtomicLocalWriter(path)  # type: ignore[return-value]  # duck-typed: BinaryIO's writing half
            if self.protocol != "file":  # s3fs opens with the cached ETag (If-Match): a rewrite would fail the read
                self.filesystem.invalidate_cache(path)
            return self.filesystem.open(path, mode)

    def cat(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes ``[start, end)`` (``None``: from the beginning / to the end)."""
        path = self._path(key)
        with self._guard(key):
            return self.filesystem.cat_file(path, start=start, end=end)

    def exists(self, key: str) -> bool:
        """Whether an object (not a folder) is stored at ``key``."""
        try:
            return self._info(key).get("type", "file") == "file"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def info(self, key: str) -> ObjectInfo:
        """Size and version token of the object at ``key`` (``FileNotFoundError`` if none)."""
        raw = self._info(key)
        if raw.get("type", "file") != "file":
            raise IsADirectoryError(self.url(key))
        if self.protocol == "file":
            st = os.stat(self._path(key))
            return ObjectInfo(key=key, size=st.st_size, version=local_version(st))
        return ObjectInfo(key=key, size=int(raw["size"]), version=_object_version(self.protocol, raw))

    def _info(self, key: str) -> dict:
        path = self._path(key)
        with self._guard(key):
            fs = self.filesystem
            if self.protocol != "file":
                fs.invalidate_cache(path)  # a listing cached earlier must not hide a newer version
            return fs.info(path)

    def ls(self, prefix: str = "") -> list[str]:
        """Keys of the objects at or below the folder ``prefix`` (``""``: the whole store), sorted."""
        prefix = check_key(prefix.rstrip("/") if prefix not in ("", "/") else "", allow_empty=True)
        base = self._base.rstrip("/")
        path = f"{base}/{prefix}" if prefix else (base or "/")
        with self._guard(prefix or None):
            fs = self.filesystem
            if self.protocol != "file":
                fs.invalidate_cache(path)
            found = fs.find(path)
        strip = f"{base}/"
        keys = []
        for p in found:
            p = p.split("://", 1)[-1] if "://" in p else p
            if not p.startswith(strip):
                continue
            key = p[len(strip) :]
            if prefix and not (key == prefix or key.startswith(prefix + "/")):
                continue  # e.g. "a/bc" when listing "a/b"
            if _TMP_MARKER in key.rsplit("/", 1)[-1]:
                continue
            keys.append(key)
        return sorted(keys)

    # ---- writes -------------------------------------------------------------------------------
    def put_file(self, local_path: str | os.PathLike, key: str) -> None:
        """Upload ``local_path`` as ``key``; readers see the old object or the whole new one."""
        path = self._path(key)
        with self._guard(key):
            if self.protocol == "file":
                with open(local_path, "rb") as src, _AtomicLocalWriter(path) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:
                self.filesystem.put_file(os.fspath(local_path), path)  # one object: atomic on GCS and S3

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` as ``key`` (atomically, as ``put_file``)."""
        path = self._path(key)
        with self._guard(key):
            if self.protocol == "file":
                with _AtomicLocalWriter(path) as dst:
                    dst.write(data)
            else:
                self.filesystem.pipe_file(path, bytes(data))

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; a missing object is not an error."""
        path = self._path(key)
        with self._guard(key):
            if self.protocol == "file":
                Path(path).unlink(missing_ok=True)
                return
            try:
                self.filesystem.rm_file(path)  # never `rm`: it expands glob characters
            except FileNotFoundError:
                pass
            self.filesystem.invalidate_cache(path)


class _AtomicLocalWriter:
    """A binary writer to a hidden temp file next to ``path``, renamed onto it on a clean close
    (discarded if the ``with`` block raised or ``abort()`` was called)."""

    def __init__(self, path: str):
        self.path = path
        folder, name = os.path.split(path)
        os.makedirs(folder or ".", exist_ok=True)
        self.tmp = os.path.join(folder, f".{name}{_TMP_MARKER}{uuid.uuid4().hex}")
        self._f = open(self.tmp, "xb")
        self._done = False

    def write(self, data) -> int:
        return self._f.write(data)

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()

    @property
    def closed(self) -> bool:
        return self._done

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self._discard()
            raise

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._discard()

    def _discard(self) -> None:
        self._f.close()
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _object_version(protocol: str, raw: dict) -> str:
    if protocol == "gs":
        if raw.get("generation"):
            return f"g{raw['generation']}"
        token = raw.get("md5Hash") or raw.get("crc32c") or raw.get("etag")
    else:
        vid = raw.get("VersionId")
        if vid and vid != "null":
            return f"v{vid}"
        token = raw.get("ETag") or raw.get("etag")
    if not token:
        raise KeyError(f"the {protocol} store returned no version for {raw.get('name')!r}")
    return "e" + str(token).strip('"')


def _describe(e: BaseException) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    """Exception types meaning the store itself failed (connection, timeout, credentials, HTTP).
    Only libraries already imported can have raised: nothing is imported here."""
    kinds: list[type[BaseException]] = [OSError, TimeoutError, ConnectionError]
    for module, names in (
        ("aiohttp", ("ClientError",)),
        ("botocore.exceptions", ("BotoCoreError", "ClientError")),
        ("google.auth.exceptions", ("GoogleAuthError",)),
        ("gcsfs.retry", ("HttpError",)),
    ):
        mod = sys.modules.get(module)
        kinds += [getattr(mod, n) for n in names if mod is not None and hasattr(mod, n)]
    return tuple(kinds)


__all__ = [
    "ObjectInfo",
    "S3Limits",
    "Store",
    "StoreKeyError",
    "StoreUnavailableError",
    "check_key",
    "local_version",
    "redact",
]
