"""Launch, check and time the warp-specialised one-pass backward (`flash_bwd_ws_kernel`, Gluon).

EXPERIMENT: not wired into `launch_bwd` or the tuner until it has been checked and timed on the GPU.

    python -m cs336_systems.attention.onepass_ws          # leaderboard shape: check, then time

The check compares dQ, dK, dV with the two-pass Triton backward (and the tests compare with a
float64 reference); the timing is round-robin (`ab_dkdv.time_round_robin`) over the Gluon kernel's
variants (ring depths, reducer registers) and the tuned Triton backward, so the two meet the same
clock. Rows go to results/attention/onepass_ws/<device>.jsonl.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import Tensor

BLOCK = 64  # square tiles (the kernel's causal loop assumes it)


def ws_supported(q: Tensor, k: Tensor, v: Tensor, do: Tensor, is_causal: bool) -> str | None:
    """Why the Gluon kernel cannot take these inputs, or None."""
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        return "needs a Hopper GPU (sm_90)"
    if q.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != q.dtype for t in (k, v, do)):
        return "needs bf16 or fp16 inputs of one dtype"
    if q.shape[-1] != 64:
        return "written for head dim 64"
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        return "needs contiguous inputs"
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q % BLOCK or n_k % BLOCK:
        return f"sequence lengths must be multiples of {BLOCK}"
    if is_causal and n_q != n_k:
        return "causal needs n_q == n_k"
    return None


def launch_bwd_onepass_ws(q, k, v, do, L, delta, is_causal: bool, stages: int = 2, slots: int = 2,
                          reduce_regs: int = 80, maxnreg: int = 128) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV of (Z, H, N, 64) inputs (see `ws_supported`); L, delta (Z, H, n_q) fp32."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .flash_launch import _scales
    from .flash_bwd_ws_kernel import bwd_onepass_ws_kernel

    if (why := ws_supported(q, k, v, do, is_causal)) is not None:
        raise ValueError(f"launch_bwd_onepass_ws: {why}; got q {tuple(q.shape)} {q.dtype}")
    Z, H, n_q, d = q.shape
    n_k = k.shape[2]
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, d], gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16)
    descs = [TensorDescriptor.from_tensor(t.reshape(-1, d), [BLOCK, d], layout) for t in (q, k, v, do)]
    dq = torch.zeros((Z, H, n_q, d), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale, qk_scale = _scales(d)
    bwd_onepass_ws_kernel[(n_k // BLOCK, Z * H)](
        *descs, L, delta, dq, dk, dv, n_q, n_k, qk_scale, sm_scale,
        D=d, BM=BLOCK, BN=BLOCK, STAGES=stages, SLOTS=slots, CAUSAL=is_causal, REDUCE_REGS=reduce_regs,
        num_warps=4, maxnreg=maxnreg)
    return dq.to(q.dtype), dk, dv


def main(argv: list[str] | None = None) -> int:
    from ..bench.store import ResultStore
    from .ab_dkdv import add_run_args, require_gpu, time_round_robin
    from .configs import bwd_config
    from .flash_launch import launch_bwd
    from .tune import _prepare, _rel_err

    ap = argparse.ArgumentParser(prog="onepass_ws", description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["2,2,80", "3,2,80", "2,3,80", "2,2,56"],
                    metavar="STAGES,SLOTS,REDUCE_REGS")
    add_run_args(ap)
    args = ap.parse_args(argv)
    from .ab_dkdv import int_tuples

    variants = int_tuples(ap, "--variants", args.variants, "STAGES,SLOTS,REDUCE_REGS")
    require_gpu(ap)
    q, k, v, do, o, L, delta = _prepare(args.Z, args.seq, args.d, torch.bfloat16)
    cfg = bwd_config(q.dtype, args.d, True, args.Z, args.seq, args.seq)
    want = launch_bwd(q, k, v, o, L, do, True, cfg)
    cells = {(("impl", "triton two-pass (tuned)"), ("stages", 0), ("slots", 0), ("reduce_regs", 0)):
             (lambda: launch_bwd(q, k, v, o, L, do, True, cfg), 0.0)}
    for stages, slots, regs in variants:
        fn = lambda s=stages, t=slots, r=regs: launch_bwd_onepass_ws(q, k, v, do, L, delta, True, s, t, r)  # noqa: E731
        try:
            got = fn()
        except Exception as exc:  # noqa: BLE001 - an experiment: report and go on with the others
            print(f"[onepass_ws] {stages},{slots},{regs}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        err = _rel_err(got, want)
        print(f"[onepass_ws] {stages},{slots},{regs}: rel err vs two-pass {err:.2e}", flush=True)
        if err < 3e-2:
            cells[(("impl", "gluon one-pass ws"), ("stages", stages), ("slots", slots), ("reduce_regs", regs))] = (fn, err)
    store = ResultStore("attention/onepass_ws", key=["run", "round", "impl", "stages", "slots", "reduce_regs"],
                        root=args.results_dir)
    time_round_robin(cells, store, args.rounds, args.rep_ms, {"Z": args.Z, "seq": args.seq, "d": args.d,
                                                              "dtype": "bf16"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
