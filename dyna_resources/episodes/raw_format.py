"""The legacy raw episode format: one HDF5 file per episode, every camera frame a JPEG.

Layout (follows the ALOHA/ACT recorder where it fits, so real users' files load)::

    /                                 root attributes, all optional (episode_id defaults to
        the file's stem): episode_id, robot_id, robot_model, robot_sw_version, task, site,
        operator (text), success (bool), started_at (ISO-8601, UTC), sim (bool),
        compress (bool, ALOHA: images are JPEG), camera_names (written, not needed),
        rate_hz (ALOHA: rate of every stream when /timestamps is absent)
    /observations/images/<cam>        one of three encodings:
        (T,) variable-length uint8           one JPEG per frame (this project's writer)
        (T, padded) uint8                    ALOHA: each frame's JPEG zero-padded to a common
                                             width (the longest JPEG of any camera)
        (T, H, W, 3) uint8                   ALOHA uncompressed RGB frames
    /observations/qpos    (N, J) float   joint positions       } stream "joint_states",
    /observations/qvel    (N, J) float   joint velocities      } timestamps /timestamps/joints
    /observations/effort  (N, J) float   joint efforts         }
    /observations/ee_pose (N, 7) float   end-effector x y z qx qy qz qw   (optional)
    /observations/gripper (N, 1) float   gripper opening                  (optional)
    /observations/wrench  (N, 6) float   wrist force-torque fx fy fz tx ty tz (optional)
    /observations/imu     (N, 6) float   ax ay az gx gy gz                (optional)
    /action               (M, A) float   commanded action
    /timestamps/images/<cam>, /timestamps/joints, /timestamps/ee_pose, /timestamps/gripper,
    /timestamps/wrench, /timestamps/imu, /timestamps/action
                          (len,) int64   nanoseconds since the Unix epoch, strictly increasing

Files without /timestamps (plain ALOHA recordings) get uniform timestamps at
``rate_hz`` (default 50 Hz) from ``started_at``. A dataset may carry a ``names``
attribute with one label per column (joint names, for example).

Required: at least one camera, joint positions, and the action stream.

Padded JPEG rows are cut at each frame's own end, not at ALOHA's ``/compress_len``: its rows
follow the recorder's camera list (``cam_high, cam_low, cam_left_wrist, cam_right_wrist``),
which the file does not store, while HDF5 lists the cameras sorted by name. A JPEG ends with
its EOI marker (FF D9) and the padding is zeros, so stripping the trailing zeros gives the
frame exactly; a frame without the marker there is a :class:`CorruptFrameError`.

A file must be self-contained: external raw storage, external links, virtual datasets and
soft links that do not resolve inside the file are refused (:class:`ExternalDataError`)
before any byte they point at is read. Every other surprise in a file (attributes of the
wrong type or value, datasets of the wrong kind or shape, a damaged HDF5 structure) raises a
:class:`RawFormatError` naming the file and the field, never another exception.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import av
import h5py
import numpy as np
import simplejpeg

from .codec import jpeg_to_yuv, to_yuv
from .errors import (
    CorruptFrameError,
    EpisodeError,
    ExternalDataError,
    MissingStreamError,
    RawFormatError,
    TimestampError,
)

FORMAT_NAME = "dyna-legacy-h5"
FORMAT_VERSION = 1
DEFAULT_ALOHA_RATE_HZ = 50.0
MAX_RATE_HZ = 1e6  # rate_hz above this (a sample period under 1 us) is not a recording rate
MAX_FRAME_SIDE = 8192  # pixels: beyond H.264's largest level (8192x4320)
MAX_JPEG_BYTES = 64 << 20  # per padded frame row
# started_at must lie in [1970, 2200): timestamps are int64 ns since the Unix epoch (which end in 2262)
STARTED_AT_RANGE = (dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2200, 1, 1, tzinfo=dt.timezone.utc))
MAX_SOFT_LINK_DEPTH = 16  # HDF5's own default limit on soft links followed in one lookup
TEXT_ATTRS = ("robot_id", "robot_model", "robot_sw_version", "task", "site", "operator")

# stream name -> {field name -> HDF5 dataset path}; the first field is required if the
# stream is required. The timestamps of a stream live at /timestamps/<ts_key>.
SAMPLE_STREAMS: dict[str, tuple[str, dict[str, str]]] = {
    "joint_states": (
        "joints",
        {
            "position": "observations/qpos",
            "velocity": "observations/qvel",
            "effort": "observations/effort",
        },
    ),
    "ee_pose": ("ee_pose", {"pose": "observations/ee_pose"}),
    "gripper": ("gripper", {"position": "observations/gripper"}),
    "wrench": ("wrench", {"force_torque": "observations/wrench"}),
    "imu": ("imu", {"accel_gyro": "observations/imu"}),
    "action": ("action", {"command": "action"}),
}
REQUIRED_STREAMS = ("joint_states", "action")
SAME_COLUMNS = ("joint_states",)  # streams whose fields are per joint: every field has one column a joint
DEFAULT_LABELS = {
    "ee_pose": ["x", "y", "z", "qx", "qy", "qz", "qw"],
    "wrench": ["fx", "fy", "fz", "tx", "ty", "tz"],
    "imu": ["ax", "ay", "az", "gx", "gy", "gz"],
}

EPISODE_ATTRS = (
    "episode_id",
    "robot_id",
    "robot_model",
    "robot_sw_version",
    "task",
    "site",
    "operator",
    "success",
    "started_at",
    "sim",
)


@dataclass(frozen=True)
class EpisodeMeta:
    episode_id: str
    robot_id: str = ""
    robot_model: str = ""
    robot_sw_version: str = ""
    task: str = ""
    site: str = ""
    operator: str = ""
    success: bool | None = None
    started_at: str = ""  # ISO-8601 UTC
    sim: bool = False

    @property
    def started_at_ns(self) -> int:
        if not self.started_at:
            return 0
        return int(round(parse_started_at(self.started_at).timestamp() * 1e6)) * 1000

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in EPISODE_ATTRS}


def parse_started_at(text: str) -> dt.datetime:
    """An ISO-8601 time (``Z`` or an offset; none means UTC) in :data:`STARTED_AT_RANGE`; ValueError otherwise."""
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time (e.g. 2026-11-02T08:15:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    lo, hi = STARTED_AT_RANGE
    if not lo <= t < hi:
        raise ValueError(f"{text!r} is outside [{lo.year}, {hi.year})")
    return t


class HDF5Columns:
    """An (N, k) float64 view of an HDF5 dataset that reads only the rows asked for.

    A long episode's proprio streams are never loaded whole (slices are read on demand);
    ``np.asarray`` reads everything when a caller really wants it. 1-D datasets appear as
    (N, 1).
    """

    def __init__(self, ds: h5py.Dataset, path: str = ""):
        self._ds, self._path = ds, path
        self.shape = (ds.shape[0], ds.shape[1] if ds.ndim == 2 else 1)
        self.dtype = np.dtype(np.float64)
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        a = np.asarray(_read_rows(self._ds, rows, self._path, self._ds.name, f"rows {rows}"))
        return a.reshape(len(a), self.shape[1]).astype(np.float64, copy=False)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self[:]
        return a if dtype is None else a.astype(dtype, copy=False)


@dataclass
class SampleStream:
    """A numeric stream: one timestamp per row, one or more fields of shape (N, k).

    Fields are numpy arrays, or :class:`HDF5Columns` when read from a file.
    """

    name: str
    timestamps_ns: np.ndarray
    fields: dict[str, np.ndarray | HDF5Columns]
    labels: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.timestamps_ns)


@dataclass
class CameraStream:
    """A camera: timestamps in memory, frames read lazily from the file."""

    name: str
    timestamps_ns: np.ndarray
    encoding: str  # "jpeg" | "rgb"
    _path: str
    _dataset: h5py.Dataset
    _padded: bool = False  # ALOHA: (T, padded) rows, each a JPEG followed by zeros

    def __len__(self) -> int:
        return len(self.timestamps_ns)

    @property
    def _stream(self) -> str:
        return f"images/{self.name}"

    def _rows(self, start: int, stop: int):
        return _read_rows(self._dataset, slice(start, stop), self._path, self._stream, f"frames {start}..{stop - 1}")

    def _jpeg(self, row: np.ndarray) -> bytes:
        # A JPEG ends with its EOI marker (FF D9), never with a zero byte: what follows it is padding.
        return row.tobytes().rstrip(b"\0") if self._padded else row.tobytes()

    def frame_bytes(self, i: int) -> bytes:
        """The stored JPEG of frame ``i``."""
        if self.encoding != "jpeg":
            raise ValueError(f"camera {self.name} stores raw frames, not JPEG")
        return self._jpeg(self._rows(i, i + 1)[0])

    def iter_jpeg(self, batch: int = 32) -> Iterator[bytes]:
        """Frames' JPEG bytes in order, reading ``batch`` frames per HDF5 call."""
        n = len(self)
        for start in range(0, n, batch):
            for row in self._rows(start, min(n, start + batch)):
                yield self._jpeg(row)

    def iter_frames(self, batch: int = 32) -> Iterator[np.ndarray]:
        """Decoded RGB frames (H, W, 3) uint8 in order; memory stays at one batch."""
        if self.encoding == "rgb":
            n = len(self)
            for start in range(0, n, batch):
                yield from self._rows(start, min(n, start + batch))
            return
        for i, jpeg in enumerate(self.iter_jpeg(batch)):
            yield decode_jpeg(jpeg, self._path, self.name, i)

    def iter_yuv(self, batch: int = 32) -> Iterator[av.VideoFrame]:
        """Frames as full-range YUV 4:2:0 for the encoder: a JPEG's own planes, no RGB round trip.
        An odd width or height loses its last column or row (see :func:`codec.to_yuv`)."""
        if self.encoding == "rgb":
            for i, rgb in enumerate(self.iter_frames(batch)):
                yield self._converted(i, partial(to_yuv, rgb))
        else:
            for i, jpeg in enumerate(self.iter_jpeg(batch)):
                yield self._converted(i, partial(jpeg_to_yuv, jpeg))

    def _converted(self, i: int, convert: Callable[[], av.VideoFrame]) -> av.VideoFrame:
        try:
            return convert()
        except ValueError as e:
            raise CorruptFrameError(self._path, self._stream, i, str(e)) from None

    def frame(self, i: int) -> np.ndarray:
        if self.encoding == "rgb":
            return self._rows(i, i + 1)[0]
        return decode_jpeg(self.frame_bytes(i), self._path, self.name, i)


