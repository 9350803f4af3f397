"""What every benchmark's command line shares: the size it runs at.

- full (no flag): the run whose figures docs/benchmarks.md publishes;
- ``--quick``: a smaller run whose figures still mean something (minutes);
- ``--tiny``: the smallest run that still goes through every step of the full one (seconds). CI
  runs every benchmark this way (tests/test_benchmarks.py), so none can rot unnoticed; its
  figures mean nothing.
"""

from __future__ import annotations

import argparse
from typing import Literal

Size = Literal["full", "quick", "tiny"]

TINY_HELP = "every step on the smallest data (seconds; what CI runs): checks the benchmark works, figures mean nothing"


def add_size_flags(ap: argparse.ArgumentParser, quick: str = "a smaller run (minutes)") -> None:
    """``--quick`` and ``--tiny``, at most one of them.

    :param quick: the ``--quick`` help text: what the quick run is made of.
    """
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help=quick)
    group.add_argument("--tiny", action="store_true", help=TINY_HELP)


def size_of(args: argparse.Namespace) -> Size:
    """The size the parsed flags ask for."""
    if args.tiny:
        return "tiny"
    return "quick" if args.quick else "full"
