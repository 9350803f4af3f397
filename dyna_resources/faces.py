"""Dagster faces of the engines: thin ConfigurableResources, kept apart from the engines.

Importing an engine never imports Dagster (the trainer loads the MCAP reader on every
DataLoader worker); only this module and ``dyna_assets`` do.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource

from .episodes.codec import VideoSettings
from .episodes.transcode import TranscodeSettings
from .home import DynaHome


class HomeResource(ConfigurableResource):
    """The embedded defaults' folder (landing zone, MCAP store, quarantine)."""

    root: str = ""  # empty: $DYNA_HOME, else ./.dyna

    def home(self) -> DynaHome:
        return (DynaHome(Path(self.root).resolve()) if self.root else DynaHome.from_env()).ensure()


class TranscodeResource(ConfigurableResource):
    """Transcode settings and the worker pool size (0: one worker per core)."""

    gop_frames: int = VideoSettings.gop_frames
    crf: float = VideoSettings.crf
    preset: str = VideoSettings.preset
    workers: int = 0

    def settings(self) -> TranscodeSettings:
        return TranscodeSettings(video=VideoSettings(gop_frames=self.gop_frames, crf=self.crf, preset=self.preset))

    def pool_size(self) -> int:
        return self.workers or os.cpu_count() or 1
