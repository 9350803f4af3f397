"""Faults are not verdicts (docs/ingest.md), on both registry backends: a worker killed mid-episode, a
full MCAP volume and a file that kills every worker it meets, through the real ingest engine with
real processes, a real SIGKILL and (where root can mount one) a real tmpfs that fills up.

The classification table (ingest/faults.py) is tested kind by kind below."""

import errno
import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from dyna_resources.catalog.registry import PENDING, QUARANTINED, TRANSCODED
from dyna_resources.ingest.batches import inventory_batch, transcode_batch
from dyna_resources.ingest.faults import (
    DATA,
    INFRASTRUCTURE,
    REASONS,
    WORKER_DEATH_ATTEMPTS,
    InfrastructureFault,
    exception_class,
    is_infrastructure_failure,
    reason_class,
    reason_kind,
)
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.storage.stores import StoreUnavailableError

from .conftest import FAST, land
from .test_batch_failures import assert_every_output_has_its_outcome, one_batch


def _landed(stores, episode_factory, n: int, prefix: str, seed: int) -> list[str]:
    names = []
    for i in range(n):
        g = episode_factory(episode_id=f"{prefix}-{i}", seed=seed + i, duration_s=1.5)
        names.append(land(stores, g, f"{prefix}-{i}.h5").name)
    return names


class Killer:
    """SIGKILLs (as the OOM killer does: no clean-up) the episode processes of this test that have
    ``target`` open, at most ``times`` of them; ``target=None``: any episode process, told by being a
    fork of this one (its command line), as soon as it exists. (Waiting, as before, to see it with an
    ``.h5`` open let an episode finish unseen now and then on a loaded machine: 3 clean-clone runs in 5.)"""

    def __init__(self, target: Path | None = None, times: int = 1, sig: int = signal.SIGKILL):
        self.target, self.times, self.sig, self.killed = target, times, sig, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        # only processes started from here on: a child an earlier test of this worker left behind (with
        # some .h5 open) is not one of this test's episode processes, and killing it would spare one of them
        self._before = {c.pid for c in psutil.Process().children(recursive=True)}
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _is_victim(self, p: psutil.Process, forked_from: list[str]) -> bool:
        try:
            if self.target is None:
                return p.cmdline() == forked_from
            return any(f.path == str(self.target) for f in p.open_files())  # mid-episode on the target
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    def _run(self):
        me = psutil.Process()
        forked_from = me.cmdline()
        while not self._stop.is_set() and len(self.killed) < self.times:
            for child in me.children():
                if (
                    child.pid not in self.killed
                    and child.pid not in self._before
                    and self._is_victim(child, forked_from)
                ):
                    os.kill(child.pid, self.sig)
                    self.killed.append(child.pid)
                    break
            time.sleep(0.002)


def test_an_episode_whose_worker_is_killed_is_tried_again_and_lands_with_nothing_quarantined(episode_factory, stores):
    names = _landed(stores, episode_factory, 3, "ep-kill", 900)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    with Killer(times=1) as killer:
        post = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
    assert len(killer.killed) == 1  # one episode's process died mid-episode, SIGKILL
    assert stores.registry.quarantined(batch) == [] and post.quarantined == []
    assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {n: TRANSCODED for n in names}
    assert sorted(post.processed) == [f"ep-kill-{i}" for i in range(3)]
    assert_every_output_has_its_outcome(stores, batch)


def test_an_episode_whose_worker_stalls_is_killed_as_stuck_tried_again_and_lands(episode_factory, stores):
    """A worker that stops using CPU (SIGSTOP here; a deadlock in a native library in the wild) is
    killed after ``stall_s`` and its episode tried again: a machine fault, not a verdict."""
    names = _landed(stores, episode_factory, 3, "ep-stall", 930)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    logged: list[str] = []
    with Killer(times=1, sig=signal.SIGSTOP) as frozen:
        post = transcode_batch(
            batch, stores, GateConfig(), settings=replace(FAST, stall_s=2.0), workers=2, log=logged.append
        )
    assert len(frozen.killed) == 1
    assert stores.registry.quarantined(batch) == [] and post.quarantined == []
    assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {n: TRANSCODED for n in names}
    (retry,) = [m for m in logged if "infrastructure fault" in m]
    assert "attempt 1 of" in retry and "stalled, it used no CPU in 2 s" in retry
    assert reason_kind("transcode", retry.split("fault: ", 1)[1]).name == "worker_died"
    assert_every_output_has_its_outcome(stores, batch)


