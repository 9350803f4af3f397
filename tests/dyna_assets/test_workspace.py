"""The workspace `make ui` serves (from the repo root) loads: what `dagster dev` would show."""

import subprocess
import sys
from pathlib import Path

from dyna_assets.definitions import defs

ROOT = Path(__file__).resolve().parents[2]


def test_workspace_validates_with_the_dagster_cli(tmp_path):
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PATH": str(dagster.parent), "DAGSTER_HOME": str(tmp_path), "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Validation successful" in proc.stdout + proc.stderr


def test_definitions_hold_the_first_assets_with_versions():
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"raw_episodes", "mcap_episodes"} <= keys
    mcap = defs.get_assets_def("mcap_episodes")
    assert mcap.code_versions_by_key[mcap.key]
