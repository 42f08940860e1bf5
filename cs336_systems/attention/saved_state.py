"""What both FlashAttention autograd Functions save for backward, and how they read it back.

The course's contract: among `o.grad_fn.saved_tensors` exactly one tensor has the shape of q
without its last dim, (batch, n_queries) or (batch, heads, n_queries), and it is the natural-log
logsumexp L, in the input dtype. In bf16/fp16 that rounding would cost the backward up to ~3% in
P = exp(S - L) (bf16 keeps 8 significant bits of L ~ 10), so for low-precision inputs the fp32 L
the kernel computed is saved too, flattened to 1-D so that it never has the contract's shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .inputs import AttentionInputs


def save_attention_state(ctx, x: AttentionInputs, o: Tensor, L32: Tensor) -> Tensor:
    """Save q, k, v, O and L; return the contract L (input dtype, shape lead + (n_q,)).

    `o` is the output as returned to the caller; `L32` is (Z, H, n_q) in fp32 (or fp64).
    """
    L = L32.view(*x.lead, x.n_queries).to(x.q.dtype)
    ctx.lead_ndim = len(x.lead)
    ctx.is_causal = x.is_causal
    q, k, v = (t.squeeze(1) if len(x.lead) == 1 else t for t in (x.q, x.k, x.v))
    if L.dtype == L32.dtype:
        ctx.save_for_backward(q, k, v, o, L)
    else:
        ctx.save_for_backward(q, k, v, o, L, L32.reshape(-1))
    return L


def load_attention_state(ctx) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(q, k, v, o) as 4-D (Z, H, N, d) views and L (Z, H, n_q) in fp32 (or the input's fp64)."""
    q, k, v, o, L, *exact = ctx.saved_tensors
    if ctx.lead_ndim == 1:
        q, k, v, o = (t.unsqueeze(1) for t in (q, k, v, o))
    L32 = exact[0] if exact else L
    return q, k, v, o, L32.view(q.shape[:-1])


def unfold_like(grad4: Tensor, lead_ndim: int) -> Tensor:
    """A (Z, H, N, d) gradient back in the caller's layout: drop H for 3-D inputs."""
    return grad4.squeeze(1) if lead_ndim == 1 else grad4


def exact_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where statistics and accumulators live: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32
