"""Claims of docs/communication-accounting.md. Nothing on that page is measured: the claims are
about the formulas' values, recomputed here by hand (float64) and compared with the page's facts."""

from __future__ import annotations

import math

import pytest

from cs336_systems.sharding import communication_accounting as ca
from report import communication_accounting as rca


def test_a_the_state_is_several_dozen_h100s():
    # (a): "the training state alone is ... TB, ... H100s' worth of memory"
    D, F, L = 16384, 53248, 126  # the problem's XXL config, typed from the problem text
    P = 2 * D * F * L
    assert ca.n_params(rca.CFG) == P
    assert math.ceil(16 * P / 80e9) == ca.devices_to_hold(ca.state_bytes(rca.CFG), ca.H100_80GB)
    assert 24 <= math.ceil(16 * P / 80e9) <= 100  # "several dozen"


def test_b_n_fsdp_is_tight_and_the_activation_limit_exists():
    # (b): "the state alone needs N_FSDP = ..." -- one device fewer does not fit
    n = ca.n_fsdp_required(rca.CFG, ca.TPU_V5P)
    assert ca.fsdp_bytes_per_device(rca.CFG, n) <= 95e9 < ca.fsdp_bytes_per_device(rca.CFG, n - 1)
    # "past about ... tokens the unsharded half of the activations alone overflows a chip"
    t = rca.tokens_until_overflow()
    assert ca.activation_bytes_per_token(rca.CFG) * t / 2 == pytest.approx(95e9, rel=1e-12)  # one division


def test_c_tensor_parallelism_hides_at_any_batch():
    # (c): "Tensor parallelism's own communication hides at any batch, since Y = ... is below F M_Y / alpha"
    alpha = 4.6e14 / 1.8e11  # C / W_ici of a TPU v5p, as the page states them
    assert rca.MESH.Y < rca.CFG.d_ff * rca.MESH.M_Y / alpha
    # "a per-device batch of ... tokens": the first whole token at or above alpha / (Y M_X)
    assert rca.summary()["per_device_tokens"] == math.ceil(alpha / (rca.MESH.Y * rca.MESH.M_X))
