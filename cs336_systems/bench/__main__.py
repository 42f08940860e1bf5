"""`python -m cs336_systems.bench NAME [ARGS...]`: run one benchmark by name (see registry.py)."""

from __future__ import annotations

import importlib
import sys

from .registry import BENCHMARKS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "list"}:
        print("usage: python -m cs336_systems.bench NAME [ARGS...]   (ARGS go to the benchmark)\n")
        width = max(map(len, BENCHMARKS))
        for name, b in BENCHMARKS.items():
            print(f"  {name:<{width}}  {'[gpu] ' if b.gpu else '      '}{b.about}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "gpu-names":  # used by `just bench-all`
        print(" ".join(n for n, b in BENCHMARKS.items() if b.gpu))
        return 0
    if name not in BENCHMARKS:
        print(f"error: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[name].module)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
