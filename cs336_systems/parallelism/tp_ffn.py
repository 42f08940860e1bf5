"""A tensor-parallel SwiGLU FFN (Megatron-LM's layout, the handout's section 8.4).

Our SwiGLU is w2(silu(w1 x) * w3 x), with Linear weights stored (d_out, d_in). The two up
projections w1 and w3 (the handout's W1 and W2) are column-parallel: rank r keeps rows r of their
(d_ff, d_model) weights, a slice of the d_ff outputs. The down projection w2 (the handout's W3) is
row-parallel: rank r keeps columns r of its (d_model, d_ff) weight, the matching slice of its
inputs. So the d_ff-wide activations never leave their rank, and a pass costs one all-reduce of a
(tokens, d_model) tensor:

    forward:   y = all-reduce_r( w2_r(silu(w1_r x) * w3_r x) )        (ReduceFromTP)
    backward:  dx = all-reduce_r( w1_r^T dx1_r + w3_r^T dx2_r )        (CopyToTP's backward)

Shards follow torch.tensor_split, so d_ff need not divide by the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cs336_systems.model.layers import SwiGLU


# --8<-- [start:autograd]
class CopyToTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the gradient: every rank used the whole x, and each
    holds only its slice's contribution to dx."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # A copy: autograd may hand the same gradient tensor to other consumers (or an expanded view).
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (sum the row-parallel partial outputs); identity backward: dy is the
    same on every rank."""

    @staticmethod
    def forward(ctx, partial, group):
        # In place: the partial sum is a fresh matmul output that nothing else reads.
        if not partial.is_contiguous():
            raise ValueError("ReduceFromTP needs a contiguous partial sum")
        ctx.mark_dirty(partial)
        dist.all_reduce(partial, group=group)
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad, None
# --8<-- [end:autograd]


# --8<-- [start:local]
def swiglu_partial(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One rank's share of the FFN: x (..., d_model); w1, w3 (f_r, d_model); w2 (d_model, f_r).
    Returns this rank's partial sum of the output, (..., d_model)."""
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)  # (..., f_r) inside


def shard_swiglu(ffn: SwiGLU, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Rank's slices of a full SwiGLU's weights (copies): rows of w1 and w3, columns of w2."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    d_ff = ffn.w1.weight.shape[0]
    if world_size > d_ff:
        raise ValueError(f"world_size {world_size} exceeds d_ff {d_ff}: some rank would get no slice")
    return {"w1": ffn.w1.weight.detach().tensor_split(world_size, dim=0)[rank].clone(),
            "w3": ffn.w3.weight.detach().tensor_split(world_size, dim=0)[rank].clone(),
            "w2": ffn.w2.weight.detach().tensor_split(world_size, dim=1)[rank].clone()}
# --8<-- [end:local]


class TensorParallelSwiGLU(nn.Module):
    """This rank's slice of a SwiGLU FFN; forward takes the whole x and returns the whole y on
    every rank of `group` (the default group if None)."""

    def __init__(self, ffn: SwiGLU, group: dist.ProcessGroup | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("TensorParallelSwiGLU needs an initialised process group")
        self.group = group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        shards = shard_swiglu(ffn, rank, world)
        self.w1 = nn.Parameter(shards["w1"])  # (d_ff_r, d_model): column-parallel
        self.w3 = nn.Parameter(shards["w3"])  # (d_ff_r, d_model): column-parallel
        self.w2 = nn.Parameter(shards["w2"])  # (d_model, d_ff_r): row-parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToTP.apply(x, self.group)
        return ReduceFromTP.apply(swiglu_partial(x, self.w1, self.w3, self.w2), self.group)
