"""Inputs the attention kernels would get wrong are refused, with a ValueError naming the argument,
before anything runs; what the Triton interpreter does compute right (fp32, fp16, and the weighted
sum in any dtype) runs and matches a float64 reference."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention import flash_launch
from cs336_systems.attention.fast import FlashAttentionFast
from cs336_systems.attention.fast.launch import launch_bwd_onepass
from cs336_systems.attention.flash_pytorch import FlashAttentionPyTorch
from cs336_systems.attention.flash_triton import FlashAttentionTriton
from cs336_systems.attention.reference import attention_reference
from cs336_systems.attention.tiles import BwdConfig, FwdConfig
from cs336_systems.attention.weighted_sum import weighted_sum
from tests.triton_mode import DEVICE, needs_triton
from tests.triton_mode import where_marks as pytestmark  # noqa: F401

IMPLS = {"pytorch": FlashAttentionPyTorch, "triton": FlashAttentionTriton, "fast": FlashAttentionFast}
U_FP16 = 2.0**-11  # unit roundoff of fp16 (11 significant bits)
U_BF16 = 2.0**-8  # unit roundoff of bf16 (8 significant bits)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.detach().double() - expected.detach()).norm() / expected.detach().norm())


# -- degenerate shapes and tiles -------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape,message", [
    ((2, 8, 0), "head dim must be at least 1"),  # was a ZeroDivisionError in the PyTorch FA2
    ((0, 8, 16), r"leading dims \(batch\[, heads\]\) must all be at least 1"),
    ((2, 0, 8, 16), r"leading dims \(batch\[, heads\]\) must all be at least 1"),
    ((2, 0, 16), "at least one position"),
], ids=["d0", "batch0", "heads0", "seq0"])
def test_degenerate_shapes_are_refused(impl, shape, message):
    q = torch.randn(*shape, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match=message):
        IMPLS[impl].apply(q, q, q, False)


@pytest.mark.parametrize("name", ["block_q", "block_k"])
@pytest.mark.parametrize("size", [0, -16, 16.0, True], ids=["zero", "negative", "float", "bool"])
def test_pytorch_fa2_refuses_bad_tile_sizes(name, size, monkeypatch):
    monkeypatch.setattr(FlashAttentionPyTorch, name, size)
    q = torch.randn(1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        FlashAttentionPyTorch.apply(q, q, q, False)


@pytest.mark.parametrize("make,message", [
    (lambda: FwdConfig(0, 16), "block_m must be a power of two, at least 16"),
    (lambda: FwdConfig(48, 16), "block_m must be a power of two"),
    (lambda: FwdConfig(16, 8), "block_n must be a power of two, at least 16"),
    (lambda: FwdConfig(16, 16, num_warps=3), "num_warps must be a power of two"),
    (lambda: FwdConfig(16, 16, num_stages=0), "num_stages must be an int of at least 1"),
    (lambda: BwdConfig(16, 16, 16, 24), "block_n2 must be a power of two"),
    (lambda: BwdConfig(16, 16, 16, 16, num_warps2=0), "num_warps must be a power of two"),
], ids=["m0", "m48", "n8", "warps3", "stages0", "n2-24", "warps2-0"])
def test_kernel_configs_refuse_tiles_triton_cannot_compile(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# -- dtypes under the interpreter ------------------------------------------------------------------

BF16_UNDER_INTERPRETER = "bfloat16 is computed wrongly by the Triton interpreter"


def test_bf16_is_refused_under_the_interpreter(monkeypatch):
    """The interpreter multiplies bf16 bit patterns as integers in tl.dot (outputs ~1e9 where the
    answer is ~1): the Function and every launcher refuse, before any kernel is loaded."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.randn(1, 2, 32, 16).bfloat16()
    L = torch.zeros(1, 2, 32)
    for Fn in (FlashAttentionTriton, FlashAttentionFast):
        with pytest.raises(ValueError, match=BF16_UNDER_INTERPRETER):
            Fn.apply(q, q, q, False)
    with pytest.raises(ValueError, match=BF16_UNDER_INTERPRETER):
        flash_launch.launch_fwd(q, q, q, False)
    with pytest.raises(ValueError, match=BF16_UNDER_INTERPRETER):
        flash_launch.launch_bwd(q, q, q, q, L, q, False)
    with pytest.raises(ValueError, match=BF16_UNDER_INTERPRETER):
        launch_bwd_onepass(q, q, q, q, L, L, False, BwdConfig(16, 16, 16, 16))


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
def test_fp16_flash_attention_matches_float64(is_causal):
    """fp16 is a numpy type, so the interpreter computes it right (and a GPU does too).

    The reference starts from the same fp16 inputs, so the only errors are the kernels' roundings to
    fp16 (unit roundoff u = 2^-11): P before P V and P^T dO, dS before dS K and dS^T Q, and each
    output; D = rowsum(dO * O) reads the rounded O. At most four such roundings chain into any output
    (<= 4u each element); the fp32 sums add n * 2^-24 ~ 3e-6, negligible. Allowed: 8u, a factor 2
    for adding up those relative errors over a whole tensor."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 2, 37, 24, generator=g).to(DEVICE, torch.float16) for _ in range(4))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64, _ = attention_reference(q64, k64, v64, is_causal)
    o64.backward(do.double())
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = FlashAttentionTriton.apply(q, k, v, is_causal)
    o.backward(do)
    for name, got, want in (("O", o, o64), ("dQ", q.grad, q64.grad), ("dK", k.grad, k64.grad),
                            ("dV", v.grad, v64.grad)):
        assert got.dtype == torch.float16
        assert rel_err(got, want) < 8 * U_FP16, f"{name}: relative error {rel_err(got, want):.3g}"


@needs_triton
@pytest.mark.parametrize("dtype,u", [(torch.bfloat16, U_BF16), (torch.float16, U_FP16)], ids=["bf16", "fp16"])
def test_weighted_sum_in_16_bits_matches_float64(dtype, u):
    """The weighted-sum kernels convert every tile to fp32 before any arithmetic, so bf16 is right
    under the interpreter too and is not refused. With the reference on the same rounded inputs,
    y, dx and dw each carry one rounding to the dtype (<= u) plus fp32 sums of D = 70 terms
    (70 * 2^-24 ~ 4e-6 << u): allowed 2u."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 9, 70, generator=g).to(DEVICE, dtype).requires_grad_()
    w = torch.randn(70, generator=g).to(DEVICE, dtype).requires_grad_()
    dy = torch.randn(5, 9, generator=g).to(DEVICE, dtype)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (x64 * w64).sum(-1).backward(dy.double())
    y = weighted_sum(x, w)
    y.backward(dy)
    y64 = (x64 * w64).sum(-1)
    for name, got, want in (("y", y, y64), ("dx", x.grad, x64.grad), ("dw", w.grad, w64.grad)):
        assert got.dtype == dtype
        assert rel_err(got, want) < 2 * u, f"{name}: relative error {rel_err(got, want):.3g}"
