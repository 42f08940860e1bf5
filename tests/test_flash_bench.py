"""The FlashAttention benchmark and tuning code paths, run small on the CPU (kernels interpreted)."""

from __future__ import annotations

import collections
import time
import warnings

import pandas as pd
import pytest
import torch

from cs336_systems.attention import tiles
from cs336_systems.attention.benchmarks import flash_sweep
from cs336_systems.attention.fast import table as tables
from cs336_systems.attention.fast.plans import BwdPlan, FwdPlan, bwd_fields, bwd_plan, fwd_fields, fwd_plan
from cs336_systems.attention.fast.tuning import problem, tune
from cs336_systems.attention.flops import attention_flops
from cs336_systems.attention.tiles import BwdConfig, FwdConfig
from cs336_systems.bench.store import ResultStore
from tests.triton_mode import ON_GPU, pytestmark  # noqa: F401


def cpu_timer(fn, **_):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def test_flop_convention():
    fwd = attention_flops(16, 16384, 16384, 64, causal=False)
    assert fwd == 4 * 16 * 16384**2 * 64
    assert attention_flops(16, 16384, 16384, 64, causal=True) == fwd / 2
    assert attention_flops(1, 8, 8, 16, False, "fwd_bwd") == 3.5 * attention_flops(1, 8, 8, 16, False)
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 8, 8, 16, False, "both")


def test_config_keys_and_fallback(monkeypatch):
    assert tables.size_class(1, 2048, 2048) == "small"
    assert tables.size_class(1, 16384, 16384) == "medium"
    assert tables.size_class(16, 16384, 16384) == "large"
    assert tables.table_key(torch.float16, 80, True, "large") == "bf16-d128-causal-large"
    table = {"fwd": {"bf16-d64-causal-medium": {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}},
             "bwd": {}}
    monkeypatch.setattr(tables, "interpreting", lambda: False)
    # small borrows medium; a missing key falls back to the heuristic
    assert tables.lookup_fwd(table, torch.bfloat16, 64, True, 1, 512, 512) == FwdPlan(FwdConfig(64, 32, 4, 2))
    monkeypatch.setattr(tables, "_WARNED", set())
    with pytest.warns(tables.UntunedShapeWarning, match="bf16-d64-full-small"):
        assert tables.lookup_fwd(table, torch.bfloat16, 64, False, 1, 512, 512) == FwdPlan(tiles.heuristic_fwd(torch.bfloat16, 64))
    with pytest.warns(tables.UntunedShapeWarning, match="bwd plan for fp32-d128-causal-small"):
        assert tables.lookup_bwd(table, torch.float32, 80, True, 1, 512, 512) == BwdPlan(tiles.heuristic_bwd(torch.float32, 128))
    with warnings.catch_warnings():  # once per key and kind: the second lookup is quiet
        warnings.simplefilter("error")
        tables.lookup_fwd(table, torch.bfloat16, 64, False, 1, 512, 512)
    # under the interpreter every shape runs the 16-wide tiles, whatever the table says
    monkeypatch.setattr(tables, "interpreting", lambda: True)
    assert tables.lookup_fwd(table, torch.bfloat16, 64, True, 1, 512, 512) == FwdPlan(tiles.INTERPRETER_FWD)


