"""The teaching path's Triton kernels launched for the speed path: the arguments of `flash_launch`'s
launchers, handed to each compiled kernel's launcher directly (`direct_launch`) instead of through
Triton's dispatch, with the constexprs of a shape and plan built once.

At the grid's short cells the GPU waits on the host, and Triton's dispatch (binding and specialising
some 30 arguments per launch) was most of the host's time for the two or three Triton launches of
an eager forward+backward. `flash_launch` stays as the course page shows it; what each launcher
here passes is checked launch by launch against it (tests/test_fast_triton_launch.py), so the two
cannot drift apart. Same contract: 4-D (Z, H, N, d) inputs with a unit last stride, contiguous
results; the inputs checked by the caller (`fast.launch` runs `flash_launch._shape` first, which
refuses what the interpreter would compute wrongly: here every check would ask the environment).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import flash_launch
from ..flash_launch import BWD, FWD, _cdiv, _no_tail, _scales, dot_precision, tma_ok
from ..tiles import BwdConfig, FwdConfig
from ..triton_loader import kernels, next_power_of_2
from .direct_launch import direct


def _dims(q: Tensor, k: Tensor) -> tuple[int, int, int, int, int]:
    Z, H, n_q, d = q.shape
    return Z, H, n_q, k.shape[2], d


def _bwd_args(q, k, v, do):
    """`flash_launch._bwd_args` without its checks: the strides and sizes every backward pass takes."""
    Z, H, n_q, n_k, d = _dims(q, k)
    sm_scale, qk_scale = _scales(d)
    return (*q.stride(), *k.stride(), *v.stride(), *do.stride()), (H, n_q, n_k, qk_scale, sm_scale)


def launch_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, c: FwdConfig) -> tuple[Tensor, Tensor]:
    """O (Z, H, n_q, d) in q's dtype and L (Z, H, n_q) fp32, as `flash_launch.launch_fwd`."""
    Z, H, n_q, n_k, d = _dims(q, k)
    o = torch.empty((Z, H, n_q, d), dtype=q.dtype, device=q.device)
    L = torch.empty((Z, H, n_q), dtype=torch.float32, device=q.device)
    tma = c.tma and tma_ok(q, k, v)
    ins = flash_launch._descriptors(q, k, v, None, c.block_m, c.block_n)[:3] if tma else (q, k, v)
    args = (*ins, o, L, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, n_q, n_k, _scales(d)[1])
    direct(kernels(FWD).flash_fwd_kernel).launch((_cdiv(n_q, c.block_m), Z * H), args,
                                                 _fwd_constexprs(is_causal, d, c, tma, dot_precision(q.dtype)))
    return o, L


@functools.cache
def _fwd_constexprs(is_causal: bool, d: int, c: FwdConfig, tma: bool, precision: str) -> dict:
    return dict(CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M=c.block_m,
                BLOCK_N=c.block_n, TMA=tma, INPUT_PRECISION=precision, num_warps=c.num_warps,
                num_stages=c.num_stages)


def launch_preprocess(o: Tensor, do: Tensor, block_m: int = 64) -> Tensor:
    """Delta (Z, H, n_q) fp32 = rowsum(O * dO), as `flash_launch.launch_preprocess`."""
    Z, H, n_q, d = o.shape
    delta = torch.empty((Z, H, n_q), dtype=torch.float32, device=o.device)
    direct(kernels(BWD).bwd_preprocess_kernel).launch(
        (_cdiv(n_q, block_m), Z * H), (o, do, delta, *o.stride(), *do.stride(), H, n_q), _pre_constexprs(d, block_m))
    return delta


@functools.cache
def _pre_constexprs(d: int, block_m: int) -> dict:
    return dict(HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M=block_m)


class PreprocessLaunch:
    """Delta's launch for contiguous (Z, H, n_q, d) O and dO of one shape, its arguments but the
    tensors found once: `run(o, do)` (`prepare_preprocess`; `eager_lane`'s backward launches it)."""

    def __init__(self, Z: int, H: int, n_q: int, d: int, block_m: int = 64):
        strides = (H * n_q * d, n_q * d, d, 1)
        self.grid, self.shape = (_cdiv(n_q, block_m), Z * H), (Z, H, n_q)
        self.tail = (*strides, *strides, H, n_q)  # O's and dO's strides, heads, queries
        self.constexprs = _pre_constexprs(d, block_m)
        self.direct = direct(kernels(BWD).bwd_preprocess_kernel)
        self._launch = None  # the bound launch, after the first

    def run(self, o: Tensor, do: Tensor) -> Tensor:
        delta = torch.empty(self.shape, dtype=torch.float32, device=o.device)
        args = (o, do, delta, *self.tail)
        if self._launch is None:
            self._launch = self.direct.bind(self.grid, args, self.constexprs)
        else:
            self._launch(args)
        return delta


prepare_preprocess = functools.cache(PreprocessLaunch)