def _read_rows(ds: h5py.Dataset, rows: slice | tuple, path: str, stream: str, what: str) -> np.ndarray:
    """``ds[rows]``; whatever HDF5 raises on a damaged file (missing data blocks of a cut file,
    a garbled chunk index or filter pipeline) becomes a RawFormatError naming the rows."""
    try:
        return ds[rows]
    except Exception as e:
        raise RawFormatError(path, f"cannot read {what}: {type(e).__name__}: {e}", stream) from None


def decode_jpeg(data: bytes, path: str, camera: str, index: int) -> np.ndarray:
    """Decode one JPEG strictly: libjpeg-turbo warnings (truncation, bad markers) are errors."""
    if len(data) < 4 or data[:2] != b"\xff\xd8":
        raise CorruptFrameError(path, f"images/{camera}", index, "not a JPEG (missing SOI marker)")
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError as e:
        raise CorruptFrameError(path, f"images/{camera}", index, f"JPEG decode failed: {e}") from None


def encode_jpeg(frame: np.ndarray, quality: int = 90) -> bytes:
    """Baseline JPEG with 4:2:0 chroma, as libjpeg, OpenCV and Pillow write by default."""
    return simplejpeg.encode_jpeg(
        np.ascontiguousarray(frame), quality=quality, colorspace="RGB", colorsubsampling="420"
    )


