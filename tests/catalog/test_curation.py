"""Curation specs compile to one parameterized query that yields the expected segments."""

import pytest

from dyna_resources.catalog.curation import CurationSpec, CurationSpecError, curate
from dyna_resources.catalog.warehouse import Warehouse

S = 1_000_000_000


def ep(i, **kw):
    base = {
        "episode_id": f"ep-{i}",
        "source_path": f"ep-{i}.h5",
        "batch_key": "b1",
        "status": "transcoded",
        "source_bytes": 1,
        "duration_s": 5.0,
        "task": "pick_place",
        "robot_id": "arm-1",
        "robot_model": "a1",
        "site": "sfo-lab",
        "success": True,
        "camera_dead": False,
        "start_ns": 100 * S,
        "end_ns": 105 * S,
        "n_steps": 1000,
        "mcap_path": f"/data/ep-{i}.mcap",
        "mcap_uri": f"file:///data/ep-{i}.mcap",
        "pipeline_version": "1.0",
        "schema_version": "1.0",
        "updated_at": 0.0,
        "cameras": "[]",
    }
    base.update(kw)
    base["duration_s"] = (base["end_ns"] - base["start_ns"]) / S
    return base


@pytest.fixture
def wh(tmp_path):
    w = Warehouse(tmp_path / "w.duckdb")
    w.apply(
        source="test",
        position="1",
        deletes=[],
        upserts=[
            ep(1),
            ep(2, task="fold_towel"),
            ep(3, success=False),
            ep(4, camera_dead=None),  # unknown flag
            ep(5, camera_dead=True),
            ep(6, status="quarantined"),
            ep(7, end_ns=101 * S),  # shorter than a segment
            ep(8, site="nyc-lab", task="o'hare'); DROP TABLE episodes; --"),
        ],
    )
    yield w
    w.close()


def test_spec_selects_the_expected_segments_in_a_deterministic_order(wh):
    spec = CurationSpec.from_mapping(
        {
            "name": "pp-real",
            "where": {
                "task": {"in": ["pick_place", "fold_towel"]},
                "success": True,
                "camera_dead": {"!=": True},
                "site": {"like": "sfo-%"},
            },
            "segments": {"length_s": 2.0, "stride_s": 1.5},
            "weights": {"by": "task", "values": {"fold_towel": 3.0}},
        }
    )
    rows = curate(wh, spec).read_all().to_pylist()
    # 5 s episodes, 2 s segments every 1.5 s: starts at 0, 1.5, 3.0 -> 3 segments each
    assert [(r["episode_id"], (r["start_ns"] - 100 * S) / S) for r in rows] == [
        (e, t) for e in ("ep-1", "ep-2", "ep-4") for t in (0.0, 1.5, 3.0)
    ]
    assert all(r["end_ns"] - r["start_ns"] == 2 * S and r["n_steps"] == 400 for r in rows)
    assert {r["episode_id"]: r["weight"] for r in rows} == {"ep-1": 1.0, "ep-2": 3.0, "ep-4": 1.0}
    assert rows[0]["uri"] == "file:///data/ep-1.mcap"
    assert curate(wh, spec).read_all().to_pylist() == rows


def test_few_valued_columns_leave_as_dictionaries_and_text_as_large_strings(wh):
    import pyarrow as pa

    t = curate(wh, CurationSpec.from_mapping({"name": "all"})).read_all()
    assert pa.types.is_dictionary(t.schema.field("task").type)
    assert t.schema.field("uri").type == pa.large_string()
    assert sorted(set(t.column("task").to_pylist())) == [
        "fold_towel",
        "o'hare'); DROP TABLE episodes; --",
        "pick_place",
    ]


def test_manifest_bytes_depend_on_its_rows_only(wh, tmp_path):
    """Dictionaries hold the chosen rows' values: a new task elsewhere in the warehouse
    leaves the manifest, and its hash (the DataVersion), unchanged."""
    from dyna_resources.catalog.manifest import write_manifest

    spec = CurationSpec.from_mapping({"name": "pp", "where": {"task": "pick_place"}})
    before = write_manifest(curate(wh, spec), tmp_path / "a", "pp")
    wh.apply(source="test", position="2", deletes=[], upserts=[ep(9, task="brand_new_task", site="zzz")])
    after = write_manifest(curate(wh, spec), tmp_path / "b", "pp")
    assert after.rows == before.rows > 0 and after.sha256 == before.sha256
    t = curate(wh, spec).read_all()
    assert t.column("task").chunk(0).dictionary.to_pylist() == ["pick_place"]


def test_a_spec_that_selects_nothing_gives_an_empty_manifest(wh, tmp_path):
    from dyna_resources.catalog.manifest import write_manifest

    spec = CurationSpec.from_mapping({"name": "none", "where": {"site": "mars-base"}})
    info = write_manifest(curate(wh, spec), tmp_path, "none", count_by=("task",))
    assert info.rows == 0 and info.stats["by_task"] == {} and info.stats["episodes"] == 0
    from trainer.manifest_loader import open_manifest, rank_slice

    t = open_manifest(info.arrow)
    assert t.num_rows == 0 and [rank_slice(t, r, 4).num_rows for r in range(4)] == [0, 0, 0, 0]


def test_values_are_bound_never_spliced(wh):
    spec = CurationSpec.from_mapping({"name": "evil", "where": {"task": "o'hare'); DROP TABLE episodes; --"}})
    sql, params = spec.compile()
    assert "DROP" not in sql and "o'hare" in params["w0"]
    assert [r["episode_id"] for r in curate(wh, spec).read_all().to_pylist()] == ["ep-8", "ep-8"]
    assert wh.count() == 8


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"name": "x", "where": {"tsk": "a"}}, "where.tsk"),
        ({"name": "x", "where": {"task": {"~": "a"}}}, "where.task"),
        ({"name": "x", "where": {"task": {"in": "a"}}}, "where.task"),
        ({"name": "x", "where": {"task; DROP TABLE episodes": "a"}}, "where.task; DROP TABLE episodes"),
        ({"name": "x", "where": {"success": None}}, "where.success"),
        ({"name": "x", "segments": {"length_s": -1}}, "segments.length_s"),
        ({"name": "x", "weights": {"by": "nope"}}, "weights.by"),
        ({"name": "x", "weights": {"by": "task", "values": {"a": "heavy"}}}, "weights.values.a"),
        ({"name": "../etc"}, "name"),
        ({"name": "a..b"}, "name"),
        ({"name": "x\n"}, "name"),  # "$" in a regex matches before a trailing newline
        ({"name": "x", "filters": {}}, "filters"),
    ],
)
def test_bad_specs_are_rejected_naming_the_field(spec, field):
    with pytest.raises(CurationSpecError) as e:
        CurationSpec.from_mapping(spec)
    assert e.value.field == field and field in str(e.value)
