"""Screenshots of the Dagster UI for README.md's "Looking at the results", taken by headless Chromium.

    make demo            # once: fills $DYNA_HOME (default ./.dyna) and its Dagster instance
    make screenshots     # installs what is missing (Debian's chromium, playwright in .venv), then runs this

It starts the Dagster webserver on the instance `make ui` uses ($DAGSTER_HOME, default
$DYNA_HOME/dagster, with the project's infra/dagster/dagster.yaml copied in, as `make ui` does), on
127.0.0.1 and a free port, waits (bounded) for it and its code location, takes the pictures and stops
it. Only the webserver runs, not the daemon that `dagster dev` adds: no sensor launches anything while
the pictures are taken. It saves, under docs/screenshots/:

  asset-graph.png       the global asset lineage, every group expanded
  batch-episodes.png    an ingest partition of mcap_episodes, its episodes_table metadata in view
  stale-partition.png   mcap_episodes' versions_current check failing for a partition (see below)
  checkpoint-curves.png a checkpoints partition's `curves` metadata open: loss and data wait by step

A demo's partitions are all current, so unless versions_current already fails in the instance, the
stale picture is taken on a throwaway copy of the instance and registry in which the check has been
recorded as a deploy of the next PIPELINE_VERSION would record it (before its drift backfill); the
instance itself is left as it was. `--no-simulate-stale` skips that shot instead.

It installs nothing: it says what is missing. Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM),
never a browser that playwright downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
INSTANCE_CONFIG = ROOT / "infra" / "dagster" / "dagster.yaml"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium waits on connections that nothing here answers.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ("graph", "batch", "stale", "curves")
MCAP = "mcap_episodes"
STALE_CHECK = "versions_current"
UI_TIMEOUT_MS = 60_000  # one page's wait for the text it shows once settled

# Set before the UI's first script: no newsletter dialog, the left navigation collapsed.
INIT_SCRIPT = "localStorage.setItem('communityNux', '\"1\"'); localStorage.setItem('dagster-nav-collapsed', 'true');"

# Run in a subprocess on the throwaway copy: records versions_current for the partitions named as the
# version check sensor would after a deploy of the next PIPELINE_VERSION (its job, one small run).
SIMULATE_DEPLOY = """
import sys
from dyna_resources import versions
major, minor = versions.PIPELINE_VERSION.rsplit(".", 1)
versions.PIPELINE_VERSION = f"{major}.{int(minor) + 1}"  # what the check compares with, read at each call
from dagster import DagsterInstance
from dyna_assets.definitions import defs
result = defs.get_job_def("report_version_checks").execute_in_process(
    instance=DagsterInstance.get(),
    run_config={"ops": {"report_versions": {"config": {"partitions": sys.argv[1:]}}}},
    tags={"dyna/trigger": "screenshots: a simulated deploy of pipeline " + versions.PIPELINE_VERSION},
)
sys.exit(0 if result.success else 1)
"""


class Missing(Exception):
    """Something the screenshots need is not there; the message says how to get it."""


@dataclass
class Homes:
    dyna: Path
    dagster: Path

    @classmethod
    def from_env(cls) -> Homes:
        """As the Makefile chooses them: $DYNA_HOME (default ./.dyna), $DAGSTER_HOME (default $DYNA_HOME/dagster)."""
        dyna = Path(os.environ.get("DYNA_HOME") or ROOT / ".dyna").resolve()
        return cls(dyna, Path(os.environ.get("DAGSTER_HOME") or dyna / "dagster").resolve())

    def env(self) -> dict[str, str]:
        return {**os.environ, "DYNA_HOME": str(self.dyna), "DAGSTER_HOME": str(self.dagster)}

    def check_filled(self) -> None:
        if not (self.dagster / "history" / "runs.db").exists() or not any(self.dyna.glob("registry.sqlite*")):
            raise Missing(
                f"no demo in DYNA_HOME={self.dyna} (DAGSTER_HOME={self.dagster}): run `make demo` first "
                "(with the same DYNA_HOME), then this again"
            )


def check_tools() -> None:
    try:
        import playwright.sync_api  # noqa: F401  # only whether it is there
    except ImportError:
        raise Missing(
            "playwright is not installed in this Python: `make screenshots` installs it into .venv "
            "(or: .venv/bin/pip install playwright; no `playwright install`, Debian's chromium is used)"
        ) from None
    if not os.access(CHROMIUM, os.X_OK):
        raise Missing(
            f"no Chromium at {CHROMIUM}: `make screenshots` installs Debian's (as root: apt-get install chromium), "
            "or set CHROMIUM to one"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Webserver:
    """`dagster-webserver` on 127.0.0.1 over the workspace `make ui` loads, in a process group of its own."""

    def __init__(self, homes: Homes, log: Path, timeout_s: float):
        self.homes, self.log_path, self.timeout_s = homes, log, timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Webserver:
        self.homes.dagster.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(INSTANCE_CONFIG, self.homes.dagster / "dagster.yaml")  # as `make ui` does
        exe = Path(sys.executable).with_name("dagster-webserver")
        cmd = [str(exe) if exe.exists() else "dagster-webserver"]
        cmd += ["-h", "127.0.0.1", "-p", str(self.port), "-w", "workspace.yaml"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.homes.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the webserver and the code server it started
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def _wait_ready(self) -> None:
        """Until the server answers and its code location has loaded, at most timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"dagster-webserver exited ({self.proc.returncode}):\n{self._log_tail()}")
            try:
                locations = self.graphql(
                    "{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus "
                    "locationOrLoadError { __typename ... on PythonError { message } } } } } }"
                )["workspaceOrError"].get("locationEntries")
            except (OSError, urllib.error.URLError, ValueError, KeyError):
                locations = None  # not answering yet
            if locations and all(e["loadStatus"] == "LOADED" for e in locations):
                errors = [e for e in locations if e["locationOrLoadError"]["__typename"] == "PythonError"]
                if errors:
                    raise RuntimeError(
                        "the code location did not load: " + errors[0]["locationOrLoadError"]["message"][-2000:]
                    )
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"dagster-webserver not ready after {self.timeout_s:.0f} s:\n{self._log_tail()}")
            time.sleep(1)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer = json.load(resp)
        if answer.get("errors"):
            raise ValueError(f"GraphQL: {answer['errors']}")
        return answer["data"]


