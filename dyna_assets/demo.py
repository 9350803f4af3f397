"""`make demo`: land a sample fleet, ingest it through Dagster partition by partition, show what came out.

Runs on the embedded defaults: everything lives under $DYNA_HOME (default ./.dyna), the
registry is SQLite there, and the Dagster instance is under $DAGSTER_HOME (default
$DYNA_HOME/dagster), so `make ui` afterwards shows the same partitions, runs and checks.
The landing sensor's tick and the runs it requests are executed in-process here; under
`make ui` the daemon does the same on its own.
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, materialize

from dyna_resources import versions
from dyna_resources.catalog.datasets import DatasetRef, DatasetRegistry, UnknownDatasetError
from dyna_resources.catalog.manifest import ManifestFiles
from dyna_resources.episodes.raw_format import RawEpisode
from dyna_resources.episodes.read_profile import TOPIC_GROUPS
from dyna_resources.episodes.sim import generate_fleet
from dyna_resources.episodes.sim.fleet import arrival_folder
from dyna_resources.home import DynaHome
from dyna_resources.ingest.batch_summary import batch_summary
from dyna_resources.ingest.ray_units import ray_cluster
from dyna_resources.resources import IngestResource, TranscodeResource
from trainer.evaluate import EvaluationResult, latest_recorded
from trainer.summary import RESULT_FILE, TrainSummary
from trainer.train import TrainConfig

from .definitions import defs
from .ingest.local import check_mcaps_present, check_versions_current, ingest_landed, reprocess_stale

SAMPLE_SPEC = """\
# A curation spec: which episodes and segments a training run reads. Edit it, or add files
# next to it: each file is one partition of the `manifests` asset.
name: demo-clean
where:
  camera_dead: {"!=": true}      # NULL-safe: unknown counts as not dead
  quality_verdict: {"!=": fail}  # the quality scores' verdict (frozen or dark cameras, spikes, ...)
  duration_s: {">=": 4}
  # the sample model reads joint velocity and the gripper, which a LeRobot dataset's rows do not hold
  # (observation.state, action): demo-sources holds those episodes
  source_format: {"!=": lerobot}
segments: {length_s: 2.0, stride_s: 1.0}
weights: {by: task, values: {pick_place: 2.0}, default: 1.0}
"""

SOURCES_SPEC = """\
# Every clean episode, whatever it was recorded as (legacy HDF5, a ROS 2 bag, a LeRobot dataset): one manifest.
name: demo-sources
where:
  camera_dead: {"!=": true}
  quality_verdict: {"!=": fail}
segments: {length_s: 2.0, stride_s: 1.0}
"""

STEPS_SPEC = """\
# Curation by step ladder: only the successful grasps, cut into short windows (each row names its step).
name: demo-grasps
where:
  camera_dead: {"!=": true}
steps:
  where: {step: grasp, outcome: success}
  scope: step