def test_plans_read_back_the_fields_they_write():
    """Rows and the table store a plan as flat fields (the rows' fields since before plans existed)."""
    from cs336_systems.attention.fast.plans import GluonBwdConfig, GluonFwdConfig

    plans = [FwdPlan(FwdConfig(64, 32, 4, 2, tma=True)), FwdPlan(FwdConfig(128, 64), GluonFwdConfig(128, 3, 2))]
    assert [fwd_plan(fwd_fields(p)) for p in plans] == plans
    plans = [BwdPlan(BwdConfig(32, 128, 128, 32, fused=True, tma2=True)), BwdPlan(BwdConfig(64, 64, 64, 64), one_pass=True),
             BwdPlan(BwdConfig(32, 128, 128, 32), gluon=GluonBwdConfig(3, 2, 88))]
    assert [bwd_plan(bwd_fields(p)) for p in plans] == plans
    assert list(bwd_fields(plans[0])) == ["block_m1", "block_n1", "block_m2", "block_n2", "num_warps1", "num_stages1",
                                          "num_warps2", "num_stages2", "fused", "one_pass", "tma1", "tma2", "gluon_ws",
                                          "ws_stages", "ws_slots", "ws_dq_regs"]
    # the committed table's entries are plans of this form
    from cs336_systems.attention.fast.tuned_configs import TUNED

    for kind, read in (("fwd", fwd_plan), ("bwd", bwd_plan)):
        assert all(read(entry) for entry in TUNED[kind].values())


def test_table_picks_the_fastest_of_the_latest_run():
    def row(kernel, config, ms, run="2"):
        return {"key": "k", "kernel": kernel, "config": config, "ms": ms, "run": run, "status": "ok"}
    fwd_a, fwd_b = {"block_m": 64}, {"block_m": 128}
    dkdv = {"block_m1": 32, "block_n1": 128, "num_warps1": 4, "num_stages1": 3,
            "block_m2": 64, "block_n2": 32, "num_warps2": 4, "num_stages2": 2, "fused": False}
    dq = {**dkdv, "block_m2": 128, "block_n2": 16, "num_warps2": 8, "num_stages2": 5}
    rows = [row("fwd", fwd_a, 1.0), row("fwd", fwd_b, 0.5), row("fwd", fwd_a, 0.1, run="1"),
            row("dkdv", dkdv, 2.0), row("dq", dq, 1.0)]
    table = tune.choose(rows)
    assert table["fwd"]["k"] == fwd_b  # the faster row of run "1" is stale
    assert table["bwd"]["k"] == {**dkdv, "block_m2": 128, "block_n2": 16, "num_warps2": 8, "num_stages2": 5}
    fused = {**dkdv, "fused": True}
    assert tune.choose(rows + [row("fused", fused, 2.9)])["bwd"]["k"] == fused
    assert tune.choose(rows + [row("fused", fused, 3.1)])["bwd"]["k"]["fused"] is False
    one_pass = {**dkdv, "one_pass": True}  # must beat the best of two-pass and fused
    assert tune.choose(rows + [row("fused", fused, 2.9), row("onepass", one_pass, 2.8)])["bwd"]["k"] == one_pass
    assert tune.choose(rows + [row("fused", fused, 2.9), row("onepass", one_pass, 2.95)])["bwd"]["k"] == fused
    assert tune.choose(rows + [row("onepass", one_pass, 3.1)])["bwd"]["k"]["fused"] is False
    # confirmation rounds overrule the single timings: fwd_a's median (0.4) beats fwd_b's (0.6),
    # though fwd_b had the fastest single timing and one lucky round
    again = [dict(row("fwd", c, ms), phase="confirm") for c, ms in
             ((fwd_a, 0.4), (fwd_b, 0.3), (fwd_a, 0.45), (fwd_b, 0.6), (fwd_a, 0.4), (fwd_b, 0.7))]
    assert tune.choose(rows + again)["fwd"]["k"] == fwd_a


def test_table_takes_a_key_from_its_own_shape():
    """A later run at another shape of the same key (the sweep's batch 1 at 65,536 for the
    leaderboard's key) does not replace the leaderboard shape's choice."""
    key, Z, N = tune.tune_shapes("leaderboard")[0][:3]
    assert key not in [s[0] for s in tune.tune_shapes("sweep")]

    def row(config, ms, run, z, n):
        return {"key": key, "kernel": "fwd", "config": config, "ms": ms, "run": run, "status": "ok", "Z": z, "seq": n}
    own, other = {"block_m": 128}, {"block_m": 64}
    rows = [row(own, 1.0, "1", Z, N), row(other, 0.5, "1", Z, N), row(own, 0.1, "2", 1, 4 * N)]
    assert tune.choose(rows)["fwd"][key] == other  # run "2" is at another shape: ignored
    assert tune.choose(rows[:2] + [row(own, 0.1, "2", Z, N)])["fwd"][key] == own


