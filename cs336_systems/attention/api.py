"""`flash_attention(q, k, v, is_causal, impl)`: the one entry point the model's attention swap calls."""

from __future__ import annotations

from torch import Tensor

IMPLS = ("triton", "pytorch")


def flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, impl: str = "triton") -> Tensor:
    """Attention of q (batch, heads, n_q, d) over k, v (batch, heads, n_k, d) by FlashAttention-2.

    impl="triton": the Triton kernels (CUDA, or any device under TRITON_INTERPRET=1);
    impl="pytorch": the tiled PyTorch version (any device; slow, for checking).
    Causal masking is top-left aligned: query i sees keys 0..i.
    """
    if impl == "triton":
        from .flash_triton import FlashAttentionTriton

        return FlashAttentionTriton.apply(q, k, v, is_causal)
    if impl == "pytorch":
        from .flash_pytorch import FlashAttentionPyTorch

        return FlashAttentionPyTorch.apply(q, k, v, is_causal)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
