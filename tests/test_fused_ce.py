"""The fused LM head + cross-entropy against an independent float64 reference: loss, d hidden and
d weight, chunked any way, with ignored positions, huge logits, a scaled backward and no grad.

The reference is torch's F.cross_entropy on float64 logits computed from float64 copies of the
very inputs ours gets; every tolerance is the rounding-error bound `ce_bounds` derives (see there),
never a number read off one machine. On a CPU the kernel runs under the Triton interpreter in fp32
(small shapes: the interpreter is slow); the bf16 and large-shape tests need a CUDA GPU.
"""

from __future__ import annotations

import importlib
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from cs336_systems.attention.triton_loader import interpreting, next_power_of_2
from cs336_systems.training_step import fused_ce as fc
from cs336_systems.training_step.fused_ce import FusedLinearCrossEntropy, fused_linear_cross_entropy
from tests.strategies import fused_ce_problems
from tests.tolerances import assert_within, gamma, unit_roundoff
from tests.triton_mode import DEVICE, ON_GPU, needs_gpu, needs_triton, where_marks

pytestmark = where_marks
F32 = torch.float32
IGNORE = -100
# exp2 and log2 in the kernel: numpy's (interpreter) are within 1 ulp, the GPU's approximate
# instructions (ex2.approx, lg2.approx) within 2 ulp relative, resp. 2^-22 absolute on log2: 2^-22
# covers both.
U_APPROX = 2.0**-22
# Underflow: an fp32 (or bf16: the same exponent range) result below the smallest normal number
# 2^-126 is rounded to a subnormal or, on a GPU that flushes, to zero: an absolute error below 2^-126
# that no relative bound covers (softmax entries of e^-500 are 0 in fp32, ~1e-218 in float64).
ETA = 2.0**-126


# -- the bound --------------------------------------------------------------------------------------

