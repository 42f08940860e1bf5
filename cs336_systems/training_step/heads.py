"""The LM head and the loss as one module: `head(hidden, targets) -> mean cross-entropy (fp32)`.

Each takes over the model's `lm_head` (the same Parameter, so the weights and their name,
`lm_head.weight`, stay), and reads it in its own forward as `self.weight`: what FSDP2's root and our
FSDP need to gather it (cs336_systems/distributed/fsdp/layers.py states that rule).

    FullLogitsLoss     the plain way: the (N, V) logits in the parameter dtype, an fp32 copy,
                       F.cross_entropy. At the 8B step, 65,536 x 151,936 logits: 20 GB in bf16.
    ChunkedLossHead    stock PyTorch's way to avoid that: chunks of `chunk` positions, each
                       chunk's logits and fp32 cross-entropy under torch.utils.checkpoint, so only
                       one chunk's (chunk, V) logits live at a time, in the forward and again when
                       the backward recomputes them.
    FusedLossHead      ours: fused_linear_cross_entropy (training_step/fused_ce.py), one Triton
                       kernel per chunk, the gradients computed in the forward.

All three: the mean over the positions whose target is not IGNORE_INDEX, as F.cross_entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


class _LossHead(nn.Module):
    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight  # (V, d): the model's lm_head weight itself, not a copy

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., V) in the parameter dtype: for tests and inspection, never the step."""
        return F.linear(hidden, self.weight)


class FullLogitsLoss(_LossHead):
    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight).float()  # (..., V) fp32
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


class _ChunkedHead(_LossHead):
    """A head that goes through the positions `chunk` at a time."""

    def __init__(self, weight: nn.Parameter, chunk: int = 4096):
        super().__init__(weight)
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.chunk = chunk


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropy of one chunk: hidden (chunk, d), targets (chunk,)."""
    logits = F.linear(hidden, weight).float()  # (chunk, V) fp32
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


class ChunkedLossHead(_ChunkedHead):
    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = hidden.flatten(0, -2)  # (N, d)
        t = targets.flatten()      # (N,)
        total = h.new_zeros((), dtype=torch.float32)
        for start in range(0, h.shape[0], self.chunk):
            end = start + self.chunk
            # use_reentrant=False: the recommended checkpoint (inputs that need no grad are fine)
            total = total + checkpoint(_chunk_loss_sum, h[start:end], self.weight, t[start:end],
                                       use_reentrant=False)
        # mean over the counted positions, as F.cross_entropy's; 0 / 0 = NaN if all are ignored
        return total / (t != IGNORE_INDEX).sum()


class FusedLossHead(_ChunkedHead):
    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # imported here: it loads Triton kernels on first use, and a CPU without Triton must still
        # import this module (the plain and stock variants need none)
        from .fused_ce import fused_linear_cross_entropy

        return fused_linear_cross_entropy(hidden, self.weight, targets, chunk_size=self.chunk,
                                          ignore_index=IGNORE_INDEX)
