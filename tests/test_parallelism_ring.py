"""The simulated ring collectives against a plain sum, and their byte counts against costs.py.

Tensors hold small integers in float64, so every partial sum is exact whatever the order of
addition: results are compared with torch.equal.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from cs336_systems.parallelism import costs, ring
from tests.strategies import world_sizes


def _inputs(N: int, numel: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(N * 1000 + numel)
    return [torch.randint(-50, 50, (numel,), generator=g).double() for _ in range(N)]


@settings(max_examples=30, deadline=None)
@given(N=world_sizes(max_world=8), chunk=world_sizes(max_world=5))
def test_ring_all_reduce_sums_and_sends_2_n_minus_1_over_n(N, chunk):
    xs = _inputs(N, N * chunk)  # S divisible by N: every chunk S/N
    S = xs[0].numel() * xs[0].element_size()
    trace = ring.all_reduce(xs)
    total = torch.stack(xs).sum(0)
    assert all(torch.equal(r, total) for r in trace.result)
    assert trace.sent == trace.received == [2 * (N - 1) * S // N] * N
    assert trace.time(W=1e9) == pytest.approx(costs.ring_collective_time(S, N, 1e9, "all_reduce"), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(N=world_sizes(max_world=8), numel=world_sizes(max_world=40))
def test_reduce_scatter_and_all_gather_with_uneven_chunks(N, numel):
    xs = _inputs(N, numel)
    rs = ring.reduce_scatter(xs)
    expected = torch.stack(xs).sum(0).tensor_split(N)
    assert all(torch.equal(rs.result[i], expected[i]) for i in range(N))
    # every device sends N - 1 chunks: all but one of the N, so at most (N-1)/N S rounded up a chunk
    S = numel * 8
    largest = max(c.numel() for c in expected) * 8
    assert all(sent <= (N - 1) * largest and sent >= (N - 1) * S // N - largest for sent in rs.sent)
    ag = ring.all_gather(rs.result)
    assert all(torch.equal(r, torch.stack(xs).sum(0)) for r in ag.result)


@settings(max_examples=30, deadline=None)
@given(N=world_sizes(max_world=8), numel=world_sizes(max_world=40))
def test_alternate_ring_sends_whole_tensors(N, numel):
    xs = _inputs(N, numel)
    S = numel * 8
    trace = ring.alternate_all_reduce(xs)
    total = torch.stack(xs).sum(0)
    assert all(torch.equal(r, total) for r in trace.result)
    assert trace.sent == trace.received == [(N - 1) * S] * N
    assert trace.time(W=2e9) == pytest.approx(costs.alternate_all_reduce_time(S, N, 2e9), rel=1e-12)


def test_alternate_ring_passes_the_tensor_the_handout_names(monkeypatch):
    """At step t device i sends x^((i - t + 1) mod N): tag each x^(j) by its value j and watch."""
    N = 5
    xs = [torch.full((3,), float(j)) for j in range(N)]
    seen = []
    exchange = ring._exchange

    def spy(trace, outgoing):
        seen.append([int(m[0]) for m in outgoing])
        return exchange(trace, outgoing)

    monkeypatch.setattr(ring, "_exchange", spy)
    ring.alternate_all_reduce(xs)
    assert len(seen) == N - 1
    for t, step in enumerate(seen, start=1):
        assert step == [(i - t + 1) % N for i in range(N)], t


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        ring.all_reduce([torch.ones(3), torch.ones(4)])
    with pytest.raises(ValueError, match="at least one"):
        ring.alternate_all_reduce([])
