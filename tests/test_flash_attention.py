"""FlashAttention-2 (PyTorch and Triton) against a float64 reference: forward, backward, contract.

On a CPU the Triton kernels run under the interpreter (fp32, small shapes); on a GPU the same tests
run the compiled kernels, and the GPU-only tests add bf16/fp16, head dim 80 and larger shapes.
"triton" is the teaching path's Function (tiles handed in, or its defaults); "fast" is the tuned
one (`attention/fast/`: plans from the measured table, or handed in), with the one-pass and Gluon
backward kernels.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from cs336_systems.attention import flash_attention
from cs336_systems.attention.fast import FlashAttentionFast
from cs336_systems.attention.fast.plans import BwdPlan, FwdPlan, GluonBwdConfig, GluonFwdConfig
from cs336_systems.attention.flash_pytorch import FlashAttentionPyTorch
from cs336_systems.attention.flash_triton import FlashAttentionTriton
from cs336_systems.attention.reference import attention_reference
from cs336_systems.attention.tiles import BwdConfig, FwdConfig
from tests.strategies import attention_problems
from tests.triton_mode import DEVICE, ON_GPU, needs_gpu, needs_triton  # noqa: F401

IMPLS = {"pytorch": FlashAttentionPyTorch, "triton": FlashAttentionTriton, "fast": FlashAttentionFast}
IMPL_PARAMS = ["pytorch", pytest.param("triton", marks=needs_triton)]  # without triton, the PyTorch half runs


def make_qkv(batch, heads, n_q, n_k, d, dtype=torch.float32, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = (batch,) if heads is None else (batch, heads)
    q = torch.randn(*lead, n_q, d, generator=g)
    k = torch.randn(*lead, n_k, d, generator=g)
    v = torch.randn(*lead, n_k, d, generator=g)
    do = torch.randn(*lead, n_q, d, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)], do.to(device=device, dtype=dtype)


def reference(q, k, v, do, is_causal):
    """O, L and the gradients in float64 (on the inputs' device)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, L = attention_reference(q64, k64, v64, is_causal)
    o.backward(do.double())
    return o.detach(), L.detach(), q64.grad, k64.grad, v64.grad


def tolerance(dtype, impl):
    """Relative Frobenius error allowed against the float64 reference.

    fp32 in IEEE arithmetic (PyTorch FA2; Triton under the interpreter): each output is a chain of at
    most N ~ d + 2 n_k + n_q + 30 roundings (the scores' dot over d, the softmax's sum and merges over
    the keys, P V; the backward's dots over d, the keys and the queries), <= ~300 for the CPU shapes.
    The worst case, gamma_N ~ 2e-5 normwise (tests/tolerances.py), needs every rounding to push the
    same way; pooled in a Frobenius norm the errors behave as independent and zero-mean (Higham and
    Mary, 2019), so the norm concentrates near sqrt(N) u ~ 1e-6 (measured: at most 5.2e-7 with AVX2
    and with the scalar kernels). 1e-5 is ~10 such widths, and 10^5 below a real bug's O(1) error.
    GPU: Triton's fp32 dots run in TF32 (10-bit mantissa); bf16/fp16 inputs keep ~3 significant digits."""
    if dtype == torch.float32:
        return 5e-3 if (impl == "triton" and ON_GPU) else 1e-5
    return 2e-2


def assert_close_rel(actual, expected, tol, what):
    """Frobenius error relative to the reference, or to an RMS of 1 where the reference is ~0
    (a single key makes dQ exactly 0)."""
    actual = actual.double()
    err = (actual - expected).norm() / max(expected.norm().item(), expected.numel() ** 0.5)
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    assert err < tol, f"{what}: relative error {err:.3g} > {tol:.1g}"


def run_and_check(impl, batch, heads, n_q, n_k, d, is_causal, dtype=torch.float32, seed=0, fwd=None, bwd=None):
    """`fwd`, `bwd`: the tiles ("triton") or plans ("fast") handed to the Function; None: its own choice."""
    (q, k, v), do = make_qkv(batch, heads, n_q, n_k, d, dtype, seed=seed)
    o_ref, L_ref, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, is_causal)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = IMPLS[impl].apply(q, k, v, is_causal, *((fwd, bwd) if fwd or bwd else ()))
    lead = q.shape[:-2]
    saved_L = [t for t in o.grad_fn.saved_tensors if t.shape == (*lead, n_q)]
    assert len(saved_L) == 1, "exactly one saved tensor must have shape (batch, [heads,] n_queries)"
    o.backward(do)
    tol = tolerance(dtype, impl)
    assert o.dtype == dtype and saved_L[0].dtype == dtype and o.device == q.device
    assert_close_rel(o, o_ref, tol, "O")
    assert_close_rel(saved_L[0], L_ref, tol, "L")
    for name, t, ref in (("dQ", q, dq_ref), ("dK", k, dk_ref), ("dV", v, dv_ref)):
        assert t.grad.dtype == dtype and t.grad.shape == t.shape
        assert_close_rel(t.grad, ref, tol, name)


