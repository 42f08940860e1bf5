"""The report layer of the distributed chapters (report/collectives.py, ddp.py, sharding.py,
communication_accounting.py), on synthetic rows whose answers are known by construction."""

from __future__ import annotations

import pandas as pd
import pytest

from report import collectives, ddp

# -- the all-reduce rows (a GPU host's file: gloo on CPU and on CUDA tensors, one rank count) -------

def _collectives_rows() -> pd.DataFrame:
    """t = o + bytes/w exactly, for three kinds with known o and w."""
    rows = []
    for backend, dtype, o, w in [("nccl", "cuda", 5e-5, 3e11), ("gloo", "cuda", 5e-4, 2e9),
                                 ("gloo", "cpu", 2e-4, 1e9)]:
        for mb in (1, 10, 100, 1024):
            t_ms = (o + mb * 2**20 / w) * 1e3
            rows.append({"backend": backend, "device_type": dtype, "world_size": 2, "size_mb": mb,
                         "size_bytes": mb * 2**20, "time_ms": t_ms, "time_ms_std": t_ms / 100,
                         "algbw_gbps": mb * 2**20 / t_ms / 1e6, "busbw_gbps": mb * 2**20 / t_ms / 1e6,
                         "ranks_per_core": 0.0625, "loadavg_1m": 1.0,
                         "status": "ok", "time_utc": "2026-11-29T00:00:00Z"})
    return pd.DataFrame(rows)


@pytest.fixture
def gpu_host_rows(monkeypatch):
    monkeypatch.setattr(collectives, "load_results", lambda bench, device: _collectives_rows())


def test_fit_matches_the_tensor_device_and_names_missing_rows(gpu_host_rows):
    # rel=1e-6: the rows are exact, so only the least-squares solve's rounding remains
    o, w = collectives.fit("x", "gloo+cpu", 2)  # not the gloo+CUDA rows
    assert o == pytest.approx(2e-4, rel=1e-6) and w == pytest.approx(1e9, rel=1e-6)
    o, w = collectives.fit("x", "gloo+cuda", 2)
    assert o == pytest.approx(5e-4, rel=1e-6) and w == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ValueError, match="nccl\\+cuda on 4 ranks"):
        collectives.fit("x", "nccl+cuda", 4)


def test_fits_table_has_one_row_per_kind_with_the_knee(gpu_host_rows):
    fits = collectives.fits("x").set_index("kind")
    assert fits.loc["nccl+cuda", "knee_bytes"] == pytest.approx(5e-5 * 3e11, rel=1e-6)
    rows = [line.split("|")[1].strip() for line in collectives.fits_table("x").splitlines()
            if line.startswith(("| gloo", "| nccl"))]
    assert rows == ["gloo+CPU", "gloo+CUDA", "nccl+CUDA"]


def test_all_reduce_table_keeps_the_two_gloos_apart(gpu_host_rows):
    kinds = [line.split("|")[1].strip() for line in collectives.all_reduce_table("x").splitlines()
             if line.startswith("| gloo")]
    assert kinds == ["gloo+CPU"] * 4 + ["gloo+CUDA"] * 4  # grouped, not interleaved by size


def test_a_cell_that_was_not_measured_is_named(gpu_host_rows):
    with pytest.raises(KeyError, match="nccl\\+cuda, 6 ranks"):
        collectives.cell("x", "nccl+cuda", 6, 1024)


# -- the DDP step rows: several runs of the same grid, each run against its own compute-only step --

def _step_rows(runs: list[dict[str, float]], resumed_at: int | None = None) -> pd.DataFrame:
    """One row per (run, stage) in time order; `resumed_at`: the first run stops before that
    stage and a later process adds the rest (one run, two processes)."""
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
    runs = [{"compute-only": 400.0, "naive": 450.0, "flat": 470.0},
            {"compute-only": 410.0, "naive": 440.0, "flat": 430.0}]
    monkeypatch.setattr(ddp, "load_results", lambda bench, device: _step_rows(runs))
    per_run = ddp.runs("x")
    assert per_run.groupby("stage").run.apply(sorted).to_dict() == {
        "compute-only": [1, 2], "flat": [1, 2], "naive": [1, 2]}
    g = ddp.steps("x").set_index("stage")
    assert g.loc["naive", "runs"] == 2
    assert g.loc["naive", "step_ms"] == pytest.approx((450 + 440) / 2)
    # overhead against the same run's compute-only step: 50 and 30, not 445 - 405 across runs
    assert g.loc["naive", "overhead_ms"] == pytest.approx((50 + 30) / 2)
    assert g.loc["naive", "outside_ms"] == pytest.approx((49 + 29) / 2)  # sync_ms is 1 in every row
    assert ddp.per_run("x", "step_ms")["flat"].agg(["min", "max"]).tolist() == [430, 470]
    assert g.loc["flat", "step_ms_runs"] == (470, 430)  # in run order
    assert g.loc["flat", "step_ms_std"] == pytest.approx(4.7)  # the noisier run's
    assert "| 470 / 430 |" in ddp.steps_table("x")
    assert ddp.clearly_faster("x", "flat", "naive").tolist() == [False, True]  # 10 > 4.4 + 4.3
    assert ddp.run_move_ms("x")["flat"] == 40


