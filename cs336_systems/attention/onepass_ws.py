"""Launch, check and time the warp-specialised one-pass backward (`flash_bwd_ws_kernel`, Gluon).

`launch_bwd` runs the kernel where a table entry says `gluon_ws` (the tuner times it as kernel
"ws" beside the Triton backwards and picks its settings); this module is its launcher and its
laboratory: ablations and variants timed round-robin against the tuned two-pass backward.

    python -m cs336_systems.attention.onepass_ws                       # check, then time variants
    python -m cs336_systems.attention.onepass_ws --versions math_only no_add full

The check compares dQ, dK, dV with the two-pass Triton backward (and the tests compare with a
float64 reference); the timing is round-robin (`ab_dkdv.time_round_robin`) over the Gluon kernel's
variants (keys per program, ring depths, the dQ warpgroup's registers), its ablations (`VERSIONS`,
made by editing the kernel's source) and the tuned Triton backward, so all meet the same clock.
Rows go to results/attention/onepass_ws/<device>.jsonl.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import Tensor

BLOCK = 64  # query rows per tile, and keys per math warpgroup


def ws_supported(q: Tensor, k: Tensor, v: Tensor, do: Tensor, is_causal: bool, block_n: int = 128) -> str | None:
    """Why the Gluon kernel cannot take these inputs, or None."""
    import triton

    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        return "needs a Hopper GPU (sm_90)"
    if not triton.__version__.startswith("3.6"):
        return f"written against Triton 3.6's Gluon API (installed: {triton.__version__})"
    if q.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != q.dtype for t in (k, v, do)):
        return "needs bf16 or fp16 inputs of one dtype"
    if q.shape[-1] != 64:
        return "written for head dim 64"
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        return "needs contiguous inputs"
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q % BLOCK or n_k % block_n:
        return f"n_q must be a multiple of {BLOCK} and n_k of {block_n}"
    if is_causal and n_q != n_k:
        return "causal needs n_q == n_k"
    return None


def register_split(block_n: int, dq_regs: int) -> tuple[int, int]:
    """(maxnreg at launch, math warpgroups' registers): the 64K-register file over one program's warps
    (a math warpgroup per 64 keys, and the dQ warpgroup); setmaxnreg then moves registers from the
    dQ warpgroup (dq_regs) to the math warpgroups."""
    warps = 4 * block_n // 64 + 4
    maxnreg = 65536 // (32 * warps) // 8 * 8
    return maxnreg, min(256, (warps * maxnreg - 4 * dq_regs) // (warps - 4) // 8 * 8)


def launch_bwd_onepass_ws(q, k, v, do, L, delta, is_causal: bool, stages: int = 2, slots: int = 2,
                          dq_regs: int = 80, block_n: int = 128, dq_tma: bool = True, red_bufs: int = 2,
                          kernel=None) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV of (Z, H, N, 64) inputs (see `ws_supported`); L, delta (Z, H, n_q) fp32.
    block_n keys per program (128), one math warpgroup per 64 of them; one more warpgroup
    (dq_regs registers per thread) does dQ's matmul and adds. `kernel` replaces the committed kernel (for ablations)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .flash_launch import _scales
    from .flash_bwd_ws_kernel import bwd_onepass_ws_kernel

    if block_n != 128:  # at 64 keys two programs per SM do not fit their registers without spills
        raise ValueError(f"launch_bwd_onepass_ws: block_n must be 128, got {block_n}")
    if dq_regs % 8 or not 24 <= dq_regs <= 256:
        raise ValueError(f"launch_bwd_onepass_ws: dq_regs must be a multiple of 8 in [24, 256], got {dq_regs}")
    if (why := ws_supported(q, k, v, do, is_causal, block_n)) is not None:
        raise ValueError(f"launch_bwd_onepass_ws: {why}; got q {tuple(q.shape)} {q.dtype}")
    Z, H, n_q, d = q.shape
    n_k = k.shape[2]
    gl_dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, d], gl_dtype)
    descs = [TensorDescriptor.from_tensor(t.reshape(-1, d), [BLOCK, d], layout) for t in (q, k, v, do)]
    dq = torch.zeros((Z, H, n_q, d), dtype=torch.float32, device=q.device)
    dq_desc = TensorDescriptor.from_tensor(dq.view(-1, d), [BLOCK, d], gl.NVMMASharedLayout.get_default_for([BLOCK, d], gl.float32))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale, qk_scale = _scales(d)
    maxnreg, math_regs = register_split(block_n, dq_regs)
    kernel = kernel or bwd_onepass_ws_kernel
    kernel[(n_k // block_n, Z * H)](
        *descs, L, delta, dq, dq_desc, dk, dv, n_q, n_k, qk_scale, sm_scale,
        D=d, BM=BLOCK, BN=block_n, STAGES=stages, SLOTS=slots, CAUSAL=is_causal, MATH_REGS=math_regs,
        DQ_REGS=dq_regs, DQ_TMA=dq_tma, RED_BUFS=red_bufs, num_warps=4, maxnreg=maxnreg)
    return dq.to(q.dtype), dk, dv


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
    import itertools
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    from ..bench.store import ResultStore
    from .ab_dkdv import add_run_args, int_tuples, load_variant, require_gpu, time_round_robin
    from .configs import bwd_config
    from .flash_launch import launch_bwd
    from .tune import _prepare, _rel_err

    ap = argparse.ArgumentParser(prog="onepass_ws", description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["128,2,2,96,0", "128,2,2,80,1", "128,2,2,96,1"],
                    metavar="BLOCK_N,STAGES,SLOTS,DQ_REGS,DQ_TMA", help="DQ_TMA 1: the adds by TMA bulk reductions")
    ap.add_argument("--versions", nargs="+", default=["full"], choices=list(VERSIONS),
                    help="ablations of the kernel (each timed at every variant)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    fields = ("block_n", "stages", "slots", "dq_regs", "dq_tma")
    variants = int_tuples(ap, "--variants", args.variants, ",".join(f.upper() for f in fields))
    # the rows' fields (kept from the first design, where a reducer partition added staged shares)
    stored = ("block_n", "stages", "slots", "reduce_warps", "reduce_regs")
    require_gpu(ap)
    q, k, v, do, o, L, delta = _prepare(args.Z, args.seq, args.d, torch.bfloat16)
    # the reference is the Triton backward the table names, even where its entry runs this kernel
    cfg = replace(bwd_config(q.dtype, args.d, True, args.Z, args.seq, args.seq), gluon_ws=False)
    want = launch_bwd(q, k, v, o, L, do, True, cfg)
    cells = {(("impl", "triton two-pass (tuned)"), ("version", ""), *((f, 0) for f in stored)):
             (lambda: launch_bwd(q, k, v, o, L, do, True, cfg), 0.0)}
    source = Path(__file__).with_name("flash_bwd_ws_kernel.py").read_text()
    with tempfile.TemporaryDirectory() as workdir:
        for version, var in itertools.product(args.versions, variants):
            path = Path(workdir) / f"ws_{version}.py"
            if not path.exists():
                path.write_text(variant_source(version, source))
            kernel = load_variant(f"ws_{version}", path).bwd_onepass_ws_kernel
            opts = dict(zip(fields, var))
            fn = lambda o=opts, kern=kernel: launch_bwd_onepass_ws(  # noqa: E731
                q, k, v, do, L, delta, True, kernel=kern, **(o | {"dq_tma": bool(o["dq_tma"])}))
            err = _rel_err(fn(), want)  # compiles
            print(f"[onepass_ws] {version} {opts}: rel err vs two-pass {err:.2e}", flush=True)
            if version == "full" and not err < 3e-2:
                raise SystemExit(f"[onepass_ws] {opts} is wrong (rel err {err:.3g}); not timing it")
            row = dict(block_n=opts["block_n"], stages=opts["stages"], slots=opts["slots"], reduce_warps=4,
                       reduce_regs=opts["dq_regs"])
            impl = IMPL + (", TMA adds" if opts["dq_tma"] else "")
            cells[(("impl", impl), ("version", version), *row.items())] = (fn, err)
        store = ResultStore(BENCH, key=["run", "round", "impl", "version", *stored],
                            root=args.results_dir)
        time_round_robin(cells, store, args.rounds, args.rep_ms, {"Z": args.Z, "seq": args.seq, "d": args.d,
                                                                  "dtype": "bf16"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
