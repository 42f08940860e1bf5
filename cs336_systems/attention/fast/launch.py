"""Host side of the speed work: run a launch plan on the teaching path's kernels or the faster ones.

`launch_fwd` / `launch_bwd` take a plan (`plans.py`, usually looked up in the tuned table): the
Gluon kernel where the plan names one and the inputs qualify, else the one-pass backward where
the plan says so, else the teaching path's kernels with the plan's tiles (launched directly:
`triton_launch`). Same tensor contract as `flash_launch`: 4-D (Z, H, N, d) inputs with a unit last
stride, contiguous results.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..flash_launch import _bwd_args, _cdiv, _descriptors, _no_tail, _shape, dot_precision, tma_ok
from ..tiles import BwdConfig
from ..triton_loader import interpreting, kernels, next_power_of_2
from .direct_launch import direct
from .plans import BwdPlan, FwdPlan
from .triton_launch import launch_bwd as launch_triton_bwd
from .triton_launch import launch_fwd as launch_triton_fwd
from .triton_launch import launch_preprocess

BWD_ONEPASS = "cs336_systems.attention.fast.flash_bwd_onepass_kernel"


def launch_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, plan: FwdPlan) -> tuple[Tensor, Tensor]:
    """O (Z, H, n_q, d) in q's dtype and L (Z, H, n_q) fp32, natural-log logsumexp."""
    _shape(q, k)  # the checks every launcher starts with, before a Gluon launch too
    if plan.gluon is not None:
        from .gluon.fwd_ws import fwd_ws_supported, launch_fwd_ws

        g = plan.gluon
        why, (q, k, v) = _gluon_inputs(fwd_ws_supported, (g.block_n,), q, k, v)
        if why is None:
            return launch_fwd_ws(q, k, v, is_causal, g.block_n, g.stages, g.warpgroups, checked=True)
        _warn_fallback("forward", why)
    return launch_triton_fwd(q, k, v, is_causal, plan.tiles)


