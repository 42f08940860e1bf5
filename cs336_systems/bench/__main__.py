"""`python -m cs336_systems.bench NAME [ARGS...]`: run one benchmark by name (see registry.py).

    python -m cs336_systems.bench list          # every benchmark, [gpu] marking `just bench-all`'s
    python -m cs336_systems.bench gpu-names     # the names `just bench-all` runs, in order
    python -m cs336_systems.bench plan          # their rough time on an H200, from the committed rows
    python -m cs336_systems.bench all [ARGS]    # `just bench-all`: the plan, then each in turn

A Ctrl-C ends the benchmark with one line saying which rows it wrote and how to go on, not a
traceback (exit 130).
"""

from __future__ import annotations

import importlib
import signal
import sys

from .registry import BENCHMARKS

EXIT_INTERRUPTED = 130  # what a shell reports for SIGINT


def interrupted_line(name: str) -> str:
    """What a Ctrl-C leaves: the rows each store opened by this run gained, and how to go on."""
    from .cli import OPENED
    from .store import read_rows

    parts, resume = [], None
    for store, before, resumable in OPENED:
        try:
            now = len(read_rows(store.path))
        except Exception:  # noqa: BLE001 - the summary must not raise a traceback itself
            continue
        if now > before:
            parts.append(f"{now - before} row(s) in {store.path}")
        resume = resume or (store.invocation if resumable else None)
    done = "wrote " + ", ".join(parts) if parts else "no row written"
    again = (f"; the same command with --resume {resume} measures only the cells not finished"
             if resume and parts else "; the cells not finished were not measured")
    return f"bench {name}: interrupted (Ctrl-C); {done}{again}"


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
    if name in ("plan", "all"):  # `just bench-all`
        from .bench_all import print_plan, run_all

        return print_plan(rest) if name == "plan" else run_all(rest)
    if name not in BENCHMARKS:
        print(f"error: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    from .cli import OPENED

    OPENED.clear()
    try:
        module = importlib.import_module(BENCHMARKS[name].module)
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not print a traceback
        sys.stderr.write("\n" + interrupted_line(name) + "\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
