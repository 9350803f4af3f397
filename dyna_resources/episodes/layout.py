"""An episode's layout: its cameras and, for every sample stream, each field's width (values a sample).

Recorded at ingest (the pre gates, from the open episode: no sample is read) in the registry's
``stream_layout`` column, carried by every manifest, so that a training run can refuse, before any rank
starts, a manifest holding episodes its model cannot read: another number of cameras, a stream or field
the sample spec reads and the episode lacks (a LeRobot dataset's rows hold no joint velocity), or a
field of another width (a 6-joint arm among 7-joint ones). Without it, such an episode fails the run the
first time one of its samples is drawn, hours in.

The text is canonical JSON (sorted keys, no spaces): episodes of one robot share one value, which the
manifest dictionary-encodes, so the check reads each distinct layout once whatever the manifest's size.

Plain Python, no Dagster import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


def episode_layout(episode) -> str:
    """The layout of an open episode (``RawEpisode`` or ``MemoryEpisode``): ``{"cameras": [...],
    "streams": {stream: {field: width}}}`` as canonical JSON."""
    streams = {
        name: {f: int(col.shape[1]) if len(col.shape) > 1 else 1 for f, col in s.fields.items()}
        for name, s in episode.streams.items()
    }
    return json.dumps({"cameras": sorted(episode.cameras), "streams": streams}, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Layout:
    cameras: tuple[str, ...]
    widths: dict[tuple[str, str], int]  # (stream, field) -> values a sample

    @classmethod
    def parse(cls, text: str) -> Layout:
        doc = json.loads(text)
        widths = {(s, f): int(w) for s, fields in doc.get("streams", {}).items() for f, w in fields.items()}
        return cls(tuple(doc.get("cameras", [])), widths)

    def lacks(
        self,
        *,
        cameras: tuple[str, ...] | None,
        camera_count: int,
        proprio: tuple[tuple[str, str], ...],
        proprio_width: int,
        action: tuple[str, str],
        action_width: int,
    ) -> str:
        """What of a model's input this layout cannot give, in words; empty when it gives all of it.
        ``cameras``: the cameras read by name (``None``: every camera the episode has, which must then be
        ``camera_count`` of them); ``proprio``: the (stream, field)s concatenated into ``proprio_width``
        values; ``action``: the (stream, field) of ``action_width`` values."""
        out = []
        if cameras is not None:
            missing = [c for c in cameras if c not in self.cameras]
            if missing:
                out.append(f"no camera {', '.join(missing)} (has {', '.join(self.cameras) or 'none'})")
        elif len(self.cameras) != camera_count:
            out.append(f"{len(self.cameras)} camera(s) ({', '.join(self.cameras)}), the model reads {camera_count}")
        absent = [f"{s}.{f}" for s, f in (*proprio, action) if (s, f) not in self.widths]
        if absent:
            out.append(f"no {', '.join(absent)}")
        else:
            width = sum(self.widths[k] for k in proprio)
            if width != proprio_width:
                parts = " + ".join(f"{s}.{f} {self.widths[(s, f)]}" for s, f in proprio)
                out.append(f"proprio {parts} = {width} values, the model reads {proprio_width}")
            if self.widths[action] != action_width:
                out.append(f"{action[0]}.{action[1]} {self.widths[action]} values, the model reads {action_width}")
        return "; ".join(out)


__all__ = ["Layout", "episode_layout"]
