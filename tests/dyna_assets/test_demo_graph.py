"""The demo path: raw_episodes -> mcap_episodes materialized on a real (ephemeral) Dagster instance."""

import json

from dagster import DagsterInstance, materialize

from dyna_assets.definitions import defs
from dyna_resources.faces import HomeResource, TranscodeResource


def _meta(result, node):
    md = result.asset_materializations_for_node(node)[0].metadata
    return {k: getattr(v, "value", v) for k, v in md.items()}


def test_graph_materializes_quarantines_and_skips_up_to_date(episode_factory, tmp_path):
    home = tmp_path / "home"
    landing = home / "landing"
    landing.mkdir(parents=True)
    good = [episode_factory(episode_id=f"ep-graph-{i}", seed=100 + i, duration_s=3.0) for i in range(2)]
    bad_jpeg = episode_factory(fault="corrupt_jpeg")
    truncated = episode_factory(fault="truncated")
    for g in [*good, bad_jpeg, truncated]:
        (landing / g.path.name).write_bytes(g.path.read_bytes())

    assets = [defs.get_assets_def(k) for k in ("raw_episodes", "mcap_episodes")]
    resources = {"home": HomeResource(root=str(home)), "transcode": TranscodeResource(workers=2)}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(assets, instance=instance, resources=resources)
        assert result.success
        raw = _meta(result, "raw_episodes")
        assert raw["episodes"] == 3 and raw["rejected"] == 1  # truncated fails the pre-transform gate
        md = _meta(result, "mcap_episodes")
        assert md["episodes_transcoded"] == 2 and md["episodes_quarantined"] == 2
        assert md["bytes_out"] < md["bytes_in"] and 0 < md["compression_ratio"] < 1
        assert md["dyna/pipeline_version"] and md["dyna/schema_version"]
        reasons = {q["kind"] for q in md["quarantined"]}
        assert reasons == {"raw_format", "corrupt_frame"}
        assert sorted(p.name for p in (home / "mcap").glob("*.mcap")) == ["ep-graph-0.mcap", "ep-graph-1.mcap"]
        records = {p.name: json.loads(p.read_text()) for p in (home / "quarantine").glob("*.json")}
        assert set(records) == {bad_jpeg.path.name + ".json", truncated.path.name + ".json"}
        assert records[bad_jpeg.path.name + ".json"]["stream"].startswith("images/")

        # a second run redoes nothing that is up to date
        again = materialize(assets, instance=instance, resources=resources)
        md2 = _meta(again, "mcap_episodes")
        assert md2["episodes_transcoded"] == 0 and md2["episodes_up_to_date"] == 2
        assert len(instance.get_runs()) == 2
