"""Gate results of a stage turned into Dagster asset-check results (one check per enabled gate)."""

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, MetadataValue

from dyna_resources.ingest.batches import GateTally, StageReport
from dyna_resources.ingest.gates import GATE_DOCS, GateConfig


def gate_check_specs(asset: str, gates: tuple[str, ...]) -> list[AssetCheckSpec]:
    # Blocking at the batch level only: one bad episode is quarantined and the batch goes on;
    # a gate set to block fails with ERROR (and stops downstream) when too many episodes fail it.
    # Not partition-aware: Dagster 1.13's partitioned checks (a preview) cannot take a result per
    # partition from a ranged backfill run and mark every batch of the range SKIPPED. A check
    # result covers the batches of its run (listed in its metadata); each batch's own gate
    # counts are in its materialization metadata and each episode's results in the registry.
    return [AssetCheckSpec(g, asset=asset, blocking=True, description=GATE_DOCS[g]) for g in gates]


def gate_check_results(asset: str, stage: str, reports: list[StageReport], config: GateConfig):
    for gate in config.enabled(stage):
        total = GateTally()
        for rep in reports:
            t = rep.gates.get(gate)
            if t:
                total.evaluated += t.evaluated
                total.failed += t.failed
                total.failures += t.failures[: max(0, 20 - len(total.failures))]
        setting = config[gate]
        fraction = total.failed / total.evaluated if total.evaluated else 0.0
        blocks = setting.blocking and fraction > setting.max_failed_fraction
        keys = [r.batch_key for r in reports]
        where = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        if not total.evaluated:
            verdict = "nothing to check in this run (its episodes were up to date)"
        else:
            verdict = f"{total.failed} of {total.evaluated} episodes failed ({setting.action})"
        # Dagster labels every one of these checks "blocking": a failed ERROR result stops what is downstream.
        # Whether this gate's failures ever do is its setting, said in words beside the label.
        stops = (
            f"stops downstream above {setting.max_failed_fraction:.0%} failed"
            if setting.blocking
            else "never stops downstream"
        )
        yield AssetCheckResult(
            asset_key=asset,
            check_name=gate,
            passed=total.failed == 0,
            severity=AssetCheckSeverity.WARN if total.failed and not blocks else AssetCheckSeverity.ERROR,
            description=f"{where}: {verdict}; " + ("over the limit, downstream stopped" if blocks else stops),
            metadata={
                "evaluated": total.evaluated,
                "failed": total.failed,
                "failed_fraction": round(fraction, 4),
                "action": setting.action,
                "stops_downstream_over_limit": setting.blocking,
                "max_failed_fraction": setting.max_failed_fraction,
                "params": MetadataValue.json(dict(setting.params)),
                "partitions": MetadataValue.json([r.batch_key for r in reports]),
                "failures": MetadataValue.json(total.failures),
            },
        )
