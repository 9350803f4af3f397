"""python -m infra.preflight [--config FILE] [--node NAME] [--dry-run] [--json]

A Slurm Prolog or HealthCheckProgram: exit 0 healthy, 1 unhealthy (node drained), 2 usage/config error.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from .checks import run_checks
from .config import DEFAULT_CONFIG_PATH, ConfigError, load_config
from .gather import read_node
from .verdict import EXIT_USAGE, conclude


def default_node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.preflight",
        description="Node preflight: exit 0 healthy, 1 unhealthy (drained), 2 config/usage error.",
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="thresholds (YAML)")
    parser.add_argument("--node", default=None, help="Slurm node name (default: $SLURMD_NODENAME, else hostname)")
    parser.add_argument("--dry-run", action="store_true", help="report, never drain")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else 0
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"preflight: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    results = run_checks(read_node(config), config)
    return conclude(results, args.node or default_node_name(), config.drain, dry_run=args.dry_run, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
