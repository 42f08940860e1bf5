"""Claims of docs/parallelism.md ("Choosing a parallelism").

The page's numbers are the formulas of cs336_systems/parallelism evaluated for the 2026
leaderboard's FFN; the only measured inputs are the bf16 matmul ceiling and NCCL's bus bandwidth
(the "measured" H200). Each test quotes the sentence it guards and recomputes what it claims by
hand, in float64, from the symbols the page states.
"""

from __future__ import annotations

import math

import pytest

from cs336_systems.model import get_config
from cs336_systems.parallelism import costs
from cs336_systems.parallelism.hardware import H200_INFINIBAND, H200_NVLINK
from report import parallelism as rp

B, D, F = 2 * 32_768, 4_096, 11_008  # "batch 2 at context 32,768 ... D = 4,096 and D_FF = 11,008"
C, W = 989e12, 450e9                 # the H200 datasheet: dense bf16, NVLink one direction


def test_the_setting_is_the_leaderboard_8b_model():
    # "The numbers are the 2026 leaderboard's 8B model (our `8B` preset): one step is batch 2 at
    # context 32,768, so B = 65,536 tokens, with D = 4,096 and D_FF = 11,008."
    cfg = get_config("8B")
    assert (2 * cfg.context_length, cfg.d_model, cfg.d_ff) == (B, D, F)
    assert (rp.SETTING.B, rp.SETTING.D, rp.SETTING.F, rp.SETTING.C, rp.SETTING.W) == (B, D, F, C, W)


def test_alternate_ring_is_n_over_2_times_slower():
    # alternate_ring_all_reduce: "That is N/2 times the ring all-reduce's ...: the same at N = 2"
    for N in (2, 8):
        alt, ring = (N - 1) * 1e9 / W, 2 * (N - 1) / N * 1e9 / W
        assert alt / ring == pytest.approx(N / 2, rel=1e-12)
    assert float(rp._FACTS["alt_ms_8"]()) == pytest.approx(7e9 / W * 1e3, abs=0.05)


def test_dp_and_fsdp_stay_compute_bound_on_one_node():
    # (b)/(c): at N = 8 the communication is shorter than the compute, both DP's backward and
    # FSDP's forward, as the tables say ("communication-bound: no")
    N = rp.N_NODE
    assert 12 * D * F * (N - 1) / (N * W) < 12 * B * D * F / (N * C)
    assert 6 * D * F * (N - 1) / (N * W) < 6 * B * D * F / (N * C)
    assert rp.bound("DP", "backward") == pytest.approx(1 + B * W / C, rel=1e-12)
    assert rp.bound("DP", "backward") > N


def test_tp_runs_out_before_dp_and_just_past_one_node():
    # "TP runs out before DP ... a training batch of tokens is usually much larger than 3/2 D_FF"
    # "Its forward pass stays compute-bound up to ... devices, just past the 8 GPUs of an HGX node"
    tp_fwd, tp_bwd = 1 + 3 * F * W / (2 * C), 1 + 3 * F * W / C
    assert rp.bound("TP", "forward") == pytest.approx(tp_fwd, rel=1e-12)
    assert rp.bound("TP", "backward") == pytest.approx(tp_bwd, rel=1e-12)
    assert tp_fwd < tp_bwd < 1 + B * W / C
    assert B > 1.5 * F
    assert rp.N_NODE < tp_fwd < rp.N_NODE + 1


def test_2d_bounds_overlap_multiplies_and_serial_is_near_a_quarter():
    # (c): "the limits multiply"; (d): "a quarter of (c) in the limit", "(0.29) of the overlapped bound"
    overlap = (1 + B * W / C) * (1 + 3 * F * W / (2 * C))
    K = 6 * B * F * W / C + 6 * F + 4 * B
    serial = K ** 2 / (96 * B * F)
    assert rp.bound("FSDP+TP, overlapped", "forward") == pytest.approx(overlap, rel=1e-12)
    assert rp.bound("FSDP+TP, not overlapped", "forward") == pytest.approx(serial, rel=1e-12)
    assert 0.25 < serial / overlap < 1 / 3
    # "in the limit": with B W / C and D_FF W / C huge (C a millionth), the ratio tends to 1/4
    tiny_C = C * 1e-6
    assert costs.fsdp_tp_max_devices(B, F, tiny_C, W, False) / costs.fsdp_tp_max_devices(
        B, F, tiny_C, W, True) == pytest.approx(0.25, rel=1e-3)


