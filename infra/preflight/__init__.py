"""Node preflight: GPU inventory and health, Xids since boot, node cache, container runtime.

Run as a Slurm Prolog or HealthCheckProgram: `python -m infra.preflight`. Readings are
gathered in gather.py; the checks in checks.py are pure functions of them.
"""

from .checks import CheckResult, NodeReadings, run_checks
from .config import ConfigError, PreflightConfig, load_config

__all__ = ["CheckResult", "ConfigError", "NodeReadings", "PreflightConfig", "load_config", "run_checks"]
