"""How fast can the GPU add the one-pass backward's dQ shares, with nothing else running?

The one-pass backward adds, for every (key tile, query tile) pair on or below the diagonal, a
(BLOCK_M, d) fp32 tile into dQ. `ab_onepass` measured what that add costs inside the kernel; this
probe measures the adds alone, in the same order and amount, to separate the memory system's
cost (L2 reductions) from the kernel's (staging, barriers):

    grid (key tiles, Z*H); program t adds a tile into each query tile at or after its diagonal

    just bench flash-reduce-probe          # leaderboard shape, 64- and 128-key tiles

Ways of adding, each timed (do_bench, median) and reported as GB/s of fp32 added:
    atomics   every thread `tl.atomic_add`s its elements (red.global)
    tma       the tile goes through shared memory to one TMA bulk tensor reduction
    store     plain stores of the same tiles (not a sum: the traffic without the read-modify-write)

Rows go to results/attention/reduce_probe/<device>.jsonl.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from cs336_systems.bench.cli import Parser, open_store

from .harness import int_tuples

BENCH = "attention/reduce_probe"
KEY = ["mode", "block_m", "block_n", "bh", "seq", "d"]
MODES = ("atomics", "tma", "store")


@triton.jit
def dq_adds_kernel(DQ, n_queries, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   MODE: tl.constexpr):
    """MODE 0: atomics, 1: TMA bulk reductions (DQ a descriptor, box (1, BLOCK_M, d)), 2: stores."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    share = tl.full([BLOCK_M, HEAD_DIM], 1.0, tl.float32) + tile.to(tl.float32)  # not foldable across tiles
    for start_m in range(tile * BLOCK_N, n_queries, BLOCK_M):
        if MODE == 1:
            DQ.atomic_add([bh, start_m, 0], share.reshape(1, BLOCK_M, HEAD_DIM))
        else:
            ptrs = DQ + bh.to(tl.int64) * n_queries * HEAD_DIM + (start_m + offs_m0)[:, None] * HEAD_DIM + offs_d[None, :]
            if MODE == 0:
                tl.atomic_add(ptrs, share, sem="relaxed")
            else:
                tl.store(ptrs, share)


def tiles_problem(seq: int, block_m: int, block_n: int) -> str | None:
    """Why these tiles cannot cover dQ exactly (the kernel has no masks), or None."""
    if seq % block_m or block_n % block_m:
        return f"seq ({seq}) and BLOCK_N ({block_n}) must be multiples of BLOCK_M ({block_m})"
    return None


def run_probe(bh: int, seq: int, d: int, block_m: int, block_n: int, mode: str, num_warps: int = 4,
              device: str = "cuda"):
    """(launch closure, the dQ buffer it adds into, bytes of fp32 one launch adds). The kernel has
    no masks, like the one-pass kernel's main loop: every share must lie inside dQ."""
    if (why := tiles_problem(seq, block_m, block_n)) is not None:
        raise ValueError(f"reduce_probe: {why}")
    dq = torch.zeros((bh, seq, d), dtype=torch.float32, device=device)
    arg = dq
    if mode == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor

        arg = TensorDescriptor.from_tensor(dq, [1, block_m, d])
    n_tiles = triton.cdiv(seq, block_n)
    grid = (n_tiles, bh)
    pairs = bh * sum(len(range(t * block_n, seq, block_m)) for t in range(n_tiles))

    def fn():
        dq_adds_kernel[grid](arg, seq, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, MODE=MODES.index(mode),
                             num_warps=num_warps)
    return fn, dq, pairs * block_m * d * 4


def main(argv: list[str] | None = None) -> int:
    from cs336_systems.bench.timing import gpu_bench

    ap = Parser(prog="flash-reduce-probe", description=__doc__.splitlines()[0])
    ap.add_argument("--bh", type=int, default=16, help="batch x heads (the leaderboard: 16)")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--tiles", nargs="+", default=["64,64", "64,128"], metavar="BLOCK_M,BLOCK_N",
                    help="query rows per share, keys per program")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    tiles = int_tuples(ap, "--tiles", args.tiles, "BLOCK_M,BLOCK_N")
    for block_m, block_n in tiles:
        if (why := tiles_problem(args.seq, block_m, block_n)) is not None:
            ap.error(f"--tiles: {why}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (this times global-memory reductions)")
    store = open_store(ap, BENCH, KEY, root=args.results_dir)
    for (block_m, block_n), mode in ((t, m) for t in tiles for m in args.modes):
        fn, _, nbytes = run_probe(args.bh, args.seq, args.d, block_m, block_n, mode)
        fn()
        ms = gpu_bench(fn, warmup_ms=25, rep_ms=200)
        cell = dict(mode=mode, block_m=block_m, block_n=block_n, bh=args.bh, seq=args.seq, d=args.d)
        store.append(cell, {"ms": ms, "gbytes": nbytes / 1e9, "gb_per_s": nbytes / 1e9 / (ms / 1e3)})
        print(f"[reduce_probe] {mode:8s} {block_m}x{block_n}: {nbytes / 1e9:.2f} GB in {ms:.3f} ms "
              f"= {nbytes / 1e6 / ms:.0f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
