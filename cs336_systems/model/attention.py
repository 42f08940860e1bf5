"""Causal multi-head self-attention and the one swappable attention function.

Every layer calls the module-level name `scaled_dot_product_attention`, looked up in this module's
globals at call time, so replacing that one name (see `use_attention`) swaps the attention of the
whole model: an NVTX-annotated version for profiling, FlashAttention-2 for speed.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

from .layers import Linear, RotaryEmbedding

AttentionFn = Callable[..., torch.Tensor]


# --8<-- [start:naive_attention]
def naive_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V, materialising the (..., n_q, n_k) score matrix.

    Q: (..., n_q, d), K and V: (..., n_k, d); mask: (n_q, n_k) bool, True = keep.
    """
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., n_q, n_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs @ V  # (..., n_q, d)
# --8<-- [end:naive_attention]


# The name every layer calls. Replace it with use_attention(...), never by editing the layers.
scaled_dot_product_attention: AttentionFn = naive_attention


def _torch_sdpa(Q, K, V, mask=None):
    """PyTorch's fused SDPA (cuDNN / flash / efficient backends): a baseline, never our answer."""
    return torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=mask is not None)


def _flash(impl: str) -> AttentionFn:
    def flash(Q, K, V, mask=None):
        # The model's only mask is the causal one, so any mask means is_causal=True.
        if impl == "triton":  # the Triton kernels with the measured tiles (attention/fast/), as a
            # custom op: one node torch.compile traces and a selective checkpoint policy can keep
            from cs336_systems.attention.fast.op import flash_attention_op

            return flash_attention_op(Q, K, V, mask is not None)
        from cs336_systems.attention import flash_attention

        return flash_attention(Q, K, V, is_causal=mask is not None, impl=impl)

    flash.__name__ = f"flash_{impl}"
    return flash


ATTENTION_IMPLS: dict[str, Callable[[], AttentionFn]] = {
    "naive": lambda: naive_attention,
    "sdpa": lambda: _torch_sdpa,
    "flash-pytorch": lambda: _flash("pytorch"),
    "flash-triton": lambda: _flash("triton"),
}


def get_attention(name: str) -> AttentionFn:
    if name not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention {name!r}; expected one of {', '.join(ATTENTION_IMPLS)}")
    return ATTENTION_IMPLS[name]()


# --8<-- [start:use_attention]
@contextlib.contextmanager
def use_attention(fn: AttentionFn | str) -> Iterator[AttentionFn]:
    """Swap the attention of every layer of every model for the duration of the block."""
    module = sys.modules[__name__]
    new = get_attention(fn) if isinstance(fn, str) else fn
    old = module.scaled_dot_product_attention
    module.scaled_dot_product_attention = new
    try:
        yield new
    finally:
        module.scaled_dot_product_attention = old
# --8<-- [end:use_attention]


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding | None = None,
                 device=None, dtype=None):
        super().__init__()
        self.num_heads, self.d_head = num_heads, d_model // num_heads
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = rope  # one instance shared by every layer (its tables are non-persistent buffers)

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (b, s, d_model) -> (b, h, s, d_head)
            return t.view(b, s, self.num_heads, self.d_head).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        # looked up in this module's globals at call time: use_attention() swaps it
        out = scaled_dot_product_attention(q, k, v, causal_mask)  # (b, h, s, d_head)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, -1))
