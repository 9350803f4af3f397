"""Evaluations bound to checkpoints, and released models; one partition per curation spec.

``evaluations`` evaluates the latest checkpoint of the partition's training run (its folder computed from
the spec's manifest and the trainer settings, as ``checkpoints`` computes it) on a held-out manifest and
records the result with the
checkpoint, the dataset version and the code commit, plus a table comparing it with the partition's
earlier evaluations. ``released_models`` exports the evaluated checkpoint's weights once to the origin
store. The engines are ``trainer.evaluate`` and ``trainer.release``.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    Config,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dyna_resources.figures import gigabytes, rounded
from dyna_resources.keys import UnsafeKeyError, check_key
from dyna_resources.resources import CacheResource, HomeResource, TrainerResource

from .. import k8s
from ..curation.assets import per_spec
from ..partitions import partition_key

HISTORY = 20  # earlier evaluations shown in the comparison table


class EvaluationConfig(Config):
    # a manifest name in the manifest store, or an .arrow URL; empty: the partition's own manifest,
    # which is the training data, not a held-out set (the metadata says so)
    heldout_manifest: str = ""
    evaluation: str = "offline_action_error"  # a registered name, "module:function", or a dyna.evaluations entry point
    batch_size: int = 8
    step: int = -1  # -1: the run's latest complete checkpoint


class ReleaseConfig(Config):
    store_url: str = ""  # empty: the deployment's model store ($DYNA_MODEL_STORE), else the home folder; under models/
    name: str = ""  # empty: the curation spec
    step: int = -1  # -1: the checkpoint the latest evaluation of this partition evaluated


def _latest_metadata(context: AssetExecutionContext, key: str, limit: int = 1) -> list[dict]:
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(key), asset_partitions=[partition_key(context, "curation spec")]),
        limit=limit,
    ).records
    return [{k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()} for r in records]


def _typed(v):
    """Dicts and lists as JSON (``metrics`` keeps every digit), the top-level floats (``action_mse``) to four
    significant digits for reading and the Plots tab, the rest as it is."""
    if isinstance(v, (dict, list)):
        return MetadataValue.json(v)
    return rounded(v) if isinstance(v, float) else v


def _run_dir(trainer: TrainerResource, home: HomeResource, cache: CacheResource, spec: str) -> Path:
    """The partition's training run folder, computed as ``checkpoints`` computes it (a key of what it trains)."""
    run_dir = trainer.run_dir(home, cache, spec)
    if not (run_dir / "checkpoints").is_dir():
        raise Failure(
            description=f"no training run of curation spec {spec!r} on its current manifest and trainer "
            f"settings ({run_dir}): materialize checkpoints first",
            allow_retries=False,
        )
    return run_dir


def _checked(name: str, what: str) -> str:
    """A name from run config that becomes a path or object key, checked like partition keys."""
    try:
        return check_key(name, what)
    except UnsafeKeyError as e:
        raise Failure(description=str(e), allow_retries=False) from None


@asset(
    **per_spec("evaluate", "training", k8s.EVALUATE),
    deps=["checkpoints"],
    description="The partition's latest checkpoint evaluated on a held-out manifest (offline action-prediction "
    "error by default; pluggable), recorded with the checkpoint, dataset version and code commit, "
    "and compared with the partition's earlier evaluations.",
)
def evaluations(
    context: AssetExecutionContext,
    config: EvaluationConfig,
    home: HomeResource,
    cache: CacheResource,
    trainer: TrainerResource,
):
    from trainer.evaluate import comparison_table, evaluate_checkpoint

    spec = partition_key(context, "curation spec")
    held = config.heldout_manifest or spec
    url = held if held.endswith(".arrow") else home.manifest_arrow_url(_checked(held, "held-out manifest name"))
    run_dir = _run_dir(trainer, home, cache, spec)
    context.log.info(f"evaluating {run_dir} ({config.evaluation}) on {url}")
    result = evaluate_checkpoint(
        run_dir,
        url,
        step=None if config.step < 0 else config.step,
        evaluation=config.evaluation,
        batch_size=config.batch_size,
        cache_dir=home.home().node_cache,
    )
    md = result.as_metadata()
    table = comparison_table(md, _latest_metadata(context, "evaluations", HISTORY))
    out = {k: _typed(v) for k, v in md.items()}
    out["result_path"] = MetadataValue.path(result.path)
    out["comparison"] = MetadataValue.md(table)
    return MaterializeResult(metadata=out, data_version=DataVersion(result.version))


@asset(
    **per_spec("release", "training", k8s.RELEASE),
    deps=["evaluations"],
    description="The evaluated checkpoint's weights (no optimizer state) with their lineage, published once, "
    "content-addressed, to the origin store: sites and inference replicas pull the same bytes "
    "through their cache instead of from the training cluster.",
)
def released_models(
    context: AssetExecutionContext,
    config: ReleaseConfig,
    home: HomeResource,
    cache: CacheResource,
    trainer: TrainerResource,
):
    from trainer.evaluate import latest_recorded
    from trainer.release import export_weights, publish

    spec = partition_key(context, "curation spec")
    name = _checked(config.name, "release name") if config.name else spec
    run_dir = _run_dir(trainer, home, cache, spec)
    evaluated = latest_recorded(run_dir)  # what the run folder says was evaluated last, not earlier metadata
    step = config.step if config.step >= 0 else (evaluated.checkpoint["step"] if evaluated else None)
    store = config.store_url or home.model_store_url()
    folder = export_weights(run_dir, step)
    rel = publish(folder, store, name)
    context.log.info(f"{'already released' if rel.already_released else 'released'}: {rel.url}")
    side = rel.sidecar
    md = {
        "url": MetadataValue.url(rel.url) if "://" in rel.url and not rel.url.startswith("file://") else rel.url,
        "sha256": rel.sha256,
        "size_GB": gigabytes(rel.size),
        "already_released": rel.already_released,
        "checkpoint": MetadataValue.json(side["source"]),
        "checkpoint_step": side["source"]["step"],
        "lineage": MetadataValue.json(side["lineage"]),
        "dataset": MetadataValue.json(side["dataset"]),
        "dataset_ref": side["dataset"].get("ref", ""),
        "manifest_sha256": side["dataset"].get("manifest_sha256", ""),
        "code_commit": side.get("code_commit") or "",
    }
    if evaluated and evaluated.checkpoint["step"] == side["source"]["step"]:
        md["evaluation"] = MetadataValue.json(
            {
                "evaluation": evaluated.evaluation,
                "metrics": evaluated.metrics,
                "heldout_manifest_sha256": evaluated.heldout_manifest_sha256,
            }
        )
    return MaterializeResult(metadata=md, data_version=DataVersion(rel.sha256))
