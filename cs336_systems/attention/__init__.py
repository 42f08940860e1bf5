"""Attention: the straightforward reference, the weighted-sum Triton example, FlashAttention-2 in
PyTorch and in Triton, and their benchmarks (docs/attention.md, docs/flash-attention.md).

Importing this package imports neither Triton nor any kernel: the Triton modules load on first use.
"""

from .api import IMPLS, flash_attention
from .reference import attention_reference, naive_attention


def __getattr__(name: str):
    # The autograd Functions, loaded on first access (the Triton one imports triton).
    if name == "FlashAttentionTriton":
        from .flash_triton import FlashAttentionTriton

        return FlashAttentionTriton
    if name == "FlashAttentionPyTorch":
        from .flash_pytorch import FlashAttentionPyTorch

        return FlashAttentionPyTorch
    if name == "WeightedSumFunction":
        from .weighted_sum import WeightedSumFunction

        return WeightedSumFunction
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["IMPLS", "flash_attention", "attention_reference", "naive_attention",
           "FlashAttentionTriton", "FlashAttentionPyTorch", "WeightedSumFunction"]