def test_table_adds_the_gluon_backward_where_the_tuner_timed_it_fastest():
    dkdv = {"block_m1": 64, "block_n1": 64, "num_warps1": 4, "num_stages1": 3,
            "block_m2": 64, "block_n2": 32, "num_warps2": 4, "num_stages2": 2, "fused": False}

    def row(kernel, config, ms, run="1"):
        return {"key": "k", "kernel": kernel, "config": config, "ms": ms, "run": run, "status": "ok"}
    ws = bwd_fields(tune.ws_from((3, 2, 88), torch.bfloat16, 64))
    rows = [row("dkdv", dkdv, 2.0), row("dq", dkdv, 1.0)]
    assert "gluon_ws" not in tune.choose(rows)["bwd"]["k"]
    won = tune.choose(rows + [row("ws", ws, 2.9)])["bwd"]["k"]
    # the Gluon settings, and the Triton fields of the best Triton backward (for inputs it does not take)
    assert won == {**dkdv, "gluon_ws": True, "ws_stages": 3, "ws_slots": 2, "ws_dq_regs": 88}
    assert bwd_plan(won).gluon is not None
    assert "gluon_ws" not in tune.choose(rows + [row("ws", ws, 3.1)])["bwd"]["k"]
    # a later run that re-timed only the Gluon kernel decides for it; the others keep their run
    later = tune.choose(rows + [row("ws", ws, 2.9), row("ws", ws, 3.2, run="2")])["bwd"]["k"]
    assert later == dkdv
    assert tune.ws_candidates(torch.float32, 64, True) == [] and tune.ws_candidates(torch.bfloat16, 80, True) == []
    assert tune.ws_candidates(torch.bfloat16, 128, True)  # d = 128 has its own Gluon kernel


def test_table_adds_the_gluon_forward_where_the_tuner_timed_it_fastest():
    fwd = fwd_fields(FwdPlan(FwdConfig(128, 64, 8, 4)))
    ws = fwd_fields(tune.fwd_ws_from((64, 5, 3), torch.bfloat16, 64))

    def row(kernel, config, ms, run="1"):
        return {"key": "k", "kernel": kernel, "config": config, "ms": ms, "run": run, "status": "ok"}
    plain = {k: v for k, v in fwd.items() if k != "gluon_ws" and not k.startswith("ws_")}
    assert tune.choose([row("fwd", fwd, 1.3)])["fwd"]["k"] == plain
    won = tune.choose([row("fwd", fwd, 1.3), row("fwd_ws", ws, 1.2)])["fwd"]["k"]
    assert won == {**plain, "gluon_ws": True, "ws_block_n": 64, "ws_stages": 5, "ws_warpgroups": 3}
    assert fwd_plan(won).gluon is not None
    assert "gluon_ws" not in tune.choose([row("fwd", fwd, 1.3), row("fwd_ws", ws, 1.4)])["fwd"]["k"]
    assert tune.fwd_ws_candidates(torch.float32, 64, True) == [] and tune.fwd_ws_candidates(torch.bfloat16, 32, True) == []


