"""Checkpoints, one partition per curation spec: the trainer launched through Dagster Pipes.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import base64
import json
import math

from dagster import (
    AssetExecutionContext,
    Failure,
    FloatMetadataValue,
    MaterializeResult,
    MetadataValue,
    PipesSubprocessClient,
    asset,
)

from dyna_resources.figures import inline_svg, rounded
from dyna_resources.resources import CacheResource, HomeResource, TrainerResource
from trainer.launch import MissingStreamError
from trainer.train import FATAL_FILE

from .. import k8s
from ..curation.assets import per_spec
from ..partitions import partition_key

# what mends each fault the trainer records as one no restart mends (trainer.train.FATAL_FILE)
_MENDS = {
    "missing_object": "Rebuild the manifest once the object is marked (mcap_episodes.mcaps_present) or restored.",
    "damaged_episode": "Re-ingest the episode and rebuild the manifest, or set the trainer's bad_samples to 'skip'.",
}


@asset(
    **per_spec("train", "training", k8s.TRAIN),
    deps=["manifests", "cache_sets"],
    pool="train",
    description="A world-action model trained on the curation spec's manifest, read through the warm page "
    "cache: torchrun launched through Dagster Pipes (restarts in place, resumes from the latest "
    "complete checkpoint), async sharded checkpoints; each records its manifest, versions and "
    "code commit.",
)
def checkpoints(context: AssetExecutionContext, home: HomeResource, cache: CacheResource, trainer: TrainerResource):
    try:
        run = trainer.prepare(home, cache, partition_key(context, "curation spec"))
    except MissingStreamError as e:  # before any rank starts: named, with the backfill that mends it
        partitions = home.registry().partitions_of(e.episodes)
        raise Failure(
            description=f"{e} Ingest partitions: {', '.join(partitions[:20])}"
            + (f" and {len(partitions) - 20} more" if len(partitions) > 20 else ""),
            metadata={
                "episodes_lacking_stream": e.total,
                "backfill": f"training_streams, partitions {', '.join(partitions[:50])}",
            },
            allow_retries=False,
        ) from None
    context.log.info(f"training run {run.run_dir} ({'resuming' if run.resuming else 'new'}): {' '.join(run.command)}")
    fatal = run.run_dir / FATAL_FILE
    fatal.unlink(missing_ok=True)  # a fault of an earlier launch; this one looks afresh
    try:
        invocation = PipesSubprocessClient(env=run.env).run(command=run.command, context=context)
    except Exception:  # Pipes' own error type is not public API: the trainer's fault file says what happened
        if not fatal.exists():
            raise
        fault = json.loads(fatal.read_text())  # a fault the trainer says no retry mends: named, not retried
        raise Failure(
            description=f"training stopped: {fault['message']}. {_MENDS[fault['fault']]}",
            metadata={
                "fault": fault["fault"],
                **({"object": fault["object"]} if fault["object"] else {}),
                "run_dir": MetadataValue.path(str(run.run_dir)),
            },
            allow_retries=False,
        ) from None
    progress = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and "step" in m]
    (result,) = invocation.get_results()
    assert isinstance(result, MaterializeResult)  # the trainer reports one materialization and no check
    metadata = {k: _rounded(v) for k, v in (result.metadata or {}).items()}
    loss = _loss_line(progress)
    metadata.update(
        {
            "config": MetadataValue.json(run.config),
            "loss_curve": MetadataValue.json(
                [{k: m[k] for k in ("step", "loss", "samples_per_s", "data_wait_fraction") if k in m} for m in progress]
            ),
            **({"loss": MetadataValue.md(loss)} if loss else {}),
            "curves": MetadataValue.md(_curves_markdown(progress, run.run_dir.name)),
            "checkpoints_dir": MetadataValue.path(str(run.run_dir / "checkpoints")),
            "attempts": len(list((run.run_dir / "attempts").iterdir())),
        }
    )
    return MaterializeResult(metadata=metadata, data_version=result.data_version)


def _rounded(v):
    """The trainer's floats (``loss_last``, ``checkpoint_write_s``) to four significant digits; the rest as sent."""
    if isinstance(v, FloatMetadataValue) and v.value is not None:
        return MetadataValue.float(rounded(v.value))
    return rounded(v) if isinstance(v, float) else v


LINE_POINTS = 60  # points of the inline loss line, evenly picked from the progress reports


def _loss_line(progress: list[dict], width: int = 240, height: int = 40) -> str | None:
    """The loss by step as a line drawing small enough that the metadata table shows it in place
    (``dyna_resources.figures.inline_svg``), log-scaled as the PNG when every loss is positive; the full
    picture is the ``curves`` entry. ``None`` with fewer than two losses."""
    points = [(p["step"], p["loss"]) for p in progress if "step" in p and isinstance(p.get("loss"), (int, float))]
    points = [(s, v) for s, v in points if math.isfinite(v)]
    if len(points) < 2:
        return None
    if len(points) > LINE_POINTS:
        points = [points[round(i * (len(points) - 1) / (LINE_POINTS - 1))] for i in range(LINE_POINTS)]
    ys = [math.log(v) for _, v in points] if all(v > 0 for _, v in points) else [v for _, v in points]
    x0, x1, y0, y1 = points[0][0], points[-1][0], min(ys), max(ys)
    xy = [
        (round((s - x0) / ((x1 - x0) or 1) * width), round((1 - (y - y0) / ((y1 - y0) or 1)) * (height - 2) + 1))
        for (s, _), y in zip(points, ys)
    ]
    svg = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'><polyline fill='none' "
        f"stroke='#1f77b4' stroke-width='1.5' points='{','.join(f'{x},{y}' for x, y in xy)}'/></svg>"
    )
    return inline_svg(f"loss from {rounded(points[0][1], 3)} to {rounded(points[-1][1], 3)}", svg)


def _curves_markdown(progress: list[dict], title: str) -> str:
    # The PNG as a data: URL inside the event log (no file server needed). At tens of kB it is over the
    # 1,000 characters Dagster shows in place, so the table links to it ("[Show Markdown]"): the picture
    # comes first, under a short alt text.
    from trainer.plots import training_curves_png

    if not any("step" in p for p in progress):
        return "(no progress reported)"
    png = base64.b64encode(training_curves_png(progress, title=title)).decode()
    return f"![loss and data wait by step](data:image/png;base64,{png})"
