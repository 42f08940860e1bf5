"""Causal masking is outright (issue 28, item 7): with scores near 1e6 (q and k scaled by 1,000 at
d = 32) the reference our tests use, naive attention and the PyTorch FlashAttention-2 (which shares
the reference's mask) match a true mask, each query attending to keys 0..i only; the course's
added -1e6 lets future keys leak there. The course's tests, far below that scale, pass either way
(tests/test_flash_attention.py runs them against this reference)."""

from __future__ import annotations

import math

import pytest
import torch

from cs336_systems.attention.flash_pytorch import FlashAttentionPyTorch
from cs336_systems.attention.reference import COURSE_MASK_VALUE, attention_reference, naive_attention

# Scores near 1e6 carry an absolute rounding error of about d u max|q_j k_j| ~ 32 x 1.1e-16 x 1e7
# ~ 4e-8 in float64, so each probability exp(s - L) is off by a relative ~4e-8 and O, a convex
# combination of v (|v| < 6), by less than ~3e-7; L by ~4e-8 absolute. A leak is O(1) (the issue saw
# an error of 4.07): 1e-6 is far between the two.
ATOL = 1e-6


def true_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L with only keys 0..i in query i's softmax (top-left aligned), row by row in float64:
    the masked keys never enter the computation."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    o, L = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=q.dtype)
    for i in range(q.shape[-2]):
        s = (q[..., i:i + 1, :] @ k[..., :i + 1, :].transpose(-2, -1)) * scale  # (..., 1, i + 1)
        L[..., i] = torch.logsumexp(s, dim=-1)[..., 0]
        o[..., i, :] = (torch.softmax(s, dim=-1) @ v[..., :i + 1, :])[..., 0, :]
    return o, L


def huge_scores(n_q: int, n_k: int, d: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, n, d, generator=g, dtype=torch.float64) for n in (n_q, n_k, n_k))
    return q * 1000, k * 1000, v


@pytest.mark.parametrize("n_q, n_k", [(128, 128), (96, 128), (128, 96)])
def test_causal_attention_with_scores_near_1e6_matches_a_true_mask(n_q, n_k):
    q, k, v = huge_scores(n_q, n_k)
    want_o, want_L = true_mask(q, k, v)
    o, L = attention_reference(q, k, v, is_causal=True)
    torch.testing.assert_close(o, want_o, atol=ATOL, rtol=0)
    torch.testing.assert_close(L, want_L, atol=ATOL, rtol=0)
    torch.testing.assert_close(naive_attention(q, k, v, is_causal=True), want_o, atol=ATOL, rtol=0)
    FlashAttentionPyTorch.block_q = FlashAttentionPyTorch.block_k = 32  # several tiles, a ragged one
    try:
        torch.testing.assert_close(FlashAttentionPyTorch.apply(q, k, v, True), want_o, atol=ATOL, rtol=0)
    finally:
        FlashAttentionPyTorch.block_q = FlashAttentionPyTorch.block_k = 64


def test_the_courses_added_minus_1e6_leaks_future_keys_at_that_scale():
    """Why the mask is outright: adding -1e6 no longer hides a key whose score is above 1e6."""
    q, k, v = huge_scores(128, 128)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    future = torch.arange(128)[None, :] > torch.arange(128)[:, None]
    o = torch.softmax(s + torch.where(future, COURSE_MASK_VALUE, 0.0), dim=-1) @ v
    leaked = (o - true_mask(q, k, v)[0]).abs().amax(dim=-1) > 0.1  # (batch, n_q)
    assert leaked.any()
