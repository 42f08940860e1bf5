"""Launch the head-dim-128 Gluon backward (`flash_bwd128_ws_kernel`) and say which inputs it takes.

`fast.launch.launch_bwd` runs it where a plan names a `GluonBwdConfig` and the inputs have d = 128
(`onepass_ws.py` launches the d = 64 kernel); other inputs run the plan's Triton kernels.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..direct_launch import Tma, for_triton

BM = 64  # queries per tile
BN = 128  # keys per program: two math warpgroups of 64


def bwd128_supported(q: Tensor, k: Tensor, v: Tensor, do: Tensor, is_causal: bool) -> str | None:
    """Why the kernel cannot take these inputs, or None."""
    from .requirements import input_problem

    if (why := input_problem((q, k, v, do), (128,))) is not None:
        return why
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q % BM or n_k % BN:
        return f"n_q must be a multiple of {BM} and n_k of {BN}"
    if is_causal and n_q != n_k:
        return "causal needs n_q == n_k"
    return None


def heads_per_group(n_bh: int, bytes_per_head: int) -> int:
    """How many heads' programs the backward runs together: the largest power of two that divides
    n_bh and keeps what every program of a head re-reads (`bytes_per_head`: Q, dO, dQ) within
    `fwd_ws.L2_BUDGET` (`fwd_ws.dividing_group`)."""
    from .fwd_ws import L2_BUDGET, dividing_group

    return dividing_group(n_bh, L2_BUDGET // max(1, bytes_per_head))


def reread_bytes_per_head(n_q: int, d: int, dtype: torch.dtype) -> int:
    """What every program of a head re-reads: its Q and dO (`dtype`) and the fp32 dQ it adds into."""
    return n_q * d * (2 * dtype.itemsize + 4)


def _geometry(n_bh: int, n_q: int, n_k: int, d: int, dtype: torch.dtype) -> tuple[tuple, ...]:
    """The tensor maps' geometry (`_rows`) of Q, of K (V's is the same), of dO, and of dQ's fp32
    sum (64-column boxes: each math warpgroup adds its half)."""
    return (_rows(n_bh * n_q, d, (BM, d), dtype), _rows(n_bh * n_k, d, (BN, d), dtype),
            _rows(n_bh * n_q, d, (BM, d), dtype), _rows(n_bh * n_q, d, (BM, 64), torch.float32))


def _rows(n_rows: int, cols: int, box: tuple[int, int], dtype: torch.dtype) -> tuple:
    """(shape, strides, box, shared layout) of a contiguous tensor seen as (n_rows, cols): a `Tma`'s
    fields after its tensor."""
    from .onepass_ws import shared_layout

    return (n_rows, cols), (cols, 1), box, shared_layout(*box, dtype)


def _constexprs(d: int, is_causal: bool, stages: int, slots: int) -> dict:
    from .fwd_ws import register_split

    maxnreg, math_regs = register_split(2)  # two math warpgroups and the loader warp, as the forward
    # dQ's product under dK's where the mask is: faster causal, slower without (results/attention/ab_bwd128)
    return dict(D=d, BM=BM, BN=BN, STAGES=stages, SLOTS=slots, CAUSAL=is_causal, DQ_UNDER_DK=is_causal,
                MATH_REGS=math_regs, num_warps=4, maxnreg=maxnreg)


def launch_bwd128_ws(q, k, v, do, L, delta, is_causal: bool, stages: int = 2, slots: int = 2,
                     kernel=None, group: int | None = None, checked: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV of (Z, H, N, 128) inputs (see `bwd128_supported`); L, delta (Z, H, n_q) fp32.
    `kernel` replaces the committed kernel (for ablations); `group`: heads whose programs run
    together (default `heads_per_group` of `reread_bytes_per_head`);
    `checked`: the caller has asked `bwd128_supported` of these inputs (the speed path's launcher)."""
    if stages < 2 or slots < 1:
        raise ValueError(f"launch_bwd128_ws: stages must be at least 2 and slots at least 1, got {stages}, {slots}")
    if not checked and (why := bwd128_supported(q, k, v, do, is_causal)) is not None:
        raise ValueError(f"launch_bwd128_ws: {why}; got q {tuple(q.shape)} {q.dtype}")
    Z, H, n_q, d = q.shape
    prepared = prepare(Z * H, n_q, k.shape[2], d, q.dtype, is_causal, stages, slots)
    if kernel is None and group is None:
        return prepared.run(q, k, v, do, L, delta)
    if group is not None and not 1 <= group <= Z * H:
        raise ValueError(f"launch_bwd128_ws: group must be in [1, {Z * H}], got {group}")
    dq, dk, dv, args = prepared.outputs_and_args(q, k, v, do, L, delta, group)
    if kernel is None:
        prepared.direct.launch(prepared.grid, args, prepared.constexprs)
    else:
        kernel[prepared.grid](*for_triton(args), **prepared.constexprs)
    return dq.to(q.dtype), dk, dv


