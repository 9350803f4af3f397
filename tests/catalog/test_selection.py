"""A curation spec's selection fingerprint: the same rows give the same fingerprint, a change to what the
manifest carries of a chosen episode (or of its steps, for a spec by step) gives another, a change to an
episode the spec does not choose does not."""

import json

import pytest

from dyna_resources.catalog.curation import CurationSpec
from dyna_resources.catalog.selection import selection_of, selections
from dyna_resources.catalog.warehouse import Warehouse
from tests.catalog.test_curation import S, ep

BY_TASK = CurationSpec.from_mapping(
    {"name": "folds", "where": {"task": "fold_towel"}, "segments": {"length_s": 1.0, "stride_s": 1.0}}
)
BY_STEP = CurationSpec.from_mapping(
    {
        "name": "grasps",
        "where": {},
        "steps": {"where": {"step": "grasp", "outcome": "success"}, "scope": "step"},
        "segments": {"length_s": 0.5, "stride_s": 0.5},
    }
)


def ladder(outcome: str) -> str:
    return json.dumps(
        [
            {"index": 0, "name": "reach", "start_ns": 100 * S, "end_ns": 102 * S, "duration_s": 2.0, "outcome": "done"},
            {
                "index": 1,
                "name": "grasp",
                "start_ns": 102 * S,
                "end_ns": 105 * S,
                "duration_s": 3.0,
                "outcome": outcome,
            },
        ]
    )


@pytest.fixture
def wh(tmp_path):
    w = Warehouse(tmp_path / "w.duckdb")
    upsert(w, ep(1, task="fold_towel", step_ladder=ladder("success")), ep(2, step_ladder=ladder("success")), ep(3))
    yield w
    w.close()


def upsert(w: Warehouse, *rows: dict) -> None:
    upsert.position = getattr(upsert, "position", 0) + 1
    w.apply(source="test", position=str(upsert.position), deletes=[], upserts=list(rows))


def fingerprint(w, spec, **current):
    return selection_of(
        w, spec, spec_file_digest="d", schema=current.get("schema", "1.0"), pipeline=current.get("pipeline", "1.0")
    )


def test_the_fingerprint_follows_the_chosen_rows_only(wh):
    first = fingerprint(wh, BY_TASK)
    assert (first.episodes, first.stale_episodes, first.spec) == (1, 0, "d") and len(first.digest) == 16
    assert fingerprint(wh, BY_TASK) == first  # the same state, the same fingerprint
    upsert(wh, ep(3, robot_id="arm-9"))  # not chosen by the spec
    assert fingerprint(wh, BY_TASK) == first
    upsert(wh, ep(1, task="fold_towel", step_ladder=ladder("success"), pipeline_version="1.1"))  # re-transcoded
    again = fingerprint(wh, BY_TASK)
    assert again.digest != first.digest and again.episodes == 1
    assert again.stale_episodes == 1 and fingerprint(wh, BY_TASK, pipeline="1.1").stale_episodes == 0
    upsert(wh, ep(1, task="fold_towel", step_ladder=ladder("success"), status="missing"))  # its MCAP gone
    assert fingerprint(wh, BY_TASK).episodes == 0


def test_a_spec_by_step_follows_its_steps(wh):
    first = fingerprint(wh, BY_STEP)
    assert first.episodes == 3  # every episode is chosen; the steps decide the windows
    upsert(wh, ep(2, step_ladder=ladder("failure")))  # one grasp now failed: fewer windows
    assert fingerprint(wh, BY_STEP).digest != first.digest


def test_an_invalid_spec_file_is_recorded_with_its_error_beside_the_valid_ones(wh, tmp_path):
    (tmp_path / "folds.yaml").write_text(
        "name: folds\nwhere: {task: fold_towel}\nsegments: {length_s: 1.0, stride_s: 1.0}\n"
    )
    (tmp_path / "typo.yaml").write_text("name: typo\nwhere: {tsk: fold_towel}\n")
    got = selections(wh, {p.stem: p for p in tmp_path.glob("*.yaml")}, schema="1.0", pipeline="1.0")
    assert got["folds"].episodes == 1 and got["folds"].error == ""
    assert got["typo"].digest == "" and "where.tsk" in got["typo"].error
