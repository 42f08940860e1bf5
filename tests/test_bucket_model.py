"""The analytical bucket model: its optimum against a brute-force scan, and the o/w fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cs336_systems.distributed.bucket_model import BucketModel, fit_latency_bandwidth


@settings(max_examples=100, deadline=None)
@given(s=st.floats(1e6, 1e10), w=st.floats(1e8, 1e12), o=st.floats(1e-6, 1e-2))
def test_optimum_matches_a_brute_force_scan(s, w, o):
    model = BucketModel(s=s, w=w, o=o)
    grid = np.geomspace(1, max(2.0, 100 * model.optimal_num_buckets), 20_001)
    scanned = grid[np.argmin(grid * o + s / (grid * w))]  # independent of the closed form
    assert model.optimal_num_buckets == pytest.approx(max(1.0, scanned), rel=2e-3)
    assert model.min_overhead <= min(model.overhead(n) for n in (1, 2, 10, 100)) + 1e-15
    if model.optimal_num_buckets > 1:
        assert model.min_overhead == pytest.approx(2 * math.sqrt(s * o / w))
        assert model.optimal_bucket_bytes == pytest.approx(math.sqrt(s * w * o))


def test_hand_checked_numbers():
    # 8 GB of gradients, 100 GB/s, 50 us per call: n* = sqrt(8e9 / (1e11 * 5e-5)) = 40,
    # b* = 200 MB, overhead 2 * sqrt(8e9 * 5e-5 / 1e11) = 4 ms.
    model = BucketModel(s=8e9, w=1e11, o=5e-5)
    assert model.optimal_num_buckets == pytest.approx(40)
    assert model.optimal_bucket_bytes == pytest.approx(2e8)
    assert model.min_overhead == pytest.approx(4e-3)
    assert model.overhead_for_bucket(2e8) == pytest.approx(4e-3)


def test_fit_recovers_latency_and_bandwidth():
    sizes = np.array([1, 10, 100, 1000]) * 2**20
    o, w = 2e-4, 3e9
    rng = np.random.default_rng(0)
    times = (o + sizes / w) * (1 + 0.01 * rng.standard_normal(sizes.size))
    o_fit, w_fit = fit_latency_bandwidth(sizes, times)
    assert o_fit == pytest.approx(o, rel=0.1) and w_fit == pytest.approx(w, rel=0.05)


@pytest.mark.parametrize("kwargs", [dict(s=0, w=1, o=1), dict(s=1, w=-1, o=1), dict(s=1, w=1, o=0)])
def test_bad_model_parameters_are_named(kwargs):
    with pytest.raises(ValueError, match="must be positive"):
        BucketModel(**kwargs)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two or more"):
        fit_latency_bandwidth([1e6, 1e6], [1e-3, 1e-3])


# -- the summaries that read the all-reduce rows (a GPU host's file: gloo on CPU and on CUDA
# tensors, one rank count) ------------------------------------------------------------------------

def _collectives_rows():
    import pandas as pd

    rows = []
    for backend, dtype, o, w in [("nccl", "cuda", 5e-5, 3e11), ("gloo", "cuda", 5e-4, 2e9),
                                 ("gloo", "cpu", 2e-4, 1e9)]:
        for mb in (1, 10, 100, 1024):
            rows.append({"backend": backend, "device_type": dtype, "world_size": 2, "size_mb": mb,
                         "size_bytes": mb * 2**20, "time_ms": (o + mb * 2**20 / w) * 1e3,
                         "status": "ok", "time_utc": "2026-11-29T00:00:00Z"})
    return pd.DataFrame(rows)


@pytest.fixture
def gpu_host_rows(monkeypatch):
    from cs336_systems.distributed import summary

    monkeypatch.setattr(summary, "load_results", lambda bench, device: _collectives_rows())
    return summary


def test_fit_matches_the_tensor_device_and_names_missing_rows(gpu_host_rows):
    summary = gpu_host_rows
    o, w = summary.fit_collectives("x", "gloo", "cpu", 2)  # not the gloo+CUDA rows
    assert o == pytest.approx(2e-4, rel=1e-6) and w == pytest.approx(1e9, rel=1e-6)
    o, w = summary.fit_collectives("x", "gloo", "cuda", 2)
    assert o == pytest.approx(5e-4, rel=1e-6) and w == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ValueError, match="nccl\\+cuda on 4 ranks"):
        summary.fit_collectives("x", "nccl", "cuda", 4)


def test_one_rank_count_is_fitted_and_the_rank_trend_is_declined(gpu_host_rows):
    summary = gpu_host_rows
    fits = summary.latency_bandwidth_fits("x").set_index(["backend", "device_type"])
    assert fits.loc[("nccl", "cuda"), "knee_bytes"] == pytest.approx(5e-5 * 3e11, rel=1e-6)
    table = summary.latency_bandwidth_table("x")
    assert "Only one rank count" in table and "nccl+CUDA" in table
    quiet = summary.latency_bandwidth_table("x", note_single_rank_count=False)
    assert "Only one rank count" not in quiet and "nccl+CUDA" in quiet
    rows = [line for line in table.splitlines() if line.startswith("| gloo")]
    assert [r.split("|")[1].strip() for r in rows] == ["gloo+CPU", "gloo+CUDA"]


def test_collectives_table_keeps_the_two_gloos_apart(gpu_host_rows):
    lines = [line for line in gpu_host_rows.collectives_table("x").splitlines()
             if line.startswith("| gloo")]
    kinds = [line.split("|")[1].strip() for line in lines]
    assert kinds == ["gloo+CPU"] * 4 + ["gloo+CUDA"] * 4  # grouped, not interleaved by size


# -- the DDP step rows: several runs of the same grid, each run against its own compute-only step --

def _step_rows(runs: list[dict[str, float]], resumed_at: int | None = None):
    """One row per (run, stage) in time order; `resumed_at`: the first run stops before that
    stage and a later process adds the rest (one run, two processes)."""
    import pandas as pd

    rows, t = [], 0
    base = {"size": "xl", "backend": "nccl", "device_type": "cuda", "world_size": 2,
            "batch_size": 4, "context_length": 512, "bucket_size_mb": None, "status": "ok",
            "rounds": 1, "timed_steps": 5, "sync_ms": 1.0, "comm_alone_ms": 1.0,
            "step_ms_mean": 0.0, "allreduce_calls": 1, "git": "g"}
    for i, steps in enumerate(runs):
        for j, (stage, ms) in enumerate(steps.items()):
            t += 3600 if (resumed_at is not None and i == 0 and j == resumed_at) else 1
            rows.append({**base, "stage": stage, "step_ms": ms, "step_ms_std": ms / 100,
                         "time_utc": f"2026-11-29T{t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}Z"})
    return pd.DataFrame(rows)


def test_two_runs_are_medians_with_each_runs_overhead(monkeypatch):
    from cs336_systems.distributed import summary

    runs = [{"compute-only": 400.0, "naive": 450.0, "flat": 470.0},
            {"compute-only": 410.0, "naive": 440.0, "flat": 430.0}]
    monkeypatch.setattr(summary, "load_results", lambda bench, device: _step_rows(runs))
    per_run = summary.ddp_runs("x")
    assert per_run.groupby("stage").run.apply(sorted).to_dict() == {
        "compute-only": [1, 2], "flat": [1, 2], "naive": [1, 2]}
    g = summary.ddp_steps("x").set_index("stage")
    assert g.loc["naive", "runs"] == 2
    assert g.loc["naive", "step_ms"] == pytest.approx((450 + 440) / 2)
    # overhead against the same run's compute-only step: 50 and 30, not 445 - 405 computed across runs
    assert g.loc["naive", "overhead_ms"] == pytest.approx((50 + 30) / 2)
    assert (g.loc["flat", "overhead_ms_lo"], g.loc["flat", "overhead_ms_hi"]) == (20, 70)
    assert (g.loc["flat", "step_ms_lo"], g.loc["flat", "step_ms_hi"]) == (430, 470)
    assert g.loc["flat", "step_ms_runs"] == (470, 430)  # in run order
    assert g.loc["flat", "step_ms_std"] == pytest.approx(4.7)  # the noisier run's
    table = summary.ddp_table("x")
    assert "each run (ms)" in table and "| 470 / 430 |" in table


def test_one_run_is_unchanged_and_a_resumed_run_stays_one(monkeypatch):
    from cs336_systems.distributed import summary

    runs = [{"compute-only": 400.0, "naive": 450.0, "flat": 470.0}]
    monkeypatch.setattr(summary, "load_results", lambda bench, device: _step_rows(runs, resumed_at=2))
    g = summary.ddp_steps("x").set_index("stage")
    assert set(g["runs"]) == {1}
    assert g.loc["flat", "overhead_ms"] == 70 and g.loc["flat", "step_ms_std"] == pytest.approx(4.7)
    assert "each run" not in summary.ddp_table("x")
