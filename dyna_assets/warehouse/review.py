"""The review pool: episodes whose quality scores fell between 'pass' and 'fail', waiting for a
reviewer's verdict (``dyna review set``).

No ``from __future__ import annotations`` here: Dagster reads the context annotation at runtime.
"""

from collections import Counter

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from dyna_resources.resources import IngestResource

from .. import k8s


@asset(
    group_name="warehouse",
    deps=["mcap_episodes"],
    tags={"dyna/stage": "review"},
    op_tags=k8s.INGEST,
    description="Episodes with quality verdict 'review' and no reviewer's verdict yet, with their reasons; "
    "decide with `dyna review set EPISODE_ID accept|reject --by NAME`.",
)
def review_pool(context: AssetExecutionContext, ingest: IngestResource):
    pool = ingest.stores().registry.review_pool()
    by_reason = Counter(x["check"] for r in pool for x in r["quality_reasons"])
    lines = ["| episode | batch | smoothness | sensor health | task | reasons |", "|---|---|---|---|---|---|"]
    for r in pool[:200]:
        reasons = "; ".join(f"{x['check']}: {x['detail']}" for x in r["quality_reasons"]).replace("|", "/")
        lines.append(
            f"| {r['episode_id']} | {r['batch_key']} | {r['smoothness_score']} | "
            f"{r['sensor_health_score']} | {r['task_score']} | {reasons} |"
        )
    context.log.info(f"{len(pool)} episode(s) waiting for review")
    return MaterializeResult(
        metadata={
            "episodes": len(pool),
            "by_reason": MetadataValue.json(dict(sorted(by_reason.items()))),
            "pool": MetadataValue.md(
                "\n".join(lines) + (f"\n\n… and {len(pool) - 200} more" if len(pool) > 200 else "")
            ),
        }
    )
