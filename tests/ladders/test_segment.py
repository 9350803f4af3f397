"""The step-ladder segmenter against the sample fleet's scripted procedures (ground truth from the
task scripts), its configuration, and its failure paths."""

import dataclasses
import io
import itertools

import numpy as np
import pytest
from PIL import Image

from dyna_resources.episodes.raw_format import SampleStream
from dyna_resources.episodes.sim.robot import ScriptedArm
from dyna_resources.ladders.config import LadderConfig, LadderConfigError
from dyna_resources.ladders.picture import ladder_png
from dyna_resources.ladders.segment import (
    AFTER_FAILURE,
    FAILURE,
    INCOMPLETE,
    SUCCESS,
    LadderError,
    Step,
    failed_step,
    register_segmenter,
    segment,
    signals_of,
)

TASKS = ["pick_place", "fold_towel", "open_drawer", "wipe_table"]
TOLERANCE_S = 0.25  # measured over 192 scripted episodes: mean 33 ms, p99 136 ms, max 176 ms
CONFIG = LadderConfig.from_mapping(None)


def _arm(task, success, seed, duration_s=11.0, model="dyna-a1") -> ScriptedArm:
    return ScriptedArm(seed=seed, task=task, robot_model=model, success=success, duration_s=duration_s)


def _ladder(arm: ScriptedArm, config=CONFIG) -> list[Step]:
    return segment(arm.streams(0), 0, int(arm.duration_s * 1e9), arm.script.task, config)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("success", [True, False])
@pytest.mark.parametrize("seed,model,duration_s", [(3, "dyna-a1", 8.0), (11, "dyna-a2", 14.0)])
def test_recovers_the_scripted_steps(task, success, seed, model, duration_s):
    arm = _arm(task, success, seed, duration_s, model)
    truth = arm.scripted_steps()
    steps = _ladder(arm)
    assert [s.name for s in steps] == [g["name"] for g in truth]
    for s, g in zip(steps, truth):
        assert abs(s.start_ns / 1e9 - g["start_s"]) < TOLERANCE_S, (s, g)
        assert abs(s.end_ns / 1e9 - g["end_s"]) < TOLERANCE_S, (s, g)
    assert steps[0].start_ns == 0 and steps[-1].end_ns == int(duration_s * 1e9)
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(steps))  # no gaps, no overlaps
    failed = failed_step(steps)
    truth_failed = next((i for i, g in enumerate(truth) if g["failed"]), None)
    assert (failed.index if failed else None) == truth_failed
    if failed is not None:
        assert failed.failure_mode == arm.script.failure_mode  # miss or slip, as scripted
        assert all(s.outcome == AFTER_FAILURE for s in steps[failed.index + 1 :])
        if failed.failure_mode == "slip":  # the hold was lost during the step, not at its edge
            assert failed.start_ns < failed.failed_at_ns < failed.end_ns
    else:
        assert all(s.outcome == SUCCESS for s in steps if s.name in ("grasp", "transport", "fold", "pull", "wipe"))


def _two_object_seed() -> int:
    for seed in range(100):
        if len(_arm("pick_place", True, seed, 15.0).script.objects) == 2:
            return seed
    raise AssertionError("no two-object pick-and-place in 100 seeds")


def test_a_repeating_procedure_runs_one_cycle_per_object():
    arm = _arm("pick_place", True, _two_object_seed(), 15.0)
    names = [s.name for s in _ladder(arm)]
    assert names == ["reach", "grasp", "transport", "release"] * 2 + ["return"]


def test_an_episode_cut_short_ends_with_an_incomplete_step():
    arm = _arm("fold_towel", True, 5, 11.0)
    fold = next(g for g in arm.scripted_steps() if g["name"] == "fold")
    cut = int((fold["start_s"] + 0.5) * 1e9)
    streams = {
        k: dataclasses.replace(
            s,
            timestamps_ns=s.timestamps_ns[s.timestamps_ns <= cut],
            fields={f: v[s.timestamps_ns <= cut] for f, v in s.fields.items()},
        )
        for k, s in arm.streams(0).items()
    }
    steps = segment(streams, 0, cut, "fold_towel", CONFIG)
    assert [s.name for s in steps] == ["reach", "grasp", "fold"]
    assert steps[-1].outcome == INCOMPLETE and steps[-1].end_ns == cut


def test_task_without_procedure_and_missing_signals_are_named():
    arm = _arm("pick_place", True, 1, 8.0)
    streams = arm.streams(0)
    with pytest.raises(LadderError, match="no procedure for task 'juggle'"):
        segment(streams, 0, 8 * 10**9, "juggle", CONFIG)
    with pytest.raises(LadderError, match="ee_pose"):
        segment({k: v for k, v in streams.items() if k != "ee_pose"}, 0, 8 * 10**9, "pick_place", CONFIG)
    relabelled = dict(streams, action=dataclasses.replace(streams["action"], labels={"command": ["a"] * 9}))
    with pytest.raises(LadderError, match="gripper_cmd"):
        segment(relabelled, 0, 8 * 10**9, "pick_place", CONFIG)


