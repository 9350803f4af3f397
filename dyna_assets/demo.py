"""`make demo`: generate a small sample fleet, materialize the graph through Dagster, show what came out.

Runs on the embedded defaults: everything lives under $DYNA_HOME (default ./.dyna) and
the Dagster instance under $DAGSTER_HOME (default $DYNA_HOME/dagster), so `make ui`
afterwards shows the same runs and materializations.
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from dagster import DagsterInstance, materialize

from dyna_resources.episodes.sim import generate_fleet
from dyna_resources.home import DynaHome

from .definitions import defs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)

    home = DynaHome.from_env().ensure()
    os.environ.setdefault("DAGSTER_HOME", str(home.dagster))
    ensure_instance_config(Path(os.environ["DAGSTER_HOME"]))

    if not any(home.landing.glob("*.h5")):
        print(f"generating {args.episodes} sample episodes into {home.landing} ...", flush=True)
        generate_fleet(home.landing, args.episodes, seed=args.seed, width=args.width, height=args.height,
                       duration_s=(8.0, 14.0), faults={"corrupt_jpeg": 1, "truncated": 1},
                       workers=os.cpu_count() or 1)

    instance = DagsterInstance.get()
    assets = [defs.get_assets_def(k) for k in ("raw_episodes", "mcap_episodes")]
    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
    result = materialize(assets, instance=instance, resources=defs.resources, run_config=quiet)
    if not result.success:
        print("materialization failed", file=sys.stderr)
        return 1
    print_summary(home, result)
    return 0


def ensure_instance_config(dagster_home: Path) -> None:
    """Give a fresh DAGSTER_HOME the project's instance config (infra/dagster/dagster.yaml)."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    target = dagster_home / "dagster.yaml"
    template = Path(__file__).resolve().parent.parent / "infra" / "dagster" / "dagster.yaml"
    if not target.exists() and template.exists():
        shutil.copyfile(template, target)


def print_summary(home: DynaHome, result) -> None:
    from dyna_resources.episodes.mcap_reader import EpisodeReader

    raw_md = result.asset_materializations_for_node("raw_episodes")[0].metadata
    md = result.asset_materializations_for_node("mcap_episodes")[0].metadata
    value = lambda k: getattr(md[k], "value", md[k])  # noqa: E731
    print()
    print("=" * 78)
    print(f"Dagster run {result.run_id}  (DAGSTER_HOME={os.environ['DAGSTER_HOME']})")
    print(f"raw episodes landed: {getattr(raw_md['episodes'], 'value', '')} good, "
          f"{getattr(raw_md['rejected'], 'value', '')} rejected at the pre-transform gate")
    print(f"MCAP: {value('episodes_transcoded')} transcoded, {value('episodes_up_to_date')} already up to date, "
          f"{value('episodes_quarantined')} quarantined")
    if value("bytes_in"):
        print(f"bytes: {value('bytes_in') / 1e6:.1f} MB as HDF5/JPEG -> {value('bytes_out') / 1e6:.1f} MB as MCAP "
              f"(ratio {value('compression_ratio'):.3f}), {value('hours') * 60:.1f} min of robot time")
    print()
    print(f"{'episode':<28}{'task':<14}{'robot':<10}{'seconds':>8}{'MB':>8}  chunks (cameras/proprio)")
    files = sorted(home.mcap.glob("*.mcap"))
    for f in files:
        with EpisodeReader(f) as r:
            m = r.metadata()
            groups = {}
            for ci in r.summary.chunk_indexes:
                groups[ci.compression or "none"] = groups.get(ci.compression or "none", 0) + 1
            secs = (r.end_ns - r.start_ns) / 1e9
        print(f"{m['episode_id']:<28}{m['task']:<14}{m['robot_id']:<10}{secs:>8.1f}{f.stat().st_size / 1e6:>8.2f}  "
              f"{groups.get('none', 0)}/{groups.get('zstd', 0)}")
    for q in sorted(home.quarantine.glob("*.json")):
        rec = json.loads(q.read_text())
        where = f" [{rec['stream']}]" if rec.get("stream") else ""
        print(f"quarantined: {q.name[:-5]}{where}: {rec['reason'][:90]}")
    print()
    print("Where things are:")
    print(f"  landing zone (HDF5):  {home.landing}")
    print(f"  MCAP episodes:        {home.mcap}")
    print(f"  quarantine records:   {home.quarantine}  (one JSON per rejected file)")
    print("How to look at them:")
    print("  Dagster UI:   make ui    then open http://127.0.0.1:3000 (assets raw_episodes, mcap_episodes)")
    if files:
        print(f"  Rerun:        .venv/bin/rerun {files[0]}")
        print(f"  Foxglove:     open {files[0]} in Foxglove (desktop app or app.foxglove.dev: Open local file)")
    print("=" * 78)


if __name__ == "__main__":
    raise SystemExit(main())