def file_sha256(path: str | Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


class _RootAttrs:
    """The root attributes, each read and checked for its type and value on request: anything
    unexpected is a RawFormatError naming the attribute (the registry stores what this returns)."""

    def __init__(self, attrs: Mapping, path: str):
        self._attrs, self._path = attrs, path

    def _fail(self, key: str, reason: str) -> RawFormatError:
        return RawFormatError(self._path, f"attribute {key}: {reason}", stream=key)

    def value(self, key: str):
        """The attribute as a Python scalar (str, int, float, bool), or None when absent or empty."""
        if key not in self._attrs:
            return None
        try:
            v = self._attrs[key]
        except Exception as e:
            raise self._fail(key, f"unreadable: {type(e).__name__}: {e}") from None
        if isinstance(v, h5py.Empty):
            return None
        if isinstance(v, np.ndarray):
            if v.ndim:
                raise self._fail(key, f"expected a single value, got an array of shape {v.shape}")
            v = v[()]
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                raise self._fail(key, "text is not UTF-8") from None
        if not isinstance(v, (str, int, float, bool)):
            raise self._fail(key, f"expected text, a number or a boolean, got {type(v).__name__}")
        return v

    def text(self, key: str, default: str = "") -> str:
        v = self.value(key)
        if v is None:
            return default
        if isinstance(v, bool):
            raise self._fail(key, f"expected text, got the boolean {v}")
        return str(v)

    def flag(self, key: str, default: bool | None) -> bool | None:
        v = self.value(key)
        if v is None:
            return default
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return bool(v)
        raise self._fail(key, f"expected a boolean, got {v!r}")

    def rate_hz(self) -> float:
        v = self.value("rate_hz")
        if v is None:
            return DEFAULT_ALOHA_RATE_HZ
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_RATE_HZ:
            raise self._fail("rate_hz", f"expected a rate in (0, {MAX_RATE_HZ:g}] Hz, got {v!r}")
        return float(v)

    def started_at(self) -> str:
        v = self.text("started_at")
        if v:
            try:
                parse_started_at(v)
            except ValueError as e:
                raise self._fail("started_at", str(e)) from None
        return v


def _check_monotonic(path: str, stream: str, ts: np.ndarray) -> None:
    if ts.ndim != 1:
        raise TimestampError(path, f"timestamps have shape {ts.shape}, expected 1-D", stream)
    if len(ts) > 1:
        bad = np.flatnonzero(np.diff(ts) <= 0)
        if len(bad):
            i = int(bad[0]) + 1
            raise TimestampError(
                path,
                f"timestamps not strictly increasing at index {i}: "
                f"{int(ts[i])} ns after {int(ts[i - 1])} ns ({len(bad)} violation(s))",
                stream,
            )


def _refuse_outside_references(h5: h5py.File, path: str) -> None:
    """Raise :class:`ExternalDataError` if anything in the file would make HDF5 read another file.

    Every link is inspected without being followed (HDF5's link iteration recurses through hard
    links only), and every dataset's creation properties are read from its own object header:
    opening a dataset reads neither its external storage nor a virtual dataset's sources (checked
    with inotify in tests/episodes/test_hostile_h5.py), so nothing outside is touched.
    """
    names: list[bytes] = []
    h5.id.links.visit(names.append)  # collected first: an exception must not cross HDF5's C callback
    for raw_name in names:
        name = raw_name.decode("utf-8", "replace")
        where = f"/{name}"
        link = h5.get(raw_name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            raise ExternalDataError(
                path,
                f"{where} is an external link to {link.filename}:{link.path}; episode files must be self-contained",
                where,
            )
        if isinstance(link, h5py.SoftLink):
            _resolve_soft_link(h5, path, where, link.path)
            continue
        obj = h5[raw_name]  # a hard link, reached through hard links only
        if not isinstance(obj, h5py.Dataset):
            continue
        if obj.external:
            files = ", ".join(sorted({str(f) for f, _, _ in obj.external}))
            raise ExternalDataError(
                path,
                f"dataset {where} keeps its data outside the file (HDF5 external "
                f"storage in {files}); episode files must be self-contained",
                where,
            )
        if obj.is_virtual:
            files = ", ".join(sorted({m.file_name for m in obj.virtual_sources()}))
            raise ExternalDataError(
                path,
                f"dataset {where} is a virtual dataset mapping {files}; episode files must be self-contained",
                where,
            )


def _resolve_soft_link(h5: h5py.File, path: str, where: str, target: str, depth: int = 0) -> str:
    """The hard path a soft link at ``where`` leads to, one link at a time (a lookup of the whole
    path would follow an external link on the way); ExternalDataError when it leaves the file."""
    if depth >= MAX_SOFT_LINK_DEPTH:
        raise ExternalDataError(
            path, f"soft link {where} -> {target}: soft links loop or chain more than {MAX_SOFT_LINK_DEPTH} deep", where
        )
    parent = where.rsplit("/", 1)[0] or "/"
    full = target if target.startswith("/") else f"{parent.rstrip('/')}/{target}"
    here = "/"
    for part in (p for p in full.split("/") if p and p != "."):
        group = h5[here]
        if not isinstance(group, h5py.Group):
            raise ExternalDataError(
                path, f"soft link {where} -> {target} does not resolve in the file ({here} is not a group)", where
            )
        link = group.get(part, getlink=True)
        step = f"{here.rstrip('/')}/{part}"
        if link is None:
            raise ExternalDataError(
                path, f"soft link {where} -> {target} points to nothing in the file ({step} does not exist)", where
            )
        if isinstance(link, h5py.ExternalLink):
            raise ExternalDataError(
                path,
                f"soft link {where} -> {target} leaves the file through the external "
                f"link {step} ({link.filename}:{link.path})",
                where,
            )
        here = _resolve_soft_link(h5, path, step, link.path, depth + 1) if isinstance(link, h5py.SoftLink) else step
    return here


class RawEpisode:
    """Reads one legacy HDF5 episode. Use as a context manager; the file stays open.

    Opening validates the layout (required streams, shapes, strictly increasing
    timestamps); camera frames are decoded lazily, and a corrupt one raises
    :class:`CorruptFrameError` naming the camera and frame.
    """

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            self._h5 = h5py.File(self.path, "r")
        except Exception as e:
            raise RawFormatError(self.path, f"cannot open as HDF5 (truncated or not HDF5): {e}") from None
        try:
            _refuse_outside_references(self._h5, self.path)
            self._load()
        except EpisodeError:
            self._h5.close()
            raise
        except Exception as e:
            self._h5.close()
            raise RawFormatError(self.path, f"damaged HDF5 structure: {type(e).__name__}: {e}") from None

    def __enter__(self) -> RawEpisode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._h5.close()

    # -- loading ----------------------------------------------------------------
    def _dataset(self, key: str, stream: str) -> h5py.Dataset:
        obj = self._h5.get(key)
        if not isinstance(obj, h5py.Dataset):
            raise RawFormatError(self.path, f"/{key} is a {type(obj).__name__}, expected a dataset", stream)
        return obj

    def _read(self, key: str, stream: str) -> np.ndarray:
        return np.asarray(_read_rows(self._dataset(key, stream), (), self.path, stream, f"/{key}"))

    def _timestamps(self, ts_key: str, n: int, stream: str) -> np.ndarray:
        key = f"timestamps/{ts_key}"
        if key in self._h5:
            ts = self._read(key, stream)
            if not np.issubdtype(ts.dtype, np.integer):
                raise TimestampError(self.path, f"timestamps must be integer ns, got {ts.dtype}", stream)
            ts = ts.astype(np.int64, copy=False)
        else:
            ts = self.meta.started_at_ns + np.round(np.arange(n) * (1e9 / self._rate_hz)).astype(np.int64)
        _check_monotonic(self.path, stream, ts)
        if len(ts) != n:
            raise TimestampError(self.path, f"{len(ts)} timestamps for {n} samples", stream)
        return ts

    def _labels(self, ds: h5py.Dataset, key: str, columns: int) -> list[str] | None:
        if "names" not in ds.attrs:
            return None
        names = np.asarray(ds.attrs["names"])
        if names.ndim != 1 or len(names) != columns:
            raise RawFormatError(
                self.path, f"attribute names: {names.size} label(s) of shape {names.shape} for {columns} column(s)", key
            )
        try:
            return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names.tolist()]
        except UnicodeDecodeError:
            raise RawFormatError(self.path, "attribute names: a label is not UTF-8", key) from None

    def _load(self) -> None:
        attrs = _RootAttrs(self._h5.attrs, self.path)
        self.meta = EpisodeMeta(
            episode_id=attrs.text("episode_id") or Path(self.path).stem,
            **{k: attrs.text(k) for k in TEXT_ATTRS},
            success=attrs.flag("success", None),
            started_at=attrs.started_at(),
            sim=bool(attrs.flag("sim", False)),
        )
        self._rate_hz = attrs.rate_hz()
        self.streams: dict[str, SampleStream] = {}
        for name, (ts_key, fields) in SAMPLE_STREAMS.items():
            first = next(iter(fields.values()))
            if first not in self._h5:
                if name in REQUIRED_STREAMS:
                    raise MissingStreamError(self.path, f"required dataset /{first} is missing", stream=name)
                continue
            arrays: dict[str, np.ndarray | HDF5Columns] = {}
            labels: dict[str, list[str]] = {}
            for fname, key in fields.items():
                if key not in self._h5:
                    continue
                ds = self._dataset(key, key)
                if ds.ndim not in (1, 2) or ds.dtype.kind not in "iuf" or 0 in ds.shape[1:]:
                    raise RawFormatError(
                        self.path, f"expected a 2-D numeric array (rows, columns), got {ds.dtype}{ds.shape}", key
                    )
                a = HDF5Columns(ds, self.path)
                if arrays and len(a) != len(next(iter(arrays.values()))):
                    raise RawFormatError(
                        self.path, f"{len(a)} rows, other fields of {name} have {len(next(iter(arrays.values())))}", key
                    )
                if name in SAME_COLUMNS and arrays:
                    other, had = next(iter(arrays.items()))
                    if a.shape[1] != had.shape[1]:
                        raise RawFormatError(
                            self.path,
                            f"{a.shape[1]} column(s) in /{key}, {had.shape[1]} in "
                            f"/{fields[other]}: the {name} fields must describe the same "
                            f"joints",
                            key,
                        )
                arrays[fname] = a
                names = self._labels(ds, key, a.shape[1])
                if names is not None:
                    labels[fname] = names
                elif name in DEFAULT_LABELS and a.shape[1] == len(DEFAULT_LABELS[name]):
                    labels[fname] = list(DEFAULT_LABELS[name])
            n = len(next(iter(arrays.values())))
            self.streams[name] = SampleStream(name, self._timestamps(ts_key, n, name), arrays, labels)

        self.cameras: dict[str, CameraStream] = {}
        images = self._h5.get("observations/images")
        if images is not None and not isinstance(images, h5py.Group):
            raise RawFormatError(self.path, "/observations/images is a dataset, expected a group of cameras", "images")
        if images is None or len(images) == 0:
            raise MissingStreamError(self.path, "no camera under /observations/images", stream="images")
        for cam in images:
            self.cameras[cam] = self._camera(images, cam)
        if not any(len(s) for s in self.streams.values()) and not any(len(c) for c in self.cameras.values()):
            raise RawFormatError(self.path, "no samples or frames in any stream")

    def _camera(self, images: h5py.Group, cam: str) -> CameraStream:
        stream = f"images/{cam}"
        ds = images.get(cam)
        if not isinstance(ds, h5py.Dataset):
            raise RawFormatError(
                self.path, f"/observations/{stream} is a {type(ds).__name__}, expected a dataset of frames", stream
            )
        padded = False
        if ds.ndim == 1 and h5py.check_vlen_dtype(ds.dtype) == np.dtype(np.uint8):
            encoding = "jpeg"
        elif ds.ndim == 4 and ds.shape[-1] == 3 and ds.dtype == np.uint8:
            encoding = "rgb"
            h, w = ds.shape[1:3]
            if not (2 <= h <= MAX_FRAME_SIDE and 2 <= w <= MAX_FRAME_SIDE):
                raise RawFormatError(
                    self.path, f"frames of {w}x{h} pixels: each side must be within 2..{MAX_FRAME_SIDE}", stream
                )
        elif ds.ndim == 2 and ds.dtype == np.uint8:
            encoding, padded = "jpeg", True  # ALOHA: zero-padded JPEG rows
            if ds.shape[1] > MAX_JPEG_BYTES:
                raise RawFormatError(
                    self.path,
                    f"padded JPEG rows of {ds.shape[1]} bytes exceed {MAX_JPEG_BYTES} bytes per frame",
                    stream,
                )
        else:
            raise RawFormatError(
                self.path,
                f"unsupported image dataset {ds.dtype}{ds.shape}: expected "
                "(T,) vlen uint8 JPEG, (T, padded) uint8 JPEG or (T, H, W, 3) uint8 RGB",
                stream,
            )
        ts = self._timestamps(stream, ds.shape[0], stream)
        return CameraStream(cam, ts, encoding, self.path, ds, padded)

    # -- summary -----------------------------------------------------------------
    @property
    def start_ns(self) -> int:
        firsts = [s.timestamps_ns[0] for s in self.streams.values() if len(s)]
        firsts += [c.timestamps_ns[0] for c in self.cameras.values() if len(c)]
        return int(min(firsts))

    @property
    def end_ns(self) -> int:
        lasts = [s.timestamps_ns[-1] for s in self.streams.values() if len(s)]
        lasts += [c.timestamps_ns[-1] for c in self.cameras.values() if len(c)]
        return int(max(lasts))

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def write_raw_episode(
    path: str | Path,
    meta: EpisodeMeta,
    cameras: Mapping[str, tuple[np.ndarray, Sequence[bytes] | Iterator[bytes]]],
    streams: Mapping[str, SampleStream],
) -> None:
    """Write an episode in this project's flavour of the layout (vlen JPEG, explicit timestamps).

    ``cameras`` maps a name to (timestamps_ns, JPEG bytes per frame); the JPEG iterable
    is consumed lazily so a long episode never sits in memory. ``streams`` are keyed by
    the names in :data:`SAMPLE_STREAMS`.
    """
    path = Path(path)
    with h5py.File(path, "w") as h5:
        h5.attrs["dyna_format"] = FORMAT_NAME
        h5.attrs["dyna_format_version"] = FORMAT_VERSION
        for k, v in meta.as_dict().items():
            if v is not None:
                h5.attrs[k] = v
        h5.attrs["compress"] = True
        h5.attrs["camera_names"] = list(cameras)
        for name, stream in streams.items():
            ts_key, fields = SAMPLE_STREAMS[name]
            h5.create_dataset(f"timestamps/{ts_key}", data=np.asarray(stream.timestamps_ns, dtype=np.int64))
            for fname, key in fields.items():
                if fname in stream.fields:
                    ds = h5.create_dataset(key, data=stream.fields[fname])
                    if fname in stream.labels:
                        ds.attrs["names"] = stream.labels[fname]
        vlen = h5py.vlen_dtype(np.uint8)
        for cam, (ts, jpegs) in cameras.items():
            ts = np.asarray(ts, dtype=np.int64)
            h5.create_dataset(f"timestamps/images/{cam}", data=ts)
            ds = h5.create_dataset(
                f"observations/images/{cam}", shape=(len(ts),), dtype=vlen, chunks=(min(max(len(ts), 1), 64),)
            )
            n = 0
            for i, jpeg in enumerate(jpegs):
                ds[i] = np.frombuffer(jpeg, dtype=np.uint8)
                n += 1
            if n != len(ts):
                raise ValueError(f"camera {cam}: {n} frames for {len(ts)} timestamps")