def launch_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, L: Tensor, do: Tensor, is_causal: bool,
               c: BwdConfig) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV (Z, H, N, d) in the inputs' dtype, as `flash_launch.launch_bwd`."""
    delta = launch_preprocess(o, do)
    if c.fused:
        return launch_bwd_fused(q, k, v, do, L, delta, is_causal, c)
    dk, dv = launch_dkdv(q, k, v, do, L, delta, is_causal, c)
    return launch_dq(q, k, v, do, L, delta, is_causal, c), dk, dv


def launch_bwd_fused(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from one launch that runs both passes, as `flash_launch.launch_bwd_fused`."""
    Z, H, n_q, n_k, d = _dims(q, k)
    dq = torch.empty((Z, H, n_q, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((Z, H, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((Z, H, n_k, d), dtype=v.dtype, device=v.device)
    strides, sizes = _bwd_args(q, k, v, do)
    n_kv_tiles, n_q_tiles = _cdiv(n_k, c.block_n1), _cdiv(n_q, c.block_m2)
    ok = (c.tma1 or c.tma2) and tma_ok(q, k, v, do)
    tma1, tma2 = c.tma1 and ok, c.tma2 and ok
    ins1 = flash_launch._descriptors(q, k, v, do, c.block_m1, c.block_n1) if tma1 else (q, k, v, do)
    ins2 = flash_launch._descriptors(q, k, v, do, c.block_m2, c.block_n2) if tma2 else (q, k, v, do)
    args = (*ins1, L, delta, dq, dk, dv, *ins2, *strides, *sizes, n_kv_tiles, n_q_tiles)
    direct(kernels(BWD).bwd_fused_kernel).launch(
        (n_kv_tiles + n_q_tiles, Z * H), args,
        _fused_constexprs(is_causal, n_q, d, c, tma1, tma2, dot_precision(q.dtype)))
    return dq, dk, dv


@functools.cache
def _fused_constexprs(is_causal: bool, n_q: int, d: int, c: BwdConfig, tma1: bool, tma2: bool, precision: str) -> dict:
    return dict(CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M1=c.block_m1,
                BLOCK_N1=c.block_n1, BLOCK_M2=c.block_m2, BLOCK_N2=c.block_n2, TMA1=tma1, TMA2=tma2,
                NO_TAIL=_no_tail(n_q, is_causal, c.block_m1, c.block_n1), INPUT_PRECISION=precision,
                num_warps=c.num_warps1, num_stages=c.num_stages1)


def launch_dkdv(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig) -> tuple[Tensor, Tensor]:
    """dK, dV (contiguous, k's dtype), as `flash_launch.launch_dkdv`."""
    Z, H, n_q, n_k, d = _dims(q, k)
    dk = torch.empty((Z, H, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((Z, H, n_k, d), dtype=v.dtype, device=v.device)
    strides, sizes = _bwd_args(q, k, v, do)
    tma = c.tma1 and tma_ok(q, k, v, do)
    ins = flash_launch._descriptors(q, k, v, do, c.block_m1, c.block_n1) if tma else (q, k, v, do)
    direct(kernels(BWD).bwd_dkdv_kernel).launch(
        (_cdiv(n_k, c.block_n1), Z * H), (*ins, L, delta, dk, dv, *strides, *sizes),
        _dkdv_constexprs(is_causal, n_q, d, c, tma, dot_precision(q.dtype)))
    return dk, dv


@functools.cache
def _dkdv_constexprs(is_causal: bool, n_q: int, d: int, c: BwdConfig, tma: bool, precision: str) -> dict:
    return dict(CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M=c.block_m1,
                BLOCK_N=c.block_n1, TMA=tma, NO_TAIL=_no_tail(n_q, is_causal, c.block_m1, c.block_n1),
                INPUT_PRECISION=precision, num_warps=c.num_warps1, num_stages=c.num_stages1)


def launch_dq(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig) -> Tensor:
    """dQ (contiguous, q's dtype), as `flash_launch.launch_dq`."""
    Z, H, n_q, n_k, d = _dims(q, k)
    dq = torch.empty((Z, H, n_q, d), dtype=q.dtype, device=q.device)
    strides, sizes = _bwd_args(q, k, v, do)
    tma = c.tma2 and tma_ok(q, k, v, do)
    ins = flash_launch._descriptors(q, k, v, do, c.block_m2, c.block_n2) if tma else (q, k, v, do)
    direct(kernels(BWD).bwd_dq_kernel).launch(
        (_cdiv(n_q, c.block_m2), Z * H), (*ins, L, delta, dq, *strides, *sizes),
        _dq_constexprs(is_causal, d, c, tma, dot_precision(q.dtype)))
    return dq


@functools.cache
def _dq_constexprs(is_causal: bool, d: int, c: BwdConfig, tma: bool, precision: str) -> dict:
    return dict(CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M=c.block_m2,
                BLOCK_N=c.block_n2, TMA=tma, INPUT_PRECISION=precision, num_warps=c.num_warps2,
                num_stages=c.num_stages2)
