"""infra/ansible: syntax check per inventory, ansible-lint (production profile, offline), a --check run
against this machine, the GPU checks against a stand-in nvidia-smi, and the inventories' shape."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.preflight.config import config_from_dict

ANSIBLE_DIR = Path(__file__).resolve().parents[2] / "infra" / "ansible"
INVENTORY_DIR = ANSIBLE_DIR / "inventory"
PROVIDERS = ["gcp", "coreweave", "lambda", "onprem"]
BIN = Path(sys.executable).parent
SYSTEM_PYTHON = Path("/usr/bin/python3")  # the local inventory's interpreter (it has the apt bindings)


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN}: pip install -e '.[dev]' (ansible-core, ansible-lint)")
    return str(path)


@pytest.fixture
def ansible_env(tmp_path: Path) -> dict[str, str]:
    """Ansible and ansible-lint write their caches and temp files under tmp_path, never into the repo."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DYNA_"))}
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        ANSIBLE_HOME=str(home / ".ansible"),
        ANSIBLE_LOCAL_TEMP=str(home / ".ansible" / "tmp"),
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        NO_COLOR="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def run(args: list[str], env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=timeout)


def tree(path: Path) -> set[str]:
    return {os.fspath(p.relative_to(path)) for p in path.rglob("*")}


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def provider_variables() -> list[str]:
    """The names site.yml asserts every inventory defines."""
    (play,) = load_yaml(ANSIBLE_DIR / "site.yml")
    (check,) = [t for t in play["pre_tasks"] if "provider_variables" in t.get("vars", {})]
    return check["vars"]["provider_variables"]


def role_default_names() -> set[str]:
    names: set[str] = set()
    for defaults in ANSIBLE_DIR.glob("roles/*/defaults/main.yml"):
        names |= set(load_yaml(defaults) or {})
    return names


# --- static: syntax and lint ------------------------------------------------------------------


