"""The docs hold together: README.md is a newcomer's page whose layout map names every package, every
relative link between README.md and docs/*.md lands on a file and heading that exist, every
benchmark has its row of latest figures in docs/benchmarks.md, and nothing refers to files that
live outside the repository."""

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

from benchmarks.__main__ import benchmark_names

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_BYTES = 15_000

# Built from parts so that this file does not match what it looks for.
OUTSIDE_REFERENCES = ("DESIGN" + ".md", "../" + "shared/")

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The text with fenced code blocks and code spans blanked: links inside code are not links."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercased, punctuation other than - and _
    removed, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page's headings give, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text())):
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [
        t for t in LINK.findall(_prose(path.read_text())) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)
    ]  # http:, https:, mailto: are not checked


def test_slug_follows_github():
    assert slug("Training (`trainer/`, no Dagster import)") == "training-trainer-no-dagster-import"
    assert slug("The warehouse `episodes` table") == "the-warehouse-episodes-table"
    assert slug("`ladders`, `quality`, `lerobot` (the data flywheel)") == "ladders-quality-lerobot-the-data-flywheel"
    assert slug("A file lands once it stands still") == "a-file-lands-once-it-stands-still"
    assert slug("mcap_episodes & co.") == "mcap_episodes--co"


def test_link_extraction_skips_code_and_external_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](x.md#y) `[b](no.md)` [c](https://e.org) ![img](pic.png)\n```\n[d](no2.md)\n```\n")
    assert relative_links(page) == ["x.md#y"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_and_headings(page):
    links = relative_links(page)
    broken = []
    for target in links:
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    missing = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not missing, f"README.md links no page for {missing}"


def _latest_figures_rows() -> dict[str, str]:
    text = (DOCS / "benchmarks.md").read_text()
    assert "\n## Latest figures\n" in text, "docs/benchmarks.md has no '## Latest figures' table"
    section = text.split("\n## Latest figures\n", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[:4] == ["benchmark", "date", "command", "machine"], header
    out = {}
    for r in rows[2:]:
        cells = [c.strip() for c in r.strip().strip("|").split("|")]
        m = re.fullmatch(r"`(\w+)`", cells[0])
        if m:
            assert all(cells[1 : len(header)]), f"row of {m.group(1)} has an empty cell: {r}"
            out[m.group(1)] = r
    return out


def test_every_benchmark_has_a_row_of_latest_figures():
    names = benchmark_names()  # what `python -m benchmarks NAME` accepts
    assert {"ingest", "catalog", "storage"} <= set(names)
    rows = _latest_figures_rows()
    assert not set(names) - set(rows), f"no row in docs/benchmarks.md for {sorted(set(names) - set(rows))}"
    assert not set(rows) - set(names), f"rows for benchmarks that do not exist: {sorted(set(rows) - set(names))}"
    for name, row in rows.items():
        assert f"benchmarks {name}" in row, f"the row of {name} does not give its command"


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # no git: the tree, less what git would ignore
        skip = {".git", ".venv", ".dyna", "build", "__pycache__", "node_modules"}
        paths = [p for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in paths if p.is_file()]


def test_nothing_refers_to_files_outside_the_repository():
    found = []
    for path in _tracked_files():
        try:
            text = path.read_text(errors="strict")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {ref}" for ref in OUTSIDE_REFERENCES if ref in line]
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


def test_readme_is_a_newcomers_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (limit {README_MAX_BYTES})"
    text = README.read_text()
    for must in ("make demo", "make test", "make ui", "## Layout map", "## Further reading"):
        assert must in text, f"README.md lost {must!r}"


def _python_folders() -> set[str]:
    """Top-level folders holding Python, and the packages directly inside them (not tests')."""
    folders = set()
    for p in _tracked_files():
        rel = p.relative_to(ROOT)
        if p.suffix != ".py" or len(rel.parts) < 2 or rel.parts[0].startswith("."):
            continue
        folders.add(rel.parts[0] + "/")
        if (
            len(rel.parts) >= 3
            and rel.parts[0] != "tests"
            and (ROOT / rel.parts[0] / rel.parts[1] / "__init__.py").exists()
        ):
            folders.add(f"{rel.parts[0]}/{rel.parts[1]}/")
    return folders


def test_readme_layout_map_names_every_python_folder():
    text = README.read_text()
    section = text.split("\n## Layout map\n", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| `([^`]+/)` \|", section, flags=re.M))
    folders = _python_folders()
    assert {"dyna_resources/", "dyna_assets/", "trainer/", "benchmarks/", "dyna_resources/ingest/"} <= folders
    assert not folders - mapped, f"README.md's layout map lacks {sorted(folders - mapped)}"
    for row in re.findall(r"^\| `[^`]+/` \|.*$", section, flags=re.M):
        folder = row.split("`")[1]
        assert (ROOT / folder).is_dir(), f"the layout map names {folder}, which does not exist"
