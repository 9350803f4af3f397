"""Slurm job templates: rendering, the requeue/retry-cap table (Python and its shell mirror), and a
real single-node Slurm (slurmctld + slurmd on loopback) when Debian's slurm-wlm is installed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infra.slurm.launcher import JobInfo, SlurmLauncher, launch_command, next_action

SECRET = "hunter2-do-not-leak"


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


# --- rendering --------------------------------------------------------------------------------


def test_render_has_requeue_cap_attempts_and_rendezvous(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNA_SECRET_TOKEN", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    launcher = SlurmLauncher(
        partition="gpu",
        nodes=4,
        gpus_per_node=8,
        time_limit="1-00:00:00",
        max_attempts=5,
        in_place_restarts=2,
        python="/opt/venv/bin/python",
        workdir=str(tmp_path),
        extra_sbatch=["--account=ml", "--exclusive"],
    )
    text = launcher.render(tmp_path / "run.json", tmp_path / "run")
    for line in (
        "#SBATCH --requeue",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --signal=B:USR1@120",
        f"#SBATCH --output={tmp_path}/run/slurm/job-%j.out",
        "#SBATCH --account=ml",
        "#SBATCH --exclusive",
    ):
        assert line + "\n" in text, line
    assert "MAX_ATTEMPTS=5\n" in text and "IN_PLACE_RESTARTS=2\n" in text and "NPROC_PER_NODE=8\n" in text
    assert "ATTEMPT=${SLURM_RESTART_COUNT:-0}" in text
    assert 'if [ "$ATTEMPT" -ge "$MAX_ATTEMPTS" ]' in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert 'FIRST_NODE=$(head -n 1 "$DIAG/nodes.txt")' in text
    assert '--rdzv-endpoint="$FIRST_NODE:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID"' in text
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
    assert f"CONFIG={tmp_path}/run.json\n" in text
    assert SECRET not in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=10)


def test_render_options_off_and_quoting(tmp_path):
    launcher = SlurmLauncher(gpus_per_node=0, signal_before_s=0, python="/opt/my env/python", workdir=str(tmp_path))
    text = launcher.render(tmp_path / "run.json", tmp_path / "run")
    for option in ("--gpus-per-node", "--signal", "--partition", "--time"):
        assert f"#SBATCH {option}" not in text
    assert "NPROC_PER_NODE=1\n" in text
    assert "PYTHON='/opt/my env/python'\n" in text


@pytest.mark.parametrize(
    "bad",
    [
        {"extra_sbatch": ["--account=a\nrm -rf /"]},
        {"workdir": "/a b"},
        {"max_attempts": 0},
        {"nodes": 0},
        {"in_place_restarts": -1},
    ],
)
def test_render_refuses_bad_values(tmp_path, bad):
    with pytest.raises(ValueError):
        SlurmLauncher(**bad).render(tmp_path / "run.json", tmp_path / "run")


def test_launch_command_writes_script_next_to_config(tmp_path):
    config = tmp_path / "run.json"
    cmd = launch_command(config, tmp_path / "run", SlurmLauncher(workdir=str(tmp_path)))
    script = tmp_path / "run.sbatch"
    assert cmd == ["sbatch", "--wait", "--parsable", str(script)]
    assert script.read_text().startswith("#!/bin/bash\n") and os.access(script, os.X_OK)
    assert (tmp_path / "run" / "slurm").is_dir()  # Slurm does not create --output's folder


def test_submit_state_wait_with_fake_commands(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    polls = tmp_path / "polls"
    _exe(bin_dir / "sbatch", '#!/bin/bash\n[ "$1" = --parsable ] && echo "77;dynatest"\n')
    # PENDING (after a requeue) on the first poll, COMPLETED on the next; job 78 is only in sacct
    _exe(
        bin_dir / "scontrol",
        f"""#!/bin/bash
