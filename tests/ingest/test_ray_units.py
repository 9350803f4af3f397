"""Work units on a real local Ray cluster (2 CPUs, started once for this module)."""

import os
import signal
import time
from itertools import pairwise
from pathlib import Path

import pytest

from dyna_resources.ingest.ray_units import (
    Progress,
    UnitDone,
    UnitFailed,
    UnitResources,
    WorkUnit,
    ray_cluster,
    run_units,
)


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster("local", num_cpus=2) as c:
        yield c


def units(n: int, folder: Path, **payload) -> list[WorkUnit]:
    return [
        WorkUnit(f"u{i:03d}", {"folder": str(folder), **payload}, bytes=1_000_000 * (i + 1), episode_s=84.0)
        for i in range(n)
    ]


# The unit functions run in Ray workers: module level, so they pickle by reference.


def write_once(unit: WorkUnit) -> str:
    """The unit's side effect, made with exclusive create: a second run of the same unit raises."""
    folder = Path(unit.payload["folder"])
    if unit.id in unit.payload.get("killed_first", ()):
        try:
            (folder / f"{unit.id}.attempt").open("x").close()
        except FileExistsError:
            pass  # the retry: carry on
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    if unit.id in unit.payload.get("always_killed", ()):
        os._exit(1)
    if unit.id in unit.payload.get("raises", ()):
        raise ValueError(f"bad unit {unit.id}")
    with (folder / f"{unit.id}.done").open("x") as f:
        f.write(str(os.getpid()))
    return unit.id


def exclusive(unit: WorkUnit) -> tuple[float, float]:
    """Holds a lock file that only one unit at a time may hold; records when it ran."""
    lock = Path(unit.payload["folder"]) / "busy"
    lock.parent.mkdir(exist_ok=True)
    lock.open("x").close()  # FileExistsError if another unit is running now
    start = time.time()
    time.sleep(0.2)  # long enough for a second unit to start, were it allowed to
    end = time.time()
    lock.unlink()
    return start, end


def wait_for_release(unit: WorkUnit) -> str:
    """Runs until the driver's progress callback says so, or fails after a minute."""
    release = Path(unit.payload["folder"]) / "release"
    deadline = time.monotonic() + 60
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no progress report came while the unit ran")
        time.sleep(0.01)
    return unit.id


def test_every_unit_comes_back_exactly_once(cluster, tmp_path):
    todo = units(12, tmp_path)
    got = list(run_units(write_once, todo, max_retries=0))
    assert sorted(r.unit.id for r in got) == [u.id for u in todo]
    assert all(isinstance(r, UnitDone) and r.value == r.unit.id for r in got)
    assert sorted(p.name for p in tmp_path.glob("*.done")) == [f"{u.id}.done" for u in todo]


def test_a_worker_killed_on_its_first_attempt_is_retried_once(cluster, tmp_path):
    todo = units(6, tmp_path, killed_first=["u002", "u004"])
    got = list(run_units(write_once, todo, max_retries=2))
    assert sorted(r.unit.id for r in got) == [u.id for u in todo]
    assert all(r.ok for r in got), [r for r in got if not r.ok]
    assert sorted(p.name for p in tmp_path.glob("*.attempt")) == ["u002.attempt", "u004.attempt"]
    # each unit's side effect exactly once: a duplicate run would have hit FileExistsError
    assert sorted(p.name for p in tmp_path.glob("*.done")) == [f"{u.id}.done" for u in todo]


