"""A/B timing of versions of the dK/dV kernel: same launch, same inputs, interleaved rounds.

When a code change moves a kernel's time, the tuner's rows cannot say whether the change or the
machine did it (two runs, maybe two hosts). This times several versions of `flash_bwd_kernel.py`
(say, the file at an earlier commit and today's) in one process, round-robin, so drift hits them
all alike. Each version is checked against today's launch before it is timed.

    just bench flash-ab-dkdv --variant old=path/to/old.py --variant new=cs336_systems/attention/flash_bwd_kernel.py \
        --configs 64,64,4,3 32,64,4,4 --rounds 3

A version's `bwd_dkdv_kernel` is launched with the constexprs it declares: TMA and NO_TAIL are each
tried both ways when the kernel has them (TMA only where `tma_ok`). Rows go to
results/attention/dkdv_ab/<device>.jsonl.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

from cs336_systems.bench.cli import Parser, open_store

from ..table import dtype_name
from ..tuning.problem import prepare, rel_err
from .harness import add_checked, add_run_args, int_tuples, load_variant, require_gpu, time_round_robin

BENCH = "attention/dkdv_ab"
KEY = ["run", "round", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma", "no_tail"]
VARIANT_PACKAGE = "cs336_systems.attention"  # where flash_bwd_kernel.py lives: its relative imports (tile_io) resolve
DTYPE = torch.bfloat16  # the leaderboard's (the interpreter test uses fp32)


def dkdv_runner(kernel, q, k, v, do, L, delta, block_m, block_n, warps, stages, tma, no_tail):
    """A closure launching `kernel` as `flash_launch.launch_dkdv` does, passing only the
    constexprs this version declares."""
    from ...flash_launch import _bwd_args, _cdiv, _descriptors, _shape, dot_precision
    from ...triton_loader import next_power_of_2

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
    from ...flash_launch import launch_dkdv, tma_ok
    from ...tiles import BwdConfig

    ap = Parser(prog="flash-ab-dkdv", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=PATH",
                    help="a version of flash_bwd_kernel.py to time (repeatable)")
    ap.add_argument("--configs", nargs="+", default=["64,64,4,3", "32,64,4,4"],
                    metavar="M,N,WARPS,STAGES", help="dK/dV tilings (block_m1, block_n1, warps, stages)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    paths = {}
    for spec in args.variant:
        name, sep, path = spec.partition("=")
        if not sep or not name.isidentifier():
            ap.error(f"--variant: expected NAME=PATH with NAME an identifier, got {spec!r}")
        if not Path(path).is_file():
            ap.error(f"--variant {name}: no file {path}")
        paths[name] = Path(path)
    configs = int_tuples(ap, "--configs", args.configs, "M,N,WARPS,STAGES")
    require_gpu(ap)
    store = open_store(ap, BENCH, KEY, root=args.results_dir)
    variants = {name: load_variant(name, path, VARIANT_PACKAGE) for name, path in paths.items()}

    q, k, v, do, _o, L, delta = state = prepare(args.Z, args.seq, args.d, DTYPE)
    want = launch_dkdv(q, k, v, do, L, delta, True, BwdConfig(64, 64, 64, 64, 4, 2, 4, 2))
    cells = {}
    for (name, mod), (m, n, w, s) in itertools.product(variants.items(), configs):
        kernel = mod.bwd_dkdv_kernel
        tmas = (False, True) if "TMA" in kernel.arg_names and tma_ok(q, k, v, do) else (False,)
        tails = (False, True) if "NO_TAIL" in kernel.arg_names else (False,)
        for tma, no_tail in itertools.product(tmas, tails):
            cell = dict(variant=name, block_m1=m, block_n1=n, num_warps1=w, num_stages1=s, tma=tma, no_tail=no_tail)
            fn = dkdv_runner(kernel, q, k, v, do, L, delta, m, n, w, s, tma, no_tail)
            add_checked(cells, cell, fn, lambda dkdv: rel_err(dkdv, want))
    del state
    time_round_robin(cells, store, args.rounds, args.rep_ms, {"Z": args.Z, "seq": args.seq, "d": args.d,
                                                              "dtype": dtype_name(DTYPE)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
