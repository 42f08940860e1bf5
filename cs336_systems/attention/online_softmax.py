"""The pure math of online softmax: running (m, l) statistics per row, and how two of them merge.

For a row of scores s_1..s_n split into chunks, each chunk c has a maximum m_c and a sum
l_c = sum_j exp(s_j - m_c). Two chunks merge exactly:

    m = max(m_a, m_b),    l = l_a * exp(m_a - m) + l_b * exp(m_b - m)

so after the last chunk, m + log(l) is the row's logsumexp and exp(s_j - m) / l its softmax,
whatever the split. FlashAttention-2 carries (m, l) and an unnormalised output accumulator over key
tiles (`online_update`); the PyTorch FA2 and the property tests use these functions, the Triton
kernels do the same arithmetic in base 2.

A row or chunk whose every score is -inf (a fully masked or padded tile) has m = -inf, l = 0;
`safe_exp_diff` keeps exp(-inf - (-inf)) from becoming NaN, so such chunks merge as the identity.
"""

from __future__ import annotations

import torch
from torch import Tensor


def safe_exp_diff(a: Tensor, m: Tensor) -> Tensor:
    """exp(a - m), with 0 where both are -inf (NaN otherwise): the weight of an empty chunk."""
    return torch.where(m == float("-inf"), torch.zeros_like(a), torch.exp(a - m))


# --8<-- [start:stats]
def chunk_stats(s: Tensor) -> tuple[Tensor, Tensor]:
    """(m, l) of the scores `s` (..., n) over the last dim: m = max, l = sum exp(s - m)."""
    m = s.amax(dim=-1)  # (...)
    l = safe_exp_diff(s, m.unsqueeze(-1)).sum(dim=-1)  # (...)
    return m, l


def merge_stats(m_a: Tensor, l_a: Tensor, m_b: Tensor, l_b: Tensor) -> tuple[Tensor, Tensor]:
    """The (m, l) of the union of two chunks, from the chunks' own statistics."""
    m = torch.maximum(m_a, m_b)
    return m, l_a * safe_exp_diff(m_a, m) + l_b * safe_exp_diff(m_b, m)


def logsumexp_from_stats(m: Tensor, l: Tensor) -> Tensor:
    """L = m + log(l): the natural-log logsumexp of the whole row (-inf for an empty row)."""
    return m + torch.log(l)
# --8<-- [end:stats]


# --8<-- [start:online_update]
def online_update(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """One FlashAttention-2 step: fold a tile of scores `s` (..., Bq, Bk) and values `v`
    (..., Bk, d) into the running m, l (..., Bq) and unnormalised output acc (..., Bq, d).

    acc stays unnormalised (sum_j exp(s_j - m) v_j); divide by l once at the end.
    """
    m_new = torch.maximum(m, s.amax(dim=-1))  # (..., Bq)
    alpha = safe_exp_diff(m, m_new)  # rescales what was accumulated under the old maximum
    p = safe_exp_diff(s, m_new.unsqueeze(-1))  # (..., Bq, Bk) = exp(S - m_new)
    l_new = alpha * l + p.sum(dim=-1)
    acc_new = alpha.unsqueeze(-1) * acc + p.to(v.dtype) @ v
    return m_new, l_new, acc_new
# --8<-- [end:online_update]


def online_softmax(s: Tensor, chunk_sizes: list[int]) -> tuple[Tensor, Tensor]:
    """Softmax and logsumexp of `s` (..., n) over the last dim, computed chunk by chunk.

    `chunk_sizes` must sum to n. Returns (softmax, logsumexp) equal to the one-pass values.
    """
    if sum(chunk_sizes) != s.shape[-1] or any(c < 1 for c in chunk_sizes):
        raise ValueError(f"chunk_sizes must be positive and sum to {s.shape[-1]}, got {chunk_sizes}")
    m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device)
    l = torch.zeros(s.shape[:-1], dtype=s.dtype, device=s.device)
    for chunk in torch.split(s, chunk_sizes, dim=-1):
        m, l = merge_stats(m, l, *chunk_stats(chunk))
    p = safe_exp_diff(s, m.unsqueeze(-1)) / l.unsqueeze(-1)
    return p, logsumexp_from_stats(m, l)
