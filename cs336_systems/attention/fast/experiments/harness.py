"""What the A/B experiments share: loading an edited kernel file as a module, their command-line
arguments, and timing cells round-robin so drift in clocks or neighbours hits each cell alike."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from ..tuning import problem


def load_variant(name: str, path: Path, package: str):
    """Import the kernel file at `path` as a module of `package` (named `_ab_<name>`), so its
    relative imports resolve as the committed kernel's do."""
    if not path.is_file():
        raise FileNotFoundError(f"no kernel file {path}")
    mod_name = f"{package}._ab_{name}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """The shape (the leaderboard's by default), the rounds and the output of an A/B run."""
    ap.add_argument("--Z", type=int, default=16, help="batch x heads")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--d", type=int, default=64)
    add_timing_args(ap)


def add_timing_args(ap: argparse.ArgumentParser) -> None:
    """The rounds, the time per timing and the output of a round-robin run (`at_least(1)`: a run that
    times nothing is refused before it compiles anything)."""
    from cs336_systems.bench.cli import at_least

    ap.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds; the median decides")
    ap.add_argument("--rep-ms", type=at_least(1), default=100, help="do_bench time per timing")
    ap.add_argument("--results-dir", default=None)


def cudnn_attention(q, k, v, causal: bool):
    """SDPA pinned to its cuDNN backend: what the experiments measure our kernels against."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def int_tuples(ap: argparse.ArgumentParser, flag: str, values: list[str], fields: str) -> list[tuple[int, ...]]:
    """'64,64,4,3'-style arguments as tuples of ints with as many fields as `fields` names; a bad one
    exits with a message naming the flag."""
    n = fields.count(",") + 1
    try:
        out = [tuple(int(x) for x in v.split(",")) for v in values]
    except ValueError:
        out = []
    if len(out) != len(values) or any(len(t) != n for t in out):
        ap.error(f"{flag}: expected {fields} integers, got {values}")
    return out


def require_gpu(ap: argparse.ArgumentParser) -> None:
    """Timing runs need CUDA (the tests run the flows on the interpreter by setting problem.DEVICE)."""
    if problem.DEVICE == "cuda" and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (this times kernels)")


def add_checked(cells: dict[tuple, tuple], cell: dict, fn, error_of, tol: float = 3e-2) -> None:
    """Run `fn` once (it compiles), and add it to the cells to time if `error_of` its result is
    below `tol`; a wrong version stops the run (a fast wrong kernel is no result)."""
    t0 = time.perf_counter()
    err = error_of(fn())
    print(f"[ab] compiled {cell} in {time.perf_counter() - t0:.1f} s, rel err {err:.2e}", flush=True)
    if not err < tol:
        raise SystemExit(f"[ab] {cell} is wrong (rel err {err:.3g}); not timing it")
    cells[tuple(cell.items())] = (fn, err)


def time_round_robin(cells: dict[tuple, tuple], store, rounds: int, rep_ms: int, shape: dict) -> None:
    """Time every cell (key: its fields as (name, value) pairs; value: (fn, rel_err)) once per round,
    round-robin, so drift in clocks or neighbours spreads over all of them; one row per timing
    (with `shape` and the run's id), then the medians, fastest first."""
    from cs336_systems.bench.timing import gpu_bench

    run = time.strftime("%Y%m%dT%H%M%S")
    times: dict[tuple, list[float]] = {c: [] for c in cells}
    for r in range(rounds):
        for cell, (fn, err) in cells.items():
            ms = gpu_bench(fn, warmup_ms=10, rep_ms=rep_ms)
            times[cell].append(ms)
            store.append(dict(cell) | {"run": run, "round": r} | shape, {"ms": ms, "rel_err": err})
        print(f"[ab] round {r + 1}/{rounds} done", flush=True)
    for cell, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"[ab] {statistics.median(ts):.3f} ms (min {min(ts):.3f})  {dict(cell)}")
