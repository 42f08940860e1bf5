"""fp32 precision of the Triton FlashAttention-2: IEEE fp32 matmuls unless the user opted in to TF32
the way PyTorch is told to; bf16/fp16 unaffected.

On any machine: `dot_precision` follows torch's setting, every launcher hands it to its kernel,
and every tl.dot in the kernels uses it. On a GPU: fp32 forward and backward against float64 at a
tolerance derived below, by default (IEEE) and with TF32 opted in.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cs336_systems.attention import flash_launch
from cs336_systems.attention.fast import FlashAttentionFast, direct_launch, triton_launch
from cs336_systems.attention.fast import launch as fast_launch
from cs336_systems.attention.fast.plans import BwdPlan
from cs336_systems.attention.flash_launch import dot_precision
from cs336_systems.attention.reference import attention_reference
from cs336_systems.attention.tiles import BwdConfig, FwdConfig
from tests.triton_mode import ON_GPU, needs_triton
from tests.triton_mode import where_marks as pytestmark  # noqa: F401

NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")  # torch >= 2.9


@contextlib.contextmanager
def tf32_opt_in(route: str):
    """Opt in to TF32 the way a user would, and restore the setting through the same API (torch
    refuses to read the old API's flags once both APIs have set them)."""
    matmul = torch.backends.cuda.matmul
    if route == "fp32_precision":
        if not NEW_API:
            pytest.skip(f"torch {torch.__version__} has no torch.backends.cuda.matmul.fp32_precision (added in 2.9)")
        saved = matmul.fp32_precision
        matmul.fp32_precision = "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:  # torch.set_float32_matmul_precision("high"): the older way, still honoured
        saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(saved)


# -- the setting, on any machine -------------------------------------------------------------------

@pytest.mark.parametrize("route", ["fp32_precision", "set_float32_matmul_precision"])
def test_fp32_is_ieee_unless_the_user_opted_in_to_tf32(route):
    assert dot_precision(torch.float32) == "ieee"  # torch's default: full fp32 matmuls
    with tf32_opt_in(route):
        assert dot_precision(torch.float32) == "tf32"
    assert dot_precision(torch.float32) == "ieee"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_inputs_keep_one_setting(dtype):
    """16-bit products are exact in the fp32 accumulator: the setting does not apply, and switching
    torch's fp32 setting must not recompile (or change) the 16-bit kernels."""
    before = dot_precision(dtype)
    with tf32_opt_in("set_float32_matmul_precision"):
        assert dot_precision(dtype) == before


@pytest.mark.parametrize("allow_tf32,expected", [(False, "ieee"), (True, "tf32")])
def test_older_torch_reads_allow_tf32(allow_tf32, expected, monkeypatch):
    # torch < 2.9 has no fp32_precision attribute, only the allow_tf32 flag
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=allow_tf32))
    assert dot_precision(torch.float32) == expected


KERNEL_FILES = ["flash_fwd_kernel.py", "flash_bwd_kernel.py", "fast/flash_bwd_onepass_kernel.py"]


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_every_dot_takes_the_input_precision(name):
    source = (Path(flash_launch.__file__).parent / name).read_text()
    assert source.count("tl.dot(") > 0
    assert source.count("tl.dot(") == source.count("input_precision=INPUT_PRECISION)")


class LaunchRecorder:
    """Stands in for the kernel modules: records (kernel, INPUT_PRECISION) per launch, runs nothing."""

    def __init__(self):
        self.launches: list[tuple[str, object]] = []

    def __getattr__(self, kernel: str):
        launches = self.launches

        class Launch:
            def __getitem__(self, grid):
                return lambda *args, **kw: launches.append((kernel, kw.get("INPUT_PRECISION", "missing")))
        return Launch()


@pytest.mark.parametrize("bwd", [BwdPlan(BwdConfig(16, 16, 16, 16)), BwdPlan(BwdConfig(16, 16, 16, 16, fused=True)),
                                 BwdPlan(BwdConfig(16, 16, 16, 16), one_pass=True)], ids=["two-pass", "fused", "one-pass"])
@pytest.mark.parametrize("dtype,opt_in,expected", [(torch.float32, False, "ieee"), (torch.float32, True, "tf32"),
                                                   (torch.bfloat16, False, "tf32")], ids=["fp32", "fp32-tf32", "bf16"])