[ "$4" = 78 ] && exit 1
echo x >> {polls}
if [ $(wc -l < {polls}) -lt 2 ]; then s=PENDING; else s=COMPLETED; fi
echo "JobId=$4 JobName=dyna-train JobState=$s Reason=None Restarts=1 ExitCode=0:0"
""",
    )
    _exe(bin_dir / "sacct", '#!/bin/bash\necho "FAILED|1:0"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    launcher = SlurmLauncher()
    assert launcher.submit(tmp_path / "job.sbatch") == "77"
    info = launcher.wait("77", timeout=10, poll_s=0.01)
    assert (info.state, info.restarts, info.exit_code, info.finished) == ("COMPLETED", 1, "0:0", True)
    assert launcher.state("78") == JobInfo("78", "FAILED", None, "1:0")


# --- the requeue table ------------------------------------------------------------------------


@pytest.mark.parametrize("cap", range(1, 7))
def test_next_action_honours_the_retry_cap(cap):
    for attempt in range(cap + 2):
        for exit_code in (0, 1, 2, 137, 255):
            got = next_action(attempt, cap, exit_code)
            if exit_code == 0:
                assert got == "done"
            else:
                assert got == ("requeue" if attempt + 1 < cap else "give_up"), (attempt, cap, exit_code)
    # the number of attempts that ever run when every attempt fails is exactly the cap
    attempt = 0
    while next_action(attempt, cap, 1) == "requeue":
        attempt += 1
    assert attempt + 1 == cap


@pytest.mark.parametrize(("attempt", "cap"), [(-1, 3), (0, 0), (2, -1)])
def test_next_action_rejects_nonsense(attempt, cap):
    with pytest.raises(ValueError):
        next_action(attempt, cap, 1)


# --- the batch script's shell logic, with fake srun/scontrol ------------------------------------


@pytest.fixture
def fake_cluster(tmp_path):
    """A PATH with recording ``scontrol`` and ``srun``, and a fake python standing in for torchrun."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    _exe(
        bin_dir / "scontrol",
        f"""#!/bin/bash
echo "scontrol $*" >> {calls}
case "$1 $2" in
  "show hostnames") printf 'node-a\\nnode-b\\n' ;;
  "show job") echo "JobId=$3 JobState=RUNNING" ;;
esac
""",
    )
    # srun drops its own options, then runs the step (the fake python) in place
    _exe(
        bin_dir / "srun",
        f"""#!/bin/bash
echo "srun $*" >> {calls}
while [[ "$1" == --* ]]; do shift; done
exec "$@"
""",
    )
    python = _exe(
        bin_dir / "fake-python",
        f"""#!/bin/bash
echo "python $* TORCH_DISABLE_SHARE_RDZV_TCP_STORE=$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" >> {calls}
[ -n "${{FAKE_SLEEP:-}}" ] && sleep "$FAKE_SLEEP"
exit "$FAKE_RC"
""",
    )
    return bin_dir, calls, python


