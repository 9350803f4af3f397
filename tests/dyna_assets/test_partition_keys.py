"""Every partitioned asset of the graph refuses a partition key that is not a safe identifier.

Anyone with access to the Dagster API can add a dynamic partition (the sensors that normally add
them filter names, the API does not), so each test adds its hostile keys through
``instance.add_dynamic_partitions`` as such a caller would, then materializes the asset from the
project's own definitions and resources on an ephemeral instance. The run must fail naming the
key, and nothing may appear outside ``$DYNA_HOME``: a curation key such as ``../../elsewhere/x``
used to make ``manifests`` read ``elsewhere/x.yaml`` and write ``x.parquet``/``.arrow``/``.json``
beside it.
"""

from pathlib import Path

import pytest
from dagster import AssetChecksDefinition, AssetSelection, DagsterInstance, materialize

from dyna_assets.definitions import build_definitions, defs
from dyna_resources.catalog.warehouse import Warehouse
from dyna_resources.keys import MAX_KEY_LENGTH, UnsafeKeyError, check_key


def project_assets() -> dict:
    """The graph's assets with the project's resources bound, loaded from the environment as the webserver
    and daemon load them (so after ``world`` has set ``DYNA_HOME``)."""
    return {a.node_def.name: a for a in build_definitions().resolve_asset_graph().assets_defs}


# the graph's shape (which assets are partitioned, and how) does not depend on the environment
PARTITIONED = sorted(
    (a for a in defs.resolve_asset_graph().assets_defs if a.partitions_def is not None), key=lambda a: a.node_def.name
)
EXPECTED = {
    "raw_episodes",
    "mcap_episodes",
    "step_ladders",
    "training_streams",
    "manifests",
    "datasets",
    "cache_sets",
    "mcap_replica",
    "checkpoints",
    "evaluations",
    "released_models",
}
HOSTILE = [
    "..",
    "../../elsewhere/x",
    "{elsewhere}/x",
    "{escape}",
    "/../../../../elsewhere/x",
    "a/b",
    "a\x00b",
    "",
    ".hidden",
    "a\\b",
    "x" * (MAX_KEY_LENGTH + 1),
    "spec\n",
    "a..b",
    "sp ec",
]


def escape_key(home: Path, elsewhere: Path) -> str:
    """The issue's key shape, ``/../../../../elsewhere/x``, aimed at the folder beside the home: as a spec
    path (``<curation>/<key>.yaml``, absolute) and as a manifest path (``<manifests>/.<key>.*``, enough
    ``..`` to reach the root) it names ``<elsewhere>/x`` both times, so the old asset read that spec
    and wrote ``x.parquet``, ``x.arrow`` and ``x.json`` beside it."""
    return "/" + "../" * len(home.parts) + str(elsewhere / "x").lstrip("/")


def hostile(raw: str, home: Path, elsewhere: Path) -> str:
    return raw.replace("{elsewhere}", str(elsewhere)).replace("{escape}", escape_key(home, elsewhere))


def test_the_graph_has_the_partitioned_assets_this_file_covers():
    assert {a.node_def.name for a in PARTITIONED} >= EXPECTED


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A home with an (empty) warehouse, and beside it a folder the keys aim at, holding a valid spec."""
    for var in (
        "DYNA_ENV",
        "DYNA_REGISTRY_URL",
        "DYNA_MANIFEST_STORE",
        "DYNA_WAREHOUSE_PATH",
        "DYNA_CACHE_DIR",
        "DYNA_CHECKPOINT_STORE",
        "DYNA_REPLICA_STORE",
        "DYNA_MODEL_STORE",
    ):
        monkeypatch.delenv(var, raising=False)
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "curation").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "x.yaml").write_text("name: x\n")
    Warehouse(home / "warehouse.duckdb").close()
    monkeypatch.setenv("DYNA_HOME", str(home))
    return tmp_path, home, elsewhere, project_assets()


def outside(tmp_path: Path, home: Path) -> dict:
    """Every file under ``tmp_path`` but outside the home, with its size and mtime."""
    return {
        str(p.relative_to(tmp_path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in tmp_path.rglob("*")
        if p.is_file() and home not in p.parents
    }


def _runnable(shape, assets: dict) -> tuple[str, list, AssetSelection | None]:
    """(the name its failures give, what to materialize, the selection) for the asset or check ``shape``
    names, taken from ``assets``: a partitioned asset check runs beside its asset, selected alone."""
    asset = assets[shape.node_def.name]
    if isinstance(asset, AssetChecksDefinition):
        (key,) = asset.check_keys
        return (
            f"{key.asset_key.to_user_string()}.{key.name}",
            [assets[key.asset_key.path[-1]], asset],
            AssetSelection.checks(asset),
        )
    return asset.node_def.name, [asset], None


def failures(result) -> list:
    return [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]


@pytest.mark.parametrize("asset", PARTITIONED, ids=lambda a: a.node_def.name)
def test_every_partitioned_asset_refuses_unsafe_keys(world, asset):
    tmp_path, home, elsewhere, assets = world
    before = outside(tmp_path, home)
    name, nodes, selection = _runnable(asset, assets)
    with DagsterInstance.ephemeral() as instance:
        for raw in HOSTILE:
            key = hostile(raw, home, elsewhere)
            instance.add_dynamic_partitions(asset.partitions_def.name, [key])
            # the tag, not materialize(partition_key=...), which takes "" for "no partition"
            result = materialize(
                nodes, instance=instance, raise_on_error=False, selection=selection, tags={"dagster/partition": key}
            )
            assert not result.success, (name, key)
            (failure,) = failures(result)
            error = failure.step_failure_data.error
            message = str(error)
            assert error.cls_name == "Failure", (name, key, message)
            assert f"{name}: " in message and " refused: " in message, (name, key, message)
            assert repr(key)[:60] in message, (name, key, message)
            assert failure.step_failure_data.user_failure_data.metadata["partition_key"].value == repr(key)
            assert not result.get_asset_materialization_events(), (name, key)
    assert outside(tmp_path, home) == before
    assert not Path("/elsewhere").exists()


def test_manifests_no_longer_reads_or_writes_outside_the_home(world):
    """The issue's reproduction: the spec beside the home is not read, no manifest lands beside it."""
    tmp_path, home, elsewhere, assets = world
    with DagsterInstance.ephemeral() as instance:
        for key in (escape_key(home, elsewhere), "../../elsewhere/x", f"{elsewhere}/x"):
            instance.add_dynamic_partitions("curation_specs", [key])
            result = materialize([assets["manifests"]], instance=instance, partition_key=key, raise_on_error=False)
            (failure,) = failures(result)
            assert "contains a path separator" in str(failure.step_failure_data.error)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["x.yaml"]
    assert not list(tmp_path.rglob("x.parquet")) and not list(tmp_path.rglob("x.arrow"))


