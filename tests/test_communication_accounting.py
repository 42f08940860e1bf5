"""communication_accounting (the XXL model) against values worked out by hand: each expected value
is written here as arithmetic on the problem's numbers, never by calling the code under test twice."""

from __future__ import annotations

import math

import pytest

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