def _batch(tmp_path, bin_dir, python, attempt, cap, rc, **extra_env):
    run_dir = tmp_path / f"run-{attempt}-{cap}-{rc}"
    script = tmp_path / "job.sbatch"
    script.write_text(
        SlurmLauncher(
            nodes=2, gpus_per_node=4, max_attempts=cap, in_place_restarts=1, python=str(python), workdir=str(tmp_path)
        ).render(tmp_path / "run.json", run_dir)
    )
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "FAKE_RC": str(rc),
        "SLURM_JWT": SECRET,
        "NCCL_AUTH_KEY": SECRET,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    if attempt:  # attempt 0 also without the variable: Slurm sets it only after a requeue
        env["SLURM_RESTART_COUNT"] = str(attempt)
    env.update(extra_env)
    proc = subprocess.Popen(
        ["bash", str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, run_dir / "slurm" / f"attempt-{attempt}"


def _run_batch(tmp_path, bin_dir, python, attempt, cap, rc):
    proc, diag = _batch(tmp_path, bin_dir, python, attempt, cap, rc)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), diag


@pytest.mark.parametrize("cap", [1, 2, 3])
@pytest.mark.parametrize("rc", [0, 1])
def test_shell_requeues_only_below_the_cap(tmp_path, fake_cluster, cap, rc):
    bin_dir, calls, python = fake_cluster
    for attempt in range(cap + 1):
        calls.write_text("")
        proc, diag = _run_batch(tmp_path, bin_dir, python, attempt, cap, rc)
        log = calls.read_text()
        requeued = "scontrol requeue 4242" in log
        assert (diag / "nodes.txt").read_text() == "node-a\nnode-b\n"
        assert "JobId=4242" in (diag / "job.txt").read_text()
        env_dump = (diag / "env.txt").read_text()
        assert "SLURM_JOB_ID=4242" in env_dump and "CUDA_VISIBLE_DEVICES=0,1,2,3" in env_dump
        assert SECRET not in env_dump and "SLURM_JWT" not in env_dump
        if attempt >= cap:  # past the cap (a requeue Slurm made on its own): refuse, never requeue
            assert proc.returncode == 3 and "retry cap" in proc.stderr
            assert "srun" not in log and not requeued
            continue
        assert "--rdzv-endpoint=node-a:29500 --rdzv-id=4242" in log
        assert "-m torch.distributed.run --nnodes=2 --nproc-per-node=4" in log
        assert "--max-restarts=1 -m trainer.train --config" in log and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in log
        assert (diag / "exit_code").read_text().strip() == str(rc)
        assert proc.returncode == rc
        expected = next_action(attempt, cap, rc)
        assert requeued == (expected == "requeue"), (attempt, cap, rc, log)
        if expected == "give_up":
            assert "giving up" in proc.stderr


@pytest.mark.parametrize(("attempt", "cap", "requeues"), [(0, 3, 1), (1, 3, 1), (2, 3, 0)])
def test_shell_requeues_once_near_the_time_limit(tmp_path, fake_cluster, attempt, cap, requeues):
    """USR1 (--signal=B:USR1@...) requeues while the cap allows, and only once per attempt."""
    bin_dir, calls, python = fake_cluster
    calls.write_text("")
    proc, diag = _batch(tmp_path, bin_dir, python, attempt, cap, rc=1, FAKE_SLEEP="2")
    deadline = time.monotonic() + 20
    while "python -m torch.distributed.run" not in calls.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert calls.read_text().count("scontrol requeue 4242") == requeues, err
    assert (diag / "exit_code").read_text().strip() == "1"
    if requeues:
        assert "time limit near" in (diag / "events.txt").read_text()


# --- a real single-node Slurm on loopback -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """slurmctld + slurmd on 127.0.0.1, from a slurm.conf of our own; SLURM_CONF points at it."""
    if not (shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("sbatch")):
        pytest.skip("Slurm is not installed (apt-get install -y --no-install-recommends slurm-wlm)")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool"):
        (root / d).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=dynatest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
# auth/none is still shipped in 22.05 and spares the test a munged; cred_expire is also how long a
# requeued job waits before it may start again (default 120 s), and the main scheduler's pass every
# sched_interval (default 60 s) is what starts it then
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
NodeName={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(conf))
        try:
            for daemon in ("slurmctld", "slurmd"):
                log = open(root / f"{daemon}.log", "w")
                procs.append(
                    (
                        subprocess.Popen(
                            [daemon, "-D", "-f", str(conf)], env=env, stdout=log, stderr=subprocess.STDOUT
                        ),
                        log,
                    )
                )
            deadline = time.monotonic() + 60
            while True:
                out = subprocess.run(
                    ["sinfo", "-h", "-o", "%T"], check=False, capture_output=True, text=True, timeout=10
                ).stdout
                if out.strip() == "idle":
                    break
                if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs):
                    logs = "\n".join((root / f"{d}.log").read_text()[-2000:] for d in ("slurmctld", "slurmd"))
                    pytest.fail(f"single-node Slurm did not come up (sinfo: {out!r}):\n{logs}")
                time.sleep(0.5)
            yield root
        finally:
            for proc, log in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                log.close()


