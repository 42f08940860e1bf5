"""Memory and communication accounting against values worked out by hand (written here as
arithmetic on the problem's numbers, never by calling the code under test twice)."""

from __future__ import annotations

import math

import pytest
import torch

from cs336_systems.model import TransformerLM, count_parameters, cross_entropy, get_config
from cs336_systems.sharding import accounting as acc
from cs336_systems.sharding import communication_accounting as ca

# -- communication_accounting: the XXL model ------------------------------------------------------

P_XXL = 219_848_638_464  # 2 * 16384 * 53248 * 126, multiplied out by hand


def test_xxl_parameter_count_and_fp32_state():
    assert ca.n_params(ca.XXLConfig()) == P_XXL
    assert ca.state_bytes(ca.XXLConfig()) == P_XXL * 16 == 3_517_578_215_424  # 4 + 4 + 8 bytes


def test_xxl_activations_per_token():
    # each block saves the inputs of its two linears: 16384 + 53248 = 69632 values, bf16
    assert ca.activation_bytes_per_token(ca.XXLConfig()) == 126 * 69_632 * 2 == 17_547_264


def test_part_a_h100_count():
    # 3.5176e12 B / 80e9 B = 43.97 -> 44 GPUs' worth of memory
    assert ca.devices_to_hold(ca.state_bytes(ca.XXLConfig()), ca.H100_80GB) == 44


@pytest.mark.parametrize("tokens", [0, 1024, 4096])
def test_part_b_n_fsdp(tokens):
    # S/N + A/2 + A/(2N) <= M  <=>  N >= (S + A/2) / (M - A/2), solved here by hand
    S, A, M = 3_517_578_215_424, 17_547_264 * tokens, 95e9
    expected = math.ceil((S + A / 2) / (M - A / 2))
    assert ca.n_fsdp_required(ca.XXLConfig(), ca.TPU_V5P, tokens) == expected
    if tokens == 0:
        assert expected == 38  # 3517.6 GB / 95 GB = 37.03
    # and the answer is tight: one device fewer does not fit
    per_device = S / (expected - 1) + A / 2 + A / (2 * (expected - 1))
    assert per_device > M


def test_part_b_rejects_a_batch_whose_unsharded_activations_overflow():
    with pytest.raises(ValueError, match="tokens"):
        ca.n_fsdp_required(ca.XXLConfig(), ca.TPU_V5P, tokens=20_000)  # A/2 = 175 GB > 95 GB


def test_part_c_compute_bound_batch():
    alpha = 4.6e14 / (2 * 9e10)  # 2555.6 FLOPs per byte
    # B/N >= alpha / (Y M_X) = 2555.6 / (4 * 2) = 319.4 tokens per device
    per_device = ca.compute_bound_batch_per_device(ca.XXLConfig(), ca.TPU_V5P, ca.Mesh())
    assert per_device == pytest.approx(alpha / 8, rel=1e-12)
    summary = ca.compute_bound_summary()
    assert summary["per_device_tokens"] == 320
    assert summary["global_batch_tokens"] == 320 * 16 * 4 == 20_480
    # at that batch the math outlasts both kinds of communication
    assert summary["t_math_s"] >= summary["t_fsdp_s"] and summary["t_math_s"] >= summary["t_tp_s"]
    # T_math = 4 B D F / (N C) per block, by hand at B = 20480
    assert summary["t_math_s"] == pytest.approx(4 * 20_480 * 16_384 * 53_248 / (64 * 4.6e14), rel=1e-12)


def test_part_c_without_overlap_needs_a_larger_batch():
    alpha = 4.6e14 / 1.8e11
    tp_over_math = alpha * 4 / 53_248  # T_TP / T_math, independent of B
    expected = alpha / 8 / (1 - tp_over_math)
    got = ca.compute_bound_batch_per_device(ca.XXLConfig(), ca.TPU_V5P, ca.Mesh(), overlap=False)
    assert got == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="Y="):
        ca.compute_bound_batch_per_device(ca.XXLConfig(), ca.TPU_V5P, ca.Mesh(X=2, Y=32))


# -- ZeRO bytes per parameter (ANCHORS.md) and communication volume -------------------------------

@pytest.mark.parametrize("N", [1, 2, 8, 64])
def test_zero_bytes_per_parameter_match_the_paper(N):
    assert acc.bytes_per_parameter("ddp", N) == 16
    assert acc.bytes_per_parameter("zero1", N) == pytest.approx(4 + 12 / N)
    assert acc.bytes_per_parameter("sharded", N) == pytest.approx(4 + 12 / N)
    assert acc.bytes_per_parameter("zero2", N) == pytest.approx(2 + 14 / N)
    assert acc.bytes_per_parameter("zero3", N) == pytest.approx(16 / N)


def test_communication_volume():
    P, N = 1000, 4
    allreduce = 2 * 3 / 4 * P * 4  # ring all-reduce of P fp32 values
    assert acc.communication_bytes_per_rank("ddp", P, N) == allreduce
    assert acc.communication_bytes_per_rank("zero1", P, N) == allreduce  # RS + AG = one AR
    assert acc.communication_bytes_per_rank("sharded", P, N) == 1.5 * allreduce
    assert acc.communication_bytes_per_rank("zero3", P, N) == 1.5 * allreduce
    assert acc.communication_bytes_per_rank("ddp", P, 1) == 0
    with pytest.raises(ValueError, match="stage"):
        acc.communication_bytes_per_rank("zero4", P, N)


def test_fp32_memory_breakdown_of_a_preset():
    cfg = get_config("small")
    P = 128_625_408  # SPEC.md section 1
    m = acc.memory_per_rank(count_parameters(cfg)["total"], 2, "sharded", acc.FP32_ADAMW)
    assert (m.params, m.grads, m.optimizer_state) == (4 * P, 4 * P, 8 * P / 2)


# -- the activation formula and the measuring helpers, against autograd itself ---------------------

def _saved_bytes_by_hand(model, x) -> int:
    """Independent count: distinct storages autograd saves, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cross_entropy(model(x), x)
    return sum(seen.values())


@pytest.mark.parametrize("batch, seq", [(1, 64), (3, 40)])
def test_activation_formula_matches_what_autograd_saves(batch, seq):
    cfg = get_config("tiny")
    torch.manual_seed(0)
    model = TransformerLM.from_config(cfg)
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    assert acc.transformer_activation_bytes(cfg, batch, seq) == _saved_bytes_by_hand(model, x)
    with acc.saved_activation_bytes(model.parameters()) as saved:
        cross_entropy(model(x), x)
    assert saved["bytes"] == _saved_bytes_by_hand(model, x)


def test_memory_probe_counts_params_grads_and_adamw_state():
    cfg = get_config("tiny")
    model = TransformerLM.from_config(cfg)
    P = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = acc.MemoryProbe(model, opt)
    init = probe.record("after_init")
    assert (init["params_bytes"], init["grads_bytes"], init["state_bytes"]) == (4 * P, 0, 0)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    cross_entropy(model(x), x).backward()
    assert probe.record("before_step")["grads_bytes"] == 4 * P
    opt.step()
    # m and v per parameter, plus AdamW's fp32 scalar step count per tensor
    assert probe.record("after_step")["state_bytes"] == 8 * P + 4 * n_tensors
