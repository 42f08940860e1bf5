"""Variants and ablations of the warp-specialised one-pass backward (Gluon), timed round-robin
beside the tuned two-pass Triton backward.

    just bench flash-onepass-ws                                  # check, then time the variants
    just bench flash-onepass-ws --versions math_only no_add full

The check compares dQ, dK, dV with the two-pass Triton backward (and the tests compare with a
float64 reference); the timing is round-robin (`harness.time_round_robin`) over the Gluon kernel's
variants (keys per program, ring depths, the dQ warpgroup's registers), its ablations (`VERSIONS`,
made by editing the kernel's source) and the tuned Triton backward, so all meet the same clock.
Rows go to results/attention/onepass_ws/<device>.jsonl.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from cs336_systems.bench.cli import Parser, open_store

from ..gluon.onepass_ws import launch_bwd_onepass_ws
from ..tuning.problem import prepare, rel_err
from .harness import add_run_args, int_tuples, load_variant, require_gpu, time_round_robin

KERNEL_FILE = Path(__file__).parents[1] / "gluon" / "flash_bwd_ws_kernel.py"
VARIANT_PACKAGE = "cs336_systems.attention.fast.gluon"

# ablations, made by editing the kernel's source (as ab_onepass does for the Triton one-pass kernel)
ADD_BLOCK = ('        if DQ_TMA:\n'
            '            tma.store_wait(RB - 1)  # the bulk reduction issued from buffer i % RB, RB tiles ago, has read it\n'
            '            gl.thread_barrier()\n'
            '            red_s.index(i % RB).store(dq * sm_scale)\n'
            '            fence_async_shared()\n'
            '            gl.thread_barrier()\n'
            '            _tma_reduce_add(dq_desc, [bh * n_q + lo + i * BM, 0], red_s.index(i % RB))\n'
            '        else:\n'
            '            gl.atomic_add(base + (i * BM + rows)[:, None] * D + cols[None, :], dq * sm_scale, sem="relaxed")\n')  # the adds: both paths
HANDOFF = ("        mbarrier.wait(ds_empty.index(W * SLOTS + t), ((i // SLOTS) & 1) ^ 1)\n"
           "        ds_s.index(W * SLOTS + t).store(dsT)\n")
DQ_LOOP = "    for i in range(n_iter):\n        t = i % SLOTS\n        dq = zero_q"
BENCH = "attention/onepass_ws"
STORED = ("block_n", "stages", "slots", "reduce_warps", "reduce_regs")  # the rows' fields (see main)
IMPL = "gluon one-pass ws, dQ warpgroup"  # rows before it: "gluon one-pass ws" (staged shares)
NEVER = "        if n_q < 0:  # ablation: never true, not known at compile time\n"
DIAG = "        n_diag = gl.minimum((key0 + 64 - lo + BM - 1) // BM, n_iter)\n"
VERSIONS = {"math_only": "math warpgroups only (dS^T computed, not handed over; no dQ)",
            "no_add": "+ dS^T handed over, dQ's matmul (not added)",
            "full": "+ the adds (the kernel as committed)",
            "mask_every_tile": "the kernel as committed, but the causal mask on every tile"}


def variant_source(name: str, source: str) -> str:
    """The kernel file's text for one ablation (raises if the lines it edits are not there once)."""
    for marker in (ADD_BLOCK, HANDOFF, DQ_LOOP, DIAG):
        if source.count(marker) != 1:
            raise ValueError(f"onepass_ws: kernel source has {source.count(marker)} copies of {marker.strip()[:60]!r}")
    guard = lambda block: NEVER + "".join("    " + line + "\n" for line in block.splitlines())  # noqa: E731
    if name == "full":
        return source
    if name == "no_add":
        return source.replace(ADD_BLOCK, guard(ADD_BLOCK))
    if name == "mask_every_tile":  # the masked loop runs every tile, the unmasked one none
        return source.replace(DIAG, "        n_diag = n_iter\n")
    if name == "math_only":
        return source.replace(HANDOFF, guard(HANDOFF)).replace(DQ_LOOP, DQ_LOOP.replace("n_iter", "n_iter * 0", 1))
    raise ValueError(f"onepass_ws: unknown version {name!r}; choose from {list(VERSIONS)}")


def main(argv: list[str] | None = None) -> int:
    from ..launch import launch_bwd
    from ..table import lookup_bwd
    from ..tuned_configs import TUNED

    ap = Parser(prog="flash-onepass-ws", description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["128,2,2,96,0", "128,2,2,80,1", "128,2,2,96,1"],
                    metavar="BLOCK_N,STAGES,SLOTS,DQ_REGS,DQ_TMA", help="DQ_TMA 1: the adds by TMA bulk reductions")
    ap.add_argument("--versions", nargs="+", default=["full"], choices=list(VERSIONS),
                    help="ablations of the kernel (each timed at every variant)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    fields = ("block_n", "stages", "slots", "dq_regs", "dq_tma")
    variants = int_tuples(ap, "--variants", args.variants, ",".join(f.upper() for f in fields))
    require_gpu(ap)
    # the rows' fields (STORED) are kept from the first design, where a reducer partition added staged shares
    store = open_store(ap, BENCH, ["run", "round", "impl", "version", *STORED], root=args.results_dir)
    q, k, v, do, o, L, delta = prepare(args.Z, args.seq, args.d, torch.bfloat16)
    # the reference is the Triton backward the table names, even where its entry runs this kernel
    plan = replace(lookup_bwd(TUNED, q.dtype, args.d, True, args.Z, args.seq, args.seq), gluon=None)
    want = launch_bwd(q, k, v, o, L, do, True, plan)
    cells = {(("impl", "triton two-pass (tuned)"), ("version", ""), *((f, 0) for f in STORED)):
             (lambda: launch_bwd(q, k, v, o, L, do, True, plan), 0.0)}
    source = KERNEL_FILE.read_text()
    with tempfile.TemporaryDirectory() as workdir:
        for version, var in itertools.product(args.versions, variants):
            path = Path(workdir) / f"ws_{version}.py"
            if not path.exists():
                path.write_text(variant_source(version, source))
            kernel = load_variant(f"ws_{version}", path, VARIANT_PACKAGE).bwd_onepass_ws_kernel
            opts = dict(zip(fields, var))
            fn = lambda o=opts, kern=kernel: launch_bwd_onepass_ws(  # noqa: E731
                q, k, v, do, L, delta, True, kernel=kern, **(o | {"dq_tma": bool(o["dq_tma"])}))
            err = rel_err(fn(), want)  # compiles
            print(f"[onepass_ws] {version} {opts}: rel err vs two-pass {err:.2e}", flush=True)
            if version == "full" and not err < 3e-2:
                raise SystemExit(f"[onepass_ws] {opts} is wrong (rel err {err:.3g}); not timing it")
            row = dict(block_n=opts["block_n"], stages=opts["stages"], slots=opts["slots"], reduce_warps=4,
                       reduce_regs=opts["dq_regs"])
            impl = IMPL + (", TMA adds" if opts["dq_tma"] else "")
            cells[(("impl", impl), ("version", version), *row.items())] = (fn, err)
        time_round_robin(cells, store, args.rounds, args.rep_ms, {"Z": args.Z, "seq": args.seq, "d": args.d,
                                                                  "dtype": "bf16"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