# What the pictures show, found through the webserver's GraphQL API.


def materialized_partition(ws: Webserver, asset: str, label: str, ok: Callable[[dict], bool] = bool) -> str | None:
    """The partition of ``asset``'s latest materialization whose metadata has ``label`` (and passes ``ok``)."""
    data = ws.graphql(
        "query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { ... on AssetNode { "
        "assetMaterializations(limit: 100) { partition metadataEntries { label "
        "... on MarkdownMetadataEntry { mdStr } } } } } }",
        {"k": {"path": [asset]}},
    )
    for m in (data["assetNodeOrError"] or {}).get("assetMaterializations") or []:
        entry = next((e for e in m["metadataEntries"] if e["label"] == label), None)
        if m["partition"] and entry is not None and ok(entry):
            return m["partition"]
    return None


def check_names(ws: Webserver, asset: str) -> list[str]:
    data = ws.graphql(
        "query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { ... on AssetNode { "
        "assetChecksOrError { ... on AssetChecks { checks { name } } } } } }",
        {"k": {"path": [asset]}},
    )
    return [c["name"] for c in ((data["assetNodeOrError"] or {}).get("assetChecksOrError") or {}).get("checks", [])]


def latest_check_failed(ws: Webserver, asset: str, check: str) -> bool:
    """Whether the check's latest execution (the one its page shows first) failed."""
    data = ws.graphql(
        "query($k: AssetKeyInput!, $c: String!) { assetCheckExecutions(assetKey: $k, checkName: $c, limit: 1) "
        "{ evaluation { success } } }",
        {"k": {"path": [asset]}, "c": check},
    )
    runs = data["assetCheckExecutions"]
    return bool(runs) and runs[0]["evaluation"] is not None and not runs[0]["evaluation"]["success"]


def partition_keys(ws: Webserver, asset: str) -> list[str]:
    data = ws.graphql(
        "query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { ... on AssetNode { partitionKeys } } }",
        {"k": {"path": [asset]}},
    )
    return list((data["assetNodeOrError"] or {}).get("partitionKeys") or [])


# The pictures.


@contextmanager
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(b: Browser, url: str, width: int, height: int) -> Page:
    ctx = b.new_context(viewport={"width": width, "height": height})
    ctx.add_init_script(INIT_SCRIPT)
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    page = ctx.new_page()
    page.goto(url, wait_until="domcontentloaded")
    return page


