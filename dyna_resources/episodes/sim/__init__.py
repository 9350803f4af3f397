"""Simulated sample fleet: scripted robot episodes rendered from real photographs.

See :mod:`.fleet` for the public entry points and the command line
(``python -m dyna_resources.episodes.sim.fleet``), :mod:`.robot` for the arm, its task
scripts and sensor streams, :mod:`.scene` for the cameras. Names are imported lazily so
that running the fleet module as a script does not import it twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "DEFAULT_CAMERAS": ".fleet",
    "FAULTS": ".fleet",
    "EpisodeSpec": ".fleet",
    "GeneratedEpisode": ".fleet",
    "SimulatedEpisode": ".fleet",
    "assign_faults": ".fleet",
    "fleet_specs": ".fleet",
    "generate_fleet": ".fleet",
    "write_episode": ".fleet",
    "TASKS": ".robot",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .fleet import (
        DEFAULT_CAMERAS,
        FAULTS,
        EpisodeSpec,
        GeneratedEpisode,
        SimulatedEpisode,
        assign_faults,
        fleet_specs,
        generate_fleet,
        write_episode,
    )
    from .robot import TASKS


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