# The course's own case (batch 4, 128 queries and keys, d 64, fp32, tolerance 1e-2 elementwise).
@pytest.mark.parametrize("impl", IMPL_PARAMS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_course_case(impl, is_causal):
    (q, k, v), do = make_qkv(4, None, 128, 128, 64)
    o_ref, L_ref, *grads_ref = reference(q, k, v, do, is_causal)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = IMPLS[impl].apply(q, k, v, is_causal)
    (L,) = [t for t in o.grad_fn.saved_tensors if t.shape == (4, 128)]
    o.backward(do)
    for actual, expected in ((o, o_ref), (L, L_ref), (q.grad, grads_ref[0]), (k.grad, grads_ref[1]),
                             (v.grad, grads_ref[2])):
        torch.testing.assert_close(actual.double(), expected, rtol=1e-2, atol=1e-2)


# Ragged sizes (not multiples of any tile), n_q != n_k both ways, 3-D and 4-D, d padded (24 -> 32).
SHAPES = [(2, None, 37, 53, 16), (1, 2, 50, 20, 32), (1, None, 1, 33, 24), (2, 3, 33, 1, 16),
          (1, None, 64, 64, 80)]


@pytest.mark.parametrize("impl", IMPL_PARAMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_ragged_shapes(impl, shape, is_causal):
    run_and_check(impl, *shape, is_causal)


# Tile shapes that disagree with each other and with the sizes: BLOCK_M != BLOCK_N both ways,
# the fused backward, tiles wider than the sequence.
CONFIGS = [
    (FwdConfig(32, 16), BwdConfig(16, 32, 32, 16)),
    (FwdConfig(16, 32), BwdConfig(32, 16, 16, 32, fused=True)),
    (FwdConfig(64, 64), BwdConfig(16, 16, 16, 16, fused=True)),
]


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("fwd,bwd", CONFIGS, ids=["m32n16", "m16n32-fused", "m64n64-fused"])
def test_triton_tile_configs(fwd, bwd, is_causal):
    run_and_check("triton", 2, None, 45, 70, 16, is_causal, fwd=fwd, bwd=bwd)
    run_and_check("triton", 1, 2, 70, 29, 32, is_causal, seed=1, fwd=fwd, bwd=bwd)


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
def test_fast_function_with_the_tables_plans(shape, is_causal):
    """The tuned Function with no plan handed in: the table's lookup (the interpreter's tiles on a CPU)."""
    run_and_check("fast", *shape, is_causal)


# Input tiles loaded through TMA tensor descriptors, forward and backward (the interpreter emulates
# them, zero-filling boxes that run past the end like the copy engine does).
TMA_FWD = FwdConfig(16, 32, tma=True)
TMA = [("triton", TMA_FWD, BwdConfig(16, 32, 32, 16, tma1=True, tma2=True)),  # two launches, ragged boxes both ways
       ("triton", TMA_FWD, BwdConfig(32, 16, 16, 32, fused=True, tma1=True, tma2=True)),  # one launch, each pass's boxes
       ("triton", TMA_FWD, BwdConfig(16, 16, 16, 16, fused=True, tma1=True)),  # one launch, dQ pass by pointers
       ("fast", FwdPlan(TMA_FWD), BwdPlan(BwdConfig(16, 32, 16, 32, tma1=True), one_pass=True))]  # one pass (dQ atomics by pointers here)


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("impl,fwd,bwd", TMA, ids=["two-launch", "fused", "fused-dkdv-only", "one-pass"])
def test_triton_tma_backward(impl, fwd, bwd, is_causal, monkeypatch):
    from cs336_systems.attention import flash_launch
    from cs336_systems.attention.fast import launch as fast_launch

    made = []
    real = flash_launch._descriptors
    record = lambda *a: made.append("bwd" if a[3] is not None else "fwd") or real(*a)  # noqa: E731 - the forward passes no dO
    monkeypatch.setattr(flash_launch, "_descriptors", record)
    monkeypatch.setattr(fast_launch, "_descriptors", record)
    run_and_check(impl, 2, None, 45, 70, 16, is_causal, fwd=fwd, bwd=bwd)
    run_and_check(impl, 1, 2, 70, 29, 32, is_causal, seed=1, fwd=fwd, bwd=bwd)
    assert "fwd" in made, "the forward did not take the TMA path"
    assert "bwd" in made, "the backward did not take the TMA path"
    made.clear()
    run_and_check(impl, 1, 2, 70, 29, 80, is_causal, seed=1, fwd=fwd, bwd=bwd)  # d = 80 is no power of two: pointer loads
    assert not made


def test_tma_ok_rules():
    from cs336_systems.attention.flash_launch import tma_ok

    x = torch.zeros(2, 3, 40, 32, device=DEVICE)
    assert tma_ok(x, x)
    assert not tma_ok(torch.zeros(2, 3, 40, 80, device=DEVICE))  # d not a power of two
    assert not tma_ok(x.transpose(-1, -2))  # last dim not unit-stride
    assert not tma_ok(torch.zeros(2, 3, 40, 33, device=DEVICE)[..., :32])  # row stride of 132 bytes
    assert not tma_ok(torch.zeros(1, 3, 40, 32, device=DEVICE).expand(2, 3, 40, 32))  # a 0 stride


# The one-pass backward (dQ by fp32 atomics), forced by a plan handed to the fast Function.
ONE_PASS = [BwdPlan(BwdConfig(16, 16, 16, 16, 1, 1, 1, 1), one_pass=True),  # the interpreter's tiles
            BwdPlan(BwdConfig(32, 16, 32, 16), one_pass=True),  # BLOCK_M > BLOCK_N
            BwdPlan(BwdConfig(16, 32, 16, 32), one_pass=True)]  # BLOCK_N > BLOCK_M, ragged key tiles


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_triton_one_pass_backward(shape, is_causal):
    run_and_check("fast", *shape, is_causal, bwd=ONE_PASS[0])


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("bwd", ONE_PASS[1:], ids=["m32n16", "m16n32"])
def test_triton_one_pass_tile_configs(bwd, is_causal):
    fwd = FwdPlan(FwdConfig(16, 16))
    run_and_check("fast", 2, None, 45, 70, 16, is_causal, fwd=fwd, bwd=bwd)
    run_and_check("fast", 1, 2, 70, 29, 80, is_causal, seed=1, fwd=fwd, bwd=bwd)


@needs_triton
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")  # then masked, as intended
@pytest.mark.parametrize("is_causal", [False, True])
def test_one_pass_ragged_keys_with_very_negative_scores(is_causal):
    """Every score is about -120, so L is too: exp(S - L) of a key past the end (K row 0, S = 0)
    overflows fp32. The two-pass dK/dV program never stores those rows; the one-pass one would
    carry their inf into dQ unless it masks them."""
    g = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(16, generator=g), dim=0)
    q = (-480 * u + 0.1 * torch.randn(1, 2, 37, 16, generator=g)).to(DEVICE)
    k = (u + 0.01 * torch.randn(1, 2, 20, 16, generator=g)).to(DEVICE)
    v, do = torch.randn(1, 2, 20, 16, generator=g).to(DEVICE), torch.randn(1, 2, 37, 16, generator=g).to(DEVICE)
    _, _, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, is_causal)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    FlashAttentionFast.apply(q, k, v, is_causal, None, ONE_PASS[0]).backward(do)
    # On a GPU Triton's fp32 dots run in TF32 (10-bit mantissa): scores of size ~480 move by ~0.2,
    # which moved dK by ~1.3% on the H200; the interpreter computes in full fp32, where a score's
    # error is <= gamma_16 * |q||k| / 4 ~ 1.1e-4 absolute, so P's relative error <= ~2.3e-4 (worst case).
    tol = 3e-2 if DEVICE == "cuda" else 1e-3
    for name, t, ref in (("dQ", q, dq_ref), ("dK", k, dk_ref), ("dV", v, dv_ref)):
        assert_close_rel(t.grad, ref, tol, name)