def settle(page: Page, locator: Locator | None = None) -> None:
    """No request in flight, and (when given) ``locator`` no longer moving (an animated zoom has ended)."""
    page.wait_for_load_state("networkidle")
    if locator is None:
        return
    box, deadline = None, time.monotonic() + 10
    while time.monotonic() < deadline:
        now = locator.bounding_box()
        if now is not None and now == box:
            return
        box = now
        page.wait_for_timeout(250)


def shoot_graph(b: Browser, ws: Webserver, out: Path) -> str:
    # Wide enough that the zoom which fits the whole graph is one at which its nodes show their details.
    width, height = 2400, 1100
    page = open_page(b, f"{ws.url}/asset-groups", width, height)
    page.get_by_text("ingest", exact=True).first.wait_for()  # the graph, its groups collapsed
    node = page.get_by_text(MCAP, exact=True).first
    if not node.is_visible():
        page.keyboard.press("Alt+e")  # the graph's own shortcut: expand all groups
    node.wait_for()
    page.locator("button:has([aria-label='panel_show_right'])").first.click()  # hide the asset tree
    settle(page)
    page.mouse.dblclick(width - 150, 140)  # on the background, top right: zoom to fit
    page.get_by_text("Asset checks").first.wait_for()  # the nodes show their details at this zoom
    page.get_by_text(re.compile(r"^\d+ partitions?$")).first.wait_for()  # ... and their partitions' status
    settle(page, node)
    page.screenshot(path=str(out))
    return "the global asset lineage, groups expanded"


def shoot_batch(b: Browser, ws: Webserver, out: Path) -> str:
    partition = materialized_partition(ws, MCAP, "episodes_table")
    if partition is None:
        raise Missing(f"no materialization of {MCAP} has an episodes_table: run `make demo` (again)")
    page = open_page(b, f"{ws.url}/assets/{MCAP}?view=partitions&partition={partition}", 2000, 1150)
    label = page.get_by_text("episodes_table", exact=True).first
    label.wait_for()
    row = label.locator("xpath=ancestor::tr[1]")
    row.get_by_text("episode_id", exact=True).first.wait_for()  # the table's header
    settle(page)
    row.evaluate("e => e.scrollIntoView({block: 'start'})")
    settle(page, row)
    page.screenshot(path=str(out))
    return f"{MCAP} partition {partition}, its episodes_table"


def shoot_stale(b: Browser, ws: Webserver, out: Path) -> str:
    page = open_page(b, f"{ws.url}/assets/{MCAP}?view=checks&checkDetail={STALE_CHECK}", 1600, 1000)
    page.get_by_text("Latest execution").first.wait_for()
    page.get_by_text("Evaluation result").first.wait_for()
    page.get_by_text("older versions").first.wait_for()  # the failed evaluation's description
    settle(page)
    page.screenshot(path=str(out))
    return f"{MCAP}.{STALE_CHECK} failing"


def shoot_curves(b: Browser, ws: Webserver, out: Path) -> str:
    partition = materialized_partition(
        ws, "checkpoints", "curves", ok=lambda e: "data:image/png;base64," in (e.get("mdStr") or "")
    )
    if partition is None:
        raise Missing("no materialization of checkpoints has a `curves` picture: run `make demo` (again)")
    page = open_page(b, f"{ws.url}/assets/checkpoints?view=partitions&partition={partition}", 1600, 1000)
    label = page.get_by_text("curves", exact=True).first
    label.wait_for()
    label.locator("xpath=ancestor::tr[1]").get_by_text("[Show Markdown]").click()
    img = page.get_by_role("dialog").locator("img").first
    img.wait_for()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=img.element_handle())
    settle(page, img)
    page.screenshot(path=str(out))
    return f"checkpoints partition {partition}, its curves"


