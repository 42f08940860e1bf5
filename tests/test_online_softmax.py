"""Online softmax: merging running (m, l) statistics chunk by chunk equals the one-pass softmax."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cs336_systems.attention.online_softmax import (chunk_stats, logsumexp_from_stats, merge_stats,
                                                    online_softmax, online_update)
from tests.strategies import chunk_sizes, rows_with_masked_chunks, score_rows


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


@settings(deadline=None)
@given(st.data())
def test_any_split_gives_the_full_softmax_and_logsumexp(data):
    s = _row(data.draw(score_rows()))
    sizes = data.draw(chunk_sizes(len(s)))
    p, L = online_softmax(s, sizes)
    torch.testing.assert_close(p, torch.softmax(s, dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(L, torch.logsumexp(s, dim=-1), rtol=1e-12, atol=1e-12)


@settings(deadline=None)
@given(st.data(), st.floats(min_value=-1e3, max_value=1e3))
def test_adding_a_constant_changes_nothing_but_L(data, c):
    s = _row(data.draw(score_rows(bound=1e3)))
    sizes = data.draw(chunk_sizes(len(s)))
    p, L = online_softmax(s, sizes)
    p_c, L_c = online_softmax(s + c, sizes)
    torch.testing.assert_close(p_c, p, rtol=1e-9, atol=1e-9)
    assert math.isclose(L_c.item(), L.item() + c, rel_tol=1e-9, abs_tol=1e-9)


@settings(deadline=None)
@given(score_rows(bound=1e30))
def test_extreme_scores_stay_finite(values):
    s = _row(values).to(torch.float32)
    p, L = online_softmax(s, [1] * len(s))
    assert torch.isfinite(p).all() and torch.isfinite(L).all()
    assert math.isclose(p.sum().item(), 1.0, rel_tol=1e-5)


@settings(deadline=None)
@given(rows_with_masked_chunks())
def test_fully_masked_chunks_merge_as_nothing(row_and_sizes):
    values, sizes = row_and_sizes
    s = _row(values)
    p, L = online_softmax(s, sizes)
    assert not torch.isnan(p).any() and torch.isfinite(L)
    torch.testing.assert_close(p, torch.softmax(s, dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(L, torch.logsumexp(s, dim=-1), rtol=1e-12, atol=1e-12)
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
    torch.testing.assert_close(logsumexp_from_stats(m_fwd, l_fwd), logsumexp_from_stats(m_bwd, l_bwd),
                               rtol=1e-12, atol=1e-12)


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
    torch.testing.assert_close(acc / l[:, None], torch.softmax(s, dim=-1) @ v, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logsumexp_from_stats(m, l), torch.logsumexp(s, dim=-1), rtol=1e-12, atol=1e-12)
