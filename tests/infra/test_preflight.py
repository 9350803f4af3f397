"""Preflight: every check on recorded-format fixtures, and the CLI end to end with fake
nvidia-smi / journalctl / container runtime and a recording scontrol first on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.preflight.checks import (
    FAIL,
    OK,
    SKIP,
    WARN,
    CacheReadings,
    NodeReadings,
    check_cache_free_space,
    check_container_runtime,
    run_checks,
)
from infra.preflight.commands import CommandOutcome, run_command
from infra.preflight.config import (
    DEFAULT_CONFIG_PATH,
    CacheConfig,
    ConfigError,
    DrainConfig,
    RuntimeConfig,
    config_from_dict,
    load_config,
)
from infra.preflight.disk import DiskUsage, mount_of, parse_mounts, probe_writable
from infra.preflight.gather import read_cache, read_gpus, read_xids
from infra.preflight.gpu import parse_nvidia_smi_xml
from infra.preflight.kernel import parse_xid_events
from infra.preflight.verdict import drain_command, drain_reason

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3

NODE_CONFIG = {
    "gpu": {
        "expected_count": 8,
        "expected_model": "NVIDIA H100 80GB HBM3",
        "allowed_driver_versions": ["550.90.07"],
        "min_max_sm_clock_mhz": 1980,
        "warn_volatile_correctable_ecc": 10000,
    },
    "cache": {"path": "/mnt/nvme", "require_mount": True, "min_free_gib": 100, "min_free_percent": 5},
    "container_runtime": {"command": ["enroot", "version"], "timeout_s": 5},
}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def cache_readings(mounts: str = "mounts_healthy.txt", write_error=None, usage=None) -> CacheReadings:
    return CacheReadings(
        path="/mnt/nvme",
        exists=True,
        is_mount=True,
        mount=mount_of("/mnt/nvme", parse_mounts(fixture(mounts))),
        write_error=write_error,
        usage=usage or DiskUsage(total_bytes=3500 * GIB, free_bytes=3100 * GIB),
    )


def readings(
    nvsmi: str = "nvsmi_healthy_8xh100.xml",
    kernel_log: str = "kern_healthy.log",
    cache: CacheReadings | None = None,
    runtime: CommandOutcome | None = None,
) -> NodeReadings:
    return NodeReadings(
        gpu=parse_nvidia_smi_xml(fixture(nvsmi)),
        xids=parse_xid_events(fixture(kernel_log)),
        cache=cache or cache_readings(),
        runtime=runtime or CommandOutcome(("enroot", "version"), 0, "3.4.1\n"),
    )


def results_by_name(node: NodeReadings, config=None):
    return {r.name: r for r in run_checks(node, config or config_from_dict(NODE_CONFIG))}


# --- every check on the healthy node -------------------------------------------------------


def test_every_check_passes_on_the_healthy_node():
    results = results_by_name(readings())
    assert {r.severity for r in results.values()} == {OK}, results
    assert len(results) == 12


def test_a_lifetime_counter_alone_never_fails_a_node():
    node = readings(nvsmi="nvsmi_lifetime_ecc_only.xml")
    gpu2 = node.gpu.gpus[2]
    assert gpu2.aggregate_uncorrectable_ecc == 5 and gpu2.volatile_uncorrectable_ecc == 0
    results = results_by_name(node)
    assert {r.severity for r in results.values()} == {OK}
    assert "lifetime uncorrectable: 6, not used" in results["ecc_volatile"].reason


# --- each fault fails its check with the reason the runbook lists ----------------------------


@pytest.mark.parametrize(
    ("nvsmi", "check", "reason"),
    [
        (
            "nvsmi_volatile_uncorrectable_ecc.xml",
            "ecc_volatile",
            "GPU 3 (00000000:5D:00.0): 2 uncorrectable ECC errors since boot",
        ),
        ("nvsmi_remap_pending.xml", "row_remapping", "GPU 5 (00000000:AB:00.0): row remap pending (needs GPU reset)"),
        (
            "nvsmi_retirement_pending.xml",
            "page_retirement",
            "GPU 1 (00000000:2A:00.0): page retirement pending (needs GPU reset)",
        ),
        ("nvsmi_missing_gpu_7of8.xml", "gpu_count", "expected 8 GPUs, found 7"),
        ("nvsmi_wrong_model.xml", "gpu_model", "GPU 0 (00000000:18:00.0) is 'NVIDIA H100 PCIe'"),
    ],
)
def test_gpu_faults_fail_with_their_reason(nvsmi, check, reason):
    results = results_by_name(readings(nvsmi=nvsmi))
    assert results[check].severity == FAIL and not results[check].ok
    assert reason in results[check].reason
    assert [r.name for r in results.values() if r.severity == FAIL] == [check]


def test_remap_failure_fails_and_newer_split_sram_counters_are_summed():
    text = fixture("nvsmi_healthy_8xh100.xml")
    text = text.replace(
        "<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>", 1
    )
    # drivers 570+ split sram_uncorrectable into parity and SEC-DED counters
    text = text.replace(
        "<sram_uncorrectable>0</sram_uncorrectable>",
        "<sram_uncorrectable_parity>1</sram_uncorrectable_parity><sram_uncorrectable_secded>2</sram_uncorrectable_secded>",
        1,
    )
    inventory = parse_nvidia_smi_xml(text)
    assert inventory.gpus[0].volatile_uncorrectable_ecc == 3
    node = NodeReadings(gpu=inventory, cache=cache_readings(), runtime=CommandOutcome(("enroot",), 0))
    results = results_by_name(node)
    assert results["row_remapping"].reason == "GPU 0 (00000000:18:00.0): row remapping failed"
    assert "GPU 0 (00000000:18:00.0): 3 uncorrectable ECC errors since boot" in results["ecc_volatile"].reason


def test_driver_and_clock_mismatches_fail():
    config = config_from_dict(
        {
            **NODE_CONFIG,
            "gpu": {**NODE_CONFIG["gpu"], "allowed_driver_versions": ["535.183.01"], "min_max_sm_clock_mhz": 2100},
        }
    )
    results = results_by_name(readings(), config)
    assert results["driver_version"].reason == "driver 550.90.07 not in 535.183.01"
    assert results["clocks"].severity == FAIL
    assert "GPU 0 (00000000:18:00.0): max SM clock 1980 MHz < 2100 MHz" in results["clocks"].reason


def test_xid_79_fails_and_a_non_fatal_xid_only_warns():
    fatal = results_by_name(readings(kernel_log="kern_xid79.log"))["xid"]
    assert fatal.severity == FAIL
    assert fatal.reason == "Xid 79 on PCI:0000:3a:00 (GPU has fallen off the bus)"
    warning = results_by_name(readings(kernel_log="kern_xid13_only.log"))["xid"]
    assert warning.ok and warning.severity == WARN
    assert warning.reason.startswith("Xid 13 on PCI:0000:9a:00 (Graphics SM Warp Exception") and "x2" in warning.reason


def test_fatal_xids_are_configuration():
    config = config_from_dict({**NODE_CONFIG, "kernel": {"fatal_xids": [13]}})
    assert results_by_name(readings(kernel_log="kern_xid13_only.log"), config)["xid"].severity == FAIL
    assert results_by_name(readings(kernel_log="kern_xid79.log"), config)["xid"].severity == WARN


def test_read_only_cache_mount_fails():
    node = readings(cache=cache_readings(mounts="mounts_cache_ro.txt", write_error="Read-only file system"))
    results = results_by_name(node)
    assert results["cache_mount"].reason == "cache /mnt/nvme mounted read-only (/dev/nvme0n1p1)"
    assert results["cache_writable"].reason == "cache /mnt/nvme not writable: Read-only file system"


def test_cache_on_the_root_disk_fails_and_a_folder_on_the_nvme_mount_passes():
    from infra.preflight.disk import MountEntry

    root = MountEntry("/dev/sda1", "/", "ext4", ("rw",))
    cache = CacheReadings("/mnt/nvme", exists=True, is_mount=False, mount=root, write_error=None, usage=None)
    result = results_by_name(readings(cache=cache))["cache_mount"]
    assert result.reason == "cache /mnt/nvme is not on a mounted volume (it would fill the root disk)"
    nvme = MountEntry("/dev/nvme0n1", "/mnt/nvme", "xfs", ("rw",))
    folder = CacheReadings(
        "/mnt/nvme/dyna-cache", exists=True, is_mount=False, mount=nvme, write_error=None, usage=None
    )
    assert results_by_name(readings(cache=folder))["cache_mount"].severity != FAIL


def test_full_disk_fails_on_bytes_and_on_percent():
    config = CacheConfig(path="/mnt/nvme", min_free_gib=100, min_free_percent=5)
    nearly_full = DiskUsage(total_bytes=3500 * GIB, free_bytes=20 * GIB)
    result = check_cache_free_space(nearly_full, "/mnt/nvme", config)
    assert result.severity == FAIL and result.reason == "cache /mnt/nvme has 20.0 GiB free (< 100 GiB)"
    big_but_full = DiskUsage(total_bytes=30000 * GIB, free_bytes=1000 * GIB)
    result = check_cache_free_space(big_but_full, "/mnt/nvme", config)
    assert result.severity == FAIL and result.reason == "cache /mnt/nvme is 3.3% free (< 5%)"


def test_mounts_parse_and_the_longest_mount_point_holds_a_path():
    mounts = parse_mounts(fixture("mounts_healthy.txt") + "/dev/sdb1 /mnt/nvme2 xfs ro 0 0\n")
    assert mount_of("/mnt/nvme/dyna-cache", mounts).device == "/dev/nvme0n1p1"
    assert mount_of("/mnt/nvme2/x", mounts).read_only
    assert mount_of("/home/user", mounts).mount_point == "/"


# --- container runtime: real commands, no timing assertions ---------------------------------


def test_dead_container_runtime_fails(tmp_path):
    config = RuntimeConfig(command=("false",), timeout_s=5)
    result = check_container_runtime(run_command(config.command, config.timeout_s), config)
    assert result.severity == FAIL and result.reason == "container runtime `false` exited 1"


def test_hung_container_runtime_is_killed_and_fails(tmp_path):
    # a wrapper whose grandchild holds the pipes, as `docker info` against a hung daemon can
    hang = tmp_path / "docker"
    hang.write_text("#!/bin/sh\nsleep 300 &\nsleep 300\n")
    hang.chmod(0o755)
    config = RuntimeConfig(command=(str(hang), "info"), timeout_s=0.5)
    outcome = run_command(config.command, config.timeout_s)
    assert outcome.timed_out
    result = check_container_runtime(outcome, config)
    assert result.severity == FAIL and result.reason.endswith("timed out after 0.5s")


def test_missing_container_runtime_fails():
    config = RuntimeConfig(command=("no-such-runtime-binary", "info"))
    result = check_container_runtime(run_command(config.command, 5), config)
    assert result.reason == "container runtime `no-such-runtime-binary info` not found"


def test_runtime_stderr_tail_goes_into_the_reason():
    outcome = CommandOutcome(
        ("docker", "info"), 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock\n"
    )
    result = check_container_runtime(outcome, RuntimeConfig(command=("docker", "info")))
    assert result.reason == (
        "container runtime `docker info` exited 1: Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
    )


# --- gathering (the real side) ----------------------------------------------------------------


def test_writable_probe_and_cache_readings(tmp_path):
    assert probe_writable(str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    assert probe_writable(str(tmp_path / "missing")) is not None
    cache = read_cache(CacheConfig(path=str(tmp_path)))
    assert cache.exists and cache.write_error is None and cache.usage.total_bytes > 0
    assert read_cache(CacheConfig(path=str(tmp_path / "missing"))).exists is False


def test_cpu_node_skips_gpu_checks_and_never_runs_nvidia_smi():
    config = config_from_dict({"gpu": {"expected_count": 0, "nvidia_smi": ["no-such-nvidia-smi"]}})
    assert read_gpus(config.gpu) == (None, None)
    results = results_by_name(NodeReadings(), config)
    for name in (
        "gpu_count",
        "gpu_model",
        "driver_version",
        "ecc_volatile",
        "row_remapping",
        "page_retirement",
        "clocks",
    ):
        assert results[name].severity == SKIP and results[name].reason == "no GPUs expected"


def test_missing_nvidia_smi_fails_a_gpu_node():
    config = config_from_dict({"gpu": {"expected_count": 8, "nvidia_smi": ["no-such-nvidia-smi", "-q", "-x"]}})
    inventory, error = read_gpus(config.gpu)
    assert inventory is None and error == "no-such-nvidia-smi not found"
    result = results_by_name(NodeReadings(gpu_error=error), config)["gpu_count"]
    assert result.severity == FAIL and result.reason == "no-such-nvidia-smi not found (expected 8 GPUs)"


def test_kernel_log_falls_back_to_the_next_command_and_warns_when_none_works(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(fixture("kern_xid79.log"))
    config = config_from_dict({"kernel": {"log_commands": [["no-such-journalctl", "-k", "-b"], ["cat", str(log)]]}})
    xids, error = read_xids(config.kernel)
    assert error is None and [x.code for x in xids] == [79]
    config = config_from_dict({"kernel": {"log_commands": [["no-such-journalctl"]]}})
    xids, error = read_xids(config.kernel)
    result = results_by_name(NodeReadings(xids=xids, kernel_log_error=error), config)["xid"]
    assert result.severity == WARN and result.reason == "kernel log unreadable: no-such-journalctl not found"


# --- verdict ---------------------------------------------------------------------------------------


def test_drain_reason_is_truncated_and_passed_as_one_argument():
    results = results_by_name(readings(nvsmi="nvsmi_wrong_model.xml", kernel_log="kern_xid79.log"))
    config = DrainConfig(max_reason_chars=80)
    reason = drain_reason(list(results.values()), config)
    assert len(reason) == 80 and reason.startswith("preflight: GPU 0 (00000000:18:00.0) is 'NVIDIA H100 PCIe'")
    assert reason.endswith("...")
    argv = drain_command("node-7", reason, config)
    assert argv == ["scontrol", "update", "NodeName=node-7", "State=DRAIN", f"Reason={reason}"]


# --- config ----------------------------------------------------------------------------------------


def test_default_config_loads():
    config = load_config(DEFAULT_CONFIG_PATH)
    assert config.gpu.expected_count == 8 and 79 in config.kernel.fatal_xids


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"gpu": {"expected_count": "eight"}}, "gpu.expected_count"),
        ({"gpu": {"expected_count": -1}}, "gpu.expected_count"),
        ({"gpu": {"expected_gpus": 8}}, "gpu.expected_gpus"),
        ({"kernel": {"fatal_xids": [79, "x"]}}, "kernel.fatal_xids[1]"),
        ({"cache": {"min_free_percent": 150}}, "cache.min_free_percent"),
        ({"container_runtime": {"command": "docker info"}}, "container_runtime.command"),
        ({"dran": {}}, "dran"),
    ],
)
def test_config_errors_name_the_field(raw, field):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw)
    assert caught.value.field_name == field
    assert str(caught.value).startswith(f"{field}: ")


# --- the CLI end to end ------------------------------------------------------------------------------


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


@pytest.fixture
def fake_node(tmp_path):
    """A bin/ with fake nvidia-smi, journalctl, enroot and a recording scontrol; returns a runner."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls.jsonl"
    _script(
        bin_dir / "scontrol",
        f"import json, sys\nwith open({str(calls)!r}, 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n",
    )
    _script(bin_dir / "enroot", "print('3.4.1')\n")
    cache = tmp_path / "cache"
    cache.mkdir()

    def run(nvsmi="nvsmi_healthy_8xh100.xml", kernel_log="kern_healthy.log", config=None, args=(), env=None):
        _script(bin_dir / "nvidia-smi", f"print(open({str(FIXTURES / nvsmi)!r}).read(), end='')\n")
        _script(bin_dir / "journalctl", f"print(open({str(FIXTURES / kernel_log)!r}).read(), end='')\n")
        raw = config or {
            "gpu": {"expected_count": 8, "expected_model": "NVIDIA H100 80GB HBM3"},
            "kernel": {"log_commands": [["journalctl", "-k", "-b", "--no-pager"]]},
            "cache": {"path": str(cache), "require_mount": False, "min_free_gib": 0, "min_free_percent": 0},
            "container_runtime": {"command": ["enroot", "version"]},
        }
        config_path = tmp_path / "preflight.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **(env or {})}
        done = subprocess.run(
            [sys.executable, "-m", "infra.preflight", "--config", str(config_path), *args],
            cwd=REPO,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        return done, recorded

    return run


def test_cli_healthy_node_exits_0_without_draining(fake_node):
    done, calls = fake_node(args=["--node", "node-7"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls == []
    assert "node-7 healthy" in done.stdout


def test_cli_faulty_node_drains_once_with_the_reasons(fake_node):
    done, calls = fake_node(
        nvsmi="nvsmi_volatile_uncorrectable_ecc.xml", kernel_log="kern_xid79.log", args=["--node", "node-7"]
    )
    assert done.returncode == 1, done.stdout + done.stderr
    reason = (
        "preflight: GPU 3 (00000000:5D:00.0): 2 uncorrectable ECC errors since boot; "
        "Xid 79 on PCI:0000:3a:00 (GPU has fallen off the bus)"
    )
    assert calls == [["update", "NodeName=node-7", "State=DRAIN", f"Reason={reason}"]]


def test_cli_node_name_comes_from_slurmd_nodename(fake_node):
    done, calls = fake_node(nvsmi="nvsmi_missing_gpu_7of8.xml", env={"SLURMD_NODENAME": "node-7"})
    assert done.returncode == 1
    assert calls == [["update", "NodeName=node-7", "State=DRAIN", "Reason=preflight: expected 8 GPUs, found 7"]]


def test_cli_dry_run_and_json_never_drain(fake_node):
    done, calls = fake_node(nvsmi="nvsmi_remap_pending.xml", args=["--node", "node-7", "--dry-run", "--json"])
    assert done.returncode == 1 and calls == []
    report = json.loads(done.stdout)
    assert report["healthy"] is False and report["drained"] is False
    assert (
        report["drain_command"][-1] == "Reason=preflight: GPU 5 (00000000:AB:00.0): row remap pending (needs GPU reset)"
    )
    assert {r["name"]: r["severity"] for r in report["results"]}["row_remapping"] == "fail"


def test_cli_config_error_exits_2_naming_the_field(fake_node):
    done, calls = fake_node(config={"gpu": {"expected_count": "eight"}}, args=["--node", "node-7"])
    assert done.returncode == 2 and calls == []
    assert "gpu.expected_count" in done.stderr


def test_cli_usage_error_exits_2(fake_node):
    done, calls = fake_node(args=["--no-such-flag"])
    assert done.returncode == 2 and calls == []


def test_cli_still_exits_1_when_scontrol_fails(fake_node, tmp_path):
    config = {
        "gpu": {"expected_count": 8},
        "kernel": {"log_commands": [["journalctl", "-k", "-b"]]},
        "drain": {"scontrol": str(tmp_path / "no-such-scontrol")},
    }
    done, calls = fake_node(nvsmi="nvsmi_missing_gpu_7of8.xml", config=config, args=["--node", "node-7"])
    assert done.returncode == 1 and calls == []
    assert "could not drain node-7: " in done.stderr and "not found" in done.stderr
