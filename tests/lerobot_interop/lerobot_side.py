"""The `lerobot` package's side of the interop tests; runs in the lerobot venv, never in .venv.

    python lerobot_side.py create ROOT SOURCE.npz      write a dataset with lerobot's own writer
    python lerobot_side.py load ROOT OUT.npz [DELTA]   read a dataset with lerobot's own loader
    python lerobot_side.py edit ROOT OTHER WORK OUT.json   merge ROOT with OTHER, split and prune ROOT

SOURCE.npz (written by the test): ``fps``, ``cameras`` (names), ``tasks`` (one per episode),
``lengths``, and per episode k ``state_k``, ``action_k``, ``<camera>_k`` (T, H, W, 3) uint8.
OUT.npz: every row's ``observation.state``, ``action``, ``timestamp``, ``episode_index``,
``frame_index``, ``index``, ``task`` and each camera's frame as (H, W, 3) uint8; with DELTA (a JSON
``delta_timestamps``) also each delta key's stacked window ``delta/<key>`` and ``delta/<key>_is_pad``.
Only lerobot's public dataset API is used, offline (HF_HUB_OFFLINE=1). Works with lerobot 0.4
(format v3.0) and 0.3 (v2.1), whose ``add_frame`` takes the task as an argument.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset

REPO_ID = "dyna/interop"


def create(root: Path, source: Path) -> None:
    src = np.load(source)
    fps, cameras = int(src["fps"]), [str(c) for c in src["cameras"]]
    state0 = src["state_0"]
    action0 = src["action_0"]
    h, w = src[f"{cameras[0]}_0"].shape[1:3]
    features = {
        "observation.state": {
            "dtype": "float32",
            "shape": (state0.shape[1],),
            "names": [f"j{i}" for i in range(state0.shape[1])],
        },
        "action": {"dtype": "float32", "shape": (action0.shape[1],), "names": None},
        **{
            f"observation.images.{c}": {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
            for c in cameras
        },
    }
    ds = LeRobotDataset.create(REPO_ID, fps=fps, features=features, root=root, robot_type="so100", use_videos=True)
    for k, (n, task) in enumerate(zip(src["lengths"], src["tasks"])):
        for i in range(int(n)):
            frame = {"observation.state": src[f"state_{k}"][i], "action": src[f"action_{k}"][i]}
            frame.update({f"observation.images.{c}": src[f"{c}_{k}"][i] for c in cameras})
            if CODEBASE_VERSION.startswith("v2."):
                ds.add_frame(frame, task=str(task))
            else:
                ds.add_frame(frame | {"task": str(task)})
        ds.save_episode()
    if hasattr(ds, "finalize"):  # 0.4: closes its Parquet writers
        ds.finalize()


def _uint8_hwc(t: torch.Tensor) -> np.ndarray:
    """lerobot's float CHW frame in [0, 1] back to the uint8 HWC it was decoded from."""
    return np.round(t.numpy() * 255.0).clip(0, 255).astype(np.uint8).transpose(*range(t.ndim - 3), -2, -1, -3)


def load(root: Path, out: Path, delta: dict | None) -> None:
    ds = LeRobotDataset(REPO_ID, root=root, delta_timestamps=delta)
    cams = list(ds.meta.video_keys)
    rows: dict[str, list] = {}
    for idx in range(len(ds)):
        item = ds[idx]
        for key in ("observation.state", "action", "timestamp", "episode_index", "frame_index", "index", "task"):
            if delta and key in delta:
                continue
            v = item[key]
            rows.setdefault(key, []).append(v.numpy() if isinstance(v, torch.Tensor) else v)
        for c in cams:
            if not (delta and c in delta):
                rows.setdefault(c, []).append(_uint8_hwc(item[c]))
        for key in delta or {}:
            v = item[key]
            rows.setdefault(f"delta/{key}", []).append(_uint8_hwc(v) if key in cams else v.numpy())
            rows.setdefault(f"delta/{key}_is_pad", []).append(item[f"{key}_is_pad"].numpy())
    tasks = ds.meta.tasks  # 0.4: a DataFrame indexed by task; 0.3: {task_index: task}
    meta = {
        "fps": ds.meta.fps,
        "total_episodes": ds.meta.total_episodes,
        "video_keys": cams,
        "codebase_version": ds.meta.info["codebase_version"],
        "tasks": list(tasks.values()) if isinstance(tasks, dict) else list(tasks.index),
    }
    np.savez(out, meta=json.dumps(meta), **{k: np.stack(v) if k != "task" else np.array(v) for k, v in rows.items()})


def edit(root: Path, other: Path, work: Path, out: Path) -> None:
    """lerobot's dataset tools on ROOT: merge it with OTHER, split it, delete its first episode;
    OUT.json gets each result's episode count and frame count (as lerobot reloads it)."""
    from lerobot.datasets.dataset_tools import (
        delete_episodes,
        merge_datasets,
        split_dataset,
    )

    ds, ds_other = LeRobotDataset(REPO_ID, root=root), LeRobotDataset(REPO_ID, root=other)
    results = {
        "merged": merge_datasets([ds, ds_other], output_repo_id="dyna/merged", output_dir=work / "merged"),
        "pruned": delete_episodes(ds, [0], output_dir=work / "pruned", repo_id="dyna/pruned"),
        **split_dataset(ds, {"first": [0], "rest": list(range(1, ds.meta.total_episodes))}, output_dir=work / "split"),
    }
    summary = {}
    for name, result in results.items():
        reloaded = LeRobotDataset(result.repo_id, root=result.root)
        last = reloaded[len(reloaded) - 1]
        summary[name] = {
            "episodes": reloaded.meta.total_episodes,
            "frames": len(reloaded),
            "last_state": last["observation.state"].tolist(),
        }
    out.write_text(json.dumps(summary))


def main(argv: list[str]) -> None:
    cmd, root, path = argv[0], Path(argv[1]), Path(argv[2])
    if cmd == "create":
        create(root, path)
    elif cmd == "load":
        load(root, path, json.loads(argv[3]) if len(argv) > 3 else None)
    elif cmd == "edit":
        edit(root, path, Path(argv[3]), Path(argv[4]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
