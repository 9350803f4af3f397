"""Train on Slurm: render ``train.sbatch.j2``, submit it, follow the job.

The batch script runs ``srun`` + torchrun (one agent per node, c10d rendezvous on the job's first
node) with ``--max-restarts`` in-place restarts; when those cannot fix a failure it requeues the
whole job (``scontrol requeue``) until ``max_attempts`` attempts have run, numbering attempts by
``SLURM_RESTART_COUNT`` and writing diagnostics to ``<run_dir>/slurm/attempt-<n>/``. The trainer
resumes each attempt from its latest complete checkpoint.

    launcher = SlurmLauncher(partition="gpu", nodes=4, gpus_per_node=8)
    cmd = launch_command("runs/x/run.json", "runs/x", launcher)  # ["sbatch", "--wait", ...]

Plain Python: jinja2 only for the template; no Dagster import.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

TEMPLATE = Path(__file__).with_name("train.sbatch.j2")
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


def next_action(attempt: int, cap: int, exit_code: int) -> str:
    """What the batch script does after attempt ``attempt`` (0-based) ended with ``exit_code``:
    ``done`` on success, ``requeue`` while another attempt fits under ``cap``, else ``give_up``.
    The template's shell function ``next_action`` is the same table."""
    if attempt < 0 or cap < 1:
        raise ValueError(f"attempt must be >= 0 and cap >= 1, got attempt={attempt} cap={cap}")
    if exit_code == 0:
        return "done"
    return "requeue" if attempt + 1 < cap else "give_up"


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # Slurm's base state: PENDING, RUNNING, COMPLETED, FAILED, ...
    restarts: int | None = None  # how often Slurm requeued it (None when sacct answered)
    exit_code: str | None = None  # "code:signal"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass
class SlurmLauncher:
    partition: str = ""  # "" is the cluster's default partition
    nodes: int = 1
    gpus_per_node: int = 8  # 0: no GPU request, one process per node
    time_limit: str = ""  # Slurm's --time, e.g. "2-00:00:00"; "" is the partition's limit
    max_attempts: int = 3  # whole-job attempts (Slurm requeues), the first included
    in_place_restarts: int = 2  # torchrun --max-restarts inside one attempt
    python: str = sys.executable
    workdir: str = "."  # where `-m trainer.train` imports from
    extra_sbatch: list[str] = field(default_factory=list)  # e.g. ["--account=ml", "--qos=high"]
    job_name: str = "dyna-train"
    rdzv_port: int = 29500
    signal_before_s: int = 120  # USR1 this long before the time limit, to requeue; 0: off

    def render(self, config_path: str | Path, run_dir: str | Path) -> str:
        values = {
            "job_name": self.job_name,
            "partition": self.partition,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "time_limit": self.time_limit,
            "run_dir": str(Path(run_dir).absolute()),
            "workdir": str(Path(self.workdir).absolute()),
            "config": str(Path(config_path).absolute()),
            "python": self.python,
            "max_attempts": self.max_attempts,
            "in_place_restarts": self.in_place_restarts,
            "nproc_per_node": max(self.gpus_per_node, 1),
            "rdzv_port": self.rdzv_port,
            "signal_before_s": self.signal_before_s,
            "extra_sbatch": list(self.extra_sbatch),
        }
        if self.nodes < 1 or self.max_attempts < 1 or self.in_place_restarts < 0:
            raise ValueError("nodes and max_attempts must be >= 1, in_place_restarts >= 0")
        for key, value in values.items():
            # #SBATCH lines are not shell-quoted: keep every value on one line and paths free of spaces.
            text = " ".join(value) if isinstance(value, list) else str(value)
            if "\n" in text or "\r" in text or (key in ("run_dir", "workdir") and " " in text):
                raise ValueError(f"{key}={text!r}: no newlines (and no spaces in paths) in a batch script")
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
        env.filters["q"] = shlex.quote
        return env.from_string(TEMPLATE.read_text()).render(**values)

    def submit(self, script_path: str | Path) -> str:
        out = _run(["sbatch", "--parsable", str(script_path)])
        return out.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"

    def state(self, job_id: str) -> JobInfo:
        """From slurmctld while it still knows the job (``scontrol``), else from accounting (``sacct``)."""
        try:
            fields = dict(
                kv.split("=", 1) for kv in _run(["scontrol", "-o", "show", "job", job_id]).split() if "=" in kv
            )
            return JobInfo(job_id, fields["JobState"], int(fields.get("Restarts", 0)), fields.get("ExitCode"))
        except (subprocess.CalledProcessError, KeyError):
            pass
        try:
            rows = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode"]).split()
        except subprocess.CalledProcessError:  # e.g. a cluster without accounting
            rows = []
        if not rows:
            raise LookupError(f"Slurm knows no job {job_id}")
        state, exit_code = rows[-1].split("|")
        return JobInfo(job_id, state.split()[0], None, exit_code)

    def wait(self, job_id: str, timeout: float, poll_s: float = 2.0) -> JobInfo:
        """Until the job is finished (a requeued job is not: it goes back to PENDING)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.state(job_id)
            if info.finished:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {info.state} after {timeout:.0f} s")
            time.sleep(poll_s)


def launch_command(config_path: str | Path, run_dir: str | Path, launcher: SlurmLauncher) -> list[str]:
    """Writes the batch script next to the config and returns the command that submits it and
    blocks until the job (all its attempts) is finished; its exit status is the job's."""
    script = Path(config_path).with_suffix(".sbatch")
    (Path(run_dir) / "slurm").mkdir(parents=True, exist_ok=True)  # Slurm does not create --output's folder
    script.write_text(launcher.render(config_path, run_dir))
    script.chmod(0o755)
    return ["sbatch", "--wait", "--parsable", str(script)]


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