def ce_bounds(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, *, block_v: int, grad_output: float = 1.0,
              ignore_index: int = IGNORE) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Bounds on |ours - exact| for the loss (a float), d hidden (N, d) and d weight (V, d), where
    h (N, d), w (V, d) are the inputs ours gets (their dtype: fp32, or bf16 on a GPU).

    First order in the unit roundoffs (Higham's convention; the u^2 terms are below 1e-12 here),
    u = 2^-24 (fp32: every kernel operation and accumulation), u_x = u of the inputs' dtype (the
    roundings to it: the logits, the stored gradient, the GEMM outputs). a = |h| |w|^T.

    Logits. z = h w^T: a dot of d terms, accumulated in fp32, |dz| <= gamma_d a (+ u_x |z| when
    rounded to bf16); Delta_i = max_j dz_ij. Perturbing a row's logits by at most Delta moves its
    logsumexp by at most Delta (the gradient of lse is softmax: it sums to 1), and log p_j by
    dz_j + Delta.

    The kernel, per row, in log space (a relative error e of l is an absolute error e of log l):
    each exp term's argument (z - m) log2(e) takes 3 roundings, an absolute error gamma_3 (m - z_j)
    in the exponent, and exp2 U_APPROX; weighted by the terms' shares p_j, l's terms are off by
    gamma_3 sum_j p_j (m - z_j + 2 Delta) + U_APPROX. The running sum adds V terms (gamma_V) and is
    rescaled once per tile (T tiles): each alpha's argument error sums to gamma_3 (m - m_first) <=
    gamma_3 (R + 2 Delta) (R: the row's logit range), plus T (U_APPROX + u) for the exp2s and the
    products. That is lambda, l's error. Loss term lse - z_t: Delta + dz_t (input) + lambda, log2's
    U_APPROX (1 + log2 l) and 2 u ln l (the ln 2 factor), u |lse| (adding m), u |loss_i|. The mean:
    the N terms summed in fp32 (gamma_N sum |loss_i|), divided by n_valid (u).

    Gradient G = (p - onehot) / n. p_j = exp2((z_j - m) log2 e) * (scale / l): relative error
    expm1(rho), rho = dz_j + Delta (input) + gamma_3 (m - z_j + 2 Delta) + U_APPROX + lambda + 3 u
    (the division, the fp32 1/n, the product); the target column subtracts the fp32 1/n (u / n) and
    rounds (u |G|); stored in bf16, u_x |G| more. dh = G W: V terms, gamma_V |G| |W| + dG |W|,
    rounded to the dtype (u_x |dh|). dW = G^T h: summed over the N positions in fp32 (chunk by
    chunk, then across chunks: at most N + 1 roundings in any path) gamma_{N+1} |G|^T |h| + dG^T |h|;
    in bf16 each chunk's partial may be rounded once (u_x |G|^T |h|) and the sum cast (u_x |dW|).
    The backward's product by grad_output rounds once more (u_x) and scales everything by |g|.
    """
    u, ux = unit_roundoff(F32), unit_roundoff(h.dtype)
    low = h.dtype != F32
    h64, w64 = h.detach().double(), w.detach().double()
    N, d = h64.shape
    V = w64.shape[0]
    valid = t != ignore_index  # (N,)
    n = int(valid.sum())
    onehot = F.one_hot(t.clamp(min=0), V).double() * valid[:, None]  # (N, V), zero rows where ignored
    z, a = h64 @ w64.T, h64.abs() @ w64.abs().T  # (N, V)
    dz = gamma(d, F32) * a + (ux * (z.abs() + gamma(d, F32) * a) if low else 0)  # (N, V)
    delta = dz.amax(1, keepdim=True)  # (N, 1)
    m = z.amax(1, keepdim=True)
    lse = torch.logsumexp(z, 1, keepdim=True)  # (N, 1)
    p = torch.softmax(z, 1)
    gap = m - z + 2 * delta  # (N, V): |stored z - stored m| bound
    R = gap.amax(1, keepdim=True)
    T = math.ceil(V / min(block_v, next_power_of_2(V)))
    lam = (gamma(3, F32) * (p * gap).sum(1, keepdim=True) + U_APPROX + gamma(V, F32)
           + gamma(3, F32) * R + T * (U_APPROX + u) + V * ETA)  # (N, 1); l >= 1, so V ETA is relative
    log_l = lse - m  # ln l in [0, ln V]
    z_t = (z * onehot).sum(1, keepdim=True)
    loss_i = lse - z_t
    dz_t = (dz * onehot).sum(1, keepdim=True)
    dloss = (delta + dz_t + lam + U_APPROX * (1 + log_l / math.log(2)) + 2 * u * log_l
             + u * (lse.abs() + loss_i.abs()))  # (N, 1)
    dloss, loss_i = dloss[valid], loss_i[valid]
    loss = loss_i.sum().item() / max(n, 1)
    loss_bound = ((dloss.sum() + gamma(N, F32) * loss_i.abs().sum()).item() / max(n, 1) + u * abs(loss)) * abs(grad_output)

    G = (p - onehot) / max(n, 1) * valid[:, None]  # (N, V)
    rho = dz + delta + gamma(3, F32) * gap + U_APPROX + lam + 3 * u
    # + 2 ETA: exp2 underflowing (times scale / l <= 1), and the product's own underflow
    dG = ((p * torch.expm1(rho) + u * onehot) / max(n, 1) + (u + (ux if low else 0)) * G.abs() + 2 * ETA) * valid[:, None]
    # each GEMM product may underflow too: ETA per term summed (V terms for dh, N + 1 for dW)
    dh = G @ w64  # (N, d)
    dh_bound = (dG @ w64.abs() + gamma(V, F32) * (G.abs() @ w64.abs()) + (ux if low else 0) * dh.abs()
                + V * ETA)
    dw = G.T @ h64  # (V, d)
    gh = G.abs().T @ h64.abs()
    dw_bound = dG.T @ h64.abs() + gamma(N + 1, F32) * gh + ((ux * gh + ux * dw.abs()) if low else 0) + (N + 1) * ETA
    g = abs(grad_output)
    return loss_bound, g * dh_bound + ux * g * dh.abs(), g * dw_bound + ux * g * dw.abs()


# -- helpers ----------------------------------------------------------------------------------------

def problem(shape, V, d, n_ignored=0, scale=1.0, dtype=F32, seed=0, device=DEVICE):
    """hidden (*shape, d), weight (V, d), targets (*shape) with `n_ignored` positions set to IGNORE."""
    g = torch.Generator().manual_seed(seed)
    N = math.prod(shape)
    h = (torch.randn(*shape, d, generator=g) * scale).to(device, dtype)
    w = (torch.randn(V, d, generator=g) / math.sqrt(d) * scale).to(device, dtype)
    t = torch.randint(0, V, (N,), generator=g)
    t[torch.randperm(N, generator=g)[:n_ignored]] = IGNORE
    return h, w, t.view(shape).to(device)


def reference(h, w, t, grad_output=1.0):
    """F.cross_entropy in float64 on float64 copies: loss, d hidden, d weight."""
    h64 = h.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    loss = F.cross_entropy((h64 @ w64.T).flatten(0, -2), t.flatten(), ignore_index=IGNORE)
    (loss * grad_output).backward()
    return loss.detach(), h64.grad, w64.grad


def ours(h, w, t, chunk_size, grad_output=1.0):
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = fused_linear_cross_entropy(h, w, t, chunk_size=chunk_size, ignore_index=IGNORE)
    assert loss.dtype == F32 and loss.dim() == 0
    (loss * grad_output).backward()
    assert h.grad.dtype == h.dtype and w.grad.dtype == w.dtype and h.grad.shape == h.shape
    return loss.detach(), h.grad, w.grad


def check(h, w, t, chunk_size, block_v, grad_output=1.0, what=""):
    loss, dh, dw = ours(h, w, t, chunk_size, grad_output)
    ref_loss, ref_dh, ref_dw = reference(h, w, t, grad_output)
    d = h.shape[-1]
    bl, bh, bw = ce_bounds(h.reshape(-1, d), w, t.flatten(), block_v=block_v, grad_output=grad_output)
    assert_within(loss * grad_output, ref_loss * grad_output, bl, f"loss {what}")
    assert_within(dh.reshape(-1, d), ref_dh.reshape(-1, d), bh, f"d hidden {what}")
    assert_within(dw, ref_dw, bw, f"d weight {what}")
    return loss


@pytest.fixture
def block_v(request, monkeypatch):
    """The kernel's vocab tile, small, so that a vocabulary of a few hundred spans several tiles."""
    monkeypatch.setattr(fc, "BLOCK_V", request.param)
    return request.param


# -- against the float64 reference --------------------------------------------------------------------

# (leading shape, V, d, chunk_size, vocab tile, ignored positions, logit scale, grad_output)
CASES = {
    "ragged vocab, ragged last chunk, ignored": ((70,), 300, 32, 16, 64, 9, 1.0, 1.0),
    "3-D hidden, loss*3 backward": ((2, 23), 257, 24, 12, 128, 5, 1.0, 3.0),
    "vocab a multiple of the tile": ((21,), 256, 16, 8, 64, 0, 1.0, 1.0),
    "one chunk, vocab under one tile": ((20,), 50, 8, 4096, 4096, 2, 1.0, 1.0),
    "all but one ignored": ((33,), 130, 16, 8, 64, 32, 1.0, 1.0),
    "chunk of one row": ((9,), 70, 8, 1, 32, 1, 1.0, -0.5),
    # logits ~ +-1e4 (exp overflows fp32 past 88): only the online max keeps them finite
    "large logits": ((24,), 200, 16, 10, 64, 3, 100.0, 1.0),
}


@needs_triton
@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_matches_float64_reference(case, monkeypatch):
    shape, V, d, chunk, tile, n_ignored, scale, g = case
    monkeypatch.setattr(fc, "BLOCK_V", tile)
    h, w, t = problem(shape, V, d, n_ignored, scale)
    loss = check(h, w, t, chunk, tile, g)
    assert torch.isfinite(loss)


@needs_triton
@settings(max_examples=8, deadline=None)
@given(fused_ce_problems())
def test_the_loss_does_not_depend_on_the_chunking(pr):
    """Two chunkings of the same problem: each is within the derived bound of the exact float64
    result, so they differ by at most twice that bound (the bound does not depend on the chunk)."""
    tile = 32  # a fixed small tile: vocabularies over 32 span several
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fc, "BLOCK_V", tile)
        h, w, t = problem((pr["n"],), pr["vocab"], pr["d"], pr["n_ignored"], seed=pr["seed"])
        (la, dha, dwa), (lb, dhb, dwb) = (ours(h, w, t, c) for c in pr["chunks"])
    bl, bh, bw = ce_bounds(h, w, t, block_v=tile)
    assert_within(la, lb, 2 * bl, f"loss, chunks {pr['chunks']}")
    assert_within(dha, dhb, 2 * bh, f"d hidden, chunks {pr['chunks']}")
    assert_within(dwa, dwb, 2 * bw, f"d weight, chunks {pr['chunks']}")
    assert_within(la, reference(h, w, t)[0], bl, "loss vs float64")


