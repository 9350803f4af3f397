"""The first two assets: the landing zone's raw episodes and their MCAP transcodes.

The ingest issue partitions these by ingest batch and adds the registry; for now the
whole landing zone is one materialization and staleness is read from the MCAP stamps.
"""

from dagster import AssetExecutionContext, MetadataValue, Output, asset

from dyna_resources import versions
from dyna_resources.episodes.batch import InventoryItem, inventory, transcode_batch
from dyna_resources.faces import HomeResource, TranscodeResource

VERSION_TAGS = {"dyna/schema_version": versions.SCHEMA_VERSION, "dyna/pipeline_version": versions.PIPELINE_VERSION}

@asset(code_version=versions.SCHEMA_VERSION, tags={"dyna/stage": "raw"})
def raw_episodes(context: AssetExecutionContext, home: HomeResource) -> Output[list[dict]]:
    """Inventory of the landing zone; each file passes the pre-transform gate or is marked bad."""
    items = inventory(list(home.home().landing.glob("*.h5")))
    good = [i for i in items if not i.error]
    bad = [i.error for i in items if i.error]
    return Output(
        [i.__dict__ for i in items],
        metadata={
            "episodes": len(good),
            "rejected": len(bad),
            "hours": round(sum(i.duration_s for i in good) / 3600, 4),
            "bytes": sum(i.bytes for i in items),
            "rejected_reasons": MetadataValue.json(bad),
            "landing": MetadataValue.path(str(home.home().landing)),
        },
    )

@asset(code_version=versions.PIPELINE_VERSION, tags={"dyna/stage": "mcap"})
def mcap_episodes(context: AssetExecutionContext, raw_episodes: list[dict], home: HomeResource,
                  transcode: TranscodeResource) -> Output[list[str]]:
    """H.264 MCAP per episode, topic-group chunks, version-stamped; bad episodes quarantined."""
    h = home.home()
    report = transcode_batch([InventoryItem(**d) for d in raw_episodes], h.mcap, h.quarantine,
                             settings=transcode.settings(), workers=transcode.pool_size())
    context.log.info(f"transcoded {len(report.transcoded)}, up to date {len(report.up_to_date)}, "
                     f"quarantined {len(report.quarantined)}")
    return Output(
        sorted(r["output"] for r in report.transcoded),
        metadata={
            "episodes_transcoded": len(report.transcoded),
            "episodes_up_to_date": len(report.up_to_date),
            "episodes_quarantined": len(report.quarantined),
            "hours": round(report.hours, 4),
            "bytes_in": report.bytes_in,
            "bytes_out": report.bytes_out,
            "compression_ratio": round(report.bytes_out / report.bytes_in, 4) if report.bytes_in else 0.0,
            "quarantined": MetadataValue.json(report.quarantined),
            "mcap_dir": MetadataValue.path(str(h.mcap)),
            **VERSION_TAGS,
        },
        tags=VERSION_TAGS,
    )
