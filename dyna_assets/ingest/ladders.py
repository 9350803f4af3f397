"""The ``step_ladders`` asset: every episode of an ingest partition cut into its task's procedure steps.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import base64
import hashlib
import json

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)

from dyna_resources.figures import inline_svg, rounded
from dyna_resources.ladders.config import SEGMENTER_VERSION
from dyna_resources.ladders.run import LadderReport, ladder_batch
from dyna_resources.resources import IngestResource, LadderResource

from .. import k8s
from .assets import BACKFILL
from .partitions import ingest_partition_keys, ingest_partitions


def _pictures_markdown(report: LadderReport) -> str:
    # The PNGs as data: URLs inside the event log (no file server needed). Together far over the 1,000
    # characters Dagster shows in place, so the table links to them ("[Show Markdown]"): the pictures come
    # first, each under its episode id (the picture's own title names the episode and its task).
    return (
        "\n\n".join(
            f"![{eid}](data:image/png;base64,{base64.b64encode(png).decode()})" for eid, png in report.pictures.items()
        )
        or "(no episode segmented in this run)"
    )


STRIP_WIDTH, ROW = 240, 6  # the inline ladder: pixels across, and per step down


def _ladder_strip(steps: list[dict]) -> str | None:
    """One episode's ladder as a line drawing small enough that the metadata table shows it in place
    (``dyna_resources.figures.inline_svg``): a bar per step over its time, a row lower each step, coloured by
    outcome as the PNG. ``None`` without steps, or when too many steps would not fit."""
    from dyna_resources.ladders.picture import COLOURS  # matplotlib: kept out of the definitions' load

    if not steps:
        return None
    t0, t1 = steps[0]["start_ns"], max(s["end_ns"] for s in steps)
    scale = STRIP_WIDTH / ((t1 - t0) or 1)
    paths: dict[str, list[str]] = {}
    for i, s in enumerate(steps):
        x, w = round((s["start_ns"] - t0) * scale), max(1, round((s["end_ns"] - s["start_ns"]) * scale))
        paths.setdefault(COLOURS.get(s["outcome"], "#999999"), []).append(f"M{x},{i * ROW}h{w}v{ROW - 1}h-{w}z")
    body = "".join(f"<path fill='{colour}' d='{''.join(d)}'/>" for colour, d in paths.items())
    svg = f"<svg xmlns='http://www.w3.org/2000/svg' width='{STRIP_WIDTH}' height='{len(steps) * ROW}'>{body}</svg>"
    failed = next((s["name"] for s in steps if s["outcome"] == "failure"), None)
    return inline_svg(f"{len(steps)} steps" + (f", failed at {failed}" if failed else ""), svg)


def _strips(report: LadderReport, registry) -> dict:
    """``ladder <episode id>``: the inline ladder of each pictured episode, from its stored steps."""
    stored = {e["episode_id"]: e["step_ladder"] for e in registry.episodes(report.units) if e["step_ladder"]}
    out = {}
    for eid in report.pictures:
        strip = _ladder_strip(json.loads(stored[eid])) if eid in stored else None
        if strip:
            out[f"ladder {eid}"] = MetadataValue.md(strip)
    return out


def _partition_metadata(report: LadderReport, registry) -> dict:
    return {
        "ladder_version": report.version,
        "segmented_this_run": len(report.segmented),
        "not_segmented": MetadataValue.json(report.errors),
        "failed_at_step": MetadataValue.json(dict(report.failed_steps.most_common())),
        "seconds_by_step": MetadataValue.json({k: rounded(v) for k, v in sorted(report.step_seconds.items())}),
        **_strips(report, registry),
        "ladders": MetadataValue.md(_pictures_markdown(report)),
    }


@multi_asset(
    specs=[
        AssetSpec(
            "step_ladders",
            code_version=SEGMENTER_VERSION,
            partitions_def=ingest_partitions,
            deps=["mcap_episodes"],
            group_name="ingest",
            tags={"dyna/stage": "labels"},
            description="Each episode cut into its task's procedure steps (duration, outcome, failure "
            "mode) in the registry; a ladder picture per sampled episode.",
        )
    ],
    partitions_def=ingest_partitions,
    backfill_policy=BACKFILL,
    can_subset=True,
    op_tags=k8s.LADDERS,
)
def step_ladders(context: AssetExecutionContext, ingest: IngestResource, ladders: LadderResource):
    registry, config = ingest.stores().registry, ladders.config()
    reports = []
    for partition in ingest_partition_keys(context, registry):
        units = [u.key for u in registry.partition_units(partition)]
        rep = ladder_batch(partition, registry, config, pictures=ladders.pictures, log=context.log.warning, units=units)
        context.add_asset_metadata(_partition_metadata(rep, registry), partition_key=partition)
        context.log.info(
            f"{partition}: segmented {len(rep.segmented)}, not segmentable {len(rep.errors)}, "
            f"failed at {dict(rep.failed_steps)}"
        )
        reports.append(rep)
    digest = hashlib.sha256(repr(sorted((r.batch_key, r.version) for r in reports)).encode())
    yield MaterializeResult(
        asset_key="step_ladders",
        data_version=DataVersion(digest.hexdigest()[:16]),
        tags={"dyna/ladder_version": config.version},
    )
