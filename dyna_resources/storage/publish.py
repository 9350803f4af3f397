"""Conditional, atomic publication of finished outputs, and moves into quarantine.

``publish_file`` uploads a local file so that no partial object is ever visible at the final key and,
when asked, so that it never overwrites an object it has not seen:

- ``gs://``: one resumable upload session, finalized by its last chunk (GCS creates the object only
  then); ``ifGenerationMatch`` (``0``: must not exist, else the generation read) makes GCS refuse the
  write if another writer got there first.
- ``s3://``: one ``PutObject`` up to ``part_size``, else a multipart upload (the object appears only on
  ``CompleteMultipartUpload``; a failed upload is aborted); ``If-None-Match: *`` / ``If-Match: <ETag>``.
- local: a hidden temp file in the target folder, then ``link`` (must not exist: atomic against every
  writer) or ``rename`` (checked against the expected version while holding an ``flock`` on the folder,
  so publishers of this module serialize; writers that bypass it are not excluded, POSIX has no
  compare-and-swap rename).

``expect`` is ``None`` (overwrite whatever is there), ``"absent"`` or a version token as
``Store.info`` returns it. The current object is read first (a refused write should not upload
gigabytes first); the server-side condition then closes the race between that read and the write.
A refused condition raises ``PreconditionFailed`` and leaves the object that was there untouched.

Private helpers of ``stores`` (``_path``, ``_guard``, ``_object_version``, ``_TMP_MARKER``) are used on
purpose: key checks, the mapping of transport errors to ``StoreUnavailableError`` and the version
token format have one definition each.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO, Literal

from .stores import _TMP_MARKER, ObjectInfo, Store, _object_version, check_key, local_version

Expect = Literal["absent"] | str | None

DEFAULT_PART_SIZE = 16 << 20  # GCS chunks must be multiples of 256 KiB, S3 parts at least 5 MiB
_S3_MAX_COPY = 5 << 30  # CopyObject's limit; larger objects are copied part by part


class PreconditionFailed(RuntimeError):
    """The object at ``key`` is not the one the operation was conditioned on (it exists where it must
    not, it is missing, or it is another version); nothing was written or removed."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"precondition failed for {key!r}: {reason}")


def publish_file(
    store_or_url: Store | str,
    local_path: str | os.PathLike,
    key: str,
    *,
    expect: Expect = None,
    endpoint_url: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
) -> ObjectInfo:
    """Upload ``local_path`` as ``key``, atomically and (with ``expect``) conditionally.

    :param store_or_url: the target store, or its root URL (``file://``, ``gs://``, ``s3://``, a local path).
    :param local_path: the finished file; it must not change while it is uploaded (checked).
    :param key: the object's key below the store root.
    :param expect: ``None`` overwrites; ``"absent"`` requires that no object exists at ``key``; a version
        token (``Store.info(key).version``) requires that exact object to be the one replaced.
    :param endpoint_url: an S3-compatible origin, when ``store_or_url`` is a URL.
    :param part_size: bytes per upload request (GCS chunk, S3 part); S3 files up to it go in one PutObject.
    :return: size and version token of the new object.
    :raises PreconditionFailed: ``expect`` did not hold; the existing object is unchanged.
    :raises StoreUnavailableError: the store could not be reached or refused the request.
    """
    store = store_or_url if isinstance(store_or_url, Store) else Store.from_url(store_or_url, endpoint_url=endpoint_url)
    if expect == "":
        raise ValueError("expect is None, 'absent' or a version token, not ''")
    if part_size < 5 << 20 or part_size % (256 << 10):
        raise ValueError("part_size must be at least 5 MiB and a multiple of 256 KiB")
    path = store._path(key)
    with open(local_path, "rb") as f:  # outside the guard: a missing or unreadable local file is not the store's
        source = _Source(f, os.fspath(local_path))
        try:
            with store._guard(key):
                if store.protocol == "file":
                    return _publish_local(path, key, source, expect)
                if store.protocol == "gs":
                    return _publish_gcs(store, path, key, source, expect, part_size)
                return _publish_s3(store, path, key, source, expect, part_size)
        except _SourceError as e:  # the local file failed or changed mid-upload: its own error, not the store's
            raise e.error from None