def test_a_file_that_kills_its_worker_on_every_attempt_becomes_a_verdict_naming_the_attempts(episode_factory, stores):
    names = _landed(stores, episode_factory, 3, "ep-poison", 910)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    poison = stores.landing.root / names[0]
    with Killer(target=poison.resolve(), times=WORKER_DEATH_ATTEMPTS) as killer:
        post = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
    assert len(killer.killed) == WORKER_DEATH_ATTEMPTS
    (q,) = stores.registry.quarantined(batch)
    assert q["source_path"] == names[0] and q["gate"] == "transcode"
    assert q["reason"].startswith(f"the worker process died on each of {WORKER_DEATH_ATTEMPTS} attempts (")
    assert q["reason"].count("SIGKILL") == WORKER_DEATH_ATTEMPTS and "2 other episode(s)" in q["reason"]
    assert reason_kind(q["gate"], q["reason"]).name == "worker_died_every_attempt"
    statuses = {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)}
    assert statuses == {names[0]: QUARANTINED, names[1]: TRANSCODED, names[2]: TRANSCODED}
    assert [r["path"] for r in post.quarantined] == [names[0]]


def test_workers_killed_on_every_attempt_with_no_other_episode_finishing_are_not_a_verdict(episode_factory, stores):
    """Every episode process dies (memory pressure on the node, say): nothing follows a file, so the
    call fails naming the episodes, they stay pending, and a later call lands them."""
    names = _landed(stores, episode_factory, 2, "ep-oom", 920)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    with Killer(times=2 * WORKER_DEATH_ATTEMPTS), pytest.raises(InfrastructureFault) as fault:
        transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
    assert sorted(fault.value.pending) == ["ep-oom-0", "ep-oom-1"]
    assert all(
        "SIGKILL" in why and f"after {WORKER_DEATH_ATTEMPTS} attempts" in why for why in fault.value.pending.values()
    )
    assert stores.registry.quarantined(batch) == []
    assert {e["status"] for e in stores.registry.episodes(batch)} == {PENDING}
    post = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
    assert sorted(post.processed) == ["ep-oom-0", "ep-oom-1"]
    assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {n: TRANSCODED for n in names}


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_a_full_mcap_volume_leaves_the_episodes_pending_and_the_next_run_lands_them(
    episode_factory, stores, monkeypatch
):
    names = _landed(stores, episode_factory, 3, "ep-full", 930)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    real = os.geteuid() == 0 and _mount_tmpfs(stores.mcap_dir, "16k")
    if not real:  # no tmpfs here: ENOSPC injected at the publish boundary, in every episode process
        from dyna_resources.ingest.episode_io import McapSink

        def full(*_a, **_k):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(McapSink, "publish", full)
    try:
        with pytest.raises(InfrastructureFault) as fault:
            transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
        assert sorted(fault.value.pending) == [f"ep-full-{i}" for i in range(3)]
        assert all("No space left on device" in why for why in fault.value.pending.values())
        assert "left pending" in str(fault.value) and "ep-full-0" in str(fault.value)
        assert stores.registry.quarantined(batch) == []
        assert {e["status"] for e in stores.registry.episodes(batch)} == {PENDING}
        assert not list(stores.mcap_dir.glob("*.mcap")) and not list(stores.mcap_dir.glob(".*.tmp"))
        # pending episodes are drift: the drift sensor's query launches their partition again
        assert stores.registry.outdated_batches(schema_version="x", pipeline_version="y") == [batch]
        if real:
            subprocess.run(["mount", "-o", "remount,size=64m", str(stores.mcap_dir)], check=True)
        else:
            monkeypatch.undo()
        post = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
        assert sorted(post.processed) == [f"ep-full-{i}" for i in range(3)]
        assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {
            n: TRANSCODED for n in names
        }
        assert_every_output_has_its_outcome(stores, batch)
    finally:
        if real:
            subprocess.run(["umount", "-l", str(stores.mcap_dir)], check=False)


# -- the table --------------------------------------------------------------------------------------

# One reason each kind of REASONS is written for (by this version or an earlier one), and its class.
EXAMPLES = {
    "cpu_limit": ("transcode", "the worker process died (SIGXCPU: over its CPU time limit of 2 s)", DATA),
    "worker_died_every_attempt": (
        "transcode",
        "the worker process died on each of 3 attempts (the worker process "
        "died (SIGSEGV: crashed: segmentation fault); ...) while 2 other episode(s) of its "
        "unit finished on the same workers",
        DATA,
    ),
    "worker_died": ("transcode", "the worker process died (SIGKILL: killed, e.g. out of memory)", INFRASTRUCTURE),
    "disk_full": ("transcode", "OSError: [Errno 28] No space left on device", INFRASTRUCTURE),
    "io_error": (
        "readable",
        "cannot open as HDF5 (truncated or not HDF5): [Errno 5] Input/output error",
        INFRASTRUCTURE,
    ),
    "out_of_memory": ("transcode", "MemoryError: ", INFRASTRUCTURE),
    "store_unavailable": (
        "transcode",
        "cannot read the raw file: StoreUnavailableError: store gs://b is unavailable: timed out",
        INFRASTRUCTURE,
    ),
    "vanished": ("readable", "file vanished from the landing zone", DATA),
    "duplicate_episode_id": ("readable", "duplicate episode_id 'ep-1': already landed as a/ep-1.h5", DATA),
    "publish_conflict": ("transcode", "not published: gs://b/mcap/ep.mcap changed", DATA),
    "registry_field": ("transcode", "the registry cannot store the outcome: mcap_path too long", DATA),
    "gate": ("timestamps", "timestamps go backwards at sample 12", DATA),
    "unreadable": ("readable", "cannot open as HDF5 (truncated or not HDF5): truncated file: eof = 1024", DATA),
}