def launch_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, L: Tensor, do: Tensor, is_causal: bool,
               plan: BwdPlan) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV (Z, H, N, d) in the inputs' dtype. L is the forward's fp32 (Z, H, n_q)."""
    _shape(q, k)
    if plan.gluon is not None:
        why, (q, k, v, do) = _gluon_inputs(gluon_bwd_supported, (is_causal,), q, k, v, do)
        if why is None:
            return launch_gluon_bwd(q, k, v, do, L, launch_preprocess(o, do), is_causal, plan.gluon, checked=True)
        _warn_fallback("backward", why)
    if plan.one_pass:
        return launch_bwd_onepass(q, k, v, do, L, launch_preprocess(o, do), is_causal, plan.tiles)
    return launch_triton_bwd(q, k, v, o, L, do, is_causal, plan.tiles)


CONTIGUOUS = "needs contiguous inputs"
_WARNED: set[tuple[str, str]] = set()
_VERDICTS: dict[tuple, str | None] = {}  # the facts of a rule's inputs -> its verdict
MAX_VERDICTS = 4096  # kinds of inputs remembered (a training run has a handful)


def _verdict(supported, options: tuple, tensors: tuple[Tensor, ...]) -> str | None:
    """`supported(*tensors, *options)`, remembered: a rule reads only the tensors' shapes, strides,
    dtypes and devices (and the process's GPU and Triton), so the same facts get the same verdict."""
    facts = (supported, options, *((t.shape, t.stride(), t.dtype, t.device) for t in tensors))
    if facts in _VERDICTS:
        return _VERDICTS[facts]
    if len(_VERDICTS) >= MAX_VERDICTS:
        _VERDICTS.clear()
    why = _VERDICTS[facts] = supported(*tensors, *options)
    return why


def _gluon_inputs(supported, options: tuple, *tensors: Tensor) -> tuple[str | None, tuple[Tensor, ...]]:
    """(why a Gluon kernel cannot take the inputs or None, the inputs it gets), by the rule
    `supported(*tensors, *options)`: copied to contiguous memory where that alone kept it from
    taking them. A model's (batch, heads, seq, d) views of (batch, seq, heads, d) projections are
    strided, and a copy of Q, K, V costs a few percent of the attention it lets the faster kernel
    run. One remembered verdict on the host path when nothing is copied."""
    why = _verdict(supported, options, tensors)
    if why == CONTIGUOUS:
        copies = tuple(t.contiguous() for t in tensors)
        why = _verdict(supported, options, copies)  # the copies' reason, if another rule still refuses them
        if why is None:
            return None, copies
    return why, tensors


def _warn_fallback(which: str, why: str) -> None:
    """Say once per reason that a plan's Gluon kernel does not run here (never silently slower).
    Machines without a Hopper GPU (the CPU interpreter, other GPUs) run the Triton kernels by
    design: no warning."""
    if "Hopper" in why or (which, why) in _WARNED:
        return
    _WARNED.add((which, why))
    warnings.warn(f"FlashAttentionFast: the tuned plan's Gluon {which} does not run here ({why}); running the "
                  f"Triton kernels instead, which are slower at these shapes. The Gluon kernels are written for "
                  f"Triton 3.6 on Hopper GPUs.", stacklevel=3)


def gluon_bwd_supported(q, k, v, do, is_causal: bool) -> str | None:
    """Why neither Gluon backward takes these inputs, or None: d = 128 has a kernel of its own
    (`gluon/flash_bwd128_ws_kernel.py`: its registers do not allow d = 64's dQ warpgroup)."""
    if q.shape[-1] == 128:
        from .gluon.bwd128_ws import bwd128_supported

        return bwd128_supported(q, k, v, do, is_causal)
    from .gluon.onepass_ws import ws_supported

    return ws_supported(q, k, v, do, is_causal)


def launch_gluon_bwd(q, k, v, do, L, delta, is_causal: bool, g, checked: bool = False
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the Gluon backward for q's head dim, with the plan's Gluon settings `g`
    (a GluonBwdConfig; d = 128 has no dQ warpgroup, so `g.dq_regs` is unused there). Raises where
    the kernel does not apply (see `gluon_bwd_supported`), unless `checked` says the caller asked."""
    if q.shape[-1] == 128:
        from .gluon.bwd128_ws import launch_bwd128_ws

        return launch_bwd128_ws(q, k, v, do, L, delta, is_causal, g.stages, g.slots, checked=checked)
    from .gluon.onepass_ws import launch_bwd_onepass_ws

    return launch_bwd_onepass_ws(q, k, v, do, L, delta, is_causal, g.stages, g.slots, g.dq_regs)


def launch_bwd_onepass(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig, kernel=None
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from one pass over the key tiles (block_m1, block_n1, warps1, stages1, tma1). dQ is
    summed in an fp32 buffer with atomics (order not deterministic), then cast to q's dtype. With
    TMA on a GPU the dQ shares are added by the TMA engine (bulk tensor reductions) rather than by
    every thread; the interpreter has no such reduction, so there only the loads use descriptors.
    `kernel`: another version of `bwd_onepass_kernel` to launch (ablations, `ab_onepass`)."""
    Z, H, n_q, n_k, d = _shape(q, k)
    dq = torch.zeros((Z, H, n_q, d), dtype=torch.float32, device=q.device)
    dk = torch.empty((Z, H, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((Z, H, n_k, d), dtype=v.dtype, device=v.device)
    strides, sizes = _bwd_args(q, k, v, do, L, delta)
    tma = c.tma1 and tma_ok(q, k, v, do)
    dq_tma = tma and not interpreting()
    ins = _descriptors(q, k, v, do, c.block_m1, c.block_n1) if tma else (q, k, v, do)
    dq_arg = _descriptors(dq, None, None, None, c.block_m1, c.block_n1)[0] if dq_tma else dq
    grid = (_cdiv(n_k, c.block_n1), Z * H)
    args = (*ins, L, delta, dq_arg, dk, dv, *strides, *sizes)
    constexprs = dict(
        CAUSAL=is_causal, EVEN_N=n_k % c.block_n1 == 0, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)),
        BLOCK_M=c.block_m1, BLOCK_N=c.block_n1, TMA=tma, DQ_TMA=dq_tma,
        NO_TAIL=_no_tail(n_q, is_causal, c.block_m1, c.block_n1), INPUT_PRECISION=dot_precision(q.dtype),
        num_warps=c.num_warps1, num_stages=c.num_stages1)
    if kernel is None:
        direct(kernels(BWD_ONEPASS).bwd_onepass_kernel).launch(grid, args, constexprs)
    else:
        kernel[grid](*args, **constexprs)
    return dq.to(q.dtype), dk, dv
