"""The flash chapter's report layer (report/flash*.py) on made-up inputs: how rows become tables,
figures and the numbers the prose quotes."""

import pandas as pd
import pytest

from report import flash, flash_sweep, flash_tuning, reproducing
from report.figures import svg


def _lb_rows() -> pd.DataFrame:
    """Two runs: an early one at a short rep with three implementations, a later one with all five
    at 10 s. Times are made up; cuDNN's over ours is the speed."""
    rows = []
    for run, git, rep, impls in (("r1", "a8e302062c11", 3000, ("ours", "cudnn", "flash")),
                                 ("r2", "046bb7a0ebb2", 10000, tuple(flash.IMPL_NAMES))):
        for impl in impls:
            for mode, ms in (("fwd", 1.0), ("fwd_bwd", 4.0)):
                scale = {"ours": 0.9 if run == "r2" else 1.1, "cudnn": 1.0}.get(impl, 2.0)
                rows.append({"run": run, "git": git, "rep_ms": rep, "impl": impl, "mode": mode, "mean_ms": ms * scale,
                             "median_ms": ms * scale, "tflops": 100 / scale, "speed_vs_cudnn": 1 / scale,
                             "status": "ok", "device": "NVIDIA H200", "time_utc": f"2026-11-29T0{len(rows) % 9}:00:00Z"})
    return pd.DataFrame(rows)


@pytest.fixture
def lb_rows(monkeypatch):
    rows = _lb_rows()
    monkeypatch.setattr(flash, "load_results", lambda bench, status=None: rows)
    return rows


def test_headline_run_is_the_newest_complete_run_at_full_rep(lb_rows):
    assert flash.headline_run(lb_rows) == "r2"
    assert flash.headline_run(lb_rows[lb_rows.run == "r1"]) == "r1"  # nothing complete: the newest


def test_leaderboard_numbers_and_tables_come_from_the_headline_run(lb_rows):
    assert flash.lb("ours", "fwd_bwd") == pytest.approx(3.6)
    assert flash.lb("ours", "fwd_bwd", run="r1") == pytest.approx(4.4)
    with pytest.raises(KeyError, match="impl='flex'"):
        flash.lb("flex", "fwd", run="r1")
    table = flash.leaderboard_table()
    assert "r1" not in table and table.count("\n| ") == 10  # five implementations, two modes
    history = flash.history_table()
    assert "Triton forward, Triton backward" in history and "Gluon forward, Gluon backward" in history
    assert flash.best_run() == "r1"  # the only run of the Triton kernels alone


def test_registered_facts_format_their_values(lb_rows):
    assert flash.FACTS["lb_speedup"]() == f"{1 / 0.9:.3f}"


def _sweep_rows() -> pd.DataFrame:
    rows = []
    for impl, scale in (("triton", 1.0), ("sdpa", 2.0), ("naive", 3.0)):
        for d in flash_sweep.DIMS:
            for mode in flash.MODE_WORDS:
                rows.append({"impl": impl, "dtype": "bf16", "d": d, "seq": flash_sweep.LARGEST, "mode": mode,
                             "ms": scale * d / 64, "tflops": 1.0, "status": "ok", "git": "g"})
    # rows in time order, as the store appends them
    rows.append({"impl": "sdpa", "dtype": "fp32", "d": 16, "seq": 128, "mode": "fwd", "ms": None,
                 "status": "unsupported", "error": "no fp32 kernel", "git": "g"})
    rows.append({"impl": "triton", "dtype": "bf16", "d": 16, "seq": flash_sweep.LARGEST, "mode": "fwd",
                 "ms": 9.0, "status": "ok", "git": "old"})  # an older timing of a cell: replaced below
    rows.append(dict(rows[0], git="new"))
    return pd.DataFrame(rows).assign(time_utc=[f"2026-01-01T00:00:{i:02d}Z" for i in range(len(rows))])


@pytest.fixture
def sweep_rows(monkeypatch):
    rows = _sweep_rows()
    monkeypatch.setattr(flash_sweep, "load_results", lambda bench: rows)
    return rows


