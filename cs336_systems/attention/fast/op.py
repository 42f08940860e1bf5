"""The tuned FlashAttention-2 as a `torch.library` custom op: one node that torch.compile traces and
selective activation checkpointing can name.

`FlashAttentionFast` (function.py) is an autograd.Function, which both tools see only from outside:
torch.compile has to leave its launches opaque (a graph break per layer), and a
`torch.utils.checkpoint` policy, which picks what to save op by op as they are dispatched, never
sees the Function's forward as one op, so a checkpointed block recomputes the quadratic attention
forward in its backward. Here the same kernels (the same table lookups, the same launches) are two
custom ops:

    cs336::flash_attention_fwd(q, k, v, is_causal) -> (O, L)
        q (Z, H, n_q, d), k and v (Z, H, n_k, d); O (Z, H, n_q, d) in q's dtype, contiguous;
        L (Z, H, n_q) fp32, the natural-log log-sum-exp of each query's scores
    cs336::flash_attention_bwd(q, k, v, O, L, dO, is_causal) -> (dq, dk, dv), contiguous

with the forward's autograd formula registered (`register_autograd`: the backward op from O, L and
dO) and a fake implementation of each (shapes, dtypes, strides only), so compile traces through
them. A checkpoint policy that answers MUST_SAVE for `FORWARD_OP` keeps O and L, and the
backward needs nothing else from the attention (training_step/checkpoint_plan.py).

    out = flash_attention_op(q, k, v, is_causal=True)    # O only, (batch[, heads], n_q, d)

L is an output so that it can be saved; it is not differentiable (marked so: a loss that used it
would need dS += dL P, which the kernels do not compute). The teaching path never imports this.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..flash_triton import check_triton_inputs, unit_last_stride
from ..inputs import check_attention_inputs
from .function import _backward, _forward

NAMESPACE = "cs336"
FORWARD_NAME = f"{NAMESPACE}::flash_attention_fwd"
BACKWARD_NAME = f"{NAMESPACE}::flash_attention_bwd"


# --8<-- [start:custom_op]
@torch.library.custom_op(FORWARD_NAME, mutates_args=())
def flash_attention_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    x = check_triton_inputs(q, k, v, is_causal)  # the kernels' checks, before any launch
    if len(x.lead) != 2:
        raise ValueError(f"q must be 4-D (batch, heads, seq, d) for {FORWARD_NAME}, got {tuple(q.shape)}")
    o, lse = _forward(x.q, x.k, x.v, x.is_causal, None)  # (Z, H, n_q, d), (Z, H, n_q) fp32
    return o.contiguous(), lse.contiguous()  # contiguous already: the fake promises it


@flash_attention_fwd.register_fake
def _(q, k, v, is_causal):
    check_attention_inputs(q, k, v, is_causal)  # shapes and dtypes: fake tensors have no data
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return o, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)


@torch.library.custom_op(BACKWARD_NAME, mutates_args=())
def flash_attention_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
                        is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v, do = (unit_last_stride(t) for t in (q, k, v, do))
    dq, dk, dv = _backward(q, k, v, o, lse, do, is_causal, None)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@flash_attention_bwd.register_fake
def _(q, k, v, o, lse, do, is_causal):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, is_causal = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.is_causal = is_causal


def _backward_formula(ctx, do, dlse):
    # dlse is None or zeros: lse is marked non-differentiable
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = flash_attention_bwd(q, k, v, o, lse, do, ctx.is_causal)
    return dq, dk, dv, None


flash_attention_fwd.register_autograd(_backward_formula, setup_context=_setup_context)
# --8<-- [end:custom_op]

FORWARD_OP = torch.ops.cs336.flash_attention_fwd.default
BACKWARD_OP = torch.ops.cs336.flash_attention_bwd.default


def flash_attention_op(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """Attention of q (batch[, heads], n_q, d) over k, v by the custom op: O in q's dtype, the
    caller's layout (a 3-D input is one head)."""
    three_d = q.dim() == 3
    if three_d:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    # A model's (batch, heads, seq, d) views of (batch, seq, heads, d) projections are strided and
    # the Gluon kernels read contiguous memory. Made contiguous here, outside the op, the copy is
    # part of the traced graph: torch.compile writes it from the kernel that makes q and k (RoPE)
    # at no extra cost, and the op saves the contiguous tensors, so its backward copies none again.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o, _ = flash_attention_fwd(q, k, v, bool(is_causal))
    return o.squeeze(1) if three_d else o