segments: {length_s: 0.5, stride_s: 0.25}
"""

# What one curation spec's run materializes, in any order: Dagster runs them as the graph orders them.
SPEC_CHAIN = ["manifests", "cache_sets", "mcap_replica", "checkpoints", "datasets", "evaluations", "released_models"]

FAULTS = {"corrupt_jpeg": 1, "truncated": 1, "dead_camera": 1, "non_monotonic": 1, "frozen_camera": 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--batches", type=int, default=3, help="aim for this many work units (in one ingest partition)")
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)

    home = DynaHome.from_env().ensure()
    os.environ.setdefault("DAGSTER_HOME", str(home.dagster))
    ensure_instance_config(Path(os.environ["DAGSTER_HOME"]))

    if not any(home.landing.rglob("*.h5")):
        print(
            f"landing {args.episodes} sample episodes in {home.landing} (faults: {', '.join(FAULTS)}) ...", flush=True
        )
        # in a time-named folder, as uploaders do: later drops (`dyna generate`) sort after it, past the cursor
        generate_fleet(
            home.landing / arrival_folder(),
            args.episodes,
            seed=args.seed,
            width=args.width,
            height=args.height,
            duration_s=(6.0, 12.0),
            faults=FAULTS,
            workers=os.cpu_count() or 1,
            mark_complete=True,
        )
        land_other_sources(home, width=args.width, height=args.height, seed=args.seed)
    landed = sum(p.stat().st_size for p in home.landing.rglob("*") if p.is_file())
    assert defs.resources is not None  # build_definitions always binds the deployment's resources
    ingest = IngestResource(
        home=defs.resources["home"], target_batch_bytes=max(1, landed // args.batches), max_wait_s=0
    )
    resources: dict[str, Any] = {**defs.resources, "ingest": ingest}

    instance = DagsterInstance.get()
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    # One local Ray cluster for every ingest run (each run would otherwise start its own): the runs'
    # work units are its tasks. $RAY_ADDRESS points the demo at a running cluster instead.
    with ray_cluster(num_cpus=os.cpu_count() or 1) as cluster:
        print(
            f"work units run on Ray: {'a local cluster' if cluster.started_here else cluster.address}, "
            f"{cluster.resources.get('CPU', 0):g} CPUs",
            flush=True,
        )
        results = ingest_landed(
            instance, defs, cursor_file=home.root / "landing_sensor.cursor", resources=resources, run_config=quiet
        )
        redone = reprocess_stale(instance, defs, resources=resources, run_config=quiet)  # after a version bump
    if redone:
        print(f"re-transcoded {len(redone)} batch(es) written by an older pipeline version", flush=True)
    results += redone
    partitions = [p.key for p in ingest.stores().registry.sealed_partitions_after(0)]
    present = check_mcaps_present(instance, defs, partitions, resources=resources, run_config=quiet)
    checked = [ev for r in present for ev in r.get_asset_check_evaluations()]
    print(
        f"mcaps_present: {sum(ev.passed for ev in checked)} of {len(partitions)} ingest partitions have every "
        f"MCAP in its store as recorded",
        flush=True,
    )
    results += present
    versions_run = check_versions_current(instance, defs, resources=resources, run_config=quiet)
    if versions_run is not None:
        reported = [
            e.event_specific_data
            for e in versions_run.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION" and e.event_specific_data is not None
        ]
        print(
            f"versions_current: {sum(r.passed for r in reported)} of {len(reported)} ingest partitions hold only "
            f"episodes at pipeline {versions.PIPELINE_VERSION}, schema {versions.SCHEMA_VERSION}",
            flush=True,
        )

    def run(selection: list[str], partition: str | None = None):
        """One run of ``selection`` (Dagster orders its steps by the graph; a failed step skips what is downstream)."""
        return materialize(
            [defs.get_assets_def(name) for name in selection],
            instance=instance,
            resources=resources,
            partition_key=partition,
            run_config=quiet,
            raise_on_error=False,
        )

    results.append(run(["warehouse_episodes"]))
    spec = home.curation / "demo-clean.yaml"
    if not spec.exists():
        spec.write_text(SAMPLE_SPEC)
    declared = home.dataset_declaration("demo-clean")  # publish the manifest as a dataset version
    if not declared.exists():
        declared.parent.mkdir(parents=True, exist_ok=True)
        declared.write_text("name: demo-clean\nversion: 1.0.0\nnotes: the make demo sample fleet\n")
    steps_spec = home.curation / "demo-grasps.yaml"
    if not steps_spec.exists():
        steps_spec.write_text(STEPS_SPEC)
    sources_spec = home.curation / "demo-sources.yaml"
    if not sources_spec.exists():
        sources_spec.write_text(SOURCES_SPEC)
    instance.add_dynamic_partitions("curation_specs", [spec.stem, steps_spec.stem, sources_spec.stem])
    # The spec's whole chain in one run: manifest -> cache set and replica -> checkpoints -> evaluation ->
    # release, and the dataset version beside them; what the curation and prewarm sensors and a user's
    # "Materialize all" do in the UI.
    chain = run(SPEC_CHAIN, spec.stem)
    grasps = run(["manifests"], steps_spec.stem)
    sources = run(["manifests"], sources_spec.stem)
    pool = run(["review_pool"])
    results += [chain, grasps, sources, pool]
    done = Outputs([chain, grasps, sources, pool])
    failed = [r for r in results if not r.success]
    files = print_summary(home, ingest, results)
    print_warehouse(resources["warehouse"])
    print_ladders(home, ingest, resources["ladders"])
    for s_path, result in ((spec, chain), (steps_spec, grasps), (sources_spec, sources)):
        if result.asset_materializations_for_node("manifests"):
            print_manifest(home, s_path, ManifestFiles.read(resources["home"].manifest_url(s_path.stem, ".json")))
    warmed, replica = done.metadata("cache_sets", spec.stem), done.metadata("mcap_replica", spec.stem)
    if warmed is not None and replica is not None:
        print_cache(spec.stem, warmed, replica)
    # What the engines recorded (typed), read where they keep it: the run folder is computed, not looked up.
    run_dir = resources["trainer"].run_dir(resources["home"], resources["cache"], spec.stem)
    if (run_dir / RESULT_FILE).exists():
        print_training(spec.stem, run_dir)
    print_flywheel(
        published_dataset(resources["home"].resolved_registry_url(), "demo-clean"),
        latest_recorded(run_dir),
        done.metadata("released_models"),
        len(ingest.stores().registry.review_pool()) if pool.success else None,
    )
    print_howto(home, files)
    if failed:
        print(f"{len(failed)} run(s) failed: {[r.run_id for r in failed]}", file=sys.stderr)
        return 1
    return 0


class Outputs:
    """The materializations of some runs, by asset (and partition): their metadata as plain values."""

    def __init__(self, results):
        self._results = results

    def metadata(self, node: str, partition: str | None = None) -> dict | None:
        """The latest materialization's metadata of ``node`` (in ``partition``), or None when none happened."""
        for result in reversed(self._results):
            for m in reversed(result.asset_materializations_for_node(node)):
                if partition is None or m.partition == partition:
                    return {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        return None


def ensure_instance_config(dagster_home: Path) -> None:
    """The embedded instance always runs the project's config (infra/dagster/dagster.yaml):
    run queue limits and pools change with the code, so an older copy is replaced."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    template = Path(__file__).resolve().parent.parent / "infra" / "dagster" / "dagster.yaml"
    if template.exists():
        shutil.copyfile(template, dagster_home / "dagster.yaml")


def land_other_sources(home: DynaHome, *, width: int, height: int, seed: int) -> None:
    """Beside the HDF5 drops: two ROS 2 bags (MCAP storage; one with JPEG cameras and a 16-bit depth
    topic, one whose cameras are already H.264 in the read profile's layout, which is copied, not
    re-encoded) and one LeRobot v3.0 dataset of two episodes, made from sample episodes of their own, and
    the topic map that reads the bags."""
    from dyna_resources.sources import samples

    scratch = home.root / "scratch" / "sample-sources"
    shutil.rmtree(scratch, ignore_errors=True)
    made = generate_fleet(scratch, 4, seed=seed + 1000, width=width, height=height, duration_s=(6.0, 8.0))
    drop = home.landing / arrival_folder()
    drop.mkdir(parents=True, exist_ok=True)
    bag = samples.write_bag(made[0].path, drop / f"bag-{made[0].path.stem}", depth=True)
    video = TranscodeResource().settings(TOPIC_GROUPS).video  # the GOP the transcoder writes: copied as it is
    h264 = samples.write_bag(made[3].path, drop / f"bag-h264-{made[3].path.stem}", video=video)
    if not (home.root / "ros2_topics.yaml").exists():
        with RawEpisode(made[0].path) as raw:
            samples.write_topic_map(home.root, sorted(raw.cameras), depth=True)
    dataset = samples.write_dataset([g.path for g in made[1:3]], drop / "lerobot-demo")
    (dataset / "meta" / "info.json.complete").touch()  # as an uploader: the dataset is whole, land it at once
    shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"landing two ROS 2 bags ({bag.name}: JPEG cameras and a depth topic; {h264.name}: H.264 cameras) "
        f"and a LeRobot v3.0 dataset ({dataset.name}, 2 episodes) beside them"
    )


def print_manifest(home: DynaHome, spec: Path, m: ManifestFiles) -> None:
    from trainer.manifest_loader import local_copy, open_manifest, rank_slice

    node_copy = local_copy(m.arrow, home.node_cache)  # what local rank 0 of each node does
    table = open_manifest(node_copy)
    slices = [rank_slice(table, r, 4).num_rows for r in range(4)]
    print(
        f"manifest from {spec.name}: {m.rows} segments of {m.stats.get('episodes', 0)} episodes "
        f"({m.stats.get('segment_hours', 0.0) * 60:.1f} segment-minutes), sha256 {m.sha256[:12]}…"
    )
    print(f"  Parquet {m.parquet}\n  Arrow IPC {m.arrow}")
    print(f"  node copy {node_copy} (checksum verified); 4 ranks mmap it and take {slices} rows, zero-copy")
    by_task = sorted(m.stats.get("by_task", {}).items(), key=lambda kv: -kv[1])  # the sidecar sorts by name
    print(f"  by task: {dict(by_task[:20])}")
    if "source_format" in table.column_names:  # one manifest, whatever each episode was recorded as
        formats = table.select(["episode_id", "source_format"]).to_pylist()
        by_format: dict[str, set] = {}
        for row in formats:
            by_format.setdefault(row["source_format"] or "hdf5", set()).add(row["episode_id"])
        print(f"  episodes by source format: { ({k: len(v) for k, v in sorted(by_format.items())}) }")
    _print_layout_check(node_copy, m.arrow)
    print("=" * 86)


def _print_layout_check(arrow: Path, url: str) -> None:
    """What a training run would say of this manifest before any rank starts (trainer/launch.py)."""
    from trainer.dataset import SampleSpec
    from trainer.launch import LayoutMismatchError, check_manifest_layout
    from trainer.model import ModelConfig

    try:
        check_manifest_layout(arrow, SampleSpec(), ModelConfig(), url)
    except LayoutMismatchError as e:
        print("  the sample model cannot train on all of it, so a run would be refused before it starts:")
        for reason, episodes in sorted(e.problems.items()):
            print(f"    {len(episodes)} episode(s): {reason}")
        return
    print("  every episode's cameras and streams fit the sample model (checked before a run starts)")


def print_ladders(home: DynaHome, ingest: IngestResource, ladders) -> None:
    """Each episode's step ladder in one line, and two of them drawn as the UI shows them."""
    import json

    from dyna_resources.ladders.picture import ladder_png
    from dyna_resources.ladders.run import ladder_episode
    from dyna_resources.ladders.segment import signals_of

    config = ladders.config()
    rows = [e for e in ingest.stores().registry.episodes() if e["step_ladder"]]
    print(f"step ladders ({config.version}; $DYNA_HOME/step_ladders.yaml overrides the procedures):")
    mark = {"success": "ok", "failure": "FAILED", "done": "", "incomplete": "incomplete", "after_failure": "-"}
    for e in rows:
        steps = json.loads(e["step_ladder"])
        line = " > ".join(
            f"{s['name']} {s['duration_s']:.1f}s{(' ' + mark[s['outcome']]) if mark[s['outcome']] else ''}"
            f"{(' (' + s['failure_mode'] + ')') if s['failure_mode'] else ''}"
            for s in steps
        )
        print(f"  {e['episode_id']:<20}{e['task']:<12} {line}")
    drawn = [e for e in rows if e["failed_step"]][:1] + [e for e in rows if not e["failed_step"]][:1]
    out = home.root / "ladders"
    out.mkdir(exist_ok=True)
    for e in drawn:
        steps, streams = ladder_episode(e["mcap_uri"], e["task"], config)
        (out / f"{e['episode_id']}.png").write_bytes(
            ladder_png(steps, signals_of(streams, config), config, title=f"{e['episode_id']}  ({e['task']})")
        )
    if drawn:
        print(
            f"  pictures: {out}/*.png (and per partition in the UI: step_ladders -> a partition -> metadata 'ladders')"
        )
    print("=" * 86)


def print_cache(partition: str, c: dict, r: dict) -> None:
    mb = 1000  # the metadata's sizes are in GB
    print(
        f"cache set {partition}: working set {c['working_set_GB'] * mb:.1f} MB of {c['files']} MCAP files in "
        f"{c['pages']} pages; fetched {c['fetched_pages']} ({c['fetched_GB'] * mb:.1f} MB), "
        f"{c['already_warm_pages']} already warm, {c['seconds']:.2f} s"
    )
    print(
        f"  node page cache {c['cache_dir']}  (training reads dynacache:: URLs; misses and a broken cache go to "
        f"the origin)"
    )
    print(
        f"  second origin {r['replica']}: {r['copied']} copied, {r['skipped_current']} already current, "
        f"{r['copied_GB'] * mb:.1f} MB, each verified by sha256"
    )
    print("=" * 86)


def print_training(partition: str, run_dir: Path) -> None:
    s = TrainSummary.read(run_dir)
    cfg = TrainConfig.from_json((run_dir / "config.json").read_text())
    lineage = cfg.lineage
    loss = f"{s.loss_first:.3f} -> {s.loss_last:.3f}" if s.loss_first is not None and s.loss_last is not None else "-"
    print(
        f"checkpoints {partition}: {s.steps} steps, loss {loss}, {s.samples_per_s:.1f} samples/s, "
        f"data wait {s.data_wait_fraction:.1%}, optimizer {s.optimizer_mode}"
    )
    print(
        f"  loader {s.loader}: {s.samples_per_epoch} samples per epoch, "
        f"{s.decodes_per_frame or 0.0:.2f} frames decoded per frame delivered, first-epoch data wait "
        f"{s.data_wait_first_epoch or 0.0:.1%}, {s.skipped} samples skipped"
    )
    profile = lineage.get("read_profile", {})
    h, w = cfg.sample.image_size
    print(
        f"  read profile {profile.get('name', '?')} (digest {profile.get('digest', '?')}; DYNA_READ_PROFILE): "
        f"{'training stream ' + cfg.sample.stream if cfg.sample.stream else 'the archive cameras'} at {h}x{w}"
    )
    print(
        f"  {run_dir / 'checkpoints'}  (async, sharded; each COMPLETE.json records the manifest, versions and commit "
        f"{lineage.get('code_commit', '?')[:12]})"
    )
    print("=" * 86)


def published_dataset(registry_url: str, name: str) -> DatasetRef | None:
    """The highest published version of dataset ``name``, or None when none is."""
    registry = DatasetRegistry(registry_url)
    try:
        return registry.resolve(name, verify=False)
    except UnknownDatasetError:
        return None
    finally:
        registry.close()


def print_flywheel(d: DatasetRef | None, e: EvaluationResult | None, rel: dict | None, waiting: int | None) -> None:
    if d is not None:
        print(
            f"dataset {d.ref}: {d.rows} segments, {d.episodes} episodes, manifest {d.sha256[:12]}… "
            f"(immutable; training can name it instead of a path)"
        )
    if e is not None:
        mse = {
            k: f"{e.metrics[k]:.4f}" if isinstance(e.metrics.get(k), (int, float)) else "-"
            for k in ("action_mse", "latent_mse")
        }
        held_out = "not held out: the training manifest" if e.heldout_is_training_data else "held-out manifest"
        print(
            f"evaluation of step {e.checkpoint['step']}: action MSE {mse['action_mse']}, latent MSE "
            f"{mse['latent_mse']} ({held_out})"
        )
    if rel:
        print(
            f"released model {rel['url']} (sha256 {rel['sha256'][:12]}…, "
            f"{'already released' if rel['already_released'] else 'new'})"
        )
    if waiting is not None:
        print(f"review pool: {waiting} episode(s) waiting (dyna review list / dyna review set …)")
    print("=" * 86)


def print_warehouse(warehouse) -> None:
    with warehouse.open(read_only=True) as wh:
        rows = wh.con.execute(
            "SELECT task, count(*) AS episodes, round(sum(duration_s) / 60, 2) AS minutes, "
            "count(*) FILTER (WHERE camera_dead OR camera_dropped) AS flagged "
            "FROM episodes WHERE status = 'transcoded' GROUP BY task ORDER BY task"
        ).fetchall()
        total = wh.count()
    print(f"warehouse (DuckDB, synced from the registry by CDC): {wh.path}, {total} rows")
    print(f"  {'task':<14}{'episodes':>9}{'minutes':>9}{'flagged':>9}")
    for task, n, minutes, flagged in rows:
        print(f"  {task:<14}{n:>9}{minutes:>9.2f}{flagged:>9}")
    print("=" * 86)


def print_summary(home: DynaHome, ingest: IngestResource, results) -> list[Path]:
    from dyna_resources.episodes.mcap_reader import EpisodeReader

    registry = ingest.stores().registry
    print()
    print("=" * 86)
    print(f"DAGSTER_HOME={os.environ['DAGSTER_HOME']}   registry: {registry.describe()}")
    print(f"runs this time: {len(results)} ({sum(r.success for r in results)} succeeded)")
    units = registry.batches_after(0)
    print(
        f"\n{'ingest partition / work unit':<30}{'files':>6}{'episodes':>9}{'minutes':>8}{'MB in':>8}{'MB out':>8}"
        f"{'ratio':>7}{'quarantined':>12}"
    )
    for partition in registry.sealed_partitions_after(0):
        mine = [u.key for u in units if u.partition_key == partition.key]
        for label, keys in [(f"{partition.key} ({len(mine)} units)", mine)] + [(f"  {k}", [k]) for k in mine]:
            s = batch_summary(keys, registry)
            print(
                f"{label:<30}{s.files:>6}{s.episodes:>9}{s.hours * 60:>8.1f}{s.bytes_in / 1e6:>8.1f}"
                f"{s.bytes_out / 1e6:>8.1f}{s.compression_ratio:>7.3f}{s.quarantined:>12}"
            )
    for r in results:
        for ev in r.get_asset_check_evaluations():
            if not ev.passed:
                print(
                    f"  check {ev.asset_key.to_user_string()}:{ev.check_name} [{ev.severity.value}] "
                    f"partition {r.dagster_run.tags.get('dagster/partition')}: {ev.description}"
                )
    print()
    eps = registry.episodes()
    print(f"{'episode':<22}{'status':<12}{'task':<14}{'robot':<10}{'sec':>6}{'MB':>7}  quality, flags")
    for e in eps:
        reasons = [r["check"] for r in json.loads(e["quality_reasons"] or "[]")]
        flags = [k for k in ("camera_dropped", "camera_dead") if e[k]] + (
            [f"{e['quality_verdict']}: {', '.join(reasons)}"] if reasons else []
        )
        mb = f"{e['mcap_bytes'] / 1e6:>7.2f}" if e["mcap_bytes"] else f"{'-':>7}"
        print(
            f"{e['episode_id']:<22}{e['status']:<12}{e['task']:<14}{e['robot_id']:<10}{e['duration_s']:>6.1f}{mb}  "
            f"{', '.join(flags) or 'ok'}  (pipeline {e['pipeline_version'] or '-'})"
        )
    for q in registry.quarantined():
        where = f" [{q['stream']}]" if q.get("stream") else ""
        print(f"quarantined {q['source_path']} at {q['stage']}/{q['gate']}{where}: {q['reason'][:80]}")
    files = sorted(home.mcap.glob("*.mcap"))
    if files:
        with EpisodeReader(files[0]) as r:
            m = r.metadata()
        print(
            f"\nstamps on {files[0].name}: schema {m['schema_version']}, pipeline {m['pipeline_version']}, "
            f"robot software {m.get('robot_sw_version', '-')}, source sha256 {m['source_sha256'][:12]}…"
        )
    return files


def print_howto(home: DynaHome, files: list[Path]) -> None:
    print("Where things are:")
    print(f"  landing zone (HDF5):  {home.landing}")
    print(f"  MCAP episodes:        {home.mcap}")
    print(f"  registry (SQLite):    {home.registry_sqlite}  (episodes, partitions, work units, gates, quarantine)")
    print(f"  warehouse (DuckDB):   {home.root / 'warehouse.duckdb'}  (episodes, for curation queries)")
    print(f"  manifests:            {home.manifests}")
    print(f"  page cache:           {home.root / 'page-cache'}")
    print(f"  training runs:        {home.root / 'runs'}  (config, checkpoints, attempts/<n>/ logs, metrics.jsonl)")
    print("How to look at them:")
    print("  Dagster UI:   make ui    then open http://127.0.0.1:3000 : assets raw_episodes / mcap_episodes,")
    print("                one partition per ingest partition (byte-balanced work units inside), gate checks,")
    print("                per-partition metadata and progress in the run log, step_ladders")
    print("                with a ladder picture per sampled episode; the landing")
    print("                sensor picks up new files dropped into the landing zone, the drift sensor")
    print(
        "                backfills only stale partitions after PIPELINE_VERSION changes (dyna_resources/versions.py);"
    )
    print("                the check mcap_episodes.versions_current marks each stale partition until then;")
    print("                warehouse_episodes records what each curation spec selects; when that changes the")
    print("                curation sensor rebuilds the manifest (run tag dyna/trigger: selection-changed);")
    print("                manifests -> cache_sets: the prewarm sensor warms a manifest's pages when its")
    print("                DataVersion changes; mcap_replica copies its files to the second origin;")
    print("                checkpoints trains on it (torchrun through Dagster Pipes, metrics in the run log);")
    print("                DYNA_READ_PROFILE (default t64) chooses the training stream transcode writes, prewarm")
    print("                warms and the trainer reads: after changing it, backfill training_streams (it adds")
    print("                the new stream to the MCAPs already there; a manifest lacking it is refused)")
    if files:
        print(f"  Rerun:        .venv/bin/rerun {files[0]}")
        print(f"  Foxglove:     open {files[0]} in Foxglove (desktop app or app.foxglove.dev: Open local file)")
        print(
            f"  One episode:  DYNA_HOME={home.root} .venv/bin/dyna episode {files[0].stem}  (verdicts, versions, "
            "file; every partition's episodes are the 'episodes_table' of mcap_episodes in the UI)"
        )
    print("-" * 86)


if __name__ == "__main__":
    raise SystemExit(main())
