"""Formatting helpers of flash_tables and sweep_tables (the flash chapter's rendered prose), on made-up inputs."""

import pandas as pd
import pytest

from cs336_systems.attention import flash_tables as ft
from cs336_systems.attention import sweep_tables as swt


def test_dims_phrase():
    assert swt.dims_phrase([64]) == "d = 64"
    assert swt.dims_phrase([32, 16]) == "d = 16 and 32"
    assert swt.dims_phrase([128, 16, 64]) == "d = 16, 64 and 128"
    with pytest.raises(ValueError, match="dims"):
        swt.dims_phrase([])


def test_wins_phrase_groups_by_size_then_mode():
    idx = pd.MultiIndex.from_tuples(
        [(16, 4096, "fwd"), (16, 32768, "fwd"), (64, 32768, "fwd"), (16, 32768, "bwd"),
         (16, 65536, "fwd_bwd"), (32, 65536, "fwd_bwd"), (128, 65536, "fwd")], names=["d", "seq", "mode"])
    fastest = pd.Series(["triton", "triton", "triton", "sdpa", "triton", "triton", "sdpa"], index=idx)
    assert swt.wins_phrase(fastest, "triton", min_seq=8192) == (
        "at 32,768 the forward (d = 16 and 64); at 65,536 the forward+backward (d = 16 and 32)")
    assert swt.wins_phrase(fastest, "sdpa") == "at 32,768 the backward (d = 16); at 65,536 the forward (d = 128)"
    assert swt.wins_phrase(fastest, "naive") == ""


def test_describe_bwd_names_the_design():
    base = dict(block_m1=32, block_n1=64, block_m2=128, block_n2=64, num_warps1=4, num_stages1=3,
                num_warps2=8, num_stages2=2, fused=False, one_pass=False, tma1=False, tma2=True)
    assert ft.describe_bwd(None) == "—"
    assert ft.describe_bwd(base) == "dK/dV 64 keys x 32 queries, 4 w, 3 st; dQ 128 queries x 64 keys, 8 w, 2 st, TMA"
    assert ft.describe_bwd({**base, "fused": True}).startswith("one launch: dK/dV 64x32, dQ 128x64")
    assert ft.describe_bwd({**base, "one_pass": True}) == "one pass, dQ by thread atomics: 64 keys x 32 queries, 4 w, 3 st"
    assert ft.describe_bwd({**base, "one_pass": True, "tma1": True}).startswith("one pass, TMA loads, dQ by TMA bulk")


def test_design_splits_one_pass_by_dq_add():
    assert ft._design("onepass", {"tma1": True}) == "onepass_tma"
    assert ft._design("onepass", {}) == "onepass_atomics"  # rows from before the TMA variant
    assert ft._design("dkdv", {"tma1": True}) == "dkdv"


def test_leaderboard_shape_filter_drops_the_key_tuned_at_other_shapes():
    rows = pd.DataFrame({"key": [ft.LB_KEY, ft.LB_KEY, "bf16-d64-causal-medium"],
                         "Z": [ft.LB["batch"], 1, ft.LB["batch"]], "seq": [ft.LB["seq"], 65536, ft.LB["seq"]]})
    kept = ft._at_leaderboard_shape(rows)
    assert kept.index.tolist() == [0]


def _fake_results(monkeypatch, sweep_git: str):
    """A tuning run of the leaderboard's key at the sweep's shape (git 'a'), then the sweep's
    bf16, d = 64, 65,536 Triton cells timed at `sweep_git`."""
    fwd = dict(block_m=64, block_n=32, num_warps=4, num_stages=2, tma=False)
    bwd = dict(block_m1=32, block_n1=64, block_m2=64, block_n2=32, num_warps1=4, num_stages1=2, num_warps2=4,
               num_stages2=2, fused=False, one_pass=False, tma1=False, tma2=False)
    tune = pd.DataFrame([{"key": ft.LB_KEY, "kernel": k, "config": c, "run": "r1", "git": "a", "Z": 1,
                          "seq": 65536, "ms": 1.0, "status": "ok", "time_utc": "2026-01-01T00:00:00Z"}
                         for k, c in (("fwd", fwd), ("dkdv", bwd), ("dq", bwd))])
    sweep = pd.DataFrame([{"impl": "triton", "dtype": "bf16", "d": 64, "seq": 65536, "mode": m, "status": "ok",
                           "git": sweep_git, "time_utc": "2026-01-01T01:00:00Z", "ms": 1.0} for m in ("fwd", "bwd")])
    monkeypatch.setattr(ft, "load_results", lambda bench, status=None: {"attention/flash_tune": tune,
                                                                        "attention/flash_sweep": sweep}[bench])
    monkeypatch.setattr(ft, "_leaderboard_tuning", lambda: tune.iloc[:0])


def test_stale_leaderboard_entry_found_when_the_sweep_code_tuned_the_key_elsewhere(monkeypatch):
    _fake_results(monkeypatch, sweep_git="a")
    st = ft.sweep_stale_leaderboard_entry()
    assert st is not None and (st["Z"], st["seq"], st["git"]) == (1, 65536, "a")
    assert st["fwd"] == "64x32, 4 warps, 2 stages" and not st["same_as_table"]


def test_no_stale_entry_when_the_cells_were_timed_by_later_code(monkeypatch):
    _fake_results(monkeypatch, sweep_git="b")
    assert ft.sweep_stale_leaderboard_entry() is None