def _job_python(tmp_path: Path, succeed_from: int) -> Path:
    """Stands in for the venv's python: records each attempt, fails while SLURM_RESTART_COUNT < succeed_from."""
    return _exe(
        tmp_path / "fake-python",
        f"""#!/bin/bash
echo "restart=${{SLURM_RESTART_COUNT:-0}} $*" >> {tmp_path}/steps.txt
[ "${{SLURM_RESTART_COUNT:-0}}" -ge {succeed_from} ]
""",
    )


def test_real_slurm_requeues_then_succeeds(slurm, tmp_path):
    launcher = SlurmLauncher(
        nodes=1,
        gpus_per_node=0,
        max_attempts=3,
        in_place_restarts=0,
        signal_before_s=0,
        python=str(_job_python(tmp_path, succeed_from=1)),
        workdir=str(tmp_path),
    )
    run_dir = tmp_path / "run"
    script = Path(launch_command(tmp_path / "run.json", run_dir, launcher)[-1])
    job = launcher.submit(script)
    info = launcher.wait(job, timeout=180, poll_s=1)
    assert (info.state, info.restarts, info.exit_code) == ("COMPLETED", 1, "0:0")
    steps = (tmp_path / "steps.txt").read_text().splitlines()
    assert [s.split()[0] for s in steps] == ["restart=0", "restart=1"]
    host = socket.gethostname()
    assert f"--rdzv-endpoint={host}:29500 --rdzv-id={job}" in steps[0]
    diag = run_dir / "slurm"
    assert sorted(p.name for p in diag.glob("attempt-*")) == ["attempt-0", "attempt-1"]
    for n, rc in ((0, "1"), (1, "0")):
        assert (diag / f"attempt-{n}" / "exit_code").read_text().strip() == rc
        assert (diag / f"attempt-{n}" / "nodes.txt").read_text().strip() == host
        assert f"JobId={job}" in (diag / f"attempt-{n}" / "job.txt").read_text()
        assert f"SLURM_JOB_ID={job}" in (diag / f"attempt-{n}" / "env.txt").read_text()
    assert "SLURM_RESTART_COUNT=1" in (diag / "attempt-1" / "env.txt").read_text()
    assert "requeueing job" in (diag / f"job-{job}.out").read_text()


def test_real_slurm_gives_up_at_the_cap(slurm, tmp_path):
    launcher = SlurmLauncher(
        nodes=1,
        gpus_per_node=0,
        max_attempts=2,
        in_place_restarts=0,
        signal_before_s=0,
        python=str(_job_python(tmp_path, succeed_from=99)),
        workdir=str(tmp_path),
    )
    run_dir = tmp_path / "run"
    cmd = launch_command(tmp_path / "run.json", run_dir, launcher)
    proc = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=180
    )  # sbatch --wait spans the requeue
    assert proc.returncode != 0
    job = proc.stdout.strip().split(";")[0]
    info = launcher.state(job)
    assert (info.state, info.restarts) == ("FAILED", 1)
    assert [s.split()[0] for s in (tmp_path / "steps.txt").read_text().splitlines()] == ["restart=0", "restart=1"]
    assert sorted(p.name for p in (run_dir / "slurm").glob("attempt-*")) == ["attempt-0", "attempt-1"]
    assert "giving up" in (run_dir / "slurm" / f"job-{job}.out").read_text()


def test_trainer_resource_launches_through_the_slurm_template(tmp_path):
    from dyna_resources.resources import TrainerResource

    config = tmp_path / "run" / "config.json"
    config.parent.mkdir()
    config.write_text("{}")
    cmd = TrainerResource(
        launcher="slurm", slurm_nodes=2, slurm_gpus_per_node=8, slurm_max_attempts=4, max_restarts=2
    ).launch_command(config)
    assert cmd[:3] == ["sbatch", "--wait", "--parsable"]
    script = Path(cmd[3]).read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --nodes=2" in script
    assert "IN_PLACE_RESTARTS=2" in script and "trainer.train" in script and str(config) in script
    with pytest.raises(ValueError, match="'k8s'"):
        TrainerResource(launcher="k8s").launch_command(config)
