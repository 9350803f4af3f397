"""The legacy raw episode format: one HDF5 file per episode, every camera frame a JPEG.

Layout (follows the ALOHA/ACT recorder where it fits, so real users' files load)::

    /                                 root attributes, all optional but episode_id:
        episode_id, robot_id, robot_model, robot_sw_version, task, site, operator,
        success (bool), started_at (ISO-8601, UTC), sim (bool),
        compress (bool, ALOHA: images are JPEG), camera_names (ALOHA row order of
        /compress_len), rate_hz (ALOHA: rate of every stream when /timestamps is absent)
    /observations/images/<cam>        one of three encodings:
        (T,) variable-length uint8           one JPEG per frame (this project's writer)
        (T, padded) uint8 + /compress_len    ALOHA: JPEG bytes zero-padded; /compress_len
                                             (n_cams, T) holds each frame's length, its rows
                                             in the order of the camera_names attribute
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
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import av
import h5py
import numpy as np
import simplejpeg

from .codec import jpeg_to_yuv, to_yuv
from .errors import CorruptFrameError, MissingStreamError, RawFormatError, TimestampError

FORMAT_NAME = "dyna-legacy-h5"
FORMAT_VERSION = 1
DEFAULT_ALOHA_RATE_HZ = 50.0

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
        t = dt.datetime.fromisoformat(self.started_at.replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return int(round(t.timestamp() * 1e6)) * 1000

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in EPISODE_ATTRS}


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
        try:
            a = np.asarray(self._ds[rows])
        except (OSError, ValueError) as e:  # data blocks missing from a cut file
            raise RawFormatError(self._path, f"cannot read rows {rows}: {e}", stream=self._ds.name) from None
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
    _lengths: np.ndarray | None = None  # ALOHA padded JPEG lengths

    def __len__(self) -> int:
        return len(self.timestamps_ns)

    def frame_bytes(self, i: int) -> bytes:
        """The stored JPEG of frame ``i``."""
        if self.encoding != "jpeg":
            raise ValueError(f"camera {self.name} stores raw frames, not JPEG")
        data = self._dataset[i]
        if self._lengths is not None:
            data = data[: int(self._lengths[i])]
        return data.tobytes()

    def iter_jpeg(self, batch: int = 32) -> Iterator[bytes]:
        """Frames' JPEG bytes in order, reading ``batch`` frames per HDF5 call."""
        n = len(self)
        for start in range(0, n, batch):
            try:
                rows = self._dataset[start : min(n, start + batch)]
            except (OSError, ValueError) as e:  # data blocks missing from a cut file
                raise RawFormatError(self._path, f"cannot read frames {start}..{min(n, start + batch) - 1}: {e}",
                                     f"images/{self.name}") from None
            for j, row in enumerate(rows):
                if self._lengths is not None:
                    row = row[: int(self._lengths[start + j])]
                yield row.tobytes()

    def iter_frames(self, batch: int = 32) -> Iterator[np.ndarray]:
        """Decoded RGB frames (H, W, 3) uint8 in order; memory stays at one batch."""
        if self.encoding == "rgb":
            n = len(self)
            for start in range(0, n, batch):
                yield from self._dataset[start : min(n, start + batch)]
            return
        for i, jpeg in enumerate(self.iter_jpeg(batch)):
            yield decode_jpeg(jpeg, self._path, self.name, i)

    def iter_yuv(self, batch: int = 32) -> Iterator[av.VideoFrame]:
        """Frames as full-range YUV 4:2:0 for the encoder: a JPEG's own planes, no RGB round trip."""
        if self.encoding == "rgb":
            for rgb in self.iter_frames(batch):
                yield to_yuv(rgb)
            return
        for i, jpeg in enumerate(self.iter_jpeg(batch)):
            try:
                yield jpeg_to_yuv(jpeg)
            except ValueError as e:
                raise CorruptFrameError(self._path, f"images/{self.name}", i, str(e)) from None

    def frame(self, i: int) -> np.ndarray:
        if self.encoding == "rgb":
            return self._dataset[i]
        return decode_jpeg(self.frame_bytes(i), self._path, self.name, i)


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
    return simplejpeg.encode_jpeg(np.ascontiguousarray(frame), quality=quality, colorspace="RGB",
                                  colorsubsampling="420")


