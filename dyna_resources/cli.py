"""`dyna`: the engines from the shell, without Dagster.

    dyna generate OUT_DIR [--episodes N] [--width W --height H] [--faults truncated=1,corrupt_jpeg=1]
        (writes OUT_DIR/<UTC time>/<episode>.h5: OUT_DIR may be the landing zone)
    dyna transcode SRC.h5 DST.mcap [--gop-frames N] [--crf X] [--preset P]
    dyna training-streams SRC.mcap DST.mcap --spec NAME:HxW[:GOP] [--spec ...]
    dyna inspect EPISODE.mcap
    dyna episode EPISODE_ID
    dyna review list
    dyna review set EPISODE_ID accept|reject --by NAME [--note TEXT]

The episode and review commands use the registry at $DYNA_REGISTRY_URL, else $DYNA_HOME/registry.sqlite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .episodes.codec import VideoSettings
from .episodes.errors import EpisodeError
from .sources.topic_map import TopicMapError


def _generate(args) -> int:
    from .episodes.sim import generate_fleet
    from .episodes.sim.fleet import arrival_folder

    faults = dict((k, int(v)) for k, v in (f.split("=") for f in args.faults.split(",") if f)) if args.faults else None
    lo, _, hi = args.duration_s.partition(",")
    duration = (float(lo), float(hi)) if hi else float(lo)
    # The call sim/fleet.py's main() makes too; kept apart: this one's arguments are the package CLI's
    # (faults as k=v,k=v), and it marks the drop complete and time-stamps it for the landing zone.
    # One time-stamped folder per call: dropped into the landing zone, its keys sort after every earlier
    # drop's, so the landing sensor's next tick sees them (it lists only keys after its cursor).
    eps = generate_fleet(
        Path(args.out) / arrival_folder(),
        args.episodes,
        seed=args.seed,
        width=args.width,
        height=args.height,
        duration_s=duration,
        faults=faults,
        workers=args.workers,
        mark_complete=True,
    )
    for e in eps:
        print(f"{e.path}  {e.spec.task:<12} {e.spec.duration_s:5.1f} s  {e.fault or ''}")
    return 0


def _transcode(args) -> int:
    from .episodes.raw_format import RawEpisode
    from .episodes.transcode import TranscodeSettings, transcode_episode
    from .sources import topic_map
    from .sources.content import content_sha256
    from .sources.memory import MemoryEpisode
    from .sources.open import open_episodes
    from .sources.ros2 import read_bag

    settings = TranscodeSettings(video=VideoSettings(gop_frames=args.gop_frames, crf=args.crf, preset=args.preset))
    if args.topics:  # a topic map of one's own, from the file named
        fmt, episodes = (
            "ros2",
            list[RawEpisode | MemoryEpisode](read_bag(args.src, topic_map.load_file(Path(args.topics)))),
        )
    else:
        fmt, episodes = open_episodes(args.src, os.environ.get("DYNA_HOME"))
    sha = content_sha256(args.src)
    dst = Path(args.dst)
    for ep in episodes:
        out = dst / f"{ep.meta.episode_id}.mcap" if len(episodes) > 1 else dst
        r = transcode_episode(args.src, out, settings, source_sha256=sha, episode=ep)
        print(
            f"{r.episode_id} ({fmt}): {r.bytes_in / 1e6:.2f} MB -> {r.bytes_out / 1e6:.2f} MB "
            f"({r.bytes_out / r.bytes_in:.3f}) in {r.total_s:.1f} s; chunks {r.chunks} -> {out}"
        )
    return 0


def _training_streams(args) -> int:
    from .episodes.training_streams import add_training_streams

    r = add_training_streams(args.src, args.dst, args.spec)
    for s in r.streams.values():
        print(
            f"{s.name}: {s.action}, {s.frames} frames encoded, {s.bytes / 1e6:.2f} MB "
            f"({r.bytes_fraction(s.name):.1%} of the source)"
        )
    print(f"{r.bytes_before / 1e6:.2f} MB -> {r.bytes_after / 1e6:.2f} MB in {r.seconds:.1f} s")
    return 0


def _inspect(args) -> int:
    from .episodes.mcap_reader import EpisodeReader

    with EpisodeReader(args.mcap) as r:
        md = r.metadata()
        print(json.dumps({k: v for k, v in md.items() if k != "transcode_settings"}, indent=2))
        depth = f"; depth: {', '.join(r.depth)}" if r.depth else ""
        print(f"cameras: {', '.join(r.cameras)}; streams: {', '.join(r.streams)}{depth}")
        print(f"{'chunk offset':>14} {'bytes':>10} {'compression':>11}  topics")
        for ci in r.summary.chunk_indexes:
            topics = sorted(r.channels[c].topic for c in ci.message_index_offsets)
            print(
                f"{ci.chunk_start_offset:>14} {ci.chunk_length:>10} {ci.compression or 'none':>11}  {' '.join(topics)}"
            )
    return 0


def _registry():
    from .catalog.registry import Registry, registry_url_from_env
    from .home import DynaHome

    return Registry(registry_url_from_env(DynaHome.from_env().root))


def _episode(args) -> int:
    from .catalog.episode_view import episode_view

    reg = _registry()
    try:
        view = episode_view(reg, args.episode_id)
    finally:
        reg.close()
    if view is None:
        print(f"error: no episode {args.episode_id!r} in the registry ({reg.describe()})", file=sys.stderr)
        return 1
    print("\n".join(view.lines()))
    return 0


def _review_list(args) -> int:
    reg = _registry()
    try:
        pool = reg.review_pool()
    finally:
        reg.close()
    for r in pool:
        reasons = "; ".join(f"{x['check']}: {x['detail']}" for x in r["quality_reasons"])
        print(
            f"{r['episode_id']}  smooth {r['smoothness_score']}  sensors {r['sensor_health_score']}  "
            f"task {r['task_score']}  {reasons}"
        )
    print(f"{len(pool)} episode(s) to review", file=sys.stderr)
    return 0


def _review_set(args) -> int:
    reg = _registry()
    try:
        reg.review(args.episode_id, args.verdict, args.by, note=args.note)
    except (KeyError, ValueError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    print(f"{args.episode_id}: {args.verdict} by {args.by}")
    return 0


def _quarantine_release(args) -> int:
    from .ingest.release import release_quarantined

    reg = _registry()
    try:
        done = release_quarantined(reg, args.reason_class, dry_run=args.dry_run)
    finally:
        reg.close()
    for r in done.records[: args.show]:
        print(f"{r['source_path']}  [{r['stage']}/{r['gate']}]  {r['reason'][:200]}")
    if len(done.records) > args.show:
        print(f"... and {len(done.records) - args.show} more")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(done.kinds.items())) or "none"
    verb = "would release" if done.dry_run else "released"
    print(f"{verb} {len(done.records)} {args.reason_class} quarantine record(s) ({kinds})")
    if not done.dry_run and done.records:
        print(
            f"{len(done.pending)} episode(s) now pending: the next run of their partitions redoes them "
            "(the drift sensor launches it)"
        )
        for p in done.reinventory:
            print(
                f"held back before inventory; run again: dagster asset materialize -w workspace.yaml "
                f"--select raw_episodes,mcap_episodes --partition {p}"
            )
    return 0


def _ladder(args) -> int:
    """Segment one MCAP episode and print its ladder: for trying procedures and thresholds on real data."""
    from .home import DynaHome
    from .ladders.config import LadderConfig, LadderConfigError
    from .ladders.picture import ladder_png
    from .ladders.run import ladder_episode
    from .ladders.segment import LadderError, signals_of

    try:
        config = LadderConfig.load(args.config or DynaHome.from_env().root / "step_ladders.yaml")
        task = args.task
        if task is None:
            from .episodes.mcap_reader import EpisodeReader

            with EpisodeReader(args.mcap) as r:
                task = r.metadata().get("task", "")
        steps, streams = ladder_episode(Path(args.mcap).resolve().as_uri(), task, config)
    except (LadderConfigError, LadderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.mcap} ({task}, {config.version})")
    for s in steps:
        mode = f" ({s.failure_mode})" if s.failure_mode else ""
        print(
            f"  {s.index:>2} {s.name:<12}{(s.start_ns - steps[0].start_ns) / 1e9:>8.2f}s {s.duration_s:>7.2f}s  "
            f"{s.outcome}{mode}"
        )
    if args.png:
        Path(args.png).write_bytes(
            ladder_png(steps, signals_of(streams, config), config, title=f"{args.mcap} ({task})")
        )
        print(f"picture: {args.png}")
    return 0


def _training_spec(text: str):
    from .episodes.training_streams import TrainingStreamSpec

    try:
        return TrainingStreamSpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dyna", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser(
        "generate",
        help="write a sample fleet of legacy HDF5 episodes into OUT/<UTC time>/ "
        "(keys that sort after earlier drops into a landing zone)",
    )
    g.add_argument("out")
    g.add_argument("--episodes", type=int, default=8)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--width", type=int, default=640)
    g.add_argument("--height", type=int, default=480)
    g.add_argument("--duration-s", default="8,16", help="seconds per episode, or LO,HI for a range (default 8,16)")
    g.add_argument("--faults", default="", help="name=count,... e.g. truncated=1,corrupt_jpeg=1")
    g.add_argument("--workers", type=int, default=1)
    g.set_defaults(fn=_generate)
    t = sub.add_parser(
        "transcode", help="a legacy HDF5 episode or a ROS 2 bag directory -> MCAP (a bag cut in several: DST/<id>.mcap)"
    )
    t.add_argument("src")
    t.add_argument("dst")
    t.add_argument("--topics", help="a ROS 2 topic map (default: $DYNA_HOME/ros2_topics.yaml, else the embedded one)")
    t.add_argument("--gop-frames", type=int, default=VideoSettings.gop_frames)
    t.add_argument("--crf", type=float, default=VideoSettings.crf)
    t.add_argument("--preset", default=VideoSettings.preset)
    t.set_defaults(fn=_transcode)
    ts = sub.add_parser(
        "training-streams",
        help="add derived small video streams (training resolution and "
        "GOP) to an MCAP episode; the archive is kept byte for byte",
    )
    ts.add_argument("src")
    ts.add_argument("dst", help="may be SRC (replaced atomically)")
    ts.add_argument(
        "--spec",
        action="append",
        required=True,
        type=_training_spec,
        help="NAME:HxW[:GOP], e.g. t128:128x128:30 (repeatable)",
    )
    ts.set_defaults(fn=_training_streams)
    i = sub.add_parser("inspect", help="print an MCAP episode's stamps and chunk layout")
    i.add_argument("mcap")
    i.set_defaults(fn=_inspect)
    lad = sub.add_parser("ladder", help="cut an MCAP episode into its task's procedure steps")
    lad.add_argument("mcap")
    lad.add_argument("--task", default=None, help="default: the episode's metadata")
    lad.add_argument("--config", default=None, help="default: $DYNA_HOME/step_ladders.yaml, else the embedded one")
    lad.add_argument("--png", default=None, help="also draw the ladder here")
    lad.set_defaults(fn=_ladder)
    ep = sub.add_parser("episode", help="one episode: status, gate verdicts, versions, failed step, how to open it")
    ep.add_argument("episode_id")
    ep.set_defaults(fn=_episode)
    r = sub.add_parser("review", help="the review pool: episodes the quality scores could not decide")
    rsub = r.add_subparsers(dest="review_cmd", required=True)
    rsub.add_parser("list", help="episodes waiting for a verdict, with reasons").set_defaults(fn=_review_list)
    rs = rsub.add_parser("set", help="record a verdict (a registry write; reaches the warehouse by CDC)")
    rs.add_argument("episode_id")
    rs.add_argument("verdict", choices=["accept", "reject"])
    rs.add_argument("--by", required=True, help="reviewer's name")
    rs.add_argument("--note", default=None)
    rs.set_defaults(fn=_review_set)
    q = sub.add_parser("quarantine", help="quarantine records: release those a fault of the machine wrote")
    qsub = q.add_subparsers(dest="quarantine_cmd", required=True)
    qr = qsub.add_parser(
        "release",
        help="release every record of a reason class (ingest/faults.py's table): their "
        "episodes become pending and are re-ingested by the next run",
    )
    qr.add_argument("--reason-class", required=True, choices=["infrastructure", "data"])
    qr.add_argument("--dry-run", action="store_true", help="list what would be released, change nothing")
    qr.add_argument("--show", type=int, default=50, help="records to print (default 50)")
    qr.set_defaults(fn=_quarantine_release)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (EpisodeError, TopicMapError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
