"""Straightforward attention: the whole score matrix, softmax, then values.

This is the definition every FlashAttention implementation is checked against (tests run it in
float64 on the CPU) and the "naive" baseline the benchmarks time (in the input dtype).
Causal masking is outright: a score whose key index exceeds its query index becomes -inf (top-left
aligned, so with n_queries != n_keys query i still sees keys 0..i, key 0 always: no row is all
-inf). The course's reference adds -1e6 instead, the same numbers while scores stay far below 1e6
(exp(s - 1e6 - L) is exactly 0 in fp32 and fp64); once they reach about 1e6 (q and k scaled by
1,000 at d = 32, say) the added -1e6 no longer hides the future keys, and an outright mask still
does. Both pass the course's tests, which stay far below that.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MASK_VALUE = float("-inf")  # a masked score: exp(-inf - L) is exactly 0 whatever the scores' size
COURSE_MASK_VALUE = -1e6  # what the course's reference adds instead (for comparison only)


def causal_bias(n_queries: int, n_keys: int, *, dtype: torch.dtype, device: torch.device | str,
                q_start: int = 0, k_start: int = 0) -> Tensor:
    """(n_queries, n_keys) block of the causal bias whose first query/key indices are q_start,
    k_start: 0 where key <= query, -inf where key > query (added to a finite score: -inf)."""
    q_idx = torch.arange(q_start, q_start + n_queries, device=device)[:, None]
    k_idx = torch.arange(k_start, k_start + n_keys, device=device)[None, :]
    return torch.where(k_idx > q_idx, MASK_VALUE, 0.0).to(dtype)


def attention_scores(q: Tensor, k: Tensor, is_causal: bool = False) -> Tensor:
    """S = q k^T / sqrt(d), plus the causal bias: (..., n_queries, n_keys)."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = s + causal_bias(q.shape[-2], k.shape[-2], dtype=s.dtype, device=s.device)
    return s


# --8<-- [start:reference]
def attention_reference(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False
                        ) -> tuple[Tensor, Tensor]:
    """(O, L) for q (..., n_q, d), k and v (..., n_k, d): O (..., n_q, d), L (..., n_q)."""
    s = attention_scores(q, k, is_causal)  # (..., n_q, n_k)
    L = torch.logsumexp(s, dim=-1)  # natural-log logsumexp of each row
    p = torch.exp(s - L.unsqueeze(-1))  # = softmax(s)
    return p @ v, L
# --8<-- [end:reference]


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """Plain PyTorch attention in the input dtype (the baseline the benchmarks time)."""
    return torch.softmax(attention_scores(q, k, is_causal), dim=-1) @ v
