"""A/B timing of versions of the dK/dV kernel: same launch, same inputs, interleaved rounds.

When a code change moves a kernel's time, the tuner's rows cannot say whether the change or the
machine did it (two runs, maybe two hosts). This times several versions of `flash_bwd_kernel.py`
(say, the file at an earlier commit and today's) in one process, round-robin, so drift hits them
all alike. Each version is checked against today's launch before it is timed.

    python -m cs336_systems.attention.ab_dkdv --variant old=path/to/old.py --variant new=path/to/new.py \
        --configs 64,64,4,3 32,64,4,4 --rounds 3

A version's `bwd_dkdv_kernel` is launched with the constexprs it declares: TMA and NO_TAIL are each
tried both ways when the kernel has them (TMA only where `tma_ok`).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

VARIANT_PACKAGE = "cs336_systems.attention"  # so a version's relative imports (tile_io) resolve
DTYPE = torch.bfloat16  # the leaderboard's (the interpreter test uses fp32)


def load_variant(name: str, path: Path):
    """Import the kernel file at `path` as a module of this package (named `_ab_<name>`)."""
    if not path.is_file():
        raise SystemExit(f"--variant {name}: no file {path}")
    mod_name = f"{VARIANT_PACKAGE}._ab_{name}"
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
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median decides")
    ap.add_argument("--rep-ms", type=int, default=100, help="do_bench time per timing")
    ap.add_argument("--results-dir", default=None)


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
    """Timing runs need CUDA (the tests run the flow on the interpreter by setting tune.DEVICE)."""
    from . import tune

    if tune.DEVICE == "cuda" and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (this times kernels)")


def dkdv_runner(kernel, q, k, v, do, L, delta, block_m, block_n, warps, stages, tma, no_tail):
    """A closure launching `kernel` as `flash_launch.launch_dkdv` does, passing only the
    constexprs this version declares."""
    from .flash_launch import _bwd_args, _cdiv, _descriptors, _shape, dot_precision
    from .triton_loader import next_power_of_2

    Z, H, n_q, n_k, d = _shape(q, k)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    strides, sizes = _bwd_args(q, k, v, do, L, delta)
    ins = _descriptors(q, k, v, do, block_m, block_n) if tma else (q, k, v, do)
    const = dict(CAUSAL=True, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M=block_m,
                 BLOCK_N=block_n, TMA=tma, NO_TAIL=no_tail, INPUT_PRECISION=dot_precision(q.dtype))
    const = {key: val for key, val in const.items() if key in kernel.arg_names}

    def run():
        kernel[(_cdiv(n_k, block_n), Z * H)](*ins, L, delta, dk, dv, *strides, *sizes, **const,
                                             num_warps=warps, num_stages=stages)
        return dk, dv
    return run


def main(argv: list[str] | None = None) -> int:
    from ..bench.store import ResultStore
    from .configs import BwdConfig, dtype_name
    from .flash_launch import launch_dkdv, tma_ok
    from .tune import _prepare, _rel_err

    ap = argparse.ArgumentParser(prog="ab_dkdv", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=PATH",
                    help="a version of flash_bwd_kernel.py to time (repeatable)")
    ap.add_argument("--configs", nargs="+", default=["64,64,4,3", "32,64,4,4"],
                    metavar="M,N,WARPS,STAGES", help="dK/dV tilings (block_m1, block_n1, warps, stages)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    variants = {}
    for spec in args.variant:
        name, sep, path = spec.partition("=")
        if not sep or not name.isidentifier():
            ap.error(f"--variant: expected NAME=PATH with NAME an identifier, got {spec!r}")
        variants[name] = load_variant(name, Path(path))
    configs = int_tuples(ap, "--configs", args.configs, "M,N,WARPS,STAGES")
    require_gpu(ap)

    q, k, v, do, _o, L, delta = state = _prepare(args.Z, args.seq, args.d, DTYPE)
    want = launch_dkdv(q, k, v, do, L, delta, True, BwdConfig(64, 64, 64, 64, 4, 2, 4, 2))
    cells = {}
    for (name, mod), (m, n, w, s) in itertools.product(variants.items(), configs):
        kernel = mod.bwd_dkdv_kernel
        tmas = (False, True) if "TMA" in kernel.arg_names and tma_ok(q, k, v, do) else (False,)
        tails = (False, True) if "NO_TAIL" in kernel.arg_names else (False,)
        for tma, no_tail in itertools.product(tmas, tails):
            cell = dict(variant=name, block_m1=m, block_n1=n, num_warps1=w, num_stages1=s, tma=tma, no_tail=no_tail)
            fn = dkdv_runner(kernel, q, k, v, do, L, delta, m, n, w, s, tma, no_tail)
            t0 = time.perf_counter()
            err = _rel_err(fn(), want)  # compiles
            print(f"[ab] compiled {cell} in {time.perf_counter() - t0:.1f} s, rel err {err:.2e}", flush=True)
            if not err < 3e-2:
                raise SystemExit(f"[ab] {cell} is wrong (rel err {err:.3g}); not timing it")
            cells[tuple(cell.items())] = (fn, err)
    del state
    store = ResultStore("attention/dkdv_ab", key=["run", "round", "variant", "block_m1", "block_n1",
                                                  "num_warps1", "num_stages1", "tma", "no_tail"],
                        root=args.results_dir)
    time_round_robin(cells, store, args.rounds, args.rep_ms, {"Z": args.Z, "seq": args.seq, "d": args.d,
                                                              "dtype": dtype_name(DTYPE)})
    return 0


def time_round_robin(cells: dict[tuple, tuple], store, rounds: int, rep_ms: int, shape: dict) -> None:
    """Time every cell (key: its fields as (name, value) pairs; value: (fn, rel_err)) once per round,
    round-robin, so drift in clocks or neighbours spreads over all of them; one row per timing
    (with `shape` and the run's id), then the medians, fastest first."""
    from ..bench.timing import gpu_bench

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


if __name__ == "__main__":
    sys.exit(main())
