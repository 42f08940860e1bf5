"""The parallelism closed forms against brute force: FLOPs counted on the actual matmuls, bytes moved
by the simulated rings over the actual gradients and activations, the inequalities solved with
sympy, the 2-D optimum by search, and the handout's TP backward equations evaluated in float64."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.model.layers import SwiGLU
from cs336_systems.parallelism import answers, costs, ring
from cs336_systems.parallelism.hardware import H200_NVLINK, Device
from cs336_systems.parallelism.tp_ffn import shard_swiglu, swiglu_partial
from cs336_systems.sharding.accounting import communication_bytes_per_rank, saved_activation_bytes
from tests.tolerances import assert_within, sum_bound

B, D, FF = 8, 12, 20  # tokens, d_model, d_ff of a small FFN


def _ffn(dtype=torch.float64) -> tuple[SwiGLU, torch.Tensor]:
    torch.manual_seed(0)
    return SwiGLU(D, FF, dtype=dtype), torch.randn(B, D, dtype=dtype)


def _flops(fn) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of fn() -> output, counted by FlopCounterMode."""
    with FlopCounterMode(display=False) as fwd:
        out = fn()
    with FlopCounterMode(display=False) as bwd:
        out.backward(torch.ones_like(out))
    return fwd.get_total_flops(), bwd.get_total_flops()


# -- FLOPs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("N", [1, 2, 4])
def test_flops_per_device_dp_and_tp(N):
    ffn, x = _ffn()
    for shard in x.tensor_split(N):  # DP / FSDP: each device runs the whole FFN on B/N tokens
        assert _flops(lambda: ffn(shard.clone().requires_grad_())) == (
            costs.ffn_flops(B, D, FF, N, "forward"), costs.ffn_flops(B, D, FF, N, "backward"))
    for r in range(N):  # TP: every token, F/N of the width
        w = {k: v.requires_grad_() for k, v in shard_swiglu(ffn, r, N).items()}
        assert _flops(lambda: swiglu_partial(x.clone().requires_grad_(), w["w1"], w["w3"], w["w2"])) == (
            costs.ffn_flops(B, D, FF, N, "forward"), costs.ffn_flops(B, D, FF, N, "backward"))


# -- communication: the bytes the simulated rings move -----------------------------------------

def _grads_of_shard(ffn: SwiGLU, x: torch.Tensor) -> torch.Tensor:
    ffn.zero_grad()
    ffn(x).sum().backward()
    return torch.cat([p.grad.flatten() for p in ffn.parameters()]).half()  # fp16 on the wire


@pytest.mark.parametrize("N", [2, 3, 4])
def test_dp_and_fsdp_comm_time_from_simulated_rings(N):
    W = 1e9
    ffn, x = _ffn()
    grads = [_grads_of_shard(ffn, shard) for shard in x.tensor_split(N)]
    dp = ring.all_reduce(grads)
    assert dp.time(W) == pytest.approx(costs.dp_comm_time(D, FF, N, W), rel=1e-12)
    # the ring adds N fp16 values per element (N - 1 fp16 roundings, any order): gamma_{N-1}(fp16)
    # times sum |g_i| (tests/tolerances.py); a fixed rtol would fail where the shards' gradients cancel
    stacked = torch.stack(grads).double()
    assert_within(dp.result[0], stacked.sum(0), sum_bound(N - 1, torch.float16, stacked.abs().sum(0)), "ring sum")
    # FSDP: gather each device's 1/N of the fp16 weights (forward, and again backward), then
    # reduce-scatter the gradients
    weights = torch.cat([p.detach().flatten() for p in ffn.parameters()]).half()
    gather = ring.all_gather(list(weights.tensor_split(N)))
    assert torch.equal(gather.result[0], weights)
    scatter = ring.reduce_scatter(grads)
    assert gather.time(W) == pytest.approx(costs.fsdp_comm_time(D, FF, N, W, "forward"), rel=1e-12)
    assert gather.then(scatter).time(W) == pytest.approx(costs.fsdp_comm_time(D, FF, N, W, "backward"),
                                                         rel=1e-12)


@pytest.mark.parametrize("N", [2, 4])
def test_tp_comm_time_and_partial_sums(N):
    W = 1e9
    ffn, x = _ffn()
    partials = [swiglu_partial(x, **shard_swiglu(ffn, r, N)).detach() for r in range(N)]
    trace = ring.all_reduce([p.half() for p in partials])
    assert trace.time(W) == pytest.approx(costs.tp_comm_time(B, D, N, W), rel=1e-12)
    # float64 partial sums add up to the unsharded output (reordered sums over d_ff = 20 terms)
    torch.testing.assert_close(torch.stack(partials).sum(0), ffn(x).detach(), rtol=1e-12, atol=1e-12)


# -- the handout's TP backward, evaluated ---------------------------------------------------------

