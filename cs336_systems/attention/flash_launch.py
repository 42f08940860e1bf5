"""Host side of the Triton FlashAttention-2: allocate outputs, launch kernels with the tiles handed in.

All functions take 4-D (Z, H, N, d) tensors whose last dim has stride 1 (any other strides) and
return contiguous results. Shape and dtype checks happen before, in `inputs.py`. `launch_fwd` and
`launch_bwd` take their tiles (`tiles.FwdConfig` / `BwdConfig`) as an argument, defaulting to
`tiles.default_fwd` / `default_bwd`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .device_facts import capability
from .inputs import refuse_under_interpreter
from .tiles import BwdConfig, FwdConfig, default_bwd, default_fwd
from .triton_loader import interpreting, kernels, next_power_of_2

FWD = "cs336_systems.attention.flash_fwd_kernel"
BWD = "cs336_systems.attention.flash_bwd_kernel"
LOG2E = 1.4426950408889634
MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension, which carries batch * heads


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _shape(q: Tensor, k: Tensor) -> tuple[int, int, int, int, int]:
    refuse_under_interpreter(q.dtype)  # every launcher starts here
    Z, H, n_q, d = q.shape
    if Z * H > MAX_GRID_Y:
        raise ValueError(f"q's batch*heads must be at most {MAX_GRID_Y}, got {Z * H}")
    return Z, H, n_q, k.shape[2], d


def _scales(d: int) -> tuple[float, float]:
    sm_scale = 1.0 / math.sqrt(d)
    return sm_scale, sm_scale * LOG2E


# --8<-- [start:dot_precision]
def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's `input_precision` for inputs of `dtype`, following PyTorch's fp32 matmul setting.

    fp32: "ieee" (full fp32 products, what torch.matmul computes by default) unless the user opted
    in to TF32 as PyTorch is told to: `torch.backends.cuda.matmul.fp32_precision = "tf32"` (torch
    >= 2.9; it also reflects `allow_tf32` and `torch.set_float32_matmul_precision`), or on older
    torch `torch.backends.cuda.matmul.allow_tf32 = True`. Then "tf32": operands rounded to a 10-bit
    mantissa on the tensor cores, products summed in fp32. (Triton's own default is "tf32".)
    bf16/fp16: the setting does not apply (their products are exact in the fp32 accumulator) and
    they keep Triton's default, so their compiled kernels are the ones tuned and measured.
    """
    if dtype != torch.float32:
        return "tf32"
    matmul = torch.backends.cuda.matmul
    try:
        opted_in = matmul.fp32_precision not in ("ieee", "none")  # "none": inherit, i.e. the default
    except AttributeError:  # torch < 2.9
        opted_in = bool(matmul.allow_tf32)
    return "tf32" if opted_in else "ieee"
# --8<-- [end:dot_precision]


# --8<-- [start:launch_fwd]
def launch_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, config: FwdConfig | None = None
               ) -> tuple[Tensor, Tensor]:
    """O (Z, H, n_q, d) in q's dtype and L (Z, H, n_q) fp32, natural-log logsumexp."""
    Z, H, n_q, n_k, d = _shape(q, k)
    c = config or default_fwd(q.dtype, d)
    o = torch.empty((Z, H, n_q, d), dtype=q.dtype, device=q.device)
    L = torch.empty((Z, H, n_q), dtype=torch.float32, device=q.device)
    grid = (_cdiv(n_q, c.block_m), Z * H)
    tma = c.tma and tma_ok(q, k, v)
    ins = _descriptors(q, k, v, None, c.block_m, c.block_n)[:3] if tma else (q, k, v)
    kernels(FWD).flash_fwd_kernel[grid](
        *ins, o, L, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, n_q, n_k, _scales(d)[1],
        CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)),
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, TMA=tma, INPUT_PRECISION=dot_precision(q.dtype),
        num_warps=c.num_warps, num_stages=c.num_stages)
    return o, L
# --8<-- [end:launch_fwd]


def launch_preprocess(o: Tensor, do: Tensor, block_m: int = 64) -> Tensor:
    """Delta (Z, H, n_q) fp32 = rowsum(O * dO)."""
    Z, H, n_q, d = o.shape
    delta = torch.empty((Z, H, n_q), dtype=torch.float32, device=o.device)
    kernels(BWD).bwd_preprocess_kernel[(_cdiv(n_q, block_m), Z * H)](
        o, do, delta, *o.stride(), *do.stride(), H, n_q,
        HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)), BLOCK_M=block_m)
    return delta


def tma_ok(*ts: Tensor) -> bool:
    """Whether tensor descriptors can describe these (Z, H, N, d) tensors: a power-of-two head dim,
    unit last stride, other strides and the base 16-byte aligned, on a Hopper or newer GPU (the
    interpreter emulates them)."""
    d = ts[0].shape[-1]
    if d != next_power_of_2(max(d, 16)):
        return False
    if not interpreting() and not (ts[0].is_cuda and capability(ts[0].device)[0] >= 9):
        return False
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0
               and all(s > 0 and s * t.element_size() % 16 == 0 for s in t.stride()[:-1]) for t in ts)


def _descriptors(q, k, v, do, rows_qdo: int, rows_kv: int) -> tuple:
    """Descriptors of the whole 4-D tensors; a load fetches one (1, 1, rows, d) box."""
    TensorDescriptor = kernels("triton.tools.tensor_descriptor").TensorDescriptor
    d = q.shape[-1]
    return tuple(TensorDescriptor.from_tensor(t, [1, 1, rows, d]) if t is not None else None
                 for t, rows in ((q, rows_qdo), (k, rows_kv), (v, rows_kv), (do, rows_qdo)))


