"""Progress of a partition's units run in this process (``units_on="process"``): a long unit is heard
at least every ``progress_every_s`` with its episodes done of the total, MB/s and ETA, not only when it
ends. The clock is injected; the heartbeat thread looks every millisecond, and each report it owes is
waited for (no sleeps, nothing timed)."""

import threading

from dyna_resources.ingest.batches import inventory_batch, transcode_batch
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.partitions import run_in_process
from dyna_resources.ingest.ray_units import Progress, UnitDone, WorkUnit

from .conftest import FAST, land
from .test_batches import one_batch

MB = 10**6


def test_a_long_unit_is_heard_every_30_s_with_its_episodes_rate_and_eta():
    now = [0.0]
    heard: list[Progress] = []
    beat = threading.Event()

    def on_progress(p: Progress) -> None:
        heard.append(p)
        if threading.current_thread().name == "ingest-progress":
            beat.set()

    # 12 episodes of 1 MB, 10 s each by the clock: the heartbeat owes a report at 30, 60, 90 and 120 s
    units = [
        WorkUnit("long", None, bytes=12 * MB, episode_s=120.0, episodes=12),
        WorkUnit("short", None, bytes=MB, episodes=1),
    ]

    def unit(u: WorkUnit, on_episode) -> str:
        total = u.episodes or 1
        for k in range(total):
            on_episode(k + 1, total, (k + 1) * u.bytes // total)
            now[0] += 10.0
            if u.id == "long" and now[0] % 30 == 0 and now[0] < 120:
                assert beat.wait(60), f"no report at {now[0]} s"  # a bound against a hang, not a timing
                beat.clear()
        return u.id

    results = list(
        run_in_process(unit, units, on_progress=on_progress, progress_every_s=30, clock=lambda: now[0], poll_s=0.001)
    )
    assert [r.value for r in results if isinstance(r, UnitDone)] == ["long", "short"]
    during = [p for p in heard if p.units_done == 0 and 0 < p.elapsed_s < 120]  # (at 120 s the unit ends)
    assert [p.elapsed_s for p in during] == [30.0, 60.0, 90.0]  # while the long unit ran, every 30 s
    assert [p.episodes_done for p in during] == [3, 6, 9] and all(p.episodes_total == 13 for p in during)
    assert [p.bytes_done for p in during] == [3 * MB, 6 * MB, 9 * MB]
    first = during[0]
    assert first.mb_per_s == 0.1 and first.eta_s == 100.0  # 10 MB left at 0.1 MB/s
    line = first.summary()
    assert line.startswith("0/2 units, 3/13 episodes, ") and "3/13 MB at 0.1 MB/s" in line and "ETA 1m40s" in line
    # a report before the first unit and after each; the gaps are never longer than 30 s
    assert heard[0].elapsed_s == 0 and heard[0].episodes_done == 0
    assert (heard[-1].units_done, heard[-1].episodes_done, heard[-1].eta_s) == (2, 13, 0.0)
    assert all(b.elapsed_s - a.elapsed_s <= 30 for a, b in zip(heard, heard[1:]))


def test_a_unit_that_raises_counts_its_estimate_and_the_heartbeat_stops():
    now = [0.0]
    heard: list[Progress] = []

    def unit(u: WorkUnit, on_episode) -> str:
        on_episode(1, 4, MB)
        raise ValueError("bad unit")

    (failed,) = run_in_process(
        unit, [WorkUnit("u", None, bytes=4 * MB, episodes=3)], on_progress=heard.append, clock=lambda: now[0]
    )
    assert not failed.ok and "ValueError: bad unit" in failed.reason
    assert (heard[-1].units_failed, heard[-1].episodes_done, heard[-1].episodes_total) == (1, 4, 4)
    assert not [t for t in threading.enumerate() if t.name == "ingest-progress"]


def test_the_engine_tells_each_episode_as_it_finishes(episode_factory, stores):
    """What the heartbeat counts: the batch engine's (done, of total, bytes) as files and episodes finish."""
    for i in range(3):
        land(stores, episode_factory(episode_id=f"ep-p{i}", seed=40 + i, duration_s=2.0))
    batch = one_batch(stores)
    sizes = sum(f.bytes for f in stores.registry.batch_files(batch))
    pre: list[tuple[int, int, int]] = []
    inventory_batch(batch, stores, GateConfig(), on_episode=lambda *a: pre.append(a))
    assert [(d, t) for d, t, _ in pre] == [(0, 3), (1, 3), (2, 3), (3, 3)] and pre[-1][2] == sizes
    post: list[tuple[int, int, int]] = []
    transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=1, on_episode=lambda *a: post.append(a))
    assert [(d, t) for d, t, _ in post] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert [b for *_, b in post] == sorted(b for *_, b in post) and post[-1][2] == sizes
    again: list[tuple[int, int, int]] = []  # up to date: all done from the start, nothing transcoded
    transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=1, on_episode=lambda *a: again.append(a))
    assert again == [(3, 3, 0)]