def test_tp_backward_equations_give_autograds_gradients():
    """tp_calcs (a), each equation of answers.TP_BACKWARD computed by hand on 2 shards, against
    autograd on the unsharded FFN (the handout's W1, W2, W3 = our w1^T, w3^T, w2^T)."""
    N = 2
    ffn, x = _ffn()
    x = x.clone().requires_grad_()
    torch.manual_seed(1)
    dy = torch.randn(B, D, dtype=torch.float64)
    ffn(x).backward(dy)
    f = F.silu

    def f_prime(t):
        s = torch.sigmoid(t)
        return s * (1 + t * (1 - s))

    dx_partials = []
    for r in range(N):
        w = shard_swiglu(ffn, r, N)
        W1, W2, W3 = w["w1"].T, w["w3"].T, w["w2"].T  # (D, F/N), (D, F/N), (F/N, D)
        x1, x2 = x.detach() @ W1, x.detach() @ W2
        z = f(x1) * x2
        dz = dy @ W3.T
        dx2 = dz * f(x1)
        dx1 = dz * f_prime(x1) * x2
        tol = dict(rtol=1e-12, atol=1e-12)  # float64, sums of <= 20 terms reordered
        torch.testing.assert_close((z.T @ dy).T, ffn.w2.weight.grad.tensor_split(N, 1)[r], **tol)
        torch.testing.assert_close((x.detach().T @ dx2).T, ffn.w3.weight.grad.tensor_split(N, 0)[r], **tol)
        torch.testing.assert_close((x.detach().T @ dx1).T, ffn.w1.weight.grad.tensor_split(N, 0)[r], **tol)
        dx_partials.append(dx1 @ W1.T + dx2 @ W2.T)
    torch.testing.assert_close(sum(dx_partials), x.grad, rtol=1e-12, atol=1e-12)
    assert len(answers.TP_BACKWARD) == 7


# -- memory per device ----------------------------------------------------------------------------

@pytest.mark.parametrize("strategy, N_fsdp, N_tp", [("dp", 2, 1), ("fsdp", 4, 1), ("tp", 1, 2),
                                                    ("fsdp_tp", 2, 2)])
def test_activation_bytes_against_saved_tensors(strategy, N_fsdp, N_tp):
    """What autograd saves running one device's share equals the formula's x, x1, x2, z plus
    silu(x1), which autograd keeps too (the mul needs it; the handout recomputes f(x1))."""
    ffn, x = _ffn(torch.float32)
    ffn.half()
    rows = x.tensor_split(N_fsdp)[0].half() if strategy != "tp" else x.half()
    w = shard_swiglu(ffn, 0, N_tp)
    with saved_activation_bytes([*w.values(), rows]) as saved:
        swiglu_partial(rows.requires_grad_(), *(t.requires_grad_() for t in (w["w1"], w["w3"], w["w2"])))
    mem = costs.ffn_memory_per_device(B, D, FF, strategy, N_fsdp, N_tp)
    silu_out = 2 * (B / (N_fsdp if strategy != "tp" else 1)) * FF / N_tp
    x_bytes = 2 * rows.numel()  # x itself is saved, but it is the input: excluded from `saved`
    assert saved["bytes"] + x_bytes == mem["activations"] + silu_out
    assert mem["state"] == 3 * D * FF * 16 / {"dp": 1, "fsdp": N_fsdp, "tp": N_tp, "fsdp_tp": N_fsdp * N_tp}[strategy]


@pytest.mark.parametrize("N", [2, 8])
def test_comm_agrees_with_the_sharding_chapters_accounting(N):
    """The DDP/ZeRO-3 bytes per rank of sharding.accounting, for the FFN's 3DF fp16 parameters,
    are what these times carry at W = 1 byte/s."""
    n = 3 * D * FF
    assert costs.dp_comm_time(D, FF, N, 1) == pytest.approx(
        communication_bytes_per_rank("ddp", n, N, grad_bytes=2, param_bytes=2))
    fsdp_step = costs.fsdp_comm_time(D, FF, N, 1, "forward") + costs.fsdp_comm_time(D, FF, N, 1, "backward")
    assert fsdp_step == pytest.approx(communication_bytes_per_rank("zero3", n, N, grad_bytes=2, param_bytes=2))


# -- the inequalities, symbolically ----------------------------------------------------------------

def test_max_devices_solve_compute_equals_comm():
    Bs, Ds, Fs, N, C, W = sympy.symbols("B D F N C W", positive=True)

    def root(compute, comm):
        (n,) = sympy.solve(sympy.Eq(compute, comm), N)
        return n

    dp = root(costs.ffn_flops(Bs, Ds, Fs, N, "backward") / C, costs.dp_comm_time(Ds, Fs, N, W))
    assert sympy.simplify(dp - costs.dp_max_devices(Bs, C, W)) == 0
    for p in ("forward", "backward"):
        fsdp = root(costs.ffn_flops(Bs, Ds, Fs, N, p) / C, costs.fsdp_comm_time(Ds, Fs, N, W, p))
        assert sympy.simplify(fsdp - costs.dp_max_devices(Bs, C, W)) == 0
        tp = root(costs.ffn_flops(Bs, Ds, Fs, N, p) / C, costs.tp_comm_time(Bs, Ds, N, W))
        assert sympy.simplify(tp - costs.tp_max_devices(Fs, C, W, p)) == 0


