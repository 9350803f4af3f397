import importlib
import pkgutil
import sys

import benchmarks

HELPERS = {"object_server"}  # modules the benchmarks use, not benchmarks themselves


def benchmark_names() -> list[str]:
    """Every benchmark: each module of this package but the private ones and the helpers."""
    return sorted(
        m.name
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if not m.name.startswith("_") and m.name not in HELPERS
    )


def main(argv: list[str]) -> int:
    names = benchmark_names()
    if not argv or argv[0] not in names:
        print(
            f"usage: python -m benchmarks NAME [--quick | --tiny]   (NAME: {', '.join(names)})\n"
            "  --quick: a smaller run whose figures still mean something; --tiny: every step on the smallest\n"
            "  data, in seconds (what CI runs for every benchmark); NAME --help: that benchmark's options",
            file=sys.stderr,
        )
        return 2
    return importlib.import_module(f"benchmarks.{argv[0]}").main(argv[1:]) or 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
