"""Attention, the teaching path (docs/attention.md, docs/flash-attention.md), readable top to bottom:

    reference.py                    softmax(Q K^T / sqrt(d)) V, and the logsumexp L
    online_softmax.py               running (m, l) statistics, merged tile by tile
    weighted_sum.py (+ _kernel)     the course's first Triton program, as an autograd Function
    flash_pytorch.py                FlashAttention-2 in PyTorch: tiled forward, recomputing backward
    flash_fwd_kernel.py, flash_bwd_kernel.py, tile_io.py   the Triton kernels
    tiles.py, flash_launch.py       the tiles a launch is handed, and the launches
    flash_triton.py                 the Triton FlashAttention-2 as an autograd Function
    inputs.py, saved_state.py, triton_loader.py, device_facts.py, flops.py, api.py
                                    checks, plumbing, the entry point

Beside it, never imported by it: `fast/` (measured tiles, the one-pass and Gluon kernels, the tuner,
the A/B experiments) and `benchmarks/` (the registered attention benchmarks).
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