def test_sweep_keeps_the_newest_timing_of_a_cell(sweep_rows):
    newest = flash_sweep.sweep_rows()
    cell = newest[(newest.impl == "triton") & (newest.d == 16) & (newest["mode"] == "fwd")]
    assert list(cell.git) == ["new"]
    assert "| ours Triton, replaced | old | 1 |" in flash_sweep.code_table()


def test_sweep_tables_mark_what_did_not_run(sweep_rows):
    assert "n/a" in flash_sweep.sweep_table("fp32", "fwd")
    assert flash_sweep.speed_vs("sdpa", 64, "fwd") == pytest.approx(2.0)
    assert "| 64 | 2.00 | 2.00 | 2.00 |" in flash_sweep.vs_table("sdpa", "bf16")
    with pytest.raises(KeyError, match="no measured sweep cell"):
        flash_sweep.speed_vs("sdpa", 64, "fwd", seq=128)


def test_sweep_figure_has_a_panel_per_mode_and_dim(sweep_rows):
    fig = flash_sweep.sweep_figure("bf16")
    assert len(fig.axes) == len(flash.MODE_WORDS) * len(flash_sweep.DIMS)
    assert svg(fig).startswith("<svg")


def test_describe_bwd_names_the_design():
    base = dict(block_m1=32, block_n1=64, block_m2=128, block_n2=64, num_warps1=4, num_stages1=3,
                num_warps2=8, num_stages2=2, fused=False, one_pass=False, tma1=False, tma2=True)
    assert flash_tuning.describe_bwd(None) == "—"
    assert flash_tuning.describe_bwd(base) == (
        "dK/dV 64 keys x 32 queries, 4 w, 3 st; dQ 128 queries x 64 keys, 8 w, 2 st, TMA")
    assert flash_tuning.describe_bwd({**base, "fused": True}).startswith("one launch: dK/dV 64x32, dQ 128x64")
    assert flash_tuning.describe_bwd({**base, "one_pass": True}) == (
        "one pass, dQ by thread atomics: 64 keys x 32 queries, 4 w, 3 st")
    assert flash_tuning.describe_bwd({**base, "one_pass": True, "tma1": True}).startswith(
        "one pass, TMA loads, dQ by TMA bulk")
    gluon = {**base, "gluon_ws": True, "ws_stages": 2, "ws_slots": 2, "ws_dq_regs": 80}
    assert flash_tuning.describe_bwd(gluon).startswith("Gluon one-pass") and "else dK/dV 64 keys" in flash_tuning.describe_bwd(gluon)


def test_design_splits_one_pass_by_dq_add():
    assert flash_tuning.design("onepass", {"tma1": True}) == "onepass_tma"
    assert flash_tuning.design("onepass", {}) == "onepass_atomics"  # rows from before the TMA variant
    assert flash_tuning.design("dkdv", {"tma1": True}) == "dkdv"


def test_leaderboard_shape_filter_drops_the_key_tuned_at_other_shapes():
    rows = pd.DataFrame({"key": [flash.LB_KEY, flash.LB_KEY, "bf16-d64-causal-medium"],
                         "Z": [flash.LB["batch"], 1, flash.LB["batch"]],
                         "seq": [flash.LB["seq"], 65536, flash.LB["seq"]]})
    assert flash_tuning.at_leaderboard_shape(rows).index.tolist() == [0]


def test_roofline_against_the_measured_ceilings():
    """The leaderboard case's FLOPs by the FA convention, independent of the package's counter:
    forward 4 n^2 d per batch-head, halved by the causal mask; forward+backward 3.5 times that;
    the ridge is the measured matmul rate over the measured copy bandwidth."""
    r = flash_tuning.roofline()
    B, n, d = flash.LB["batch"], flash.LB["seq"], flash.LB["d"]
    assert r["fwd_tflop"] == pytest.approx(4 * n * n * d * B / 2 / 1e12)
    assert r["total_tflop"] == pytest.approx(3.5 * r["fwd_tflop"])
    assert r["ridge"] == pytest.approx(reproducing.matmul_ceiling_tflops("bf16") / reproducing.copy_ceiling_tbps())