@contextmanager
def simulated_deploy(homes: Homes, partitions: list[str], workdir: Path) -> Iterator[Homes]:
    """A copy of the Dagster instance and the registry in which versions_current has been recorded as a
    deploy of the next PIPELINE_VERSION records it; removed afterwards."""
    if os.environ.get("DYNA_REGISTRY_URL") or os.environ.get("DYNA_ENV", "embedded") != "embedded":
        raise Missing("the stale picture's simulation needs the embedded registry (no DYNA_REGISTRY_URL, DYNA_ENV)")
    copy = Homes(workdir / "dyna", workdir / "dyna" / "dagster")
    copy.dyna.mkdir(parents=True)
    shutil.copytree(homes.dagster, copy.dagster, ignore=shutil.ignore_patterns("*.lock", "logs"))
    src, dst = sqlite3.connect(homes.dyna / "registry.sqlite"), sqlite3.connect(copy.dyna / "registry.sqlite")
    try:
        src.backup(dst)  # consistent even while a writer holds the original
    finally:
        src.close()
        dst.close()
    proc = subprocess.run(
        [sys.executable, "-c", SIMULATE_DEPLOY, *partitions],
        cwd=ROOT,
        env=copy.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"recording versions_current in the copy failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    yield copy


def stale_plan(ws: Webserver, simulate: bool) -> tuple[str, list[str]]:
    """Where the stale picture comes from: ("here", []) when versions_current fails in this instance now,
    ("copy", partitions) for a simulated deploy over those partitions, or ("skip", [why])."""
    if STALE_CHECK not in check_names(ws, MCAP):
        return "skip", [f"{MCAP} has no check {STALE_CHECK} in this code"]
    if latest_check_failed(ws, MCAP, STALE_CHECK):
        return "here", []
    if not simulate:
        return "skip", [f"{STALE_CHECK} does not fail for any partition now (--no-simulate-stale)"]
    partitions = partition_keys(ws, MCAP)
    return ("copy", partitions) if partitions else ("skip", [f"{MCAP} has no partition"])


FILES = {
    "graph": "asset-graph.png",
    "batch": "batch-episodes.png",
    "stale": "stale-partition.png",
    "curves": "checkpoint-curves.png",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder for the PNGs (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--only", default=",".join(SHOTS), help=f"comma-separated subset of {','.join(SHOTS)}")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for the webserver (default 180)")
    ap.add_argument("--no-simulate-stale", action="store_true", help="skip the stale shot unless one is stale")
    args = ap.parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := sorted(set(wanted) - set(SHOTS)):
        ap.error(f"unknown shot(s) {unknown}; choose from {','.join(SHOTS)}")

    homes = Homes.from_env()
    try:
        check_tools()
        homes.check_filled()
    except Missing as e:
        print(f"screenshots: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"screenshots of DYNA_HOME={homes.dyna} (DAGSTER_HOME={homes.dagster}) into {args.out}", flush=True)
    shooters = {"graph": shoot_graph, "batch": shoot_batch, "stale": shoot_stale, "curves": shoot_curves}
    failed: list[str] = []

    def take(name: str, b: Browser, ws: Webserver) -> None:
        out = args.out / FILES[name]
        try:
            what = shooters[name](b, ws, out)
        except Missing as e:
            print(f"  {name}: skipped: {e}", flush=True)
        except Exception as e:  # one picture's failure does not stop the others; the exit status says so
            failed.append(name)
            print(f"  {name}: FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        else:
            print(f"  {name}: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} ({what})", flush=True)

    with tempfile.TemporaryDirectory(prefix="dyna-screenshots-") as tmp:
        try:
            with Webserver(homes, Path(tmp) / "webserver.log", args.timeout) as ws, browser() as b:
                print(f"dagster-webserver at {ws.url}", flush=True)
                for name in (n for n in wanted if n != "stale"):
                    take(name, b, ws)
                stale, detail = stale_plan(ws, not args.no_simulate_stale) if "stale" in wanted else ("", [])
                if stale == "here":
                    take("stale", b, ws)
                elif stale == "skip":
                    print(f"  stale: skipped: {detail[0]}", flush=True)
            if stale == "copy":
                print(
                    "  stale: no partition is stale now; a deploy of the next PIPELINE_VERSION simulated "
                    "in a throwaway copy of the instance",
                    flush=True,
                )
                with simulated_deploy(homes, detail, Path(tmp)) as copy:
                    with Webserver(copy, Path(tmp) / "webserver-copy.log", args.timeout) as ws, browser() as b:
                        take("stale", b, ws)
        except Missing as e:
            print(f"screenshots: {e}", file=sys.stderr)
            return 2
        except RuntimeError as e:
            print(f"screenshots: {e}", file=sys.stderr)
            return 1
    if failed:
        print(f"screenshots: {len(failed)} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