def _no_tail(n_q: int, is_causal: bool, block_m: int, block_n: int) -> bool:
    """No dK/dV program has a ragged last query tile: the query tiles after the diagonal start on
    a multiple of BLOCK_M and end exactly at n_q."""
    return n_q % block_m == 0 and (not is_causal or block_n % block_m == 0)


def _bwd_args(q, k, v, do, L, delta):
    Z, H, n_q, n_k, d = _shape(q, k)
    sm_scale, qk_scale = _scales(d)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    return strides, (H, n_q, n_k, qk_scale, sm_scale)


def launch_dkdv(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig) -> tuple[Tensor, Tensor]:
    """dK, dV (contiguous, k's dtype): one program per key tile."""
    Z, H, n_q, n_k, d = _shape(q, k)
    dk = torch.empty((Z, H, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((Z, H, n_k, d), dtype=v.dtype, device=v.device)
    strides, sizes = _bwd_args(q, k, v, do, L, delta)
    tma = c.tma1 and tma_ok(q, k, v, do)
    ins = _descriptors(q, k, v, do, c.block_m1, c.block_n1) if tma else (q, k, v, do)
    kernels(BWD).bwd_dkdv_kernel[(_cdiv(n_k, c.block_n1), Z * H)](
        *ins, L, delta, dk, dv, *strides, *sizes,
        CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)),
        BLOCK_M=c.block_m1, BLOCK_N=c.block_n1, TMA=tma, NO_TAIL=_no_tail(n_q, is_causal, c.block_m1, c.block_n1),
        INPUT_PRECISION=dot_precision(q.dtype), num_warps=c.num_warps1, num_stages=c.num_stages1)
    return dk, dv


def launch_dq(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig) -> Tensor:
    """dQ (contiguous, q's dtype): one program per query tile."""
    Z, H, n_q, n_k, d = _shape(q, k)
    dq = torch.empty((Z, H, n_q, d), dtype=q.dtype, device=q.device)
    strides, sizes = _bwd_args(q, k, v, do, L, delta)
    tma = c.tma2 and tma_ok(q, k, v, do)
    ins = _descriptors(q, k, v, do, c.block_m2, c.block_n2) if tma else (q, k, v, do)
    kernels(BWD).bwd_dq_kernel[(_cdiv(n_q, c.block_m2), Z * H)](
        *ins, L, delta, dq, *strides, *sizes,
        CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)),
        BLOCK_M=c.block_m2, BLOCK_N=c.block_n2, TMA=tma, INPUT_PRECISION=dot_precision(q.dtype),
        num_warps=c.num_warps2, num_stages=c.num_stages2)
    return dq


def launch_bwd_fused(q, k, v, do, L, delta, is_causal: bool, c: BwdConfig) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from one launch that runs both passes."""
    Z, H, n_q, n_k, d = _shape(q, k)
    dq = torch.empty((Z, H, n_q, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((Z, H, n_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((Z, H, n_k, d), dtype=v.dtype, device=v.device)
    strides, sizes = _bwd_args(q, k, v, do, L, delta)
    n_kv_tiles, n_q_tiles = _cdiv(n_k, c.block_n1), _cdiv(n_q, c.block_m2)
    ok = (c.tma1 or c.tma2) and tma_ok(q, k, v, do)  # checked only when asked for: it is on every call's path
    tma1, tma2 = c.tma1 and ok, c.tma2 and ok
    ins1 = _descriptors(q, k, v, do, c.block_m1, c.block_n1) if tma1 else (q, k, v, do)
    ins2 = _descriptors(q, k, v, do, c.block_m2, c.block_n2) if tma2 else (q, k, v, do)
    kernels(BWD).bwd_fused_kernel[(n_kv_tiles + n_q_tiles, Z * H)](
        *ins1, L, delta, dq, dk, dv, *ins2, *strides, *sizes, n_kv_tiles, n_q_tiles,
        CAUSAL=is_causal, HEAD_DIM=d, HEAD_DIM_PAD=next_power_of_2(max(d, 16)),
        BLOCK_M1=c.block_m1, BLOCK_N1=c.block_n1, BLOCK_M2=c.block_m2, BLOCK_N2=c.block_n2,
        TMA1=tma1, TMA2=tma2, NO_TAIL=_no_tail(n_q, is_causal, c.block_m1, c.block_n1),
        INPUT_PRECISION=dot_precision(q.dtype), num_warps=c.num_warps1, num_stages=c.num_stages1)
    return dq, dk, dv


# --8<-- [start:launch_bwd]
def launch_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, L: Tensor, do: Tensor, is_causal: bool,
               config: BwdConfig | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV (Z, H, N, d) in the inputs' dtype. L is the forward's fp32 (Z, H, n_q)."""
    Z, H, n_q, n_k, d = _shape(q, k)
    c = config or default_bwd(q.dtype, d)
    delta = launch_preprocess(o, do)
    if c.fused:
        return launch_bwd_fused(q, k, v, do, L, delta, is_causal, c)
    dk, dv = launch_dkdv(q, k, v, do, L, delta, is_causal, c)
    return launch_dq(q, k, v, do, L, delta, is_causal, c), dk, dv
# --8<-- [end:launch_bwd]