def test_every_reason_kind_has_an_example_that_classifies_as_it_says():
    assert set(EXAMPLES) == {k.name for k in REASONS}
    for name, (gate, reason, cls) in EXAMPLES.items():
        kind = reason_kind(gate, reason)
        assert (kind.name, kind.fault) == (name, cls), (name, kind)
        assert reason_class(gate, reason) == cls


def test_a_gate_named_like_a_machine_fault_is_still_a_verdict():
    assert reason_class("frame_drops", "42 frames dropped: No space left on device in the recorder") == DATA


def test_exceptions_classify_by_type_errno_and_cause():
    assert exception_class(OSError(errno.ENOSPC, "No space left on device")) == INFRASTRUCTURE
    assert exception_class(OSError(errno.EIO, "Input/output error")) == INFRASTRUCTURE
    assert exception_class(MemoryError()) == INFRASTRUCTURE
    assert exception_class(StoreUnavailableError("gs://b", "timed out")) == INFRASTRUCTURE
    assert exception_class(TimeoutError("read")) == INFRASTRUCTURE
    assert exception_class(FileNotFoundError(errno.ENOENT, "gone")) == DATA
    assert exception_class(ValueError("bad shape")) == DATA
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("writing the chunk failed") from inner
    except RuntimeError as wrapped:
        assert exception_class(wrapped) == INFRASTRUCTURE


def test_unit_failures_are_classified_by_kind_and_reason():
    assert is_infrastructure_failure("died", "WorkerCrashedError: ...")
    assert is_infrastructure_failure("raised", "InfrastructureFault: work unit u: 2 episode(s) left pending ...")
    assert is_infrastructure_failure("raised", "StoreUnavailableError: store gs://b is unavailable: refused")
    assert not is_infrastructure_failure("raised", "KeyError: 'cameras'")


def test_an_infrastructure_fault_crosses_processes_whole():
    import pickle

    f = pickle.loads(pickle.dumps(InfrastructureFault("u1", {"ep-1": "OSError: [Errno 28] No space left"})))
    assert f.unit == "u1" and f.pending == {"ep-1": "OSError: [Errno 28] No space left"}
    assert "ep-1" in str(f)


# -- releasing what earlier versions quarantined for the machine's faults ------------------------------


def _quarantined_as_before(stores, batch, source_path: str, reason: str, stage: str = "transcode") -> None:
    """A quarantine record as earlier versions wrote one (the episode held at the current versions)."""
    from dyna_resources import versions
    from dyna_resources.catalog.registry import Outcome

    ep = next(e for e in stores.registry.episodes(batch) if e["source_path"] == source_path)
    stores.registry.record_outcomes(
        [
            Outcome(
                source_path,
                batch,
                "post",
                [],
                {
                    "episode_id": ep["episode_id"],
                    "status": QUARANTINED,
                    "schema_version": versions.SCHEMA_VERSION,
                    "pipeline_version": versions.PIPELINE_VERSION,
                },
                {
                    "gate": "transcode",
                    "stage": stage,
                    "reason": reason,
                    "stream": None,
                    "pipeline_version": versions.PIPELINE_VERSION,
                },
            )
        ]
    )


