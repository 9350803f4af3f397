"""Run leases on both registry backends: held while the holder lives, gone when it releases them or
dies by SIGKILL (nobody cleans up), checked from another process."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

from dyna_resources.catalog.leases import RunLease


def test_a_lease_is_alive_while_held_and_gone_once_released(registry):
    lease = RunLease(registry, "run-1:post:p1", check_every_s=0)
    assert not lease.alive()  # never taken
    fresh = RunLease(registry, "run-1:post:p1", check_every_s=0)
    with fresh.hold():
        assert fresh.alive() and RunLease(registry, "run-1:post:p1").alive()
        assert not RunLease(registry, "run-2:post:p1", check_every_s=0).alive()  # another run's
        copy = pickle.loads(pickle.dumps(fresh))  # what a Ray worker receives
        assert copy.alive() and copy.key == fresh.key
    assert not RunLease(registry, "run-1:post:p1", check_every_s=0).alive()
    assert not copy.alive(now=time.monotonic() + 10)  # it looks again once check_every_s has passed
    assert not copy.alive()  # and a dead lease stays dead


def test_a_lease_whose_holder_is_killed_is_gone_at_once(registry, tmp_path):
    url = registry.url.render_as_string(hide_password=False)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from dyna_resources.catalog.leases import RunLease
        from dyna_resources.catalog.registry import Registry
        RunLease(Registry({url!r}), "run-9:post:p9").hold()
        print("held", flush=True)
        time.sleep(600)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert RunLease(registry, "run-9:post:p9").alive()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        lease = RunLease(registry, "run-9:post:p9", check_every_s=0)
        for _ in range(100):  # PostgreSQL ends the dead session's backend a moment later
            if not lease.alive():
                break
            lease = RunLease(registry, "run-9:post:p9", check_every_s=0)
            time.sleep(0.05)
        assert not lease.alive()
    finally:
        holder.kill()
