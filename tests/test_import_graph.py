"""The layering of the packages, checked by reading the code's imports and by importing it.

- No import cycle between the project's modules, counting imports inside functions (a function-level
  import hides a cycle from Python, not from a reader).
- The engines (``dyna_resources``, but for its Dagster resources in ``dyna_resources/resources.py``),
  the trainer and ``infra`` import with Dagster hidden: they run and test without it.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dyna_assets", "dyna_resources", "trainer", "infra", "benchmarks")
DAGSTER_FREE = ("dyna_resources", "trainer", "infra")
DAGSTER_LAYER = {"dyna_resources.resources"}  # the Dagster resources: the one module of the engines' package that may


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if ".venv" not in p.parts and "__pycache__" not in p.parts
    }


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its body (type-checking-only imports aside)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `from pkg import name`: the module pkg.name or pkg
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    import a\n")
    mods = {"a": a, "b": b}
    graph = {n: imports_of(n, p, mods) for n, p in mods.items()}
    assert cycles(graph) == [["a", "b"]]
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    assert cycles({n: imports_of(n, p, mods) for n, p in mods.items()}) == []


def test_no_import_cycles_between_project_modules():
    modules = project_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 100 and "dyna_resources.ingest.quality" in graph["dyna_resources.ingest.gates"]
    assert cycles(graph) == []


HIDE_DAGSTER = """
import importlib, importlib.abc, pkgutil, sys
class NoDagster(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dagster" or name.startswith(("dagster.", "dagster_")):
            raise ImportError(f"{name} is hidden by the test")
sys.meta_path.insert(0, NoDagster())
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
assert not any(m == "dagster" or m.startswith("dagster.") for m in sys.modules), "dagster was imported"
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def dagster_free_modules() -> list[str]:
    return sorted(
        n
        for n in project_modules()
        if n.split(".")[0] in DAGSTER_FREE and n not in DAGSTER_LAYER and not n.startswith("infra.dagster")
    )  # infra/dagster: the deployment's Dagster config


def test_engines_trainer_and_infra_import_without_dagster():
    names = dagster_free_modules()
    assert "trainer.launch" in names and "dyna_resources.ingest.batches" in names and len(names) > 50
    proc = subprocess.run([sys.executable, "-c", HIDE_DAGSTER, *names], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("name", ["dyna_resources.resources", "dyna_assets.definitions"])
def test_the_hiding_works_on_the_dagster_layer(name):
    proc = subprocess.run([sys.executable, "-c", HIDE_DAGSTER, name], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and "hidden by the test" in proc.stdout


def private_imports(path: Path) -> list[str]:
    """Imports of another package's private names (``pkg._mod``, ``from pkg import _name``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if (
                top not in PACKAGES
                and top != "tests"
                and any(p.startswith("_") and not p.startswith("__") for p in name.split(".")[1:])
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_private_apis_of_libraries_are_used_only_where_isolated():
    allowed = {ROOT / "dyna_assets" / "dagster_private.py"}
    files = [p for p in project_modules().values() if p not in allowed] + sorted((ROOT / "tests").rglob("*.py"))
    assert private_imports(allowed.pop()), "the isolating module should hold the private imports"
    assert [hit for p in files for hit in private_imports(p)] == []