INGEST_PARTITIONED = [a for a in PARTITIONED if a.partitions_def.name == "ingest_partitions"]


def test_the_ingest_assets_are_partitioned_by_ingest_partition():
    # mcaps_present: the partition's check that its MCAPs are in the store; versions_current: that its
    # episodes are at the current versions (asset checks, partitioned too)
    assert sorted(a.node_def.name for a in INGEST_PARTITIONED) == [
        "mcap_episodes",
        "mcap_episodes_mcaps_present",
        "mcap_episodes_versions_current",
        "raw_episodes",
        "step_ladders",
        "training_streams",
    ]


@pytest.mark.parametrize("asset", INGEST_PARTITIONED, ids=lambda a: a.node_def.name)
def test_a_ranged_backfill_run_with_one_unsafe_key_uses_none_of_them(world, asset):
    """Backfills of ingest partitions run ranges of keys: one unsafe key refuses the run before any partition."""
    good, bad = "20261129-000001", "20261129-000002/../../x"
    _, nodes, selection = _runnable(asset, world[3])
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ingest_partitions", [good, bad])
        result = materialize(
            nodes,
            instance=instance,
            raise_on_error=False,
            selection=selection,
            tags={"dagster/asset_partition_range_start": good, "dagster/asset_partition_range_end": bad},
        )
        (failure,) = failures(result)
        assert repr(bad) in str(failure.step_failure_data.error)
        assert not result.get_asset_materialization_events()


@pytest.mark.parametrize("asset", INGEST_PARTITIONED, ids=lambda a: a.node_def.name)
def test_a_safe_key_the_registry_never_sealed_fails_by_name_without_retries(world, asset):
    """What Dagster's "Add a partition" lets anyone type: a well-formed key that is no ingest partition."""
    _, nodes, selection = _runnable(asset, world[3])
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ingest_partitions", ["mybatch"])
        result = materialize(
            nodes, instance=instance, raise_on_error=False, selection=selection, tags={"dagster/partition": "mybatch"}
        )
        (failure,) = failures(result)
        error = str(failure.step_failure_data.error)
        assert "no ingest partition 'mybatch' in the registry" in error and "landing sensor" in error
        assert "KeyError" not in error
        assert not result.get_asset_materialization_events()


def test_safe_keys_still_build(world):
    """The keys the sensors make (batch keys, spec file stems) pass, and such a spec builds its manifest."""
    _, home, _, assets = world
    for key in ("20261129-000123", "20261129T14-000123", "pick-place.real_v2", "a" * MAX_KEY_LENGTH):
        assert check_key(key) == key
    (home / "curation" / "pick-place.real_v2.yaml").write_text("name: pick-place.real_v2\n")
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["pick-place.real_v2"])
        result = materialize([assets["manifests"]], instance=instance, partition_key="pick-place.real_v2")
        assert result.success
    assert (home / "manifests" / "pick-place.real_v2.arrow").is_file()


@pytest.mark.parametrize(
    "key, reason",
    [
        ("..", "contains '..'"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("a\x00b", "NUL"),
        ("", "empty"),
        (".hidden", "starts with '.'"),
        ("x" * (MAX_KEY_LENGTH + 1), "more than 128"),
        ("spec\n", "'\\n'"),
        ("-x", "start with a letter or digit"),
        ("é", "'é'"),
        (7, "not a string"),
    ],
)
def test_check_key_names_the_reason(key, reason):
    with pytest.raises(UnsafeKeyError) as e:
        check_key(key, "ingest batch")
    assert reason in str(e.value) and str(e.value).startswith("ingest batch ")


@pytest.mark.parametrize(
    "asset, config, what",
    [
        ("evaluations", {"heldout_manifest": "../../elsewhere/x"}, "held-out manifest name"),
        ("released_models", {"name": "../../elsewhere/x"}, "release name"),
    ],
)
def test_names_from_run_config_are_checked_like_keys(world, asset, config, what):
    """Run config is API input too: a manifest or release name that would become a path is refused first."""
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["spec-ok"])
        result = materialize(
            [world[3][asset]],
            instance=instance,
            partition_key="spec-ok",
            raise_on_error=False,
            run_config={"ops": {asset: {"config": config}}},
        )
        (failure,) = failures(result)
        assert f"{what} '../../elsewhere/x' refused: contains a path separator" in str(failure.step_failure_data.error)
