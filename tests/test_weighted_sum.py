"""The weighted-sum Triton example against float64 torch, for any number of leading dims."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cs336_systems.attention.weighted_sum import weighted_sum
from tests.triton_mode import DEVICE, ON_GPU, needs_gpu, pytestmark  # noqa: F401


def check(shape, dtype=torch.float32, seed=0, tol=1e-5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(shape), generator=g).to(DEVICE, dtype).requires_grad_()
    w = torch.randn(shape[-1], generator=g).to(DEVICE, dtype).requires_grad_()
    dy = torch.randn(tuple(shape[:-1]), generator=g).to(DEVICE, dtype)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = (x64 * w64).sum(-1)
    y64.backward(dy.double())
    y = weighted_sum(x, w)
    y.backward(dy)
    assert y.shape == shape[:-1] and y.dtype == dtype
    for actual, expected in ((y, y64), (x.grad, x64.grad), (w.grad, w64.grad)):
        torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * max(1.0, shape[-1] ** 0.5))


@pytest.mark.parametrize("shape", [(5, 7), (130, 64), (3, 17, 70), (2, 3, 4, 129), (40,)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matches_torch(shape):
    check(shape)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=3), st.integers(1, 150))
def test_any_leading_dims(lead, D):
    check((*lead, D), seed=len(lead) + D)


def test_non_contiguous_input():
    x = torch.randn(6, 40, device=DEVICE).t()  # (40, 6), strides (1, 40)
    w = torch.randn(6, device=DEVICE)
    torch.testing.assert_close(weighted_sum(x, w), (x * w).sum(-1), rtol=1e-5, atol=1e-5)


def test_bad_inputs():
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight must have shape"):
        weighted_sum(x, torch.randn(7, device=DEVICE))
    with pytest.raises(ValueError, match="weight must have x's dtype"):
        weighted_sum(x, torch.randn(8, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match="weight must be on x's device"):
        weighted_sum(x, torch.randn(8, device="meta"))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_low_precision(dtype):
    check((4, 1000, 300), dtype=dtype, tol=2e-2)