def test_2d_whole_device_splits_are_the_best_integer_ones():
    # "or 30 x 8 = 240 whole devices" / "18 x 4 = 72 whole devices": brute force over every split,
    # with each time recomputed from the page's formulas
    for overlap in (True, False):
        best = (0, 0, 0)
        for f in range(1, 80):
            for t in range(1, 80):
                T = 6 * B * D * F / (f * t * C)
                t_f = (f - 1) / f * 6 * D * F / (t * W)
                t_t = 2 * (t - 1) / t * 2 * B * D / (f * W)
                if (max(t_f, t_t) if overlap else t_f + t_t) <= T and f * t > best[0]:
                    best = (f * t, f, t)
        assert rp.integer_split(overlap) == best[1:]
        assert best[0] <= rp.bound("FSDP+TP, overlapped" if overlap else "FSDP+TP, not overlapped", "forward")


def test_measured_h200_keeps_c_over_w_within_a_few_percent():
    # "The measured H200 is slower than its datasheet in both compute and bandwidth by similar
    # factors, so C/W barely moves ..., none of them moves by more than a few percent."
    reach = rp.reachable_device()
    c_factor, w_factor = reach.flops / C, reach.egress_bandwidth / W
    assert c_factor < 1 and w_factor < 1
    assert abs(c_factor / w_factor - 1) < 0.05
    table = rp.bounds()
    moved = table["H200 NVLink, measured"] / table["H200 NVLink, datasheet"] - 1
    assert (moved.abs() < 0.05).all(), moved


def test_infiniband_tp_is_communication_bound_on_two_devices():
    # "Across nodes W is 9 times smaller and so are the bounds (less one): DP stops at 4.3 devices
    # and TP's forward pass at 1.8, below 2, so TP over InfiniBand is communication-bound already
    # on two devices."
    ratio = H200_NVLINK.egress_bandwidth / H200_INFINIBAND.egress_bandwidth
    assert ratio == pytest.approx(9)
    for strategy, p in (("DP", "backward"), ("TP", "forward")):
        assert rp.bound(strategy, p, "H200 InfiniBand, datasheet") - 1 == pytest.approx(
            (rp.bound(strategy, p) - 1) / ratio, rel=1e-12)
    assert rp.bound("TP", "forward", "H200 InfiniBand, datasheet") < 2
    N = 2  # communication outlasts compute at N = 2 over InfiniBand
    assert 4 * B * D * (N - 1) / (N * H200_INFINIBAND.egress_bandwidth) > 6 * B * D * F / (N * C)


def test_ratio_curves_cross_one_at_the_bounds():
    # "Each curve crosses 1 at its bound."
    df = rp.answers.time_curves(rp.SETTING)
    for strategy, p, name in (("DP", "backward", "DP"), ("FSDP", "forward", "FSDP"), ("TP", "forward", "TP")):
        g = df[(df.strategy == strategy) & (df["pass"] == p)]
        limit = rp.bound(name, p)
        assert not g[g.N <= limit].comm_bound.any()
        assert g[g.N > limit].comm_bound.all()


def test_tp_prediction_adds_the_two_terms():
    # "a TP step should take about their sum": the table's last column is the sum of the two
    table = rp.tp_prediction_table()
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        compute, comm, total = (float(c.removesuffix(" ms")) for c in cells[3:6])
        assert total == pytest.approx(compute + comm, abs=2e-3)  # three decimals each
    assert math.isclose(6 * 65_536 * D * F / 2 / C * 1e3, 8.963, abs_tol=1e-3)