@pytest.mark.skipif(ON_GPU, reason="the CPU variant of the flow; on a GPU the real benchmarks run instead")
def test_tune_flow_on_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(problem, "DEVICE", "cpu")
    monkeypatch.setattr(tune, "DTYPES", {"bf16": torch.float32})
    monkeypatch.setattr("cs336_systems.bench.timing.gpu_bench", cpu_timer)
    monkeypatch.setattr(tune, "fwd_candidates", lambda *a: [FwdConfig(16, 16, 1, 1), FwdConfig(32, 16, 1, 1)])
    monkeypatch.setattr(tune, "dkdv_candidates", lambda *a: [(16, 16, 1, 1), (16, 32, 1, 1)])
    monkeypatch.setattr(tune, "dq_candidates", lambda *a: [(16, 16, 1, 1)])
    monkeypatch.setattr(tune, "heuristic_fwd", lambda *a: FwdConfig(16, 16, 1, 1))
    monkeypatch.setattr(tune, "heuristic_bwd", lambda *a: BwdConfig(16, 16, 16, 16, 1, 1, 1, 1))
    monkeypatch.setattr(tune, "ws_candidates", lambda *a: [(2, 2, 80)])  # the Gluon kernels: Hopper only
    monkeypatch.setattr(tune, "fwd_ws_candidates", lambda *a: [(64, 4, 3)])
    store = ResultStore(tune.BENCH, key=["key", "kernel", "config", "run"], device="cpu", root=tmp_path)
    shape = ("bf16-d16-causal-large", 1, 40, 16, "bf16", False)
    tune.tune(store, [shape], None)
    rows = store.rows()
    assert {r["kernel"] for r in rows} == {"fwd", "fwd_ws", "dkdv", "dq", "fused", "onepass", "ws"}
    # where a Gluon kernel cannot run, its candidate is recorded as such, not timed as a Triton fallback
    for kind in ("ws", "fwd_ws"):
        (ws,) = [r for r in rows if r["kernel"] == kind]
        assert ws["status"] == "unsupported" and "Hopper" in ws["error"]
    rows = [r for r in rows if r["kernel"] not in ("ws", "fwd_ws")]
    first = [r for r in rows if r.get("phase") != "confirm"]
    # rel_err: normwise against float64, fp32 under the interpreter: tests/test_flash_attention.py's
    # tolerance() derives 1e-5 (errors concentrate near sqrt(N) u ~ 1e-6; a wrong kernel is O(1))
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in first)
    again = collections.Counter(r["kernel"] for r in rows if r.get("phase") == "confirm")
    timed = collections.Counter(r["kernel"] for r in first)  # each tiling with and without TMA
    assert again == {k: min(n, tune.CONFIRM_TOP) * tune.CONFIRM_ROUNDS for k, n in timed.items() if n > 1}
    table = tune.choose(rows)
    assert set(table["fwd"]) == set(table["bwd"]) == {"bf16-d16-causal-large"}
    assert "gluon_ws" not in table["bwd"]["bf16-d16-causal-large"]
    # a run of some kernels only (--kinds) adds their rows; the table keeps the others' latest run
    time.sleep(1)  # runs are named by the second
    tune.tune(store, [shape], None, kinds=("fwd",))
    assert {r["kernel"] for r in store.rows() if r["run"] == max(r["run"] for r in store.rows())} == {"fwd"}
    assert set(tune.choose(store.rows())["bwd"]) == {"bf16-d16-causal-large"}


def test_tuner_times_each_key_under_its_own_mask(monkeypatch):
    """A non-causal key's candidates run (and are checked) with the non-causal kernels, a causal
    key's with the causal ones: the mask comes from the key."""
    from cs336_systems.attention import flash_launch

    seen = []
    real = flash_launch.launch_fwd
    monkeypatch.setattr(problem, "DEVICE", "cpu")
    monkeypatch.setattr(flash_launch, "launch_fwd", lambda q, k, v, causal, *a: seen.append(causal) or real(q, k, v, causal, *a))
    monkeypatch.setattr(problem, "launch_fwd", flash_launch.launch_fwd)
    for key, causal in (("bf16-d16-full-large", False), ("bf16-d16-causal-large", True)):
        seen.clear()
        fn = tune._runner("fwd", FwdPlan(FwdConfig(16, 16, 1, 1)), problem.prepare(1, 32, 16, torch.float32, causal),
                          tune.key_is_causal(key))
        fn()
        assert seen == [causal, causal]  # the problem's forward, then the candidate's