def file_sha256(path: str | Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def _attr(attrs: Mapping, key: str, default=None):
    if key not in attrs:
        return default
    v = attrs[key]
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
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
        except (OSError, ValueError) as e:
            raise RawFormatError(self.path, f"cannot open as HDF5 (truncated or not HDF5): {e}") from None
        try:
            self._load()
        except Exception:
            self._h5.close()
            raise

    def __enter__(self) -> RawEpisode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._h5.close()

    # -- loading ----------------------------------------------------------------
    def _read(self, key: str) -> np.ndarray:
        try:
            return self._h5[key][()]
        except (OSError, KeyError, ValueError) as e:
            raise RawFormatError(self.path, f"cannot read dataset: {e}", stream=key) from None

    def _timestamps(self, ts_key: str, n: int, stream: str) -> np.ndarray:
        key = f"timestamps/{ts_key}"
        if key in self._h5:
            ts = np.asarray(self._read(key))
            if not np.issubdtype(ts.dtype, np.integer):
                raise TimestampError(self.path, f"timestamps must be integer ns, got {ts.dtype}", stream)
            ts = ts.astype(np.int64, copy=False)
        else:
            rate = float(_attr(self._h5.attrs, "rate_hz", DEFAULT_ALOHA_RATE_HZ))
            ts = self.meta.started_at_ns + np.round(np.arange(n) * (1e9 / rate)).astype(np.int64)
        _check_monotonic(self.path, stream, ts)
        if len(ts) != n:
            raise TimestampError(self.path, f"{len(ts)} timestamps for {n} samples", stream)
        return ts

    def _load(self) -> None:
        attrs = self._h5.attrs
        episode_id = _attr(attrs, "episode_id") or Path(self.path).stem
        success = _attr(attrs, "success")
        self.meta = EpisodeMeta(
            episode_id=str(episode_id),
            robot_id=str(_attr(attrs, "robot_id", "")),
            robot_model=str(_attr(attrs, "robot_model", "")),
            robot_sw_version=str(_attr(attrs, "robot_sw_version", "")),
            task=str(_attr(attrs, "task", "")),
            site=str(_attr(attrs, "site", "")),
            operator=str(_attr(attrs, "operator", "")),
            success=None if success is None else bool(success),
            started_at=str(_attr(attrs, "started_at", "")),
            sim=bool(_attr(attrs, "sim", False)),
        )
        self.streams: dict[str, SampleStream] = {}
        for name, (ts_key, fields) in SAMPLE_STREAMS.items():
            first = next(iter(fields.values()))
            if first not in self._h5:
                if name in REQUIRED_STREAMS:
                    raise MissingStreamError(self.path, f"required dataset /{first} is missing", stream=name)
                continue
            arrays: dict[str, HDF5Columns] = {}
            labels: dict[str, list[str]] = {}
            for fname, key in fields.items():
                if key not in self._h5:
                    continue
                ds = self._h5[key]
                if ds.ndim not in (1, 2) or not np.issubdtype(ds.dtype, np.number):
                    raise RawFormatError(self.path, f"expected a 2-D numeric array, got {ds.dtype}{ds.shape}", key)
                a = HDF5Columns(ds, self.path)
                if arrays and len(a) != len(next(iter(arrays.values()))):
                    raise RawFormatError(self.path, f"{len(a)} rows, other fields of {name} have "
                                         f"{len(next(iter(arrays.values())))}", key)
                arrays[fname] = a
                names = ds.attrs.get("names")
                if names is not None:
                    labels[fname] = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
                elif name in DEFAULT_LABELS and a.shape[1] == len(DEFAULT_LABELS[name]):
                    labels[fname] = list(DEFAULT_LABELS[name])
            n = len(next(iter(arrays.values())))
            self.streams[name] = SampleStream(name, self._timestamps(ts_key, n, name), arrays, labels)

        self.cameras: dict[str, CameraStream] = {}
        images = self._h5.get("observations/images")
        if images is None or len(images) == 0:
            raise MissingStreamError(self.path, "no camera under /observations/images", stream="images")
        compress_len = self._h5.get("compress_len")
        cam_order = [c.decode() if isinstance(c, bytes) else str(c) for c in attrs.get("camera_names", [])]
        for cam in images:
            ds = images[cam]
            stream = f"images/{cam}"
            lengths = None
            if ds.dtype == h5py.vlen_dtype(np.uint8) or ds.dtype.kind == "O":
                encoding = "jpeg"
            elif ds.ndim == 4 and ds.shape[-1] == 3 and ds.dtype == np.uint8:
                encoding = "rgb"
            elif ds.ndim == 2 and ds.dtype == np.uint8:
                encoding = "jpeg"
                if compress_len is None:
                    raise RawFormatError(self.path, "padded JPEG rows without /compress_len", stream)
                row = cam_order.index(cam) if cam in cam_order else sorted(images).index(cam)
                lengths = np.asarray(compress_len[row]).astype(np.int64)
                if len(lengths) != ds.shape[0] or (lengths > ds.shape[1]).any():
                    raise RawFormatError(self.path, "compress_len does not match the padded frames", stream)
            else:
                raise RawFormatError(self.path, f"unsupported image dataset {ds.dtype}{ds.shape}", stream)
            ts = self._timestamps(stream, ds.shape[0], stream)
            self.cameras[cam] = CameraStream(cam, ts, encoding, self.path, ds, lengths)

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
            ds = h5.create_dataset(f"observations/images/{cam}", shape=(len(ts),), dtype=vlen,
                                   chunks=(min(max(len(ts), 1), 64),))
            n = 0
            for i, jpeg in enumerate(jpegs):
                ds[i] = np.frombuffer(jpeg, dtype=np.uint8)
                n += 1
            if n != len(ts):
                raise ValueError(f"camera {cam}: {n} frames for {len(ts)} timestamps")