def test_every_launch_passes_the_precision(bwd, dtype, opt_in, expected, monkeypatch):
    recorder = LaunchRecorder()
    monkeypatch.setattr(flash_launch, "kernels", lambda module: recorder)
    monkeypatch.setattr(fast_launch, "kernels", lambda module: recorder)  # the one-pass kernel's launcher
    monkeypatch.setattr(triton_launch, "kernels", lambda module: recorder)  # the fast path's other launches
    # no GPU, nothing compiled: the direct launcher takes Triton's dispatch, which the recorder stands in for
    monkeypatch.setattr(direct_launch, "interpreting", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # nothing runs; bf16 is refused only by the interpreter
    q = torch.zeros(1, 2, 32, 16, dtype=dtype)
    L = torch.zeros(1, 2, 32)
    setting = tf32_opt_in("set_float32_matmul_precision") if opt_in else contextlib.nullcontext()
    with setting:
        flash_launch.launch_fwd(q, q, q, True, FwdConfig(16, 16))
        fast_launch.launch_bwd(q, q, q, q, L, q, True, bwd)
    with_dots = [(kernel, p) for kernel, p in recorder.launches if kernel != "bwd_preprocess_kernel"]
    assert len(with_dots) == (2 if bwd.tiles.fused or bwd.one_pass else 3)
    assert all(p == expected for _, p in with_dots), recorder.launches


# -- on the GPU: fp32 against float64 --------------------------------------------------------------

U_FP32 = 2.0**-24  # unit roundoff of IEEE fp32 (24 significant bits)
U_TF32 = 2.0**-11  # TF32 keeps 10 mantissa bits: each matmul operand is rounded to 11 significant bits


def fp32_tolerance(q, k, v, do, u_operand: float) -> float:
    """Relative (Frobenius) error allowed for O, dQ, dK, dV of fp32 attention whose matmuls round
    their operands with unit roundoff `u_operand` (0 for IEEE fp32, U_TF32 for TF32) and add in fp32.

    A dot product of m terms computed so is off by at most gamma(m) = 2 u_operand + m u relative to
    sum |a_i b_i| (each operand rounded once; m roundings of the fp32 sum, Higham's gamma_m).
    - S = Q K^T / sqrt(d) is off by gamma(d) |Q||K|^T / sqrt(d) (normwise: s = its RMS over the
      scores, from these inputs); P = exp(S - L) turns that absolute error into a relative error of
      P, and L carries as much: 2 gamma(d) s.
    - dP = dO V^T is off by gamma(d) |dO||V|^T, relative to dP's own size g = RMS(|dO||V|^T) / RMS(dP);
      it enters dS = P * (dP - D): gamma(d) g.
    - every output sums n = max(n_q, n_k) terms, and the backward chains two such sums (dP or P V,
      then dS K): 2 gamma(n).
    Their sum is the bound. Large logits (inputs x 8) grow s 64-fold, which is why TF32's error grows
    with them and IEEE's stays small.
    """
    d, n = q.shape[-1], max(q.shape[-2], k.shape[-2])

    def gamma(m: int) -> float:
        return 2 * u_operand + m * U_FP32

    def rms(t):
        return float(t.pow(2).mean().sqrt())

    q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
    s = rms(q64.abs() @ k64.abs().transpose(-2, -1)) / math.sqrt(d)
    g = rms(do64.abs() @ v64.abs().transpose(-2, -1)) / rms(do64 @ v64.transpose(-2, -1))
    return 2 * gamma(d) * s + gamma(d) * g + 2 * gamma(n)


def fp32_problem(shape, scale: float, seed: int = 0):
    Z, H, n_q, n_k, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = scale * torch.randn(Z, H, n_q, d, device="cuda", generator=g)
    k, v = (scale * torch.randn(Z, H, n_k, d, device="cuda", generator=g) for _ in range(2))
    do = torch.randn(Z, H, n_q, d, device="cuda", generator=g)
    return q, k, v, do


def errors_vs_float64(q, k, v, do, is_causal, bwd: BwdPlan | None = None):
    """Relative errors of O, dQ, dK, dV of the tuned Triton Function (the table's plans, or `bwd`)
    against float64, and its outputs."""
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64, _ = attention_reference(q64, k64, v64, is_causal)
    o64.backward(do.double())
    q32, k32, v32 = (t.clone().requires_grad_() for t in (q, k, v))
    o = FlashAttentionFast.apply(q32, k32, v32, is_causal, None, bwd)
    o.backward(do)
    got = {"O": o.detach(), "dQ": q32.grad, "dK": k32.grad, "dV": v32.grad}
    want = {"O": o64.detach(), "dQ": q64.grad, "dK": k64.grad, "dV": v64.grad}
    return {name: float((got[name].double() - want[name]).norm() / want[name].norm()) for name in got}, got


needs_compiled = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: only the compiled kernels can use TF32 "
                                    "(the interpreter computes fp32 in IEEE, with numpy)")
# Explicit backward kernels besides the table's choice, at tiles that fit fp32 at d = 128 (padded from 80)
BWD_KERNELS = {"table": None, "two-pass": BwdPlan(BwdConfig(16, 32, 32, 16, 4, 1, 4, 1)),
               "fused": BwdPlan(BwdConfig(16, 32, 32, 16, 4, 1, 4, 1, fused=True)),
               "one-pass": BwdPlan(BwdConfig(16, 32, 16, 32, 4, 1, 4, 1), one_pass=True)}


@needs_compiled
@needs_triton
@pytest.mark.parametrize("bwd", BWD_KERNELS)
@pytest.mark.parametrize("scale", [1.0, 8.0], ids=["unit", "large-logits"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 1024, 1024, 64), (1, 3, 777, 1531, 80)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_fp32_matches_float64_at_ieee_precision(shape, is_causal, scale, bwd):
    q, k, v, do = fp32_problem(shape, scale)
    tol = fp32_tolerance(q, k, v, do, u_operand=0.0)
    errs, _ = errors_vs_float64(q, k, v, do, is_causal, BWD_KERNELS[bwd])  # None: the table's choice
    assert all(e < tol for e in errs.values()), f"errors {errs} vs IEEE fp32 bound {tol:.2g}"


@needs_compiled
@needs_triton
@pytest.mark.parametrize("route", ["fp32_precision", "set_float32_matmul_precision"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gpu_fp32_with_tf32_opted_in(is_causal, route):
    q, k, v, do = fp32_problem((2, 4, 1024, 1024, 64), 1.0)
    _, ieee = errors_vs_float64(q, k, v, do, is_causal)
    with tf32_opt_in(route):
        errs, tf32 = errors_vs_float64(q, k, v, do, is_causal)
    tol = fp32_tolerance(q, k, v, do, u_operand=U_TF32)
    assert all(e < tol for e in errs.values()), f"errors {errs} vs TF32 bound {tol:.2g}"
    # the opt-in reached the kernels: rounding the operands to TF32 changes the outputs' bits
    assert not torch.equal(ieee["O"], tf32["O"]) and not torch.equal(ieee["dQ"], tf32["dQ"])