def move_to_quarantine(store: Store, key: str, quarantine_prefix: str) -> ObjectInfo:
    """Move the object at ``key`` to ``<quarantine_prefix>/<key>`` in the same store.

    Object stores copy server-side (the copy is of the version read first) and then delete the source
    only if it is still that version, so an object rewritten meanwhile is never lost; a local store
    renames. An existing quarantined copy is replaced.

    :param store: the store holding ``key``.
    :param key: the object to hold back.
    :param quarantine_prefix: the folder below the store root that receives it.
    :return: size and version token of the quarantined object.
    :raises FileNotFoundError: no object at ``key``.
    :raises PreconditionFailed: the source changed during the move (it is kept; a copy may remain).
    """
    dest = check_key(f"{quarantine_prefix.strip('/')}/{key}")
    src_path, dest_path = store._path(key), store._path(dest)
    with store._guard(key):
        if store.protocol == "file":
            os.makedirs(os.path.dirname(dest_path), exist_ok=True)
            os.replace(src_path, dest_path)
            _fsync_dir(os.path.dirname(dest_path))
            _fsync_dir(os.path.dirname(src_path))
            st = os.stat(dest_path)
            return ObjectInfo(dest, st.st_size, local_version(st))
        if store.protocol == "gs":
            return _quarantine_gcs(store, src_path, dest_path, key, dest)
        return _quarantine_s3(store, src_path, dest_path, key, dest)


# ---- local --------------------------------------------------------------------------------------
def _publish_local(path: str, key: str, source: _Source, expect: Expect) -> ObjectInfo:
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}{_TMP_MARKER}{uuid.uuid4().hex}")  # hidden from listings
    try:
        with open(tmp, "xb") as dst:
            dst.writelines(source.chunks(1 << 20))
            dst.flush()
            os.fsync(dst.fileno())
        with _folder_lock(folder):
            if expect == "absent":
                try:
                    os.link(tmp, path)  # fails if anything is there: no window between check and act
                except FileExistsError:
                    raise PreconditionFailed(key, "an object already exists") from None
            else:
                if expect is not None:
                    try:
                        current = local_version(os.stat(path))
                    except FileNotFoundError:
                        raise PreconditionFailed(key, f"no object, expected version {expect}") from None
                    if current != expect:
                        raise PreconditionFailed(key, f"version is {current}, expected {expect}")
                os.replace(tmp, path)
            _remove(tmp)  # after link(): the object's second name; removing it changes ctime, so stat after
            _fsync_dir(folder)
            st = os.stat(path)
    finally:
        _remove(tmp)
    return ObjectInfo(key, st.st_size, local_version(st))


@contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ---- reading the local file ---------------------------------------------------------------------
class _SourceError(Exception):
    """Carries an error of the local file through ``Store._guard`` (which would report any ``OSError``
    as the store being unavailable)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class _Source:
    """The open local file, read exactly as big as it was when opened."""

    def __init__(self, f: BinaryIO, name: str):
        self.f, self.name = f, name
        self.before = os.fstat(f.fileno())
        self.size = self.before.st_size

    def chunks(self, chunk: int) -> Iterator[bytes]:
        """Exactly ``size`` bytes in pieces of ``chunk``; before the last piece is handed out the file
        is checked to be unchanged, so no upload is finalized with a file that shrank, grew or was
        rewritten meanwhile."""
        left = self.size
        if not left:
            self.check_unchanged()
        while left:
            try:
                data = self.f.read(min(chunk, left))
            except OSError as e:
                raise _SourceError(e) from None
            if not data:
                raise _SourceError(OSError(errno.EIO, f"{self.name} shrank while it was uploaded"))
            left -= len(data)
            if not left:
                self.check_unchanged()
            yield data

    def check_unchanged(self) -> None:
        try:
            now, more = os.fstat(self.f.fileno()), self.f.read(1)
        except OSError as e:
            raise _SourceError(e) from None
        if more or (now.st_size, now.st_mtime_ns) != (self.before.st_size, self.before.st_mtime_ns):
            raise _SourceError(OSError(errno.EIO, f"{self.name} changed while it was uploaded"))


# ---- GCS ----------------------------------------------------------------------------------------
def _split(path: str) -> tuple[str, str]:
    bucket, _, name = path.partition("/")
    return bucket, name


def _gcs_current(fs, bucket: str, name: str) -> dict | None:
    try:
        return fs.call("GET", "b/{}/o/{}", bucket, name, json_out=True)  # metadata, never a cached listing
    except FileNotFoundError:
        return None


def _check_expected(protocol: str, key: str, current: dict | None, expect: Expect) -> None:
    """Raise ``PreconditionFailed`` unless the object now at ``key`` (``current``) is what ``expect`` says:
    checked before any upload, so a write that will be refused sends nothing; the store enforces it again."""
    if expect is None:
        return
    if expect == "absent":
        if current is not None:
            raise PreconditionFailed(key, f"an object already exists (version {_object_version(protocol, current)})")
        return
    if current is None:
        raise PreconditionFailed(key, f"no object, expected version {expect}")
    version = _object_version(protocol, current)
    if version != expect:
        raise PreconditionFailed(key, f"version is {version}, expected {expect}")


def _gcs_condition(key: str, current: dict | None, expect: Expect) -> dict:
    """The ``ifGenerationMatch`` parameter for ``expect``, after checking it against ``current``."""
    _check_expected("gs", key, current, expect)
    if expect is None:
        return {}
    if expect == "absent":
        return {"ifGenerationMatch": "0"}
    assert current is not None  # a version was expected: _check_expected raised if there is no object
    return {"ifGenerationMatch": str(current["generation"])}


def _publish_gcs(store: Store, path: str, key: str, source: _Source, expect: Expect, part_size: int) -> ObjectInfo:
    # gcsfs writes conditionally only with ifGenerationMatch=0 (its mode="create"), so the resumable
    # session is opened here, with any generation; the chunks go through gcsfs' own upload_chunk.
    from fsspec.asyn import sync
    from gcsfs.core import upload_chunk

    fs = store.filesystem
    bucket, name = _split(path)
    condition = _gcs_condition(key, _gcs_current(fs, bucket, name), expect)
    ctype = "application/octet-stream"
    location = None
    try:
        headers, _ = fs.call(
            "POST",
            fs.base.replace("/storage/v1/", "/upload/storage/v1/") + "b/{}/o",
            bucket,
            uploadType="resumable",
            name=name,
            json={"name": name},
            headers={"X-Upload-Content-Type": ctype, "X-Upload-Content-Length": str(source.size)},
            **condition,
        )
        location = headers["Location"]
        out = None
        if source.size == 0:  # a session is finalized by a chunk: an empty object by a zero-length one
            source.check_unchanged()
            _, body = fs.call("PUT", location, headers={"Content-Range": "bytes */0", "Content-Length": "0"})
            out = json.loads(body)
        offset = 0
        for chunk in source.chunks(part_size):  # GCS creates the object when the last chunk arrives
            out = sync(fs.loop, upload_chunk, fs, location, chunk, offset, source.size, ctype)
            offset += len(chunk)
    except FileExistsError:  # gcsfs' name for HTTP 412, at the session's start or its end (then it is over)
        raise PreconditionFailed(key, "another writer changed the object meanwhile") from None
    except BaseException:
        if location:
            _gcs_cancel(fs, location)
        raise
    finally:
        fs.invalidate_cache(path)
    if not out or "generation" not in out:
        raise OSError(errno.EIO, "GCS did not confirm the upload")
    return ObjectInfo(key, int(out["size"]), _object_version("gs", out))


def _gcs_cancel(fs, location: str) -> None:
    """Cancel a resumable session: one attempt, best effort (an unfinished session never becomes an
    object and expires by itself; gcsfs' retry loop would spend ~30 s on an endpoint that refuses)."""
    from fsspec.asyn import sync

    with contextlib.suppress(Exception):  # the error that stopped the upload is the one to report
        sync(fs.loop, type(fs)._request.__wrapped__, fs, "DELETE", location)


def _quarantine_gcs(store: Store, src: str, dest: str, key: str, dest_key: str) -> ObjectInfo:
    # gcsfs' cp_file pins no source generation (only via version_aware '#gen' paths), so rewriteTo is called here.
    fs = store.filesystem
    bucket, name = _split(src)
    dbucket, dname = _split(dest)
    current = _gcs_current(fs, bucket, name)
    if current is None:
        raise FileNotFoundError(store.url(key))
    generation = str(current["generation"])
    token = None
    try:
        while True:
            out = fs.call(
                "POST",
                "b/{}/o/{}/rewriteTo/b/{}/o/{}",
                bucket,
                name,
                dbucket,
                dname,
                json_out=True,
                headers={"Content-Type": "application/json"},
                sourceGeneration=generation,
                rewriteToken=token,
            )
            if out.get("done"):
                break
            token = out["rewriteToken"]
    except FileNotFoundError:
        raise PreconditionFailed(key, f"generation {generation} went away before it was copied") from None
    try:
        fs.call("DELETE", "b/{}/o/{}", bucket, name, ifGenerationMatch=generation)
    except FileExistsError:
        raise PreconditionFailed(
            key, f"rewritten after generation {generation} was copied to {dest_key!r}; the source was kept"
        ) from None
    except FileNotFoundError:
        pass  # deleted by someone else meanwhile: the move's end state
    fs.invalidate_cache(src)
    fs.invalidate_cache(dest)
    res = out["resource"]
    return ObjectInfo(dest_key, int(res["size"]), _object_version("gs", res))


# ---- S3 -----------------------------------------------------------------------------------------
def _s3_refused(e: BaseException) -> bool:
    """Whether a failed conditional S3 call was refused for its condition (412, or 409 for a
    conflicting concurrent conditional write); s3fs wraps botocore's error, keeping it as the cause."""
    if isinstance(e, FileExistsError):  # s3fs' name for a failed If-None-Match
        return True
    response = getattr(e.__cause__, "response", None) or getattr(e, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")


def _s3_current(fs, bucket: str, name: str) -> dict | None:
    try:
        return fs.call_s3("head_object", Bucket=bucket, Key=name)
    except FileNotFoundError:
        return None


def _s3_condition(key: str, current: dict | None, expect: Expect) -> dict:
    # same shape as _gcs_condition (and _s3_current as _gcs_current): the shared check is _check_expected;
    # what stays here, the header and the field it compares, is each store's own.
    _check_expected("s3", key, current, expect)
    if expect is None:
        return {}
    # S3 conditions compare ETags, not version ids: a rewrite with identical bytes would pass, harmlessly.
    if expect == "absent":
        return {"IfNoneMatch": "*"}
    assert current is not None  # a version was expected: _check_expected raised if there is no object
    return {"IfMatch": current["ETag"]}


def _publish_s3(store: Store, path: str, key: str, source: _Source, expect: Expect, part_size: int) -> ObjectInfo:
    fs = store.filesystem
    bucket, name = _split(path)
    condition = _s3_condition(key, _s3_current(fs, bucket, name), expect)
    try:
        if source.size <= part_size:
            body = b"".join(source.chunks(part_size))
            out = fs.call_s3("put_object", Bucket=bucket, Key=name, Body=body, **condition)
        else:
            out = _s3_multipart(fs, bucket, name, source, part_size, condition)
    except (OSError, RuntimeError) as e:
        if condition and _s3_refused(e):
            raise PreconditionFailed(key, "another writer changed the object meanwhile") from None
        if "IfMatch" in condition and isinstance(e, FileNotFoundError):
            raise PreconditionFailed(key, "the object was deleted meanwhile") from None
        raise
    finally:
        fs.invalidate_cache(path)
    return ObjectInfo(key, source.size, _object_version("s3", out))


def _s3_multipart(fs, bucket: str, name: str, source: _Source, part_size: int, condition: dict) -> dict:
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=name)["UploadId"]
    try:
        parts = []
        for number, chunk in enumerate(source.chunks(part_size), 1):
            out = fs.call_s3("upload_part", Bucket=bucket, Key=name, UploadId=upload, PartNumber=number, Body=chunk)
            parts.append({"PartNumber": number, "ETag": out["ETag"]})
        # The object appears only now, and S3 evaluates the condition only now.
        return fs.call_s3(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=name,
            UploadId=upload,
            MultipartUpload={"Parts": parts},
            **condition,
        )
    except BaseException:
        _s3_abort(fs, bucket, name, upload)
        raise


def _s3_abort(fs, bucket: str, name: str, upload: str) -> None:
    """Abort a multipart upload (best effort: an unfinished upload never becomes an object)."""
    with contextlib.suppress(Exception):  # the error that stopped the upload is the one to report
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=name, UploadId=upload)