@pytest.mark.parametrize("inventory", PROVIDERS + ["local"])
def test_syntax_check(inventory: str, ansible_env: dict[str, str]) -> None:
    result = run([tool("ansible-playbook"), "--syntax-check", "-i", f"inventory/{inventory}", "site.yml"], ansible_env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile(ansible_env: dict[str, str]) -> None:
    before = tree(ANSIBLE_DIR)
    result = run([tool("ansible-lint"), "--offline", "--nocolor"], ansible_env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Profile 'production' was required, and it passed" in output, output
    assert tree(ANSIBLE_DIR) == before, "ansible-lint wrote into the repository"


# --- the inventories ---------------------------------------------------------------------------


@pytest.mark.parametrize("inventory", PROVIDERS + ["local"])
def test_inventory_defines_every_provider_variable(inventory: str) -> None:
    defined = set(load_yaml(INVENTORY_DIR / inventory / "group_vars" / "all.yml"))
    missing = sorted(set(provider_variables()) - defined)
    assert not missing, f"inventory/{inventory} is missing provider variables: {missing}"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_provider_inventory_adds_no_unknown_variables(provider: str) -> None:
    """Anything else a provider sets must override a role default; a new provider difference goes into
    site.yml's provider_variables (and so into every inventory)."""
    defined = set(load_yaml(INVENTORY_DIR / provider / "group_vars" / "all.yml"))
    unknown = sorted(defined - set(provider_variables()) - role_default_names())
    assert not unknown, f"inventory/{provider} sets {unknown}: neither provider variables nor role defaults"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_provider_inventory_lists_gpu_nodes(provider: str) -> None:
    hosts = load_yaml(INVENTORY_DIR / provider / "hosts.yml")
    assert hosts["gpu_nodes"]["hosts"], f"inventory/{provider} lists no gpu_nodes"


SECRET_NAME = re.compile(r"(password|passwd|secret|token|api_?key|private_?key|credential)", re.I)
SECRET_VALUE = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\b(ghp|gho|ghs|github_pat|glpat|xox[abp])[-_][A-Za-z0-9_]{16,}"),
    re.compile(r"\b[a-z][a-z0-9+]*://[^/\s:@]+:[^/\s@]+@"),  # user:password@ in a URL
    re.compile(r"\"type\":\s*\"service_account\""),
    re.compile(r"\b[A-Za-z0-9+/_-]{40,}={0,2}"),  # a long opaque token
]


ASSIGNMENT = re.compile(r"^\s*(?:-\s*)?([A-Za-z_][\w.-]*)\s*[:=]\s*(.*)$")  # YAML key or KEY=value


def secret_findings(text: str) -> list[str]:
    findings = [m.group(0) for pattern in SECRET_VALUE for m in pattern.finditer(text)]
    for line in text.splitlines():
        assignment = ASSIGNMENT.match(line)
        if not assignment:
            continue
        key, value = assignment.group(1), assignment.group(2).strip().strip("'\"")
        # A secret-named variable may only point elsewhere (a lookup or a vault variable), never hold a value.
        if SECRET_NAME.search(key) and value not in ("", "{}", "[]") and "{{" not in value:
            findings.append(line.strip())
    return findings


def test_secret_detector_catches_planted_secrets() -> None:
    assert secret_findings("dyna_registry_url: postgresql://dyna:hunter2@db:5432/dyna")
    assert secret_findings("db_password: hunter2")
    assert secret_findings("aws: AKIAABCDEFGHIJKLMNOP")
    assert secret_findings("DYNA_API_TOKEN=abc123")
    assert not secret_findings('db_password: "{{ vault_db_password }}"')
    assert not secret_findings("torch_index_url: https://download.pytorch.org/whl/cu128")


def test_no_secrets_in_the_playbook_or_inventories() -> None:
    files = [p for p in ANSIBLE_DIR.rglob("*") if p.is_file()]
    findings = {os.fspath(p.relative_to(ANSIBLE_DIR)): f for p in files if (f := secret_findings(p.read_text()))}
    assert not findings, f"secret-looking values: {findings}"


# --- runs against this machine -----------------------------------------------------------------


def require_local_check_target() -> None:
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"the local inventory runs modules with {SYSTEM_PYTHON}, which this machine lacks")
    probe = subprocess.run([str(SYSTEM_PYTHON), "-c", "import apt"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"{SYSTEM_PYTHON} has no apt bindings (python3-apt): the apt module cannot run in check mode")


def digest(paths: list[Path]) -> dict[str, str]:
    return {os.fspath(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.exists()}


def rendered_by_diff(output: str, template: str) -> str:
    """The file --diff shows for a new template: the '+' lines after its '+++ after: ...' header."""
    match = re.search(rf"\+\+\+ after: \S*{re.escape(template)}\n@@[^\n]*\n((?:\+[^\n]*\n)+)", output)
    assert match, f"--diff shows no {template}:\n{output}"
    return "".join(line[1:] + "\n" for line in match.group(1).splitlines())


def test_check_run_against_localhost_changes_nothing(tmp_path: Path, ansible_env: dict[str, str]) -> None:
    """The whole playbook in check mode: no GPU role (expected_gpus: 0), no device, every path under
    DYNA_ANSIBLE_CHECK_ROOT, slurmd untouched. Afterwards that root is still empty and the system
    files the roles would edit are byte for byte the same."""
    require_local_check_target()
    check_root = tmp_path / "check-root"
    check_root.mkdir()
    system_files = digest([Path("/etc/fstab"), Path("/etc/group"), Path("/etc/slurm/slurm.conf")])
    env = {**ansible_env, "DYNA_ANSIBLE_CHECK_ROOT": str(check_root)}

    result = run([tool("ansible-playbook"), "--check", "--diff", "-i", "inventory/local", "site.yml"], env, timeout=180)
    output = result.stdout + result.stderr

    assert result.returncode == 0, output
    assert re.search(r"localhost\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", output), output
    # The templates rendered (shown by --diff) with the inventory's values.
    assert f"Prolog={check_root}/etc/dyna/prolog.sh" in output, output
    assert f"DYNA_CACHE_DIR={check_root}/nvme/dyna-cache" in output, output
    assert "python -m infra.preflight --config" in output, output
    preflight = yaml.safe_load(rendered_by_diff(output, "preflight.yaml.j2"))
    assert preflight["cache"]["path"] == f"{check_root}/nvme/dyna-cache"
    config_from_dict(preflight)  # the preflight accepts the config the playbook writes
    assert list(check_root.iterdir()) == [], "check mode created files"
    assert digest([Path("/etc/fstab"), Path("/etc/group"), Path("/etc/slurm/slurm.conf")]) == system_files


FAKE_NVIDIA_SMI = """#!/bin/sh
# Stand-in for nvidia-smi: answers the role's query only; anything else (e.g. -pm 1) fails loudly.
case "$*" in
  *--query-gpu=name,driver_version,persistence_mode*)
    printf 'NVIDIA H100 80GB HBM3, 570.86.15, Disabled\\nNVIDIA H100 80GB HBM3, 570.86.15, Disabled\\n' ;;
  *) echo "unexpected nvidia-smi call: $*" >&2; exit 3 ;;
esac
"""


@pytest.mark.parametrize(
    ("extra_vars", "passes"),
    [
        ({"expected_gpus": 2, "expected_gpu_model": "NVIDIA H100 80GB HBM3"}, True),
        ({"expected_gpus": 8, "expected_gpu_model": "NVIDIA H100 80GB HBM3"}, False),
        ({"expected_gpus": 2, "expected_gpu_model": "NVIDIA A100-SXM4-80GB"}, False),
        ({"expected_gpus": 2, "expected_gpu_model": "NVIDIA H100 80GB HBM3", "gpu_driver_min_version": "580.0"}, False),
    ],
    ids=["matches", "too-few-gpus", "wrong-model", "old-driver"],
)
def test_gpu_role_checks_count_model_and_driver(
    tmp_path: Path, ansible_env: dict[str, str], extra_vars: dict, passes: bool
) -> None:
    """The gpu role alone, in check mode, against a stand-in nvidia-smi reporting two H100s."""
    require_local_check_target()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake_bin / "nvidia-smi").chmod(0o755)
    env = {**ansible_env, "PATH": f"{fake_bin}{os.pathsep}{ansible_env['PATH']}"}
    env["DYNA_ANSIBLE_CHECK_ROOT"] = str(tmp_path / "check-root")

    args = [tool("ansible-playbook"), "--check", "-i", "inventory/local", "site.yml", "--tags", "gpu"]
    args += ["-e", yaml.safe_dump(extra_vars, default_flow_style=True).strip()]
    result = run(args, env)
    output = result.stdout + result.stderr

    assert "TASK [gpu : Check the driver, GPU count and model]" in output, output
    if passes:
        assert result.returncode == 0, output
    else:
        assert result.returncode != 0, output
        assert "nvidia-smi reports" in output, output
