"""Curation spec mistakes that used to surface from inside DuckDB (a ``ConversionException``
naming ``$w0``, "Lists larger than 2^32") are refused before the query runs, naming the field,
the value and what was expected; through the ``manifests`` asset on an ephemeral instance, with
the spec in a real file and a real warehouse."""

import pytest
from dagster import DagsterInstance, materialize

from dyna_assets.curation.assets import manifests
from dyna_resources.catalog.curation import MAX_SEGMENTS_PER_EPISODE, CurationSpec, CurationSpecError
from dyna_resources.catalog.warehouse import Warehouse
from dyna_resources.resources import HomeResource, WarehouseResource

S = 1_000_000_000


def episode(i: int, seconds: float = 5.0, **kw) -> dict:
    row = {
        "episode_id": f"ep-{i}",
        "source_path": f"ep-{i}.h5",
        "batch_key": "b1",
        "status": "transcoded",
        "source_bytes": 1,
        "duration_s": seconds,
        "task": "pick_place",
        "robot_id": "arm-1",
        "robot_model": "a1",
        "site": "sfo-lab",
        "success": True,
        "sim": False,
        "start_ns": 100 * S,
        "end_ns": 100 * S + int(seconds * S),
        "n_steps": int(seconds * 50),
        "mcap_path": f"/data/ep-{i}.mcap",
        "mcap_uri": f"file:///data/ep-{i}.mcap",
        "pipeline_version": "1.0",
        "schema_version": "1.0",
        "updated_at": 0.0,
        "cameras": "[]",
    }
    row.update(kw)
    return row


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / "curation").mkdir(parents=True)
    wh = Warehouse(home / "warehouse.duckdb")
    # ep-2 spans 20,000 s: 2,000,001 segments of 1 s every 10 ms
    wh.apply(source="test", position="1", deletes=[], upserts=[episode(1), episode(2, seconds=20_000.0)])
    wh.close()
    return home


def build(home, spec_yaml: str):
    """Materialize the ``manifests`` partition of ``spec_yaml`` (written to curation/s.yaml)."""
    (home / "curation" / "s.yaml").write_text(spec_yaml)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("curation_specs", ["s"])
        return materialize(
            [manifests],
            instance=instance,
            partition_key="s",
            raise_on_error=False,
            resources={
                "home": HomeResource(root=str(home)),
                "warehouse": WarehouseResource(home=HomeResource(root=str(home))),
            },
        )


def refusal(home, spec_yaml: str) -> str:
    result = build(home, spec_yaml)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.step_failure_data.error
    assert error.cls_name == "Failure", str(error)  # a CurationSpecError, not an exception from DuckDB
    assert not list((home / "manifests").glob("s.*"))
    return str(error)


TYPE_MISMATCHES = [
    # (spec, field, value as shown, expected)
    (
        "where: {duration_s: {'>=': four}}",
        "where.duration_s",
        "'four' (str)",
        "expected a number (duration_s is DOUBLE)",
    ),
    ("where: {robot_id: 7}", "where.robot_id", "7 (int)", "expected text (robot_id is VARCHAR)"),
    ("where: {pipeline_version: 1.0}", "where.pipeline_version", "1.0 (float)", "quote it in YAML: '1.0'"),
    ("where: {success: 'yes'}", "where.success", "'yes' (str)", "expected true or false (success is BOOLEAN)"),
    ("where: {n_steps: {in: [100, many]}}", "where.n_steps", "'many' (str)", "in item 1: expected an integer"),
    ("where: {duration_s: {like: '4%'}}", "where.duration_s", "", "like applies to text columns; duration_s is DOUBLE"),
    ("where: {duration_s: {'>': .nan}}", "where.duration_s", "nan (float)", "expected a number"),
    ("steps: {where: {step_index: {'>': two}}}", "steps.where.step_index", "'two' (str)", "step_index is INTEGER"),
    (
        "weights: {by: pipeline_version, values: {1.0: 2.0}}",
        "weights.values.1.0",
        "1.0 (float)",
        "a key: expected text",
    ),
]


@pytest.mark.parametrize("where, field, value, expected", TYPE_MISMATCHES, ids=[t[1] for t in TYPE_MISMATCHES])
def test_type_mismatches_name_the_field_value_and_type(home, where, field, value, expected):
    message = refusal(home, f"name: s\n{where}\n")
    assert f"{home / 'curation' / 's.yaml'}: {field}: " in message
    assert value in message and expected in message
    assert "$w" not in message and "$s" not in message and "Conversion" not in message


def test_type_mismatches_are_found_when_the_spec_is_loaded(tmp_path):
    """No warehouse, no query: the file alone is refused."""
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nwhere: {duration_s: {'>=': four}}\n")
    with pytest.raises(CurationSpecError) as e:
        CurationSpec.load(path)
    assert e.value.field == "where.duration_s"


BOUNDS = [
    ("segments: {length_s: 2.0, stride_s: 1e-9}", "segments.stride_s", "1e-09 s is out of bounds: from 0.001 s"),
    ("segments: {length_s: 2.0, stride_s: 1.0e-9}", "segments.stride_s", "1e-09 s is out of bounds"),
    ("segments: {length_s: 1e-6}", "segments.length_s", "1e-06 s is out of bounds"),
    ("segments: {length_s: 1e6, stride_s: 1.0}", "segments.length_s", "to 86400 s (a day)"),
    ("segments: {length_s: .inf}", "segments.length_s", "inf s is out of bounds"),
    ("segments: {length_s: 2.0, stride_s: .nan}", "segments.stride_s", "must be a positive number, got nan"),
    ("weights: {default: .inf}", "weights.default", "from 0 to 1e+06, got inf"),
    ("weights: {by: task, values: {pick_place: .nan}}", "weights.values.pick_place", "got nan"),
]


@pytest.mark.parametrize("spec, field, reason", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_numeric_fields_are_bounded_naming_the_field_and_the_bound(home, spec, field, reason):
    message = refusal(home, f"name: s\n{spec}\n")
    assert f": {field}: " in message and reason in message
    assert "2^32" not in message


def test_segments_per_episode_are_bounded_before_the_manifest_query(home):
    """A legal stride on a very long episode: refused naming the episode and the bound; excluding
    that episode, as the message suggests, builds the manifest."""
    message = refusal(home, "name: s\nsegments: {length_s: 1.0, stride_s: 0.01}\n")
    assert ": segments.stride_s: episode ep-2 would give 1,999,901 segments" in message
    assert f"more than the {MAX_SEGMENTS_PER_EPISODE:,} per episode allowed" in message
    result = build(home, "name: s\nwhere: {duration_s: {'<=': 3600}}\nsegments: {length_s: 1.0, stride_s: 0.01}\n")
    assert result.success
    (m,) = result.asset_materializations_for_node("manifests")
    assert m.metadata["rows"].value == 401 and m.metadata["episodes"].value == 1  # ep-1: 5 s, 1 s every 10 ms
