"""The encoder cost model on hand-made points: front, pick, floors and bad input."""

from __future__ import annotations

import math

import pytest

from dyna_resources.episodes.encode_cost import (
    GIB,
    CostModel,
    EncodePoint,
    cheapest,
    cost_per_episode_hour,
    episode_hours_per_core_hour,
    pareto_front,
)

FLOOR = 35.0


def point(
    preset: str, bytes_per_frame: float, cpu_ms: float, psnr: float = 36.0, crf: float = 21.0, options: str = ""
) -> EncodePoint:
    return EncodePoint(
        preset=preset,
        crf=crf,
        options=options,
        bytes_per_frame=bytes_per_frame,
        psnr_db=psnr,
        cpu_s_per_frame=cpu_ms / 1e3,
    )


SLOWER = point("slower", 15_000, 52.0)
MEDIUM = point("medium", 17_500, 20.0)
VERYFAST = point("veryfast", 22_000, 6.0)
DOMINATED = point("fast", 18_000, 25.0)  # MEDIUM is smaller and faster
UNDER_FLOOR = point("ultrafast", 9_000, 2.0, psnr=33.0)  # smallest and fastest, but too lossy
POINTS = [SLOWER, DOMINATED, MEDIUM, UNDER_FLOOR, VERYFAST]


def test_front_is_the_undominated_acceptable_points_fastest_first():
    assert pareto_front(POINTS, FLOOR) == [VERYFAST, MEDIUM, SLOWER]


def test_a_dominated_point_is_never_on_the_front():
    for floor in (30.0, FLOOR, 35.9):
        assert DOMINATED not in pareto_front(POINTS, floor)


def test_a_point_equal_to_another_on_both_axes_appears_once():
    twin = point("medium", MEDIUM.bytes_per_frame, MEDIUM.cpu_s_per_frame * 1e3, options="ref=3")
    front = pareto_front([MEDIUM, twin, SLOWER], FLOOR)
    assert front == [MEDIUM, SLOWER]


def test_the_quality_floor_takes_points_off_the_front():
    assert UNDER_FLOOR in pareto_front(POINTS, 30.0)  # it dominates everything when the floor allows it
    assert UNDER_FLOOR not in pareto_front(POINTS, FLOOR)


def test_cost_is_compute_once_plus_storage_over_the_retention():
    model = CostModel(
        core_hour_usd=0.04, storage_gb_month_usd=0.02, retention_months=36, copies=2, frames_per_episode_hour=324_000
    )
    cost = cost_per_episode_hour(SLOWER, model)
    assert cost.compute_usd == pytest.approx(0.052 * 324_000 / 3600 * 0.04)
    assert cost.storage_usd == pytest.approx(15_000 * 324_000 / GIB * 0.02 * 36 * 2)
    assert cost.total_usd == pytest.approx(cost.compute_usd + cost.storage_usd)


def test_episode_hours_per_core_hour_at_the_fleet_rate():
    # 1 episode-hour = 3 cameras x 30 Hz x 3600 s of frames: at 1/90 s a frame one core keeps up with one camera-set
    assert episode_hours_per_core_hour(point("x", 1, 1000 / 90)) == pytest.approx(1.0)
    assert episode_hours_per_core_hour(SLOWER) == pytest.approx(3600 / (0.052 * 324_000))
    assert math.isinf(episode_hours_per_core_hour(point("free", 1, 0.0)))


def test_the_pick_follows_the_price_of_storage():
    expensive_storage = cheapest(POINTS, CostModel(storage_gb_month_usd=0.02), FLOOR)
    # MEDIUM is cheapest between ~0.00103 (vs VERYFAST) and ~0.00159 USD/GB-month (vs SLOWER)
    cheap_storage = cheapest(POINTS, CostModel(storage_gb_month_usd=0.0013), FLOOR)
    free_storage = cheapest(POINTS, CostModel(storage_gb_month_usd=0.0), FLOOR)
    assert expensive_storage.point == SLOWER  # storage dominates: fewest bytes wins
    assert cheap_storage.point == MEDIUM  # the middle of the front
    assert free_storage.point == VERYFAST  # only compute is left: the fastest acceptable wins


def test_the_pick_follows_the_price_of_compute():
    assert cheapest(POINTS, CostModel(core_hour_usd=0.0), FLOOR).point == SLOWER
    assert cheapest(POINTS, CostModel(core_hour_usd=1000.0), FLOOR).point == VERYFAST


def test_the_pick_is_on_the_front():
    for price in (0.0, 0.0001, 0.001, 0.02, 1.0):
        pick = cheapest(POINTS, CostModel(storage_gb_month_usd=price), FLOOR)
        assert pick.point in pareto_front(POINTS, FLOOR)


def test_a_point_under_the_quality_floor_is_never_picked():
    for model in (CostModel(), CostModel(storage_gb_month_usd=0.0), CostModel(core_hour_usd=0.0)):
        assert cheapest(POINTS, model, FLOOR).point != UNDER_FLOOR
    assert cheapest([UNDER_FLOOR], CostModel(), FLOOR) is None


def test_the_throughput_floor_rules_out_slow_points():
    pick = cheapest(POINTS, CostModel(), FLOOR, min_episode_hours_per_core_hour=1.0)
    assert pick.point == VERYFAST  # 6 ms a frame: ~1.85 episode-hours per core-hour; MEDIUM makes ~0.56
    assert pick.episode_hours_per_core_hour >= 1.0
    assert cheapest(POINTS, CostModel(), FLOOR, min_episode_hours_per_core_hour=100.0) is None


def test_pick_reports_its_cost_and_rate():
    pick = cheapest(POINTS, CostModel(), FLOOR)
    assert pick.cost == cost_per_episode_hour(pick.point, CostModel())
    assert pick.episode_hours_per_core_hour == episode_hours_per_core_hour(pick.point)


def test_no_points_is_a_clear_error():
    with pytest.raises(ValueError, match="points must not be empty"):
        pareto_front([], FLOOR)
    with pytest.raises(ValueError, match="points must not be empty"):
        cheapest([], CostModel(), FLOOR)


@pytest.mark.parametrize(
    "field, value",
    [
        ("core_hour_usd", -0.01),
        ("storage_gb_month_usd", -1.0),
        ("retention_months", -3),
        ("core_hour_usd", math.nan),
        ("storage_gb_month_usd", math.inf),
        ("copies", 0),
        ("copies", 1.5),
        ("frames_per_episode_hour", 0),
    ],
)
def test_a_bad_price_names_its_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        CostModel(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("bytes_per_frame", 0),
        ("bytes_per_frame", -5.0),
        ("cpu_s_per_frame", -0.001),
        ("psnr_db", math.nan),
        ("crf", -1.0),
        ("preset", ""),
    ],
)
def test_a_bad_point_names_its_field(field, value):
    kwargs = dict(preset="medium", crf=21.0, options="", bytes_per_frame=1000.0, psnr_db=36.0, cpu_s_per_frame=0.02)
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        EncodePoint(**{**kwargs, field: value})


def test_a_bad_floor_names_itself():
    with pytest.raises(ValueError, match="^min_psnr_db must be"):
        pareto_front(POINTS, math.nan)
    with pytest.raises(ValueError, match="^min_episode_hours_per_core_hour must be"):
        cheapest(POINTS, CostModel(), FLOOR, min_episode_hours_per_core_hour=-1.0)
