"""Lint, import order, format and types, as tests: ``make test`` fails on what ruff or mypy finds.

Their configuration is in pyproject.toml ([tool.ruff], [tool.mypy]).
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["dyna_assets", "dyna_resources", "trainer", "infra", "benchmarks", "tests"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    proc = run("ruff", "check", "--no-cache", *CODE)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_the_code_is_formatted():
    proc = run("ruff", "format", "--check", "--no-cache", *CODE)
    assert proc.returncode == 0, "run `.venv/bin/ruff format .`:\n" + proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing():
    proc = run("mypy", "--no-incremental", "dyna_assets", "dyna_resources", "trainer", "infra", "benchmarks")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_every_noqa_says_why():
    """A noqa comment names its rule and a reason after it (ruff's RUF100 removes one that silences nothing)."""
    noqa = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
    bare = []
    for path in sorted(p for d in CODE for p in (ROOT / d).rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = noqa.search(line)
            if m and not re.match(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+\S", m["rest"]):
                bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bare == []


def test_the_checks_catch_what_they_should(tmp_path):
    """The configuration really checks: an unused import, unsorted imports and a type error are reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\n\ndef f(x: int) -> str:\n    return x\n")
    ruff = run("ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert ruff.returncode == 1 and "F401" in ruff.stdout and "I001" in ruff.stdout
    mypy = run("mypy", "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert mypy.returncode == 1 and "Incompatible return value type" in mypy.stdout