def test_the_functions_cached_plans_are_the_tables(monkeypatch):
    """FlashAttentionFast builds each plan once (host time); the cached plan is what the lookup gives,
    and the interpreter's tiles never leak into a GPU call's plan or the other way round."""
    from cs336_systems.attention.fast import function
    from cs336_systems.attention.fast.tuned_configs import TUNED

    for interp in (False, True):
        monkeypatch.setattr(tables, "interpreting", lambda interp=interp: interp)
        for n_bh, seq, d, causal in ((16, 16384, 64, True), (32, 8192, 128, False), (32, 32768, 128, True), (1, 64, 16, True)):
            size = tables.size_class(n_bh, seq, seq)
            want_f = tables.lookup_fwd(TUNED, torch.bfloat16, d, causal, n_bh, seq, seq)
            want_b = tables.lookup_bwd(TUNED, torch.bfloat16, d, causal, n_bh, seq, seq)
            assert function.tuned_plan("fwd", torch.bfloat16, d, causal, size, interp) == want_f
            assert function.tuned_plan("bwd", torch.bfloat16, d, causal, size, interp) == want_b
    assert function.tuned_plan("fwd", torch.bfloat16, 64, True, "large", False) != function.tuned_plan(
        "fwd", torch.bfloat16, 64, True, "large", True)


def test_grid_keys_cover_both_masks_and_the_training_steps_cell():
    shapes = tune.tune_shapes("grid")
    keys = {s[0] for s in shapes}
    assert {"bf16-d64-full-medium", "bf16-d64-full-large", "bf16-d128-full-medium", "bf16-d128-full-large"} <= keys
    # the 2026 training step's attention, 32 heads x 32,768 at d = 128, is its own size class
    assert tables.size_class(32, 32768, 32768) == "huge" and "bf16-d128-causal-huge" in keys
    for key, Z, N, d, dt, _ in shapes:  # each key is tuned at a shape of its own class
        assert tables.table_key(torch.bfloat16, d, tune.key_is_causal(key), tables.size_class(Z, N, N)) == key


@pytest.mark.skipif(ON_GPU, reason="the CPU variant of the flow; on a GPU the real benchmarks run instead")
def test_sweep_flow_on_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(flash_sweep, "DEVICE", "cpu")
    monkeypatch.setattr(flash_sweep, "gpu_bench", cpu_timer)
    monkeypatch.setattr(flash_sweep, "PYTORCH_FA2_MAX_SEQ", 32)
    from cs336_systems.attention import flash_pytorch  # compiling on 2 CPU cores is a test of its own (slow)

    monkeypatch.setattr(flash_pytorch, "compiled_attention_backward", flash_pytorch.attention_backward)
    args = type("Args", (), dict(results_dir=tmp_path, impls=["triton", "naive", "pytorch", "sdpa"], dtypes=["fp32"],
                                 dims=[16], seqs=[32, 48], modes=["fwd", "bwd", "fwd_bwd"], workers=1, max_minutes=5,
                                 remeasure=False))
    monkeypatch.setattr(flash_sweep.torch.cuda, "is_available", lambda: False)
    flash_sweep.run(args)
    store = ResultStore(flash_sweep.BENCH, key=["impl"], root=tmp_path)
    rows = store.rows()
    status = {(r["impl"], r["seq"], r["mode"]): r["status"] for r in rows}
    assert len(rows) == 4 * 2 * 3
    assert all(status[("triton", n, m)] == "ok" and status[("naive", n, m)] == "ok" for n in (32, 48)
               for m in ("fwd", "bwd", "fwd_bwd"))
    assert status[("pytorch", 32, "bwd")] == "ok" and status[("pytorch", 48, "fwd")] == "unsupported"
    assert status[("sdpa", 32, "fwd")] == "unsupported"  # no fp32 kernels
    first = rows[0]["invocation"]
    flash_sweep.run(args, ResultStore(flash_sweep.BENCH, flash_sweep.KEY, root=tmp_path, invocation=first))
    assert len(store.rows()) == len(rows)  # --resume of a finished run: nothing left to do
    args.impls = ["triton", "sdpa"]  # after a kernel change: ours measured again, the skips stay
    flash_sweep.run(args)  # a new run
    again = store.rows()[len(rows):]
    assert sorted((r["impl"], r["seq"], r["mode"]) for r in again) == sorted(
        ("triton", n, m) for n in (32, 48) for m in ("fwd", "bwd", "fwd_bwd"))
    assert {r["invocation"] for r in again} != {first}
    newest = pd.DataFrame(store.rows()).drop_duplicates(["impl", "dtype", "d", "seq", "mode"], keep="last")
    assert len(newest) == len(rows) and set(newest[newest.impl == "triton"].ms) == {r["ms"] for r in again}
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in ok)