# -- what is computed when ---------------------------------------------------------------------------

@pytest.fixture
def calls(monkeypatch):
    """Records (need_dh, need_dw) of every chunked pass and write_grad of every kernel launch."""
    seen = {"chunked": [], "write_grad": []}
    chunked, launch = fc._chunked, fc.launch_ce_rows

    def spy_chunked(p, need_dh, need_dw):
        seen["chunked"].append((need_dh, need_dw))
        return chunked(p, need_dh, need_dw)

    def spy_launch(*args):
        seen["write_grad"].append(args[-1])
        return launch(*args)

    monkeypatch.setattr(fc, "_chunked", spy_chunked)
    monkeypatch.setattr(fc, "launch_ce_rows", spy_launch)
    return seen


@needs_triton
def test_no_grad_computes_only_the_loss(calls, monkeypatch):
    monkeypatch.setattr(fc, "BLOCK_V", 64)
    h, w, t = problem((30,), 100, 16, 4)
    h.requires_grad_(), w.requires_grad_()
    bound = ce_bounds(h, w, t, block_v=64)[0]
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h, w, t, chunk_size=7)
    plain = fused_linear_cross_entropy(h.detach(), w.detach(), t, chunk_size=7)  # nothing requires grad
    assert calls["chunked"] == [(False, False)] * 2 and set(calls["write_grad"]) == {False}
    assert loss.grad_fn is None and plain.grad_fn is None
    for x in (loss, plain):
        assert_within(x, reference(h, w, t)[0], bound, "no-grad loss")