def test_2d_no_overlap_optimum_by_lagrange():
    Bs, Fs, C, W, Nf, Nt, Ds = sympy.symbols("B F C W N_f N_t D", positive=True)
    t_fsdp, t_tp = costs.fsdp_tp_comm_times(Bs, Ds, Fs, Nf, Nt, W)
    compute = costs.ffn_flops(Bs, Ds, Fs, Nf * Nt, "forward") / C
    # on the boundary compute = t_fsdp + t_tp, solve for N_t and maximise N_f N_t over N_f
    (nt,) = sympy.solve(sympy.Eq(compute, t_fsdp + t_tp), Nt)
    product = sympy.simplify(Nf * nt)
    (nf_star,) = [s for s in sympy.solve(sympy.diff(product, Nf), Nf)]
    best = sympy.simplify(product.subs(Nf, nf_star))
    assert sympy.simplify(best - costs.fsdp_tp_max_devices(Bs, Fs, C, W, overlap=False)) == 0
    assert sympy.simplify(nf_star - costs.fsdp_tp_split(Bs, Fs, C, W, overlap=False)[0]) == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_2d_bound_by_search_over_integer_splits(overlap):
    """A small setting where the bound is tens of devices: no integer (N_FSDP, N_TP) beyond the
    bound stays compute-bound, and the best feasible one comes within rounding of it."""
    Bv, Dv, Fv, C, W = 600.0, 64.0, 300.0, 1000.0, 50.0
    bound = costs.fsdp_tp_max_devices(Bv, Fv, C, W, overlap)
    best = 0
    for nf in range(1, 200):
        for nt in range(1, 200):
            t_f, t_t = costs.fsdp_tp_comm_times(Bv, Dv, Fv, nf, nt, W)
            comm = max(t_f, t_t) if overlap else t_f + t_t
            if comm <= costs.ffn_flops(Bv, Dv, Fv, nf * nt, "forward") / C * (1 + 1e-12):
                best = max(best, nf * nt)
    assert best <= bound + 1e-9
    nf, nt = costs.fsdp_tp_split(Bv, Fv, C, W, overlap)
    assert best >= math.floor(nf) * math.floor(nt)


# -- the setting and the answers ---------------------------------------------------------------------

def test_8b_config_has_8_13b_parameters():
    cfg = get_config("8B")
    counts = count_parameters(cfg)
    assert round(counts["total"] / 1e9, 2) == 8.13 and round(counts["non_embedding"] / 1e9, 2) == 7.50
    model = TransformerLM.from_config(cfg.with_context(16), device="meta")
    assert sum(p.numel() for p in model.parameters()) == counts["total"]


def test_leaderboard_answers_are_consistent():
    s = answers.leaderboard_setting()
    assert (s.B, s.D, s.F) == (65_536, 4_096, 11_008)
    table = answers.communication_bound_devices(s)
    n = dict(zip(zip(table["strategy"], table["pass"]), table["max_devices"]))
    assert n["DP", "backward"] == pytest.approx(1 + s.B * s.W / s.C)
    assert n["TP", "backward"] == pytest.approx(2 * n["TP", "forward"] - 1)
    overlapped, serial = n["FSDP+TP, overlapped", "forward"], n["FSDP+TP, not overlapped", "forward"]
    assert overlapped == pytest.approx(n["DP", "backward"] * n["TP", "forward"])
    assert serial < overlapped
    parts = answers.fsdp_tp_calcs(s, 8, 4)
    assert parts["c"]["value"]["N"] == pytest.approx(overlapped)
    assert answers.alternate_ring_all_reduce(1e6, 8, 1e9)["slowdown"]["value"] == pytest.approx(4)
    assert answers.data_parallel_calcs(s, 8)["c"]["value"] == pytest.approx(n["DP", "backward"])
    assert set(answers.tp_calcs(s, 4)) == {"a", "b", "c", "d"}
    assert set(answers.fsdp_calcs(s, 4)) == {"a", "b", "c"}
    curves = answers.time_curves(s, Ns=(1, 2, 64))
    assert set(curves["strategy"]) == {"DP", "FSDP", "TP", "FSDP+TP"}
    tp64 = curves[(curves.N == 64) & (curves.strategy == "TP")].iloc[0]
    assert tp64.comm_bound  # 64 > the TP forward bound


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="N"):
        costs.dp_comm_time(D, FF, 0, 1e9)
    with pytest.raises(ValueError, match="op"):
        costs.ring_collective_time(1, 2, 1, "broadcast")
    with pytest.raises(ValueError, match="strategy"):
        costs.ffn_memory_per_device(B, D, FF, "pp")
    with pytest.raises(ValueError, match="egress_bandwidth"):
        Device("x", flops=1.0, egress_bandwidth=0.0, memory_bytes=1.0, source="")
    assert H200_NVLINK.alpha == pytest.approx(989e12 / 450e9)
