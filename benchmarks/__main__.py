import importlib
import pkgutil
import sys

import benchmarks

HELPERS = {"object_server"}  # modules the benchmarks use, not benchmarks themselves


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                   if not m.name.startswith("_") and m.name not in HELPERS)
    if not argv or argv[0] not in names:
        print(f"usage: python -m benchmarks NAME [--quick]   (NAME: {', '.join(names)})", file=sys.stderr)
        return 2
    return importlib.import_module(f"benchmarks.{argv[0]}").main(argv[1:]) or 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