@needs_triton
def test_only_the_gradients_asked_for(calls, monkeypatch):
    monkeypatch.setattr(fc, "BLOCK_V", 64)
    h, w, t = problem((25,), 90, 8, 3)
    w.requires_grad_()
    fused_linear_cross_entropy(h, w, t, chunk_size=10).backward()
    assert calls["chunked"] == [(False, True)] and set(calls["write_grad"]) == {True}
    assert h.grad is None
    assert_within(w.grad, reference(h, w, t)[2], ce_bounds(h, w, t, block_v=64)[2], "d weight alone")


@needs_triton
def test_every_target_ignored_gives_nan_loss_and_zero_gradients_as_torch():
    h, w, t = problem((6,), 40, 8, n_ignored=6)
    loss, dh, dw = ours(h, w, t, chunk_size=4)
    ref_loss, ref_dh, ref_dw = reference(h, w, t)
    assert torch.isnan(loss) and torch.isnan(ref_loss)
    assert not dh.any() and not dw.any() and not ref_dh.any() and not ref_dw.any()


@needs_triton
def test_a_second_backward_sees_the_saved_gradients_unscaled():
    h, w, t = problem((12,), 60, 8, 1)
    h.requires_grad_()
    loss = fused_linear_cross_entropy(h, w, t, chunk_size=5)
    (loss * 2.0).backward(retain_graph=True)
    first = h.grad.clone()
    h.grad = None
    (loss * 2.0).backward()
    assert torch.equal(h.grad, first)  # the same product of the same values: bound 0


# -- arguments ---------------------------------------------------------------------------------------