def test_one_pass_and_fused_exclude_each_other():
    with pytest.raises(ValueError, match="one_pass and fused"):
        BwdPlan(BwdConfig(16, 16, 16, 16, fused=True), one_pass=True)


@pytest.mark.parametrize("impl", IMPL_PARAMS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=attention_problems())
def test_random_problems(impl, problem):
    run_and_check(impl, problem["batch"], problem["heads"], problem["n_queries"], problem["n_keys"],
                  problem["head_dim"], problem["is_causal"])


def test_pytorch_tiles_are_honoured():
    saved = FlashAttentionPyTorch.block_q, FlashAttentionPyTorch.block_k
    try:
        FlashAttentionPyTorch.block_q, FlashAttentionPyTorch.block_k = 16, 32
        run_and_check("pytorch", 1, None, 47, 71, 16, True)
    finally:
        FlashAttentionPyTorch.block_q, FlashAttentionPyTorch.block_k = saved


@needs_triton
def test_flash_attention_entry_point():
    (q, k, v), _ = make_qkv(1, 2, 40, 40, 16)
    o_ref, _ = attention_reference(q.double(), k.double(), v.double(), True)
    for impl in ("triton", "pytorch"):
        assert_close_rel(flash_attention(q, k, v, is_causal=True, impl=impl), o_ref, 1e-2, impl)
    with pytest.raises(ValueError, match="impl"):
        flash_attention(q, k, v, impl="cuda")