def test_a_failing_unit_is_reported_typed_and_the_others_finish(cluster, tmp_path):
    todo = units(5, tmp_path, raises=["u001"], always_killed=["u003"])
    got = {r.unit.id: r for r in run_units(write_once, todo, max_retries=1)}
    assert sorted(got) == [u.id for u in todo]
    raised, died = got.pop("u001"), got.pop("u003")
    assert isinstance(raised, UnitFailed) and raised.kind == "raised"
    assert raised.unit_id == "u001" and raised.reason == "ValueError: bad unit u001"
    assert isinstance(died, UnitFailed) and died.kind == "died" and died.unit_id == "u003"
    assert died.reason.startswith("WorkerCrashedError")
    assert all(isinstance(r, UnitDone) for r in got.values())
    assert sorted(p.name for p in tmp_path.glob("*.done")) == [f"{i}.done" for i in sorted(got)]


def test_progress_counts_up_to_the_total(cluster, tmp_path):
    todo = units(8, tmp_path, raises=["u005"])
    seen: list[Progress] = []
    results = []
    for r in run_units(write_once, todo, max_retries=0, on_progress=seen.append):
        results.append(r)
        assert seen[-1].units_done == len(results)  # reported before the result is handed over
    done = [p.units_done for p in seen]
    assert done[0] == 0 and done == sorted(done) and done[-1] == len(todo)
    assert set(range(len(todo) + 1)) <= set(done)  # a report on every completion
    last = seen[-1]
    assert last.units_failed == 1 and last.units_total == len(todo)
    assert last.bytes_done == last.bytes_total == sum(u.bytes for u in todo)
    assert last.episode_hours_done == pytest.approx(8 * 84 / 3600)
    assert last.eta_s == 0.0 and "8/8 units (1 failed)" in last.summary()


def test_progress_is_reported_while_units_run(cluster, tmp_path):
    """The unit finishes only after the third report: reports come between completions."""
    seen: list[Progress] = []

    def on_progress(p: Progress) -> None:
        seen.append(p)
        if len(seen) == 3:
            (tmp_path / "release").touch()

    got = list(run_units(wait_for_release, units(1, tmp_path), on_progress=on_progress, progress_every_s=0.05))
    assert [r.ok for r in got] == [True]
    assert [p.units_done for p in seen[:3]] == [0, 0, 0] and seen[-1].units_done == 1


def test_units_asking_for_the_whole_cluster_never_overlap(cluster, tmp_path):
    assert cluster.resources["CPU"] == 2
    todo = units(3, tmp_path)
    got = list(run_units(exclusive, todo, resources=UnitResources(num_cpus=2), max_retries=0))
    assert all(r.ok for r in got), [r for r in got if not r.ok]
    spans = sorted(r.value for r in got)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(spans))


def test_a_unit_may_carry_its_own_request(cluster, tmp_path):
    big = UnitResources(num_cpus=2)
    todo = [WorkUnit(u.id, u.payload, resources=big) for u in units(2, tmp_path)]
    got = list(run_units(exclusive, todo, resources=UnitResources(num_cpus=0.5), max_retries=0))
    assert all(r.ok for r in got), [r for r in got if not r.ok]


def test_repeated_unit_ids_are_refused(cluster, tmp_path):
    todo = units(2, tmp_path)
    with pytest.raises(ValueError, match="u000"):
        list(run_units(write_once, [*todo, todo[0]]))


def block(unit: WorkUnit) -> str:
    """Runs until released (never, here) or for 30 s, then leaves a mark."""
    folder = Path(unit.payload["folder"])
    deadline = time.monotonic() + 30
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    (folder / f"{unit.id}.finished").touch()
    return unit.id


def quick_or_block(unit: WorkUnit) -> str:
    return unit.id if unit.id == "u000" else block(unit)


def test_closing_early_cancels_the_units_still_running(cluster, tmp_path):
    todo = units(3, tmp_path)
    results = run_units(quick_or_block, todo, max_retries=0)
    assert next(results).unit.id == "u000"
    results.close()
    # Runs only once the cancelled units have given their CPUs back (else after their 30 s).
    after = list(run_units(exclusive, units(1, tmp_path / "after"), resources=UnitResources(num_cpus=2)))
    assert [r.ok for r in after] == [True]
    assert not list(tmp_path.glob("*.finished"))
