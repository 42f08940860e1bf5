"""`just bench-all`: every `[gpu]` benchmark in order, each in a fresh process, with a plan first.

    python -m cs336_systems.bench plan [--device nvidia-h200]   # the rough times alone
    python -m cs336_systems.bench all [ARGS...]                 # the plan, then every benchmark

Before it starts it prints roughly how long each benchmark takes on the device, from the committed
rows' wall times: a row's `cell_wall_s` (the sweep runner records it), or for older rows the time
since the row before it in the same file, when that gap is short enough to be one cell's work
(GAP_S); the newest row of each cell counts, a cell with no usable time counts as the file's
median. Then each benchmark runs with its `bench_all_args` (registry.py) and ARGS, under a
progress line: `== [3/13] memory (about 14 min; 21 min so far)`. A failed benchmark is reported and
the next one runs; the exit status is the worst of theirs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .registry import BENCHMARKS, Benchmark

GAP_S = 30 * 60  # a longer gap between two rows is a pause between GPU calls, not a cell's work
DEVICE = "nvidia-h200"


def _time(row: dict) -> float | None:
    try:
        return dt.datetime.strptime(row["time_utc"], "%Y-%m-%dT%H:%M:%SZ").timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def file_seconds(rows: Sequence[dict], key: Sequence[str]) -> tuple[float, int]:
    """(rough seconds, cells) of one results file: the wall times of the newest row per cell."""
    timed = sorted(((t, i, r) for i, r in enumerate(rows) if (t := _time(r)) is not None),
                   key=lambda x: (x[0], x[1]))
    seconds: list[float | None] = []
    newest: dict[tuple, int] = {}
    previous = None
    for t, _, row in timed:
        gap = t - previous if previous is not None else None
        wall = row.get("cell_wall_s")
        seconds.append(float(wall) if isinstance(wall, (int, float)) else gap if gap is not None and gap <= GAP_S
                       else None)
        newest[tuple(str(row.get(k)) for k in key)] = len(seconds) - 1
        previous = t
    known = [s for s in seconds if s is not None]
    median = statistics.median(known) if known else 0.0
    chosen = [seconds[i] for i in newest.values()]
    return sum(s if s is not None else median for s in chosen), len(chosen)


def estimate(bench: Benchmark, root: Path, device: str = DEVICE) -> tuple[float, int] | None:
    """(rough seconds, cells) of one benchmark on `device`, or None without committed rows."""
    from .store import read_rows, results_path

    total, cells, found = 0.0, 0, False
    for name, key in bench.timed:
        path = results_path(name, device, root)
        if path.exists():
            seconds, n = file_seconds(read_rows(path), key)
            total, cells, found = total + seconds, cells + n, True
    return (total, cells) if found else None


def human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan(root: Path, device: str = DEVICE) -> list[tuple[str, tuple[float, int] | None]]:
    return [(name, estimate(b, root, device)) for name, b in BENCHMARKS.items() if b.gpu]


def print_plan(argv: list[str] | None = None, root: Path | None = None) -> int:
    from .store import COMMITTED_ROOT

    ap = argparse.ArgumentParser(prog="bench plan", description="rough time of each [gpu] benchmark")
    ap.add_argument("--device", default=DEVICE, help=f"the device slug of the results files (default {DEVICE})")
    args = ap.parse_args(argv)
    rows = plan(root or COMMITTED_ROOT, args.device)
    width = max(len(n) for n, _ in rows)
    print(f"just bench-all: {len(rows)} benchmarks; rough times on {args.device} from the committed rows' wall times")
    for name, est in rows:
        shown = f"~{human(est[0]):>7}  ({est[1]} cells)" if est else "    ?     (no committed rows)"
        print(f"  {name:<{width}}  {shown}")
    total = sum(est[0] for _, est in rows if est)
    print(f"  {'total':<{width}}  ~{human(total):>7}" + ("  (without the ?)" if any(e is None for _, e in rows) else ""))
    return 0


def run_all(argv: list[str], root: Path | None = None) -> int:
    """Every [gpu] benchmark in a fresh process, with a progress line before each."""
    from .store import COMMITTED_ROOT

    print_plan([], root)
    estimates = dict(plan(root or COMMITTED_ROOT))
    names = [n for n, b in BENCHMARKS.items() if b.gpu]
    start, codes, done = time.monotonic(), {}, []
    for i, name in enumerate(names, 1):
        est = estimates.get(name)
        so_far = human(time.monotonic() - start)
        print(f"== [{i}/{len(names)}] {name} ({'about ' + human(est[0]) if est else 'no estimate'}; "
              f"{so_far} so far)", flush=True)
        cmd = [sys.executable, "-m", "cs336_systems.bench", name, *BENCHMARKS[name].bench_all_args, *argv]
        t0 = time.monotonic()
        try:
            code = subprocess.run(cmd).returncode
        except KeyboardInterrupt:
            left = names[i:]
            print(f"bench-all: interrupted during {name}; finished: {', '.join(done) or 'none'}; "
                  f"not run: {', '.join(left) or 'none'}", file=sys.stderr)
            return 130
        codes[name] = code
        done.append(name)
        took = human(time.monotonic() - t0)
        print(f"== {name}: {'done' if code == 0 else f'!! exit {code}'} in {took}", flush=True)
    failed = [n for n, c in codes.items() if c != 0]
    print(f"== bench-all: {len(names) - len(failed)} of {len(names)} benchmarks exited 0"
          + (f"; not: {', '.join(f'{n} ({codes[n]})' for n in failed)}" if failed else "")
          + f"; {human(time.monotonic() - start)} in all")
    return max(codes.values(), default=0, key=lambda c: (c != 0, c))
