"""Launch the warp-specialised one-pass backward (`flash_bwd_ws_kernel`, Gluon) and say which inputs it takes.

`fast.launch.launch_bwd` runs it where a plan names a `GluonBwdConfig` (a table entry that says
`gluon_ws`; the tuner times it as kernel "ws" beside the Triton backwards and picks its settings);
other inputs run the plan's Triton kernels. Its variants and ablations are timed by
`experiments/ab_onepass_ws.py`.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

BLOCK = 64  # query rows per tile, and keys per math warpgroup


def ws_supported(q: Tensor, k: Tensor, v: Tensor, do: Tensor, is_causal: bool, block_n: int = 128) -> str | None:
    """Why the Gluon kernel cannot take these inputs, or None."""
    from .requirements import input_problem

    if (why := input_problem((q, k, v, do), (64,))) is not None:
        return why
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q % BLOCK or n_k % block_n:
        return f"n_q must be a multiple of {BLOCK} and n_k of {block_n}"
    if is_causal and n_q != n_k:
        return "causal needs n_q == n_k"
    return None


@functools.cache
def shared_layout(rows: int, d: int, dtype: torch.dtype):
    """The NVMMA shared-memory layout of a (rows, d) tile of `dtype` (the same every call: built once)."""
    from triton.experimental.gluon import language as gl

    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for([rows, d], gl_dtype)


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
    from ...flash_launch import _scales
    from ..direct_launch import Tma, direct, for_triton
    from .flash_bwd_ws_kernel import bwd_onepass_ws_kernel

    if block_n != 128:  # at 64 keys two programs per SM do not fit their registers without spills
        raise ValueError(f"launch_bwd_onepass_ws: block_n must be 128, got {block_n}")
    if dq_regs % 8 or not 24 <= dq_regs <= 256:
        raise ValueError(f"launch_bwd_onepass_ws: dq_regs must be a multiple of 8 in [24, 256], got {dq_regs}")
    if (why := ws_supported(q, k, v, do, is_causal, block_n)) is not None:
        raise ValueError(f"launch_bwd_onepass_ws: {why}; got q {tuple(q.shape)} {q.dtype}")
    Z, H, n_q, d = q.shape
    n_k = k.shape[2]
    layout = shared_layout(BLOCK, d, q.dtype)
    descs = [Tma.rows(t, (BLOCK, d), layout) for t in (q, k, v, do)]
    dq = torch.zeros((Z, H, n_q, d), dtype=torch.float32, device=q.device)
    dq_desc = Tma.rows(dq, (BLOCK, d), shared_layout(BLOCK, d, torch.float32))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale, qk_scale = _scales(d)
    maxnreg, math_regs = register_split(block_n, dq_regs)
    grid = (n_k // block_n, Z * H)
    args = (*descs, L, delta, dq, dq_desc, dk, dv, n_q, n_k, qk_scale, sm_scale)
    constexprs = dict(D=d, BM=BLOCK, BN=block_n, STAGES=stages, SLOTS=slots, CAUSAL=is_causal, MATH_REGS=math_regs,
                      DQ_REGS=dq_regs, DQ_TMA=dq_tma, RED_BUFS=red_bufs, num_warps=4, maxnreg=maxnreg)
    if kernel is None:
        direct(bwd_onepass_ws_kernel).launch(grid, args, constexprs)
    else:
        kernel[grid](*for_triton(args), **constexprs)
    return dq.to(q.dtype), dk, dv