def test_without_an_effort_signal_the_opening_decides_the_hold():
    arm = _arm("pick_place", False, 2, 11.0)  # seed 2 fails; either a miss or a slip
    config = LadderConfig.from_mapping({"signals": {"gripper_effort": None}})
    truth = arm.scripted_steps()
    steps = _ladder(arm, config)
    assert [s.name for s in steps] == [g["name"] for g in truth]
    assert failed_step(steps).index == next(i for i, g in enumerate(truth) if g["failed"])


@pytest.mark.parametrize(
    "data,field",
    [
        ({"thresholds": {"pause_speed": 0.1}}, "thresholds.pause_speed"),
        ({"thresholds": {"min_pause_s": -1}}, "thresholds.min_pause_s"),
        (
            {"procedures": {"x": {"cycle": [{"step": "a", "ends_at": "gripper_closes"}]}}},
            "procedures.x.cycle[0].ends_at",
        ),
        (
            {"procedures": {"x": {"cycle": [{"step": "a", "ends_at": "grip_open", "check": "vibes"}]}}},
            "procedures.x.cycle[0].check",
        ),
        ({"procedures": {"x": {"cycle": []}}}, "procedures.x.cycle"),
        ({"segmenter": "learned-v9"}, "segmenter"),
        ({"signals": {"gripper_effort": {"stream": "joint_states"}}}, "signals.gripper_effort"),
        ({"colour": "red"}, "unknown field"),
    ],
)
def test_bad_configuration_names_the_field(data, field):
    with pytest.raises(LadderConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        LadderConfig.from_mapping(data)


def test_version_follows_the_configuration(tmp_path):
    assert LadderConfig.from_mapping(None).version == LadderConfig.load(tmp_path / "absent.yaml").version
    changed = LadderConfig.from_mapping({"thresholds": {"min_pause_s": 0.2}})
    assert changed.version != CONFIG.version and changed.version.startswith("heuristic-1.")
    path = tmp_path / "step_ladders.yaml"
    path.write_text(
        "procedures:\n  pick_place:\n    cycle:\n      - {step: approach, ends_at: grip_close}\n"
        "      - {step: hold, ends_at: grip_open, check: kept_hold, failure_mode: dropped}\n"
        "    final: rest\n"
    )
    custom = LadderConfig.load(path)
    steps = _ladder(_arm("pick_place", True, 3, 8.0), custom)
    assert [s.name for s in steps] == ["approach", "hold", "rest"]
    assert steps[1].outcome == SUCCESS


def test_a_registered_segmenter_is_used_when_configured():
    def halves(streams, start, end, procedure, config):
        mid = (start + end) // 2
        return [Step(0, procedure.cycle[0].step, start, mid, SUCCESS), Step(1, "rest", mid, end, FAILURE, "tired")]

    register_segmenter("halves", halves)
    steps = segment({}, 0, 10, "pick_place", LadderConfig.from_mapping({"segmenter": "halves"}))
    assert [(s.name, s.outcome) for s in steps] == [("reach", SUCCESS), ("rest", FAILURE)]


def test_ladder_picture_is_a_png_of_the_episode():
    arm = _arm("open_drawer", False, 4, 10.0)
    streams = arm.streams(0)
    png = ladder_png(_ladder(arm), signals_of(streams, CONFIG), CONFIG, title="ep (open_drawer)")
    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG" and img.size == (640, 416)
    assert np.asarray(img.convert("RGB")).std() > 10  # not a blank canvas


def test_one_bad_sample_does_not_split_a_pause():
    """Sensor noise on one end-effector sample must not invent a motion start inside a pause."""
    arm = _arm("pick_place", True, 3, 8.0)
    streams = arm.streams(0)
    grasp = next(s for s in _ladder(arm) if s.name == "grasp")
    ee = streams["ee_pose"]
    t = ee.timestamps_ns
    i = int(np.searchsorted(t, (grasp.start_ns + grasp.end_ns) // 2))
    pose = np.array(ee.fields["pose"])
    pose[i, 0] += 0.003  # a 3 mm glitch: 0.03 m/s over the speed window, above the pause threshold
    streams["ee_pose"] = SampleStream("ee_pose", t, {"pose": pose}, ee.labels)
    steps = segment(streams, 0, 8 * 10**9, "pick_place", CONFIG)
    assert [s.name for s in steps] == [s.name for s in _ladder(arm)]
    assert abs(steps[1].end_ns - grasp.end_ns) < 0.05e9
    assert CONFIG.thresholds["pause_speed_m_s"] < 0.003 / CONFIG.thresholds["speed_window_s"]
