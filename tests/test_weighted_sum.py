"""The weighted-sum Triton example against float64 torch, for any number of leading dims."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cs336_systems.attention.weighted_sum import weighted_sum
from tests.tolerances import assert_within, sum_bound, underflow_error, unit_roundoff
from tests.triton_mode import DEVICE, ON_GPU, needs_gpu, pytestmark  # noqa: F401


def check(shape, dtype=torch.float32, seed=0):
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
    # Bounds per element (tests/tolerances.py): the kernels accumulate in float32 and round once to
    # `dtype` at the store. y sums D products: gamma_D(fp32) sum|x w|, plus u(dtype) |y|. dx = dy w is
    # one product: (u(fp32) + u(dtype)) |dy w|. dw sums all rows' dy x (per tile, then the tiles):
    # gamma_rows(fp32) sum|dy x|, plus u(dtype) |dw|. Each store into `dtype` may also underflow: a
    # float16 dx = dy w below 2^-14 is a subnormal, off by up to eta = 2^-25 whatever its size.
    xa, wa, dya = x64.detach().abs(), w64.detach().abs(), dy.double().abs()
    rows = dy.numel()
    u32, u, eta = unit_roundoff(torch.float32), unit_roundoff(dtype), underflow_error(dtype)
    bounds = (sum_bound(shape[-1], torch.float32, (xa * wa).sum(-1)) + u * y64.detach().abs() + eta,
              (u32 + u) * dya[..., None] * wa + eta,
              sum_bound(rows, torch.float32, (dya[..., None] * xa).reshape(-1, shape[-1]).sum(0))
              + u * w64.grad.abs() + eta)
    for name, actual, expected, bound in (("y", y, y64, bounds[0]), ("dx", x.grad, x64.grad, bounds[1]),
                                          ("dw", w.grad, w64.grad, bounds[2])):
        assert_within(actual, expected, bound, f"{name} {tuple(shape)} {dtype}")


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
    expected = (x.double() * w.double()).sum(-1)
    assert_within(weighted_sum(x, w), expected, sum_bound(6, torch.float32, (x * w).double().abs().sum(-1)),
                  "non-contiguous")


def test_bad_inputs():
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight must have shape"):
        weighted_sum(x, torch.randn(7, device=DEVICE))
    with pytest.raises(ValueError, match="weight must have x's dtype"):
        weighted_sum(x, torch.randn(8, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match="weight must be on x's device"):
        weighted_sum(x, torch.randn(8, device="meta"))


def test_float16_stores_need_the_underflow_term():
    """The dx store on the CPU, as the kernel does it (fp32 product of float16 values, one rounding to
    float16): dozens of products land among the subnormals, past the relative bound alone (the
    GPU test failed on exactly this), and none past it with eta added."""
    g = torch.Generator().manual_seed(0)
    dy, w = torch.randn(4000, 1, generator=g).half(), torch.randn(300, generator=g).half()
    exact = dy.double() * w.double()
    err = ((dy.float() * w.float()).half().double() - exact).abs()
    relative = (unit_roundoff(torch.float32) + unit_roundoff(torch.float16)) * exact.abs()
    assert (err > relative).sum() > 10
    assert (err <= relative + underflow_error(torch.float16)).all()


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_low_precision(dtype):
    check((4, 1000, 300), dtype=dtype)