# -- bad input: ValueError naming the argument ----------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_bad_inputs_raise_value_error(impl):
    Fn = IMPLS[impl]
    (q, k, v), _ = make_qkv(2, None, 8, 8, 16)
    cases = [
        ((q[0], k[0], v[0], False), "q must have shape"),  # 2-D
        ((q[None, None], k[None, None], v[None, None], False), "q must have shape"),  # 5-D
        ((q, k.half(), v, False), "k must have q's dtype"),
        ((q, k, v.half(), False), "v must have q's dtype"),
        ((q, k[:1], v[:1], False), "k must have q's leading dims"),
        ((q, k, v[..., :8], False), "v must have k's shape"),
        ((q, k[..., :8], v[..., :8], False), "k must have q's head dim"),
        ((q, k.to("meta"), v, False), "k must be on q's device"),
        ((q, k, v, "yes"), "is_causal"),
        ((q.cpu().numpy(), k, v, False), "q must be a torch.Tensor"),
    ]
    if impl == "triton":
        small = [t[..., :8].contiguous() for t in (q, k, v)]
        big = [torch.zeros(2, 4, 136, device=q.device) for _ in range(3)]
        cases += [((*small, False), "head dim must be in 16..128"), ((*big, False), "head dim must be in 16..128"),
                  ((q.double(), k.double(), v.double(), False), "dtype must be one of")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            Fn.apply(*args)


def test_triton_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    (q, k, v), _ = make_qkv(1, None, 8, 8, 16, device="cpu")
    with pytest.raises(ValueError, match="q, k, v must be CUDA tensors"):
        FlashAttentionTriton.apply(q, k, v, False)


@pytest.mark.slow
def test_pytorch_compiled_backward_matches_eager():
    saved = FlashAttentionPyTorch.compile_backward
    try:
        FlashAttentionPyTorch.compile_backward = True
        run_and_check("pytorch", 2, None, 37, 45, 16, True)
        run_and_check("pytorch", 1, 2, 33, 20, 32, False)
    finally:
        FlashAttentionPyTorch.compile_backward = saved


# -- GPU only ------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("impl", ["triton", "fast"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 1000, 1000, 80), (1, 3, 777, 1531, 64), (3, 2, 1200, 300, 128),
                                   (4, None, 513, 513, 16)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_dtypes_and_odd_sizes(impl, dtype, shape, is_causal):
    run_and_check(impl, *shape, is_causal, dtype=dtype)


@needs_gpu
@pytest.mark.parametrize("impl", ["triton", "fast"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gpu_leaderboard_layout_under_compile(impl, dtype):
    """Heads folded into batch, torch.compile(Fn.apply), o.sum().backward(): the leaderboard's step
    at a smaller sequence."""
    (q, k, v), _ = make_qkv(16, None, 2048, 2048, 64, dtype)
    do = torch.ones_like(q)
    o_ref, _, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    f = torch.compile(IMPLS[impl].apply)
    o = f(q, k, v, True)
    o.sum().backward()
    tol = tolerance(dtype, "triton")
    for name, actual, expected in (("O", o, o_ref), ("dQ", q.grad, dq_ref), ("dK", k.grad, dk_ref),
                                   ("dV", v.grad, dv_ref)):
        assert_close_rel(actual, expected, tol, name)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("bwd", [BwdPlan(BwdConfig(64, 64, 64, 64, 4, 3, 4, 3), one_pass=True),
                                 BwdPlan(BwdConfig(32, 128, 32, 128, 8, 2, 8, 2), one_pass=True),
                                 # TMA loads, and dQ added by TMA bulk reductions (GPU only)
                                 BwdPlan(BwdConfig(64, 64, 64, 64, 4, 3, 4, 3, tma1=True), one_pass=True),
                                 BwdPlan(BwdConfig(64, 128, 64, 128, 8, 3, 8, 3, tma1=True), one_pass=True)],
                         ids=["m64n64", "m32n128", "m64n64-tma", "m64n128-tma"])
@pytest.mark.parametrize("shape", [(2, 4, 1000, 1000, 80), (1, 3, 777, 1531, 64), (3, 2, 1200, 300, 128),
                                   (4, None, 1024, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_one_pass_backward(shape, bwd, is_causal, dtype):
    if dtype == torch.float32 and (bwd.tiles.block_n1 == 128 or bwd.tiles.tma1) and shape[-1] > 64:
        # (the TMA version stages each fp32 dQ tile in shared memory for the bulk reduction: 322 KB at 64 x 64)
        pytest.skip("fp32, head dim padded to 128, 128 keys or TMA: over 227 KB of shared memory (compile_report)")
    run_and_check("fast", *shape, is_causal, dtype=dtype, bwd=bwd)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("fwd,bwd", [
    (FwdConfig(128, 64, 8, 3, tma=True), BwdConfig(64, 64, 128, 64, 4, 3, 4, 3, fused=True, tma1=True, tma2=True)),
    (FwdConfig(64, 64, 4, 3, tma=True), BwdConfig(32, 128, 128, 32, 4, 3, 4, 3, tma1=True, tma2=True))],
    ids=["fused", "two-launch"])
@pytest.mark.parametrize("shape", [(1, 3, 777, 1531, 64), (3, 2, 1200, 300, 128), (4, None, 1024, 1024, 64),
                                   (2, 4, 1000, 1000, 16)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_tma(shape, fwd, bwd, is_causal, dtype):
    if dtype == torch.float32 and shape[-1] == 128:
        pytest.skip("fp32 at head dim 128 with these tiles: over 227 KB of shared memory")
    run_and_check("triton", *shape, is_causal, dtype=dtype, fwd=fwd, bwd=bwd)


@needs_gpu
def test_gpu_pytorch_fa2_bf16():
    run_and_check("pytorch", 2, 2, 300, 260, 64, True, dtype=torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(4, None, 1024, 1024, 64), (2, 2, 512, 1024, 64), (1, 3, 777, 1531, 64),
                                   (2, 4, 1000, 1000, 80)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_gluon_backward_through_the_table(shape, is_causal, dtype, monkeypatch):
    """A plan with Gluon settings, through the fast autograd Function: the Gluon backward where the inputs
    qualify (Hopper, Triton 3.6, 16-bit, d = 64, keys a multiple of 128, causal only square), the
    plan's Triton kernels elsewhere; the gradients right either way."""
    import triton

    from cs336_systems.attention.fast.gluon import onepass_ws

    calls = []
    real = onepass_ws.launch_bwd_onepass_ws
    monkeypatch.setattr(onepass_ws, "launch_bwd_onepass_ws", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    # The Triton tiles are the 16-bit tuned ones; fp32 (never the Gluon kernel's) gets tiles of the size
    # the fp32 table picks: with the 128-wide ones (likely spilling), one fp32 case ran past 170 s.
    tiles = BwdConfig(32, 32, 32, 32) if dtype == torch.float32 else BwdConfig(32, 128, 128, 32, 4, 3, 4, 3)
    bwd = BwdPlan(tiles, gluon=GluonBwdConfig(stages=2, slots=2, dq_regs=80))
    run_and_check("fast", *shape, is_causal, dtype=dtype, bwd=bwd)
    qualifies = dtype != torch.float32 and (shape[2:] == (1024, 1024, 64) or (shape[2:] == (512, 1024, 64)
                                                                                and not is_causal))
    gluon_here = torch.cuda.get_device_capability()[0] == 9 and triton.__version__.startswith("3.6")
    assert bool(calls) == (qualifies and gluon_here)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(4, None, 1024, 1024, 64), (1, 3, 777, 1531, 64), (2, 4, 1000, 1000, 80)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_gluon_forward_through_the_table(shape, is_causal, dtype, monkeypatch):
    """A forward plan with Gluon settings, through the fast autograd Function: the Gluon forward where the
    inputs qualify (Hopper, Triton 3.6, 16-bit, d = 64, keys a multiple of 64), the plan's Triton
    forward elsewhere; output, saved L and gradients right either way."""
    import triton

    from cs336_systems.attention.fast.gluon import fwd_ws

    calls = []
    real = fwd_ws.launch_fwd_ws
    monkeypatch.setattr(fwd_ws, "launch_fwd_ws", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fwd = FwdPlan(FwdConfig(64, 32, 4, 2), GluonFwdConfig(block_n=64, stages=4, warpgroups=3))
    run_and_check("fast", *shape, is_causal, dtype=dtype, fwd=fwd)
    qualifies = dtype != torch.float32 and shape[-1] == 64 and shape[3] % 64 == 0
    gluon_here = torch.cuda.get_device_capability()[0] == 9 and triton.__version__.startswith("3.6")
    assert bool(calls) == (qualifies and gluon_here)
