"""Evaluations bound to checkpoints, and released models; one partition per curation spec.

``evaluations`` evaluates the latest checkpoint of the partition's training run (the one the latest
``checkpoints`` materialization names) on a held-out manifest and records the result with the
checkpoint, the dataset version and the code commit, plus a table comparing it with the partition's
earlier evaluations. ``released_models`` exports the evaluated checkpoint's weights once to the origin
store. The engines are ``trainer.evaluate`` and ``trainer.release``.

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

import hashlib
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

from dyna_resources.resources import HomeResource
from dyna_resources.keys import UnsafeKeyError, check_key

from .. import k8s
from ..curation.assets import curation_specs
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
        limit=limit).records
    return [{k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()} for r in records]


def _run_dir(context: AssetExecutionContext) -> Path:
    found = _latest_metadata(context, "checkpoints")
    if not found or "checkpoints_dir" not in found[0]:
        raise RuntimeError(f"no checkpoints materialization for partition {context.partition_key!r}: train first")
    return Path(found[0]["checkpoints_dir"]).parent


def _checked(name: str, what: str) -> str:
    """A name from run config that becomes a path or object key, checked like partition keys."""
    try:
        return check_key(name, what)
    except UnsafeKeyError as e:
        raise Failure(description=str(e), allow_retries=False) from None


def _row(md: dict, this: bool = False) -> str:
    metrics, ck, ds = md.get("metrics") or {}, md.get("checkpoint") or {}, md.get("dataset") or {}

    def num(k):
        v = metrics.get(k)
        return f"{v:.5g}" if isinstance(v, (int, float)) else "–"

    held = (md.get("heldout_manifest_sha256") or "")[:12]
    return (f"| {ck.get('step', '?')}{' (this)' if this else ''} | `{(ck.get('sha256') or '')[:12]}` | "
            f"{ds.get('ref') or ''} | `{(md.get('code_commit') or '')[:12]}` | "
            f"{md.get('evaluation', '?')} | `{held}` | {num('action_mse')} | {num('latent_mse')} |")


def comparison_table(current: dict, earlier: list[dict]) -> str:
    """Markdown: this evaluation, then earlier ones of the partition (newest first, one row per
    checkpoint x held-out manifest x evaluation)."""
    head = ("| step | checkpoint | dataset | code | evaluation | held-out | action MSE | latent MSE |\n"
            "|---|---|---|---|---|---|---|---|")

    def ident(md):
        return ((md.get("checkpoint") or {}).get("sha256"), md.get("heldout_manifest_sha256"), md.get("evaluation"))

    seen, rows = {ident(current)}, [_row(current, this=True)]
    for md in earlier:
        if ident(md) not in seen:
            seen.add(ident(md))
            rows.append(_row(md))
    return "\n".join([head, *rows])


@asset(partitions_def=curation_specs, deps=["checkpoints"], group_name="training", tags={"dyna/stage": "evaluate"},
       op_tags=k8s.EVALUATE,
       description="The partition's latest checkpoint evaluated on a held-out manifest (offline action-prediction "
                   "error by default; pluggable), recorded with the checkpoint, dataset version and code commit, "
                   "and compared with the partition's earlier evaluations.")
def evaluations(context: AssetExecutionContext, config: EvaluationConfig, home: HomeResource):
    from trainer.evaluate import evaluate_checkpoint

    held = config.heldout_manifest or partition_key(context, "curation spec")
    url = held if held.endswith(".arrow") else home.manifest_arrow_url(_checked(held, "held-out manifest name"))
    run_dir = _run_dir(context)
    context.log.info(f"evaluating {run_dir} ({config.evaluation}) on {url}")
    res = evaluate_checkpoint(run_dir, url, step=None if config.step < 0 else config.step,
                              evaluation=config.evaluation, batch_size=config.batch_size,
                              cache_dir=home.home().node_cache)
    metrics = res["evaluation"]["metrics"]
    md = {
        "evaluation": config.evaluation,
        "metrics": metrics,
        "checkpoint": res["checkpoint"],
        "checkpoint_step": res["checkpoint"]["step"],
        "checkpoint_sha256": res["checkpoint"]["sha256"],
        "lineage": res["lineage"],
        "dataset": res["dataset"],
        "dataset_ref": res["dataset"].get("ref", ""),
        "manifest_sha256": res["dataset"].get("manifest_sha256", ""),
        "code_commit": res["code_commit"] or "",
        "heldout_manifest": url,
        "heldout_manifest_sha256": res["heldout_manifest_sha256"],
        "heldout_is_training_data": res["heldout_is_training_data"],
        "run_dir": str(run_dir),
        "result_path": res["path"],
    }
    if res["heldout_is_training_data"]:
        md["note"] = ("evaluated on the training manifest: not held out (set heldout_manifest to a held-out "
                      "curation spec's manifest for a real held-out error)")
    table = comparison_table(md, _latest_metadata(context, "evaluations", HISTORY))
    for k in ("action_mse", "latent_mse"):
        if isinstance(metrics.get(k), (int, float)):
            md[k] = float(metrics[k])
    out = {k: MetadataValue.json(v) if isinstance(v, (dict, list)) else v for k, v in md.items()}
    out["result_path"] = MetadataValue.path(res["path"])
    out["comparison"] = MetadataValue.md(table)
    version = hashlib.sha256(f"{md['checkpoint_sha256']}:{md['heldout_manifest_sha256']}:{config.evaluation}"
                             .encode()).hexdigest()
    return MaterializeResult(metadata=out, data_version=DataVersion(version))


@asset(partitions_def=curation_specs, deps=["evaluations"], group_name="training", tags={"dyna/stage": "release"},
       op_tags=k8s.RELEASE,
       description="The evaluated checkpoint's weights (no optimizer state) with their lineage, published once, "
                   "content-addressed, to the origin store: sites and inference replicas pull the same bytes "
                   "through their cache instead of from the training cluster.")
def released_models(context: AssetExecutionContext, config: ReleaseConfig, home: HomeResource):
    from trainer.release import export_weights, publish

    name = _checked(config.name, "release name") if config.name else partition_key(context, "curation spec")
    evaluated = _latest_metadata(context, "evaluations")
    if config.step >= 0:
        run_dir, step = _run_dir(context), config.step
    elif evaluated:
        run_dir, step = Path(evaluated[0]["run_dir"]), int(evaluated[0]["checkpoint_step"])
    else:
        run_dir, step = _run_dir(context), None
    store = config.store_url or home.model_store_url()
    folder = export_weights(run_dir, step)
    rel = publish(folder, store, name)
    context.log.info(f"{'already released' if rel.already_released else 'released'}: {rel.url}")
    side = rel.sidecar
    md = {
        "url": MetadataValue.url(rel.url) if "://" in rel.url and not rel.url.startswith("file://") else rel.url,
        "sha256": rel.sha256,
        "size": rel.size,
        "already_released": rel.already_released,
        "checkpoint": MetadataValue.json(side["source"]),
        "checkpoint_step": side["source"]["step"],
        "lineage": MetadataValue.json(side["lineage"]),
        "dataset": MetadataValue.json(side["dataset"]),
        "dataset_ref": side["dataset"].get("ref", ""),
        "manifest_sha256": side["dataset"].get("manifest_sha256", ""),
        "code_commit": side.get("code_commit") or "",
    }
    if evaluated and int(evaluated[0]["checkpoint_step"]) == side["source"]["step"]:
        md["evaluation"] = MetadataValue.json({k: evaluated[0].get(k) for k in ("evaluation", "metrics",
                                                                              "heldout_manifest_sha256")})
    return MaterializeResult(metadata=md, data_version=DataVersion(rel.sha256))