def _quarantine_s3(store: Store, src: str, dest: str, key: str, dest_key: str) -> ObjectInfo:
    fs = store.filesystem
    bucket, name = _split(src)
    dbucket, dname = _split(dest)
    current = _s3_current(fs, bucket, name)
    if current is None:
        raise FileNotFoundError(store.url(key))
    etag, size = current["ETag"], int(current["ContentLength"])
    source = {"Bucket": bucket, "Key": name}
    if current.get("VersionId") and current["VersionId"] != "null":
        source["VersionId"] = current["VersionId"]
    try:
        if size <= _S3_MAX_COPY:
            out = fs.call_s3("copy_object", Bucket=dbucket, Key=dname, CopySource=source, CopySourceIfMatch=etag)
            out = {**out, **out.get("CopyObjectResult", {})}
        else:
            out = _s3_copy_parts(fs, source, dbucket, dname, size, etag)
        fs.call_s3("delete_object", Bucket=bucket, Key=name, IfMatch=etag)
    except (OSError, RuntimeError) as e:
        if _s3_refused(e):
            raise PreconditionFailed(key, f"changed during the move to {dest_key!r}; the source was kept") from None
        raise
    fs.invalidate_cache(src)
    fs.invalidate_cache(dest)
    return ObjectInfo(dest_key, size, _object_version("s3", out))


def _s3_copy_parts(fs, source: dict, bucket: str, name: str, size: int, etag: str) -> dict:
    # s3fs' _copy_managed copies parts without a source condition: each part here is pinned to the ETag.
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=name)["UploadId"]
    try:
        parts = []
        for number, start in enumerate(range(0, size, DEFAULT_PART_SIZE * 32), 1):
            end = min(start + DEFAULT_PART_SIZE * 32, size) - 1
            out = fs.call_s3(
                "upload_part_copy",
                Bucket=bucket,
                Key=name,
                UploadId=upload,
                PartNumber=number,
                CopySource=source,
                CopySourceRange=f"bytes={start}-{end}",
                CopySourceIfMatch=etag,
            )
            parts.append({"PartNumber": number, "ETag": out["CopyPartResult"]["ETag"]})
        return fs.call_s3(
            "complete_multipart_upload", Bucket=bucket, Key=name, UploadId=upload, MultipartUpload={"Parts": parts}
        )
    except BaseException:
        _s3_abort(fs, bucket, name, upload)
        raise


__all__ = ["DEFAULT_PART_SIZE", "Expect", "PreconditionFailed", "move_to_quarantine", "publish_file"]
