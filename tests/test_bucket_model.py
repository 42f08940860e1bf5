"""The analytical bucket model: its optimum against a brute-force scan, and the o/w fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cs336_systems.distributed.bucket_model import BucketModel, fit_latency_bandwidth


@settings(max_examples=100, deadline=None)
@given(s=st.floats(1e6, 1e10), w=st.floats(1e8, 1e12), o=st.floats(1e-6, 1e-2))
def test_optimum_matches_a_brute_force_scan(s, w, o):
    model = BucketModel(s=s, w=w, o=o)
    grid = np.geomspace(1, max(2.0, 100 * model.optimal_num_buckets), 20_001)
    scanned = grid[np.argmin(grid * o + s / (grid * w))]  # independent of the closed form
    assert model.optimal_num_buckets == pytest.approx(max(1.0, scanned), rel=2e-3)
    assert model.min_overhead <= min(model.overhead(n) for n in (1, 2, 10, 100)) + 1e-15
    if model.optimal_num_buckets > 1:
        assert model.min_overhead == pytest.approx(2 * math.sqrt(s * o / w))
        assert model.optimal_bucket_bytes == pytest.approx(math.sqrt(s * w * o))


def test_hand_checked_numbers():
    # 8 GB of gradients, 100 GB/s, 50 us per call: n* = sqrt(8e9 / (1e11 * 5e-5)) = 40,
    # b* = 200 MB, overhead 2 * sqrt(8e9 * 5e-5 / 1e11) = 4 ms.
    model = BucketModel(s=8e9, w=1e11, o=5e-5)
    assert model.optimal_num_buckets == pytest.approx(40)
    assert model.optimal_bucket_bytes == pytest.approx(2e8)
    assert model.min_overhead == pytest.approx(4e-3)
    assert model.overhead_for_bucket(2e8) == pytest.approx(4e-3)


def test_fit_recovers_latency_and_bandwidth():
    sizes = np.array([1, 10, 100, 1000]) * 2**20
    o, w = 2e-4, 3e9
    rng = np.random.default_rng(0)
    times = (o + sizes / w) * (1 + 0.01 * rng.standard_normal(sizes.size))
    o_fit, w_fit = fit_latency_bandwidth(sizes, times)
    assert o_fit == pytest.approx(o, rel=0.1) and w_fit == pytest.approx(w, rel=0.05)


@pytest.mark.parametrize("kwargs", [{"s": 0, "w": 1, "o": 1}, {"s": 1, "w": -1, "o": 1}, {"s": 1, "w": 1, "o": 0}])
def test_bad_model_parameters_are_named(kwargs):
    with pytest.raises(ValueError, match="must be positive"):
        BucketModel(**kwargs)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two or more"):
        fit_latency_bandwidth([1e6, 1e6], [1e-3, 1e-3])