class BwdLaunch:
    """The backward's launch for one shape, dtype and plan, its answers found once:
    `run(q, k, v, do, L, delta)` allocates dQ's fp32 sum, dK and dV, and launches."""

    def __init__(self, n_bh: int, n_q: int, n_k: int, d: int, dtype: torch.dtype, is_causal: bool, stages: int,
                 slots: int):
        from ...flash_launch import _scales
        from ..direct_launch import direct
        from .flash_bwd128_ws_kernel import bwd128_ws_kernel

        self.grid = (n_k // BN, n_bh)
        self.group = heads_per_group(n_bh, reread_bytes_per_head(n_q, d, dtype))  # the default
        self.constexprs = _constexprs(d, is_causal, stages, slots)
        self.n_q, self.n_k = n_q, n_k
        self.sm_scale, self.qk_scale = _scales(d)
        self.geometry = _geometry(n_bh, n_q, n_k, d, dtype)  # of Q, K, V, dO, dQ's tensor maps
        self.direct = direct(bwd128_ws_kernel)
        self._launch = None  # the bound launch, after the first

    def outputs_and_args(self, q, k, v, do, L, delta, group: int | None = None):
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        g_q, g_k, g_do, g_dq = self.geometry
        args = (Tma(q, *g_q), Tma(k, *g_k), Tma(v, *g_k), Tma(do, *g_do), L, delta, Tma(dq, *g_dq), dk, dv,
                self.n_q, self.n_k, self.qk_scale, self.sm_scale, self.group if group is None else group)
        return dq, dk, dv, args

    def run(self, q, k, v, do, L, delta) -> tuple[Tensor, Tensor, Tensor]:
        """dQ, dK, dV of contiguous inputs of this launch's shape and dtype (unchecked)."""
        dq, dk, dv, args = self.outputs_and_args(q, k, v, do, L, delta)
        if (L.data_ptr() | delta.data_ptr()) & 15:  # the bound launch's kernel assumes 16-byte aligned rows
            self.direct.launch(self.grid, args, self.constexprs)
        elif self._launch is None:
            self._launch = self.direct.bind(self.grid, args, self.constexprs)
        else:
            self._launch(args)
        return dq.to(q.dtype), dk, dv


@functools.cache
def prepare(n_bh: int, n_q: int, n_k: int, d: int, dtype: torch.dtype, is_causal: bool, stages: int,
            slots: int) -> BwdLaunch:
    """The one BwdLaunch of a shape, dtype and plan."""
    return BwdLaunch(n_bh, n_q, n_k, d, dtype, is_causal, stages, slots)


def bwd128_args_for_report(is_causal: bool, stages: int, slots: int):
    """(kernel, runtime args, constexprs) of a launch on CPU stand-ins: for the offline compile report."""
    from .flash_bwd128_ws_kernel import bwd128_ws_kernel

    n, d = 4096, 128
    x = torch.empty(1, 1, n, d, dtype=torch.bfloat16)
    dq = torch.empty(1, 1, n, d, dtype=torch.float32)
    vec = torch.empty(1, 1, n, dtype=torch.float32)
    g_q, g_k, g_do, g_dq = _geometry(1, n, n, d, x.dtype)
    q_d, k_d, v_d, do_d, dq_d = for_triton((Tma(x, *g_q), Tma(x, *g_k), Tma(x, *g_k), Tma(x, *g_do), Tma(dq, *g_dq)))
    args = (q_d, k_d, v_d, do_d, vec, vec, dq_d, x, x, n, n, 0.1, 0.1, 1)
    return bwd128_ws_kernel, args, _constexprs(d, is_causal, stages, slots)
