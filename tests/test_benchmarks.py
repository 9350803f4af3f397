"""Every benchmark runs in CI, in its tiny mode, as a user runs it: `python -m benchmarks NAME --tiny`.

The benchmarks are discovered (``benchmarks.__main__.benchmark_names``), not listed here, so a new
one is covered the day it is added. Each must exit 0 and print a readable table, then one JSON
object as its last line, saying it ran at size "tiny". A benchmark that cannot run a part (a
missing encoder, an optional environment) says so in its table and its JSON, and still passes.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import benchmarks
from benchmarks.__main__ import HELPERS, benchmark_names
from benchmarks.manifest import BUILD_SPEC, REALISTIC, build, make_warehouse
from dyna_resources.catalog.warehouse import warehouse_columns

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # a tiny run takes seconds; this only stops a hung one from holding CI


def test_every_module_is_a_benchmark_or_a_named_helper():
    modules = {m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.name.startswith("_")}
    assert HELPERS <= modules, f"benchmarks/__main__.py HELPERS names missing modules: {sorted(HELPERS - modules)}"
    assert set(benchmark_names()) == modules - HELPERS
    assert len(benchmark_names()) >= 9  # what there was when this test was written: discovery finds them


def _env(tmp_path: Path) -> dict[str, str]:
    """This environment without the deployment's DYNA_* settings: a benchmark runs on the embedded
    defaults, with its home in the test's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNA_")}
    env.update(DYNA_HOME=str(tmp_path / "home"), DAGSTER_HOME=str(tmp_path / "dagster"), PYTHONUNBUFFERED="1")
    (tmp_path / "dagster").mkdir()
    return env


@pytest.mark.parametrize("name", benchmark_names())
def test_benchmark_runs_tiny(name, tmp_path):
    cmd = [sys.executable, "-m", "benchmarks", name, "--tiny"]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"`{' '.join(cmd[1:])}` still running after {TIMEOUT_S} s; stdout so far:\n{out[-3000:]}")
    where = f"`python -m benchmarks {name} --tiny`"
    assert proc.returncode == 0, (
        f"{where} exited {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}"
        f"\n--- stderr (tail)\n{proc.stderr[-3000:]}"
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"{where} printed nothing on stdout"
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        pytest.fail(f"{where}: the last line of stdout is not JSON ({e}): {lines[-1][:300]!r}")
    assert isinstance(result, dict) and result, f"{where}: the last line is {type(result).__name__}, not a JSON object"
    assert result.get("size") == "tiny", f"{where}: the JSON says size {result.get('size')!r}, not 'tiny'"
    table = lines[:-1]
    assert len(table) >= 3, f"{where}: {len(table)} lines before the JSON, not a table:\n" + "\n".join(table)
    for line in table:
        assert not line.lstrip().startswith(("{", "[")), f"{where}: JSON before the last line: {line[:200]!r}"


# -- the manifest benchmark's synthetic warehouse: derived from the warehouse's columns --------------


def test_manifest_warehouse_takes_a_column_the_registry_gains(tmp_path):
    new = [
        ("brand_new_score", "DOUBLE"),
        ("brand_new_note", "VARCHAR"),
        ("brand_new_flag", "BOOLEAN"),
        ("brand_new_count", "INTEGER"),
        ("brand_new_ns", "BIGINT"),
    ]
    make_warehouse(tmp_path / "w.duckdb", 2000, warehouse_columns() + new)

    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        described = {r[0]: r[1] for r in con.execute("DESCRIBE episodes").fetchall()}
        nulls = con.execute(
            "SELECT count(*) FROM episodes WHERE brand_new_score IS NULL OR brand_new_note IS NULL "
            "OR brand_new_flag IS NULL OR brand_new_count IS NULL OR brand_new_ns IS NULL"
        ).fetchone()
        distinct_tasks = con.execute("SELECT count(DISTINCT task) FROM episodes").fetchone()
    assert described == dict(warehouse_columns() + new)
    assert nulls == (0,) and distinct_tasks == (6,)
    assert set(REALISTIC) < set(described)
    info, _, _ = build(tmp_path / "w.duckdb", BUILD_SPEC, tmp_path / "store")
    assert info.rows > 0


def test_manifest_warehouse_names_a_column_of_an_unknown_type(tmp_path):
    with pytest.raises(SystemExit, match=r"warehouse column 'recorded_on' has type TIMESTAMP, which has no synthetic"):
        make_warehouse(tmp_path / "w.duckdb", 10, warehouse_columns() + [("recorded_on", "TIMESTAMP")])


def test_manifest_warehouse_names_realistic_values_for_a_column_that_is_gone(tmp_path):
    without_site = [(n, ty) for n, ty in warehouse_columns() if n != "site"]
    with pytest.raises(SystemExit, match=r"REALISTIC names columns the warehouse does not have: \['site'\]"):
        make_warehouse(tmp_path / "w.duckdb", 10, without_site)


def test_loader_mix_sweep_runs_tiny(tmp_path):
    """`python -m benchmarks loader --mix-sweep` (the bounded mix's measured effect in docs/benchmarks.md) rots too."""
    cmd = [sys.executable, "-m", "benchmarks", "loader", "--tiny", "--mix-sweep", "--dir", str(tmp_path / "corpus")]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["size"] == "tiny" and set(last["mix_sweep"]) == {"1", "3", "8"}
    assert last["mix_sweep"]["1"]["units_per_batch"] <= last["mix_sweep"]["8"]["units_per_batch"]


def test_ingest_by_source_runs_tiny_and_carries_every_source_figure(tmp_path):
    """`python -m benchmarks ingest --source all --tiny`: the sources side by side, every figure the issue names."""
    cmd = [sys.executable, "-m", "benchmarks", "ingest", "--source", "all", "--tiny"]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["size"] == "tiny" and result["detail"]["sources"]["lerobot"]["episodes"] == 2
    for key in ("overhead_ratio_hdf5", "overhead_ratio_ros2", "overhead_ratio_lerobot"):
        assert result[key] > 1.0, key  # the pipeline does the codec's work and more
    assert result["lerobot_native_speedup_vs_hdf5_route"] > 0
    assert result["passthrough_speedup_ros2"] > 1.0  # copying H.264 costs less than encoding JPEG
    assert result["detail"]["sources"]["ros2"]["h264_copied"] == [6, 6]  # 2 bags x 3 cameras, every one copied
