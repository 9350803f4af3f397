import shutil
from pathlib import Path

import pytest

from dyna_resources.episodes.codec import VideoSettings
from dyna_resources.episodes.transcode import TranscodeSettings
from dyna_resources.ingest.batches import IngestStores
from dyna_resources.ingest.landing import LandingZone

FAST = TranscodeSettings(video=VideoSettings(gop_frames=30, preset="veryfast"))


@pytest.fixture
def stores(registry, tmp_path) -> IngestStores:
    """Ingest stores on each registry backend (SQLite, then a real PostgreSQL)."""
    s = IngestStores(registry, LandingZone(tmp_path / "landing"), tmp_path / "mcap", tmp_path / "quarantine")
    s.landing.root.mkdir()
    return s


def land(stores_or_dir, generated, name: str | None = None) -> Path:
    """Copy a generated episode into the landing zone (as an uploader would: whole file, final name)."""
    root = stores_or_dir.landing.root if hasattr(stores_or_dir, "landing") else Path(stores_or_dir)
    dst = root / (name or generated.path.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(generated.path, dst)
    return dst