def test_release_of_the_infrastructure_class_re_ingests_those_episodes_and_keeps_the_verdicts(
    episode_factory, stores, monkeypatch, capsys
):
    from dyna_resources.cli import main
    from dyna_resources.ingest.release import release_quarantined

    names = _landed(stores, episode_factory, 3, "ep-rel", 940)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    _quarantined_as_before(stores, batch, names[0], "the worker process died (SIGKILL: killed, e.g. out of memory)")
    _quarantined_as_before(stores, batch, names[1], "the worker process died (SIGXCPU: over its CPU time limit of 2 s)")
    first = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
    assert first.processed == ["ep-rel-2"] and sorted(first.skipped) == []  # the two held back are not stale

    if stores.registry.backend == "sqlite":  # the CLI reads the registry of $DYNA_HOME
        monkeypatch.setenv("DYNA_HOME", str(Path(str(stores.registry.url.database)).parent))
    else:
        monkeypatch.setenv("DYNA_REGISTRY_URL", stores.registry.url.render_as_string(hide_password=False))
    assert main(["quarantine", "release", "--reason-class", "infrastructure", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{names[0]}  [transcode/transcode]" in out and "would release 1 infrastructure" in out
    assert "worker_died 1" in out and names[1] not in out
    assert len(stores.registry.quarantined(batch)) == 2  # a dry run changes nothing

    done = release_quarantined(stores.registry, "infrastructure")
    assert [r["source_path"] for r in done.records] == [names[0]] and done.pending == ["ep-rel-0"]
    assert done.reinventory == [] and done.kinds == {"worker_died": 1}
    assert [q["source_path"] for q in stores.registry.quarantined(batch)] == [names[1]]  # the verdict stays
    assert stores.registry.episode_by_id("ep-rel-0")["status"] == PENDING
    again = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=2)
    assert again.processed == ["ep-rel-0"]
    statuses = {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)}
    assert statuses == {names[0]: TRANSCODED, names[1]: QUARANTINED, names[2]: TRANSCODED}
    assert release_quarantined(stores.registry, "infrastructure").records == []


def test_staged_raw_files_a_killed_worker_left_are_swept_by_the_next_unit_and_counted(episode_factory, stores):
    from dyna_resources.ingest.batches import STAGING, STAGING_MAX_AGE_S

    _landed(stores, episode_factory, 1, "ep-sweep", 950)
    batch = one_batch(stores)
    staging = stores.mcap_dir / STAGING / "2026-12-05"
    staging.mkdir(parents=True)
    old, fresh, half = staging / "ep-old.h5", staging / "ep-fresh.h5", staging / ".ep-x.h5.staging-0123abcd"
    for p, age in ((old, STAGING_MAX_AGE_S + 60), (fresh, 60), (half, STAGING_MAX_AGE_S + 1)):
        p.write_bytes(b"x" * 1000)
        os.utime(p, (time.time() - age, time.time() - age))
    pre = inventory_batch(batch, stores, GateConfig())
    assert pre.staging_swept == (2, 2000)
    assert not old.exists() and not half.exists() and fresh.exists()  # one a unit on the node may be reading
    post = transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=1)
    assert post.staging_swept == (0, 0) and post.processed == ["ep-sweep-0"]


def test_a_unit_whose_run_is_gone_kills_its_episodes_publishes_nothing_more_and_the_next_run_lands_them(
    episode_factory, stores
):
    from dyna_resources.catalog.leases import RunEnded, RunLease

    names = _landed(stores, episode_factory, 4, "ep-gone", 960)
    batch = one_batch(stores)
    inventory_batch(batch, stores, GateConfig())
    lease = RunLease(stores.registry, "run-gone:post", check_every_s=0.1)
    held = lease.hold()

    def end_the_run_mid_episode():
        me = psutil.Process()
        while not any(any(f.path.endswith(".h5") for f in c.open_files()) for c in me.children()):
            time.sleep(0.005)
        held.release()  # what the step does when Dagster marks the run failed (or what its death does)

    ender = threading.Thread(target=end_the_run_mid_episode)
    ender.start()
    with pytest.raises(RunEnded) as ended:
        transcode_batch(batch, stores, GateConfig(), settings=FAST, workers=1, lease=lease)
    ender.join()
    assert ended.value.unit == batch and "stopped before publishing" in str(ended.value)

    def holds_raw_file(c: psutil.Process) -> bool:  # an episode process (others may be the test's own)
        try:
            return any(f.path.endswith(".h5") for f in c.open_files())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    assert not any(holds_raw_file(c) for c in psutil.Process().children())
    # Nothing published after the end: an episode that published once its run was gone would have no outcome
    # (the unit stops collecting them), so every MCAP in the store is one the registry records as transcoded.
    assert_every_output_has_its_outcome(stores, batch)
    assert stores.registry.quarantined(batch) == []
    rows = {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)}
    assert set(rows.values()) <= {TRANSCODED, "accepted"} and list(rows.values()).count(TRANSCODED) < len(names)
    with RunLease(stores.registry, "run-next:post").hold():
        transcode_batch(
            batch, stores, GateConfig(), settings=FAST, workers=2, lease=RunLease(stores.registry, "run-next:post")
        )
    assert {e["source_path"]: e["status"] for e in stores.registry.episodes(batch)} == {n: TRANSCODED for n in names}
    assert_every_output_has_its_outcome(stores, batch)