def test_benchmarks_refuse_bad_arguments(capsys):
    from cs336_systems.attention.benchmarks import leaderboard

    for main, argv, message in ((leaderboard.main, ["--impls", "cudnn,magic"], "--impls"),
                                (leaderboard.main, ["--batch", "16", "--heads", "5"], "--heads"),
                                (flash_sweep.main, ["--dims", "8"], "--dims"),
                                (flash_sweep.main, ["--modes", "sideways"], "--modes")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_leaderboard_clock_summary():
    from cs336_systems.attention.benchmarks import leaderboard
    from cs336_systems.profiling.clocks import ClockSampler

    sampler = ClockSampler()
    sampler.samples = [[0.5, 1980.0, 1980.0, 650.0, 50.0], [1.0, 1800.0, 1980.0, 700.0, 55.0],
                       [1.5, 1850.0, 1980.0, None, 56.0]]
    assert leaderboard.clock_summary(sampler) == {"sm_mhz_median": 1850.0, "sm_mhz_min": 1800.0, "power_w_median": 675.0}
    assert leaderboard.clock_summary(ClockSampler()) == {"sm_mhz_median": None, "sm_mhz_min": None, "power_w_median": None}


def test_table_counts_fp32_rows_only_if_their_dots_were_true_fp32():
    """The table serves PyTorch's default fp32 setting (true fp32 dots): an fp32 row timed with TF32
    dots, or from before rows said (no `fp32_dots`), times other kernels and is ignored, however fast."""
    key = "fp32-d64-causal-medium"

    def row(config, ms, run, **dots):
        return {"key": key, "kernel": "fwd", "config": config, "ms": ms, "run": run, "status": "ok", **dots}
    ieee, tf32 = {"block_m": 32}, {"block_m": 128}
    assert tune.choose([row(tf32, 0.1, "1")])["fwd"] == {}  # before the field existed: the TF32 era
    assert tune.choose([row(tf32, 0.1, "2", fp32_dots="tf32"), row(ieee, 0.5, "1", fp32_dots="ieee")])["fwd"][key] == ieee
    bf16 = {**row(tf32, 0.1, "1"), "key": "bf16-d64-causal-medium"}  # not fp32: no field needed
    assert tune.choose([bf16])["fwd"]["bf16-d64-causal-medium"] == tf32


def test_tune_shapes_filter_by_dtype_and_tune_fp32_at_the_medium_shape_only():
    fp32 = tune.tune_shapes("sweep", ("fp32",))
    assert fp32 and all(s[4] == "fp32" and s[0].endswith("-medium") and s[2] == 16384 for s in fp32)
    assert {s[3] for s in fp32} == {16, 32, 64, 128}
    assert all(s[4] == "bf16" for s in tune.tune_shapes(None, ("bf16",)))
    assert tune.tune_shapes(None) == tune.tune_shapes(None, ("bf16", "fp32"))