def test_one_run_is_unchanged_and_a_resumed_run_stays_one(monkeypatch):
    runs = [{"compute-only": 400.0, "naive": 450.0, "flat": 470.0}]
    monkeypatch.setattr(ddp, "load_results", lambda bench, device: _step_rows(runs, resumed_at=2))
    g = ddp.steps("x").set_index("stage")
    assert set(g["runs"]) == {1}
    assert g.loc["flat", "overhead_ms"] == 70 and g.loc["flat", "step_ms_std"] == pytest.approx(4.7)
    assert "each run" not in ddp.steps_table("x")


def test_runs_table_lists_each_run_of_the_chosen_stages(monkeypatch):
    runs = [{"compute-only": 400.0, "naive": 450.0, "flat": 470.0},
            {"compute-only": 410.0, "naive": 440.0, "flat": 430.0}]
    monkeypatch.setattr(ddp, "load_results", lambda bench, device: _step_rows(runs))
    body = [line.split("|")[1:3] for line in ddp.runs_table("x", ["flat", "naive"]).splitlines()[2:]
            if line.startswith("| ")]
    assert [(s.strip(), r.strip()) for s, r in body] == [("flat", "1"), ("flat", "2"), ("naive", "1"),
                                                          ("naive", "2")]


def test_model_vs_measured_uses_the_bucket_counts_the_caps_made(monkeypatch):
    monkeypatch.setattr(collectives, "load_results", lambda bench, device: _collectives_rows())
    rows = [{"compute-only": 400.0, "bucketed": 450.0}]
    steps = _step_rows(rows).assign(grad_bytes=2**30)
    steps.loc[steps.stage == "bucketed", ["bucket_size_mb", "allreduce_calls"]] = [1.0, 7]
    monkeypatch.setattr(ddp, "load_results", lambda bench, device: steps)
    m = ddp.model_vs_measured("x").iloc[0]
    o, w = 5e-5, 3e11  # the nccl+cuda rows' o and w
    assert m["buckets"] == 7  # not s / 1 MB = 1024
    assert m["model_ms"] == pytest.approx((7 * o + 2**30 / (7 * w)) * 1e3, rel=1e-6)
    assert m["measured_ms"] == 50


# -- the things computed, not measured ------------------------------------------------------------

def test_xl_tensor_sizes_cover_every_parameter_once():
    from cs336_systems.model import TransformerLM, count_parameters, get_config

    df = ddp.xl_tensor_sizes()
    n_tensors = len(list(TransformerLM.from_config(get_config("xl"), device="meta").parameters()))
    assert df["tensors"].sum() == n_tensors
    assert (df["bytes"] * df["tensors"]).sum() == 4 * count_parameters(get_config("xl"))["total"]
    assert df["share"].sum() == pytest.approx(1.0)


def test_stage_diff_is_the_diff_of_the_two_stages_sections():
    text = ddp.stage_diff("naive", "flat")
    assert text.startswith("```diff\n--- cs336_systems/distributed/ddp/naive.py")
    assert "-class DDPNaive(DataParallel):" in text and "+class DDPFlat(DataParallel):" in text


def test_communication_accounting_tables_show_the_formulas_values():
    from cs336_systems.sharding import communication_accounting as ca
    from report import communication_accounting as rca

    assert f"{ca.n_params(ca.XXLConfig()):,}" in rca.xxl_memory_table()
    assert f"| {ca.compute_bound_summary()['global_batch_tokens']:,} |" in rca.batch_reduction_table()


def test_sharding_computed_tables_follow_the_accounting():
    from cs336_systems.sharding import accounting as acc
    from report import sharding

    table = sharding.zero_bytes_table(world_sizes=(1, 8))
    ddp_row = next(line for line in table.splitlines() if line.startswith("| DDP "))
    assert ddp_row.split("|")[2].strip() == format(acc.bytes_per_parameter("ddp", 1), ".3g")