def _bad_cases():
    h, w = torch.randn(4, 8, device=DEVICE), torch.randn(10, 8, device=DEVICE)
    t = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    return {
        "hidden not a tensor": ((h.tolist(), w, t), {}, "hidden"),
        "hidden 0-d": ((torch.tensor(1.0), w, t.new_zeros(())), {}, "hidden"),
        "weight 1-D": ((h, w[0], t), {}, "weight"),
        "weight's d": ((h, torch.randn(10, 7), t), {}, "weight"),
        "targets' shape": ((h, w, t[:3]), {}, "targets"),
        "hidden fp64": ((h.double(), w.double(), t), {}, "hidden"),
        "weight's dtype": ((h, w.half(), t), {}, "weight"),
        "targets int32": ((h, w, t.int()), {}, "targets"),
        "weight's device": ((h, w.to("meta"), t), {}, "weight"),
        "targets' device": ((h, w, t.to("meta")), {}, "targets"),
        "target out of range": ((h, w, torch.tensor([0, 1, 10, -100], device=DEVICE)), {}, "targets"),
        "negative target": ((h, w, torch.tensor([0, -1, 2, 3], device=DEVICE)), {}, "targets"),
        "chunk_size 0": ((h, w, t), {"chunk_size": 0}, "chunk_size"),
        "chunk_size True": ((h, w, t), {"chunk_size": True}, "chunk_size"),
        "chunk_size 2.5": ((h, w, t), {"chunk_size": 2.5}, "chunk_size"),
        "ignore_index str": ((h, w, t), {"ignore_index": "x"}, "ignore_index"),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("case", BAD.values(), ids=list(BAD))
def test_bad_arguments_are_refused_before_any_work(case, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(fc, "_chunked", no_work)
    args, kwargs, name = case
    with pytest.raises(ValueError, match=f"^{name}"):
        fused_linear_cross_entropy(*args, **kwargs)
    with pytest.raises(ValueError, match=f"^{name}"):  # the Function checks too, for direct callers
        FusedLinearCrossEntropy.apply(*args, kwargs.get("chunk_size", 4096), kwargs.get("ignore_index", IGNORE))


@pytest.mark.skipif(not interpreting(), reason="the interpreter's refusal of bf16")
def test_bf16_is_refused_under_the_interpreter():
    h, w, t = torch.randn(4, 8), torch.randn(10, 8), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="^hidden's dtype torch.bfloat16"):
        fused_linear_cross_entropy(h.bfloat16(), w.bfloat16(), t)


def test_cpu_tensors_are_refused_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="^hidden must be a CUDA tensor"):
        fused_linear_cross_entropy(torch.randn(4, 8), torch.randn(10, 8), torch.zeros(4, dtype=torch.int64))


def test_importing_the_module_never_imports_triton(monkeypatch):
    from cs336_systems.attention.triton_loader import TritonNotInstalled

    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    for name in (fc.__name__, fc.KERNELS):
        monkeypatch.delitem(sys.modules, name, raising=False)
    fresh = importlib.import_module(fc.__name__)
    if not interpreting() and not ON_GPU:
        return  # the CPU refusal comes before the kernel is loaded
    h, w, t = torch.randn(4, 8, device=DEVICE), torch.randn(10, 8, device=DEVICE), torch.zeros(4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(TritonNotInstalled, match="pip install triton"):
        fresh.fused_linear_cross_entropy(h, w, t)


# -- the benchmark's arguments -------------------------------------------------------------------------

# -- on a GPU: bf16, the default tile, memory ------------------------------------------------------------

@pytest.fixture
def full_precision_gemms(monkeypatch):
    """The bounds assume every GEMM accumulates in fp32: no TF32 for fp32 inputs, no reduced-precision
    (bf16) partial sums for bf16 inputs (which torch allows cuBLAS by default)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)


@needs_gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, F32], ids=str)
def test_gpu_matches_float64_reference(dtype, full_precision_gemms):
    # V = 5000: two tiles of the default 4096, the second ragged; N = 1000 in chunks of 256
    h, w, t = problem((2, 500), 5000, 128, n_ignored=100, dtype=dtype)
    check(h, w, t, chunk_size=256, block_v=fc.BLOCK_V, grad_output=2.0, what=str(dtype))


@needs_gpu
@needs_triton
def test_gpu_large_logits_bf16(full_precision_gemms):
    h, w, t = problem((600,), 3000, 64, n_ignored=10, scale=30.0, dtype=torch.bfloat16)
    assert torch.isfinite(check(h, w, t, chunk_size=128, block_v=fc.BLOCK_V, what="large logits"))


@needs_gpu
@needs_triton
def test_gpu_peak_memory_stays_far_below_the_full_logits():
    N, V, d, chunk = 16384, 32768, 256, 2048
    h, w, t = problem((N,), V, d, dtype=torch.bfloat16)
    h.requires_grad_(), w.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fused_linear_cross_entropy(h, w, t, chunk_size=chunk).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # what ours holds at most: the (chunk, V) buffer; dW in fp32, cast to bf16, a bf16 chunk partial
    # and the scaled grad; dh and the scaled grad; cuBLAS workspaces and small tensors (64 MiB)
    allowed = chunk * V * 2 + V * d * (4 + 2 + 2 + 2) + 2 * N * d * 2 + (64 << 20)
    assert extra <= allowed < N * V * 2, (extra, allowed, N * V * 2)
