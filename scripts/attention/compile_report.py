"""Compile the FlashAttention kernels for Hopper (sm_90) on any machine and print their resources.

    python scripts/attention/compile_report.py [--dtype bf16] [--d 64] [--causal] [--tuned] [--onepass-candidates]

Per kernel (forward, dK/dV pass, dQ pass, fused backward, one-pass backward): shared memory,
registers, spills, and whether the tensor-core (wgmma) and asynchronous-copy instructions are there
(`cs336_systems.attention.fast.tuning.compile_report`). Heuristic tiles by default; `--tuned`, the
measured table's plan for the leaderboard launch (256 x 16384).
"""

from __future__ import annotations

import argparse
import sys

import torch

from cs336_systems.attention.fast.table import lookup_bwd, lookup_fwd
from cs336_systems.attention.fast.tuned_configs import TUNED
from cs336_systems.attention.fast.tuning.compile_report import report
from cs336_systems.attention.fast.tuning.tune_candidates import onepass_candidates, onepass_from
from cs336_systems.attention.tiles import heuristic_bwd, heuristic_fwd
from cs336_systems.attention.triton_loader import next_power_of_2

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="compile_report", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tuned", action="store_true",
                    help="report the measured table's tiles for the leaderboard launch (256 x 16384), not the heuristic ones")
    ap.add_argument("--onepass-candidates", action="store_true",
                    help="also compile every one-pass candidate the tuner would time for this dtype and d")
    args = ap.parse_args(argv)
    if not 16 <= args.d <= 128:
        ap.error(f"--d must be in 16..128, got {args.d}")
    dtype, d_pad = DTYPES[args.dtype], next_power_of_2(args.d)
    fwd, bwd = heuristic_fwd(dtype, d_pad), heuristic_bwd(dtype, d_pad)
    if args.tuned:
        fwd = lookup_fwd(TUNED, dtype, args.d, args.causal, 256, 16384, 16384).tiles
        bwd = lookup_bwd(TUNED, dtype, args.d, args.causal, 256, 16384, 16384).tiles
    # the one-pass kernel at the heuristic dK/dV pass's tiles, whose program it extends
    h = heuristic_bwd(dtype, d_pad)
    onepass = onepass_from((h.block_m1, h.block_n1, h.num_warps1, h.num_stages1)).tiles
    for kind, config in (("fwd", fwd), ("dkdv", bwd), ("dq", bwd), ("fused", bwd), ("onepass", onepass)):
        print(kind, config, report(kind, config, dtype, args.d, args.causal))
    if args.onepass_candidates:
        for c in onepass_candidates(dtype, args.d, wide=True):
            print("onepass", c, report("onepass", onepass_from(c).tiles, dtype, args.d, args.causal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
