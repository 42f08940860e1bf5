"""Online softmax: merging running (m, l) statistics chunk by chunk equals the one-pass softmax."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cs336_systems.attention.online_softmax import (
    chunk_stats,
    logsumexp_from_stats,
    merge_stats,
    online_softmax,
    online_update,
)
from tests.strategies import chunk_sizes, rows_with_masked_chunks, score_rows
from tests.tolerances import assert_within, gamma, unit_roundoff

F64 = torch.float64


def online_softmax_bounds(s: torch.Tensor, dtype: torch.dtype = F64) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise bounds on |p_hat - p| and |L_hat - L| for one softmax / logsumexp of the scores
    `s` (..., n) computed in `dtype`, chunked any way (one chunk: the one-pass version).

    m is exact (a max). Each exp(x), x <= 0 computed from a rounded x, is off by at most
    u |x| e^x + 2 u e^x <= 3 u in absolute terms (x e^x <= 1/e; 2 u: exp's own rounding). l >= 1 (it
    holds the max's exp(0)) sums n such terms (3 n u, plus gamma_n for the additions) and is
    rescaled at most once per merge, <= n merges of an exp, a product and an add (5 u each): l is
    relatively within gamma_{12 n + 10}, which covers these and p = exp(s - m) / l's own 4 u
    (absolute). L = m + log l: l's relative error, plus u log n and u |L| for the log and the add.
    """
    n = s.shape[-1]
    g, u = gamma(12 * n + 10, dtype), unit_roundoff(dtype)
    s64 = s.double()
    p, L = torch.softmax(s64, dim=-1), torch.logsumexp(s64, dim=-1)
    return g * p + 4 * u, g + u * (math.log(n) + L.abs())


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


@settings(deadline=None)
@given(st.data())
def test_any_split_gives_the_full_softmax_and_logsumexp(data):
    s = _row(data.draw(score_rows()))
    sizes = data.draw(chunk_sizes(len(s)))
    p, L = online_softmax(s, sizes)
    p_bound, L_bound = online_softmax_bounds(s)  # each side within its bound: twice between them
    assert_within(p, torch.softmax(s, dim=-1), 2 * p_bound, "p")
    assert_within(L, torch.logsumexp(s, dim=-1), 2 * L_bound, "L")


@settings(deadline=None)
@given(st.data(), st.floats(min_value=-1e3, max_value=1e3))
def test_adding_a_constant_changes_nothing_but_L(data, c):
    s = _row(data.draw(score_rows(bound=1e3)))
    sizes = data.draw(chunk_sizes(len(s)))
    p, L = online_softmax(s, sizes)
    p_c, L_c = online_softmax(s + c, sizes)
    # s + c is rounded: each score moves by delta <= u |s + c|, which moves p relatively by <= 2 delta
    # and L by <= delta; on top, each of the two runs is within its bound; L + c rounds once more.
    delta = unit_roundoff(F64) * (s + c).abs().max().item()
    p_bound, L_bound = online_softmax_bounds(s)
    assert_within(p_c, p, 2 * p_bound + 2 * delta * p.abs(), "p")
    assert_within(L_c, L + c, 2 * L_bound + delta + unit_roundoff(F64) * abs(L.item() + c), "L")


@settings(deadline=None)
@given(score_rows(bound=1e30))
def test_extreme_scores_stay_finite(values):
    s = _row(values).to(torch.float32)
    p, L = online_softmax(s, [1] * len(s))
    assert torch.isfinite(p).all() and torch.isfinite(L).all()
    # float32: every p_j within its bound, and the sum of n of them rounds n - 1 times
    p_bound, _ = online_softmax_bounds(s, torch.float32)
    assert_within(p.sum(), torch.tensor(1.0), p_bound.sum() + gamma(len(s), torch.float32), "sum of p")


@settings(deadline=None)
@given(rows_with_masked_chunks())
def test_fully_masked_chunks_merge_as_nothing(row_and_sizes):
    values, sizes = row_and_sizes
    s = _row(values)
    p, L = online_softmax(s, sizes)
    assert not torch.isnan(p).any() and torch.isfinite(L)
    p_bound, L_bound = online_softmax_bounds(s)
    assert_within(p, torch.softmax(s, dim=-1), 2 * p_bound, "p")
    assert_within(L, torch.logsumexp(s, dim=-1), 2 * L_bound, "L")
    m, l = chunk_stats(torch.full((3,), float("-inf"), dtype=torch.float64))
    assert m.item() == float("-inf") and l.item() == 0.0  # an empty chunk is the merge identity


@settings(deadline=None)
@given(st.data())
def test_merge_order_does_not_matter(data):
    s = _row(data.draw(score_rows(max_len=30, bound=1e4)))
    sizes = data.draw(chunk_sizes(len(s)))
    stats = [chunk_stats(c) for c in torch.split(s, sizes)]
    m_fwd, l_fwd = stats[0]
    for m, l in stats[1:]:
        m_fwd, l_fwd = merge_stats(m_fwd, l_fwd, m, l)
    m_bwd, l_bwd = stats[-1]
    for m, l in reversed(stats[:-1]):
        m_bwd, l_bwd = merge_stats(m, l, m_bwd, l_bwd)
    _, L_bound = online_softmax_bounds(s)  # two merge orders, each within the bound
    assert_within(logsumexp_from_stats(m_fwd, l_fwd), logsumexp_from_stats(m_bwd, l_bwd), 2 * L_bound, "L")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 8), st.data())
def test_online_update_over_key_tiles_is_attention(n_q, n_k, d, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    s = torch.randn(n_q, n_k, generator=g, dtype=torch.float64) * 5
    v = torch.randn(n_k, d, generator=g, dtype=torch.float64)
    m = torch.full((n_q,), float("-inf"), dtype=torch.float64)
    l = torch.zeros(n_q, dtype=torch.float64)
    acc = torch.zeros(n_q, d, dtype=torch.float64)
    start = 0
    for size in data.draw(chunk_sizes(n_k)):
        m, l, acc = online_update(m, l, acc, s[:, start:start + size], v[start:start + size])
        start += size
    # O = sum_j p_j v_j: each p_j within its bound, times |v_j|, plus the n products and sums
    # (gamma_{n+1} of sum p |v|); the same holds for softmax(s) @ v, so twice between them.
    p_bound, L_bound = online_softmax_bounds(s)
    magnitude = torch.softmax(s, dim=-1) @ v.abs()
    o_bound = p_bound @ v.abs() + gamma(n_k + 1, F64) * magnitude
    assert_within(acc / l[:, None], torch.softmax(s, dim=-1) @ v, 2 * o_bound, "O")
    assert_within(logsumexp_from_stats(m, l), torch.logsumexp(s, dim=-1), 2 * L_bound, "L")
