"""Checkpoints, one partition per curation spec: the trainer launched through Dagster Pipes.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import base64
import json

from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, PipesSubprocessClient, asset

from dyna_resources.resources import CacheResource, HomeResource, TrainerResource
from trainer.train import FATAL_FILE

from .. import k8s
from ..curation.assets import per_spec
from ..partitions import partition_key


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
    run = trainer.prepare(home, cache, partition_key(context, "curation spec"))
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
            description=f"training stopped: {fault['message']}. Rebuild the manifest once the object "
            "is marked (mcap_episodes.mcaps_present) or restored.",
            metadata={"object": fault["object"], "run_dir": MetadataValue.path(str(run.run_dir))},
            allow_retries=False,
        ) from None
    progress = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and "step" in m]
    (result,) = invocation.get_results()
    assert isinstance(result, MaterializeResult)  # the trainer reports one materialization and no check
    metadata = dict(result.metadata or {})
    metadata.update(
        {
            "config": MetadataValue.json(run.config),
            "loss_curve": MetadataValue.json(
                [{k: m[k] for k in ("step", "loss", "samples_per_s", "data_wait_fraction") if k in m} for m in progress]
            ),
            "curves": MetadataValue.md(_curves_markdown(progress, run.run_dir.name)),
            "checkpoints_dir": MetadataValue.path(str(run.run_dir / "checkpoints")),
            "attempts": len(list((run.run_dir / "attempts").iterdir())),
        }
    )
    return MaterializeResult(metadata=metadata, data_version=result.data_version)


def _curves_markdown(progress: list[dict], title: str) -> str:
    # Dagster renders markdown metadata; a data: URL keeps the PNG inside the event log, no file server needed.
    from trainer.plots import training_curves_png

    if not any("step" in p for p in progress):
        return "(no progress reported)"
    png = base64.b64encode(training_curves_png(progress, title=title)).decode()
    return f"![loss and data wait by step](data:image/png;base64,{png})"
