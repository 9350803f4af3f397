"""Simulated episodes written exactly as the ALOHA/ACT recorder writes them.

The recorder (``aloha_scripts/record_episodes.py`` and its forks) writes one
``episode_<n>.hdf5`` per episode, 50 Hz, no timestamps, no episode metadata::

    /                               attrs: sim (bool), compress (bool)
    /observations/images/<cam>      compress=False: (T, 480, 640, 3) uint8, chunks (1, 480, 640, 3)
                                    compress=True:  (T, padded) uint8, chunks (1, padded): each
                                    frame's JPEG, zero-padded to the longest JPEG of any camera
    /observations/qpos|qvel|effort  (T, 14) float32 (h5py's default dtype: the recorder passes none)
    /action                         (T, 14) float32
    /compress_len                   (n_cams, T) float32, only when compress=True: JPEG lengths,
                                    one row per camera in the recorder's camera list order
                                    (cam_high, cam_low, cam_left_wrist, cam_right_wrist), which
                                    the file does not store; HDF5 lists the cameras sorted by name

Both arms are scripted arms of :mod:`.robot` (the right one with its own seed), 6 joints and
a gripper each; the four cameras are rendered by :mod:`.scene` (two wrist cameras, a top and
a front camera), so :func:`render_frame` gives the raw frame a decoded one should resemble.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import h5py
import numpy as np

from .. import raw_format
from .fleet import EpisodeSpec, SimulatedEpisode

ALOHA_CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")  # the recorder's order
ALOHA_RATE_HZ = 50.0
ALOHA_JPEG_QUALITY = 50  # the recorder's cv2.IMWRITE_JPEG_QUALITY
# which arm's simulation renders each ALOHA camera, and its camera there (names starting
# "wrist" ride on that arm's flange)
_VIEWS = {
    "cam_high": (0, "scene_top"),
    "cam_low": (0, "scene_front"),
    "cam_left_wrist": (0, "wrist"),
    "cam_right_wrist": (1, "wrist"),
}


@dataclass(frozen=True)
class AlohaEpisode:
    spec: EpisodeSpec
    path: Path
    compress: bool
    camera_names: tuple[str, ...]  # the recorder's order: the row order of /compress_len
    steps: int

    @cached_property
    def _arms(self) -> tuple[SimulatedEpisode, SimulatedEpisode]:
        return _arms(self.spec)

    def render_frame(self, camera: str, i: int) -> np.ndarray:
        """The raw RGB frame of ``camera`` at step ``i`` (what the recorder got from the camera)."""
        arm, view = _VIEWS[camera]
        return self._arms[arm].render_frame(view, i)


def _arms(spec: EpisodeSpec) -> tuple[SimulatedEpisode, SimulatedEpisode]:
    """The left and the right arm (its own seed), each with its cameras, everything at 50 Hz."""
    spec = dataclasses.replace(spec, camera_hz=ALOHA_RATE_HZ, proprio_hz=ALOHA_RATE_HZ, action_hz=ALOHA_RATE_HZ)
    views = [tuple(v for a, v in _VIEWS.values() if a == arm) for arm in (0, 1)]
    return (
        SimulatedEpisode(dataclasses.replace(spec, cameras=views[0])),
        SimulatedEpisode(dataclasses.replace(spec, seed=spec.seed + 1, cameras=views[1])),
    )


def write_aloha_episode(
    spec: EpisodeSpec,
    path: str | Path,
    *,
    compress: bool = True,
    camera_names: tuple[str, ...] = ALOHA_CAMERAS,
    jpeg_quality: int = ALOHA_JPEG_QUALITY,
) -> AlohaEpisode:
    """Write ``spec`` in the ALOHA recorder's layout at ``path`` (written to a temporary name, then
    renamed). ``spec.episode_id`` and the other metadata are not written: the recorder writes none.

    :param compress: JPEG frames zero-padded plus /compress_len (True) or raw RGB frames (False).
    :param camera_names: the recorder's camera list; its order is the row order of /compress_len.
    """
    unknown = sorted(set(camera_names) - set(_VIEWS))
    if unknown or not camera_names:
        raise ValueError(f"camera names must be among {', '.join(ALOHA_CAMERAS)}, got {list(camera_names)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    camera_names = tuple(camera_names)
    sims = _arms(spec)
    arms = [s.streams() for s in sims]
    steps = min(len(a[k]) for a in arms for k in ("joint_states", "action"))
    steps = min([steps] + [sims[_VIEWS[c][0]].n_frames(_VIEWS[c][1]) for c in camera_names])

    def both(stream: str, fld: str, cols: int) -> np.ndarray:
        return np.concatenate([np.asarray(a[stream].fields[fld])[:steps, :cols] for a in arms], axis=1)

    # the whole episode in memory, as the recorder holds it: meant for short test episodes
    frames = {c: [sims[_VIEWS[c][0]].render_frame(_VIEWS[c][1], i) for i in range(steps)] for c in camera_names}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with h5py.File(tmp, "w") as root:
            root.attrs["sim"] = True
            root.attrs["compress"] = compress
            obs = root.create_group("observations")
            image = obs.create_group("images")
            if compress:
                jpegs = {c: [raw_format.encode_jpeg(f, jpeg_quality) for f in frames[c]] for c in camera_names}
                lengths = np.array([[len(j) for j in jpegs[c]] for c in camera_names])
                padded = int(lengths.max())
                for c in camera_names:
                    rows = np.zeros((steps, padded), np.uint8)
                    for i, j in enumerate(jpegs[c]):
                        rows[i, : len(j)] = np.frombuffer(j, np.uint8)
                    image.create_dataset(c, data=rows, chunks=(1, padded))
                root.create_dataset("compress_len", (len(camera_names), steps), dtype="f4")[...] = lengths
            else:
                for c in camera_names:
                    stack = np.stack(frames[c])
                    image.create_dataset(c, data=stack, chunks=(1, *stack.shape[1:]))
            # joints 0-5 and the gripper of each arm; the action: joint targets and the gripper target
            obs.create_dataset("qpos", (steps, 14), dtype="f4")[...] = both("joint_states", "position", 7)
            obs.create_dataset("qvel", (steps, 14), dtype="f4")[...] = both("joint_states", "velocity", 7)
            obs.create_dataset("effort", (steps, 14), dtype="f4")[...] = both("joint_states", "effort", 7)
            root.create_dataset("action", (steps, 14), dtype="f4")[...] = both("action", "command", 7)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return AlohaEpisode(spec, path, compress, camera_names, steps)
