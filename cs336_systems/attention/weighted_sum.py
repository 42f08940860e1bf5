"""The course's first Triton example (seed §1.3.1): y = (x * w).sum(-1), forward and backward.

x has any number of leading dims (..., D); w is (D,). The leading dims are flattened into rows for
the kernel (the course's version assumes 2-D input) and restored on the way out. The weight
gradient is reduced through a partial buffer, one row per program, summed by torch: the same
no-atomics idea FlashAttention-2's backward uses for dQ.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_loader import interpreting, kernels

KERNELS = "cs336_systems.attention.weighted_sum_kernel"
ROWS_TILE = 16
D_TILE = 64


def _check(x: object, w: object) -> None:
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor of shape (..., D), got {type(x).__name__}")
    if not isinstance(w, Tensor) or w.dim() != 1 or w.shape[0] != x.shape[-1]:
        shape = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
        raise ValueError(f"weight must have shape ({x.shape[-1]},) to match x's last dim, got {shape}")
    if w.dtype != x.dtype:
        raise ValueError(f"weight must have x's dtype {x.dtype}, got {w.dtype}")
    if w.device != x.device:
        raise ValueError(f"weight must be on x's device {x.device}, got {w.device}")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"x must be a CUDA tensor (or run with TRITON_INTERPRET=1), got device {x.device}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --8<-- [start:function]
class WeightedSumFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        _check(x, weight)
        lead, D = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, D)  # (rows, D): a view whenever the leading dims allow it
        n_rows = x2.shape[0]
        y = torch.empty(n_rows, dtype=x.dtype, device=x.device)
        kernels(KERNELS).weighted_sum_fwd[(_cdiv(n_rows, ROWS_TILE),)](
            x2, weight, y, x2.stride(0), x2.stride(1), weight.stride(0), n_rows, D,
            ROWS_TILE=ROWS_TILE, D_TILE=D_TILE)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape = x.shape
        return y.view(lead)

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        n_rows, D = x2.shape
        dy = dy.reshape(-1)  # (rows,)
        n_tiles = _cdiv(n_rows, ROWS_TILE)
        dx = torch.empty((n_rows, D), dtype=x2.dtype, device=x2.device)
        dw_partial = torch.empty((n_tiles, D), dtype=torch.float32, device=x2.device)
        kernels(KERNELS).weighted_sum_bwd[(n_tiles,)](
            x2, weight, dy, dx, dw_partial, x2.stride(0), x2.stride(1), weight.stride(0),
            dy.stride(0), n_rows, D, ROWS_TILE=ROWS_TILE, D_TILE=D_TILE)
        return dx.view(ctx.x_shape), dw_partial.sum(dim=0).to(weight.dtype)
# --8<-- [end:function]


def weighted_sum(x: Tensor, weight: Tensor) -> Tensor:
    """(x * weight).sum(-1) through the Triton kernels."""
    return WeightedSumFunction.apply(x, weight)
