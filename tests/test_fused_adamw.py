"""FusedAdamW (our Triton AdamW) against a float64 AdamW written out here, against torch.optim.AdamW,
through a state-dict round trip, and its refusals; the micro-benchmark's argument errors.

Tolerances are elementwise rounding bounds (tests/tolerances.py: adamw_rounding_depth derives the
counts). An element's error is relative to the magnitude of the terms its value is built from:
m_T = sum over steps of products of betas and gradients, so its bound is gamma times M_T, the same
recursion run on |g|; p_T = p_0 decay^T - sum_t decay^(T-t) step_size_t m_t / denom_t, bounded by
gamma times P_T = |p_0| decay^T + sum_t decay^(T-t) step_size_t M_t / denom_t. v_T and every
denominator are sums of non-negative terms, so their errors are relative to themselves.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch

from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.training_step import adamw_bench
from cs336_systems.training_step import fused_adamw as fused_adamw_module
from cs336_systems.training_step.fused_adamw import FusedAdamW
from tests.tolerances import adamw_rounding_depth, assert_within, compound_gamma, gamma
from tests.triton_mode import DEVICE, ON_GPU, needs_gpu, needs_triton, where_marks

pytestmark = where_marks

F32, F64 = torch.float32, torch.float64


# -- the float64 reference: the formulas, one step after another ----------------------------------

def reference_adamw(p0: torch.Tensor, grads: list[torch.Tensor | None], lr: float, betas: tuple[float, float],
                    eps: float, weight_decay: float) -> dict[str, torch.Tensor | int]:
    """AdamW in float64 on one parameter: p0 (any shape) and its gradient per step (None: the
    parameter sat that step out, its count does not advance). Returns p, m, v, the step count, and the
    magnitudes the bounds use: M (m's recursion on |g|), L (the same for m written as a lerp), and
    P and P_lerp (p's recursion on |p0| and those)."""
    b1, b2 = betas
    p = p0.to(F64)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    M, L, P, P_lerp = torch.zeros_like(p), torch.zeros_like(p), p.abs(), p.abs()
    t = 0
    for g in grads:
        if g is None:
            continue
        t += 1
        g = g.to(F64)
        decay = 1 - lr * weight_decay
        p = p * decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        denom = v_hat.sqrt() + eps  # = sqrt(v) / sqrt(1 - b2^t) + eps
        p = p - lr * m_hat / denom
        M = b1 * M + (1 - b1) * g.abs()
        L = (2 - b1) * L + (1 - b1) * g.abs()  # m + w (g - m): terms m, w g, w m; w = 1 - b1
        P = abs(decay) * P + lr / (1 - b1**t) * M / denom
        P_lerp = abs(decay) * P_lerp + lr / (1 - b1**t) * L / denom
    return {"p": p, "m": m, "v": v, "step": t, "M": M, "L": L, "P": P, "P_lerp": P_lerp}


def float32_beta_error(beta: float, steps: int) -> float:
    """The relative error of 1 - beta^t (t <= steps; t = 1 is 1 - beta itself) computed in float32
    from beta rounded to float32, as torch's fused CUDA AdamW does (measured: its 1 - 0.999 is off by
    1.3e-5). beta^t carries t roundings of beta and at most 4 ulp (8 u) of powf, gamma_{t+8}; the
    subtraction from 1 multiplies that by beta^t / (1 - beta^t) (1000 for 0.999) and rounds once
    (u). Ours takes these from the host in float64, one rounding each, as adamw_rounding_depth counts."""
    u = gamma(1, F32)
    return max(gamma(t + 8, F32) * beta**t / (1 - beta**t) + u for t in range(1, steps + 1))


def bounds(ref: dict, storage: torch.dtype, form: str = "ours", betas: tuple[float, float] | None = None,
           ) -> dict[str, torch.Tensor]:
    """Elementwise bounds on |run - float64 reference| for a run in float32 arithmetic whose state
    is stored in `storage`: the run's own error (compound_gamma over its float32 and storage
    roundings) plus the float64 reference's (gamma_N(float64), the same counts). `betas`: the run
    computes 1 - beta and the bias corrections from float32 betas (torch's fused CUDA AdamW); m's
    terms carry one (1 - beta1), v's one (1 - beta2), p's update both and both bias corrections."""
    n = adamw_rounding_depth(ref["step"])
    # float32 state: the store rounds nothing the arithmetic has not already rounded
    p_counts, m_counts = {F32: n["param"]}, {F32: n["exp_avg"]}
    if storage != F32:
        p_counts[storage], m_counts[storage] = n["param_stores"], n["moment_stores"]
    k1, k2 = (float32_beta_error(b, ref["step"]) for b in betas) if betas else (0.0, 0.0)
    p_gamma = (1 + compound_gamma(p_counts)) * (1 + 2 * (k1 + k2)) - 1 + gamma(n["param"], F64)
    m_gamma = (1 + compound_gamma(m_counts)) * (1 + k1) - 1 + gamma(n["exp_avg"], F64)
    v_gamma = (1 + compound_gamma(m_counts)) * (1 + k2) - 1 + gamma(n["exp_avg_sq"], F64)
    M, P = (ref["L"], ref["P_lerp"]) if form == "lerp" else (ref["M"], ref["P"])
    return {"p": p_gamma * P, "m": m_gamma * M, "v": v_gamma * ref["v"]}


# -- a run: two groups, odd sizes, a frozen parameter, one that skips a step ------------------------

SHAPES = [(3000,), (7, 13), (1,), (1025,)]  # none a multiple of the kernel's 1024-element block
GROUPS = [dict(lr=1e-2, weight_decay=0.1, eps=1e-8, betas=(0.9, 0.999)),
          # gradients ~1e-2 and eps 1e-3: eps is a tenth of sqrt(v_hat), so where it is added shows
          dict(lr=3e-2, weight_decay=0.0, eps=1e-3, betas=(0.8, 0.99))]
STEPS = 4


def problem(device: str, dtype: torch.dtype, seed: int = 0, shapes=SHAPES, steps: int = STEPS):
    """Initial parameters per group (the last one of group 0 never has a gradient) and per step the
    gradients (group 1's first parameter sits step 2 out)."""
    gen = torch.Generator().manual_seed(seed)
    params = [[torch.randn(s, generator=gen) for s in shapes], [torch.randn(s, generator=gen) for s in shapes[:2]]]
    params[0].append(torch.randn(5, generator=gen))  # frozen
    scale = [1.0, 1e-2]
    grads = []
    for step in range(steps):
        grads.append([[None if (gi == 0 and pi == len(group) - 1) or (gi == 1 and pi == 0 and step == 1)
                       else scale[gi] * torch.randn(p.shape, generator=gen) for pi, p in enumerate(group)]
                      for gi, group in enumerate(params)])
    cast = lambda t: None if t is None else t.to(device, dtype)  # noqa: E731
    return ([[cast(p) for p in g] for g in params],
            [[[cast(x) for x in g] for g in step] for step in grads])


def run(opt_class, params, grads, steps=None, **kw):
    """Clones of `params`, stepped by `opt_class` through `grads`; returns (params, optimizer)."""
    ps = [[p.clone() for p in g] for g in params]
    opt = opt_class([{"params": g, **cfg} for g, cfg in zip(ps, GROUPS)], **kw)
    for step in grads[:steps]:
        for group, gs in zip(ps, step):
            for p, g in zip(group, gs):
                p.grad = None if g is None else g.clone()
        opt.step()
    return ps, opt


def check_against_reference(params, grads, ps, opt, storage, what):
    for gi, (group, cfg) in enumerate(zip(params, GROUPS)):
        for pi, p0 in enumerate(group):
            ref = reference_adamw(p0, [step[gi][pi] for step in grads], **cfg)
            p, state = ps[gi][pi], opt.state[ps[gi][pi]]
            name = f"{what} group {gi} param {pi} {tuple(p0.shape)}"
            if ref["step"] == 0:
                assert torch.equal(p, p0) and not state, f"{name}: no gradient, yet changed"
                continue
            assert state["step"] == ref["step"], name
            assert state["exp_avg"].dtype == p.dtype and state["exp_avg_sq"].dtype == p.dtype
            b = bounds(ref, storage)
            assert_within(state["exp_avg"], ref["m"], b["m"], f"{name} exp_avg")
            assert_within(state["exp_avg_sq"], ref["v"], b["v"], f"{name} exp_avg_sq")
            assert_within(p, ref["p"], b["p"], f"{name} param")


@needs_triton
def test_matches_the_float64_reference():
    """float32 (interpreter on CPU, compiled on a GPU): two groups, odd sizes, a frozen parameter."""
    params, grads = problem(DEVICE, F32)
    ps, opt = run(FusedAdamW, params, grads)
    check_against_reference(params, grads, ps, opt, F32, "fp32")


@needs_triton
@pytest.mark.parametrize("variant", ["default", "foreach", "fused"])
def test_matches_torch_adamw(variant):
    """torch.optim.AdamW on the same float32 inputs. Each run is within its own bound of the exact
    one: ours with magnitudes M, P; torch's with the lerp form's L, P_lerp (its single-tensor and
    foreach paths write m <- m + (1 - b1)(g - m), valid as written for beta1 > 1/2); the float32
    counts of adamw_rounding_depth cover each of its three forms (the fused one rounds fewer times,
    but on CUDA from float32 betas: float32_beta_error)."""
    kw = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[variant]
    params, grads = problem(DEVICE, F32, seed=1)
    ours, opt = run(FusedAdamW, params, grads)
    theirs, topt = run(torch.optim.AdamW, params, grads, **kw)
    for gi, (group, cfg) in enumerate(zip(params, GROUPS)):
        for pi, p0 in enumerate(group):
            ref = reference_adamw(p0, [step[gi][pi] for step in grads], **cfg)
            if ref["step"] == 0:
                assert torch.equal(ours[gi][pi], theirs[gi][pi])
                continue
            mine = bounds(ref, F32)
            torch_s = bounds(ref, F32, form="lerp", betas=cfg["betas"] if variant == "fused" else None)
            s, ts = opt.state[ours[gi][pi]], topt.state[theirs[gi][pi]]
            name = f"vs torch {variant} group {gi} param {pi}"
            assert s["step"] == int(ts["step"]), name
            assert_within(ours[gi][pi], theirs[gi][pi], mine["p"] + torch_s["p"], f"{name} param")
            assert_within(s["exp_avg"], ts["exp_avg"], mine["m"] + torch_s["m"], f"{name} exp_avg")
            assert_within(s["exp_avg_sq"], ts["exp_avg_sq"], mine["v"] + torch_s["v"], f"{name} exp_avg_sq")


@needs_triton
def test_state_dict_round_trip_continues_exactly():
    """Two steps, a state dict, a fresh optimizer on copies of the parameters, two more steps: the
    same values as four uninterrupted steps, bit for bit (the same operations on the same values)."""
    params, grads = problem(DEVICE, F32, seed=2)
    straight, _ = run(FusedAdamW, params, grads)
    first, opt = run(FusedAdamW, params, grads, steps=2)
    saved = copy.deepcopy(opt.state_dict())
    resumed = [[p.detach().clone() for p in g] for g in first]
    opt2 = FusedAdamW([{"params": g, **cfg} for g, cfg in zip(resumed, GROUPS)])
    opt2.load_state_dict(saved)
    for step in grads[2:]:
        for group, gs in zip(resumed, step):
            for p, g in zip(group, gs):
                p.grad = None if g is None else g.clone()
        opt2.step()
    for a, b in zip(sum(straight, []), sum(resumed, [])):
        assert torch.equal(a, b)
    assert [g["lr"] for g in opt2.param_groups] == [c["lr"] for c in GROUPS]


@needs_triton
def test_loads_a_torch_adamw_state_dict():
    """torch keeps `step` as a tensor; after loading, ours holds an int and carries on from it."""
    p = torch.randn(300, device=DEVICE)
    theirs = torch.optim.AdamW([p.clone()])
    theirs.param_groups[0]["params"][0].grad = torch.randn(300, device=DEVICE)
    theirs.step()
    ours = FusedAdamW([p])
    ours.load_state_dict(theirs.state_dict())
    state = ours.state[p]
    assert state["step"] == 1 and isinstance(state["step"], int)
    assert torch.equal(state["exp_avg"], theirs.state[theirs.param_groups[0]["params"][0]]["exp_avg"])
    p.grad = torch.randn(300, device=DEVICE)
    ours.step()
    assert ours.state[p]["step"] == 2


# -- on a GPU: bf16 and fp32 at sizes the interpreter would take minutes on -------------------------

GPU_SHAPES = [((1 << 20) + 7,), (333, 4097), (1,)]


@needs_gpu
@needs_triton
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_matches_the_float64_reference(dtype):
    """bf16 parameters, gradients and moments, float32 arithmetic: each step rounds p, m and v to
    bf16 once at the store (adamw_rounding_depth's storage counts), on top of the float32 roundings."""
    params, grads = problem("cuda", dtype, seed=3, shapes=GPU_SHAPES, steps=5)
    ps, opt = run(FusedAdamW, params, grads)
    check_against_reference(params, grads, ps, opt, dtype, str(dtype))


@needs_gpu
@needs_triton
def test_gpu_bf16_matches_torch_fused_adamw():
    """torch.optim.AdamW(fused=True) on bf16 also keeps bf16 moments and computes in float32, rounding
    p, m, v to bf16 once per step: each run is within the bf16 bound of the exact run (torch's with
    its float32 betas' error on top), so they are within the sum of the two of each other."""
    params, grads = problem("cuda", torch.bfloat16, seed=4, shapes=GPU_SHAPES, steps=5)
    ours, opt = run(FusedAdamW, params, grads)
    theirs, topt = run(torch.optim.AdamW, params, grads, fused=True)
    for gi, (group, cfg) in enumerate(zip(params, GROUPS)):
        for pi, p0 in enumerate(group):
            ref = reference_adamw(p0, [step[gi][pi] for step in grads], **cfg)
            if ref["step"] == 0:
                continue
            b, tb = bounds(ref, torch.bfloat16), bounds(ref, torch.bfloat16, betas=cfg["betas"])
            s, ts = opt.state[ours[gi][pi]], topt.state[theirs[gi][pi]]
            assert ts["exp_avg"].dtype == torch.bfloat16
            name = f"vs torch fused bf16 group {gi} param {pi}"
            assert_within(ours[gi][pi], theirs[gi][pi], b["p"] + tb["p"], f"{name} param")
            assert_within(s["exp_avg"], ts["exp_avg"], b["m"] + tb["m"], f"{name} exp_avg")
            assert_within(s["exp_avg_sq"], ts["exp_avg_sq"], b["v"] + tb["v"], f"{name} exp_avg_sq")


# -- refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, name", [
    ({"lr": -1e-3}, "lr"), ({"lr": float("nan")}, "lr"), ({"lr": "0.1"}, "lr"),
    ({"betas": (1.0, 0.999)}, r"betas\[0\]"), ({"betas": (0.9, -0.1)}, r"betas\[1\]"), ({"betas": (0.9,)}, "betas"),
    ({"eps": -1e-8}, "eps"), ({"eps": float("inf")}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"),
])
def test_bad_hyperparameters_name_the_argument(kw, name):
    p = torch.zeros(3)
    with pytest.raises(ValueError, match=rf"^{name} must"):
        FusedAdamW([p], **kw)
    with pytest.raises(ValueError, match=rf"^{name} must"):  # in a param group too
        FusedAdamW([{"params": [p], **kw}])


def test_bad_parameters_are_refused(monkeypatch):
    with pytest.raises(ValueError, match=r"params\[0\].*must be contiguous"):
        FusedAdamW([torch.zeros(4, 6, device=DEVICE).t()])
    with pytest.raises(ValueError, match=r"params\[0\].*sparse"):
        FusedAdamW([torch.zeros(4, 6, device=DEVICE).to_sparse()])
    with pytest.raises(ValueError, match=r"params\[1\].*dtype"):
        FusedAdamW([torch.zeros(3, device=DEVICE), torch.zeros(3, dtype=F64, device=DEVICE)])
    if not ON_GPU:
        with pytest.raises(ValueError, match=r"interpreter has no bfloat16"):
            FusedAdamW([torch.zeros(3, dtype=torch.bfloat16)])
    monkeypatch.setattr(fused_adamw_module, "interpreting", lambda: False)
    with pytest.raises(ValueError, match=r"params\[0\].*CPU tensor runs it only under the Triton interpreter"):
        FusedAdamW([torch.zeros(3)])


@needs_triton
def test_bad_gradients_are_refused():
    p = torch.zeros(4, 6, device=DEVICE)
    opt = FusedAdamW([p])
    p.grad = torch.zeros(6, 4, device=DEVICE).t()
    with pytest.raises(ValueError, match=r"p\.grad.*must be contiguous"):
        opt.step()
    p.grad = torch.zeros(4, 6, device=DEVICE).to_sparse()
    with pytest.raises(ValueError, match=r"p\.grad.*sparse"):
        opt.step()


def test_importing_the_optimizer_does_not_import_triton():
    code = ("import sys; sys.modules['triton'] = None; "
            "import cs336_systems.training_step.fused_adamw, cs336_systems.training_step.adamw_bench")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


# -- the micro-benchmark ----------------------------------------------------------------------------

@pytest.mark.parametrize("size", ["tiny", "8B"])
def test_bench_shapes_are_the_models(size):
    model = TransformerLM.from_config(get_config(size), device="meta")
    assert adamw_bench.parameter_shapes(get_config(size)) == [tuple(p.shape) for p in model.parameters()]
    assert adamw_bench.sharded((151_936, 4096), 2) == (75_968, 4096)
    assert adamw_bench.sharded((4097,), 2) == (2049,)


def test_bench_counts_the_models_elements():
    cfg = adamw_bench.get_config("8B")
    shapes = adamw_bench.parameter_shapes(cfg)
    assert sum(math.prod(s) for s in shapes) == count_parameters(cfg)["total"]
    assert len(shapes) == 3 + 9 * cfg.num_layers  # 309 tensors: one launch each per step
