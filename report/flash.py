"""The flash chapter's leaderboard (batch 16 with the heads folded in, 16,384 positions, d = 64, bf16,
causal): one row per (run, implementation, mode); the chapter quotes the *headline run*, the newest
that timed every implementation at the course's 10 s. Also the helpers the other flash modules share.
"""

from __future__ import annotations

import re

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT
from report import gpu_tests
from report.registry import register
from report.results import load_results, where, with_source

LB_BENCH = "attention/flash_leaderboard"
LB = dict(batch=16, seq=16384, d=64)  # the leaderboard case
LB_KEY = "bf16-d64-causal-large"  # its entry in the tuned table (the sweep's bf16, d = 64, 65,536 cells use it too)
IMPL_NAMES = {"ours": "ours", "cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2 CUDA)",
              "flex": "flex_attention", "naive": "naive, torch.compile"}
MODE_WORDS = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
ALL_TRITON, ALL_GLUON = "Triton forward, Triton backward", "Gluon forward, Gluon backward"
# Which of our kernels each run timed at the leaderboard key (the tuned table then, as the results'
# commit messages say). A new run must be added here: flash.every_run_names_its_kernels fails until it is.
KERNELS_BY_GIT = {
    **dict.fromkeys(["a8e302062c11", "11a4e5b4cfd9", "20201d038c9c", "df107f57b502", "ea5a58f90003",
                     "fa876024134e", "793db780cbec", "ad91fb53dbbf"], ALL_TRITON),
    **dict.fromkeys(["6e43da17bb07", "b1c97d801eb9", "5fca10db0bce"], "Triton forward, Gluon backward"),
    "046bb7a0ebb2": ALL_GLUON,
}
GLUON_LOG = "nvidia-h200-gluon-kernels.log"  # the Gluon kernels' own GPU test log
ERRORS = ("o", "dq", "dk", "dv")  # the outputs and gradients whose relative error each row records


def first_value(rows: pd.DataFrame, column: str, missing: str) -> float:
    """The column's value in the first row; a KeyError saying `missing` where there is no row."""
    if rows.empty:
        raise KeyError(missing)
    return float(rows[column].iloc[0])


def round_stats(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Median, min and max ms over a run's interleaved rounds, and how many rounds, one row per keys."""
    return df.groupby(keys, as_index=False).agg(median_ms=("ms", "median"), min_ms=("ms", "min"),
                                                max_ms=("ms", "max"), rounds=("ms", "size"))


def leaderboard_rows() -> pd.DataFrame:
    return load_results(LB_BENCH, status="ok")


def headline_run(df: pd.DataFrame) -> str:
    """The newest run of every implementation at the course's 10 s, else the newest complete run, else the newest."""
    complete = [run for run, g in df.groupby("run") if set(IMPL_NAMES) <= set(g.impl)]
    full_rep = [run for run in complete if (df[df.run == run].rep_ms >= 10000).all()]
    return max(full_rep or complete or list(df.run))


def headline_rows() -> pd.DataFrame:
    df = leaderboard_rows()
    return df[df.run == headline_run(df)]


def per_run(mode: str) -> pd.DataFrame:
    """run -> mean ms, one column per implementation (runs in time order), plus `git` and `kernels`."""
    df = leaderboard_rows()
    t = where(df, mode=mode).pivot_table(index="run", columns="impl", values="mean_ms")
    git = df.groupby("run").git.first()
    return t.assign(git=git, kernels=git.map(KERNELS_BY_GIT)).sort_index()


def run_speedups() -> pd.Series:
    """cuDNN's forward+backward time over ours, per run in time order (above 1: ours is faster)."""
    t = per_run("fwd_bwd")
    return t.cudnn / t.ours


def speed(mode: str = "fwd_bwd", run: str | None = None) -> float:
    return lb("cudnn", mode, run=run) / lb("ours", mode, run=run)


def lb(impl: str, mode: str, col: str = "mean_ms", run: str | None = None) -> float:
    df = leaderboard_rows()
    run = run or headline_run(df)
    return first_value(where(df, run=run, impl=impl, mode=mode), col,
                       f"no leaderboard row for impl={impl!r} mode={mode!r} in run {run}")


def backward_ms(impl: str, run: str | None = None) -> float:
    return lb(impl, "fwd_bwd", run=run) - lb(impl, "fwd", run=run)


def fwd_margin() -> float:
    return abs(lb("ours", "fwd") / lb("cudnn", "fwd") - 1)


def cudnn_fwd_spread() -> float:
    """cuDNN's slowest forward over its fastest, across the runs, less 1: the runs' noise."""
    cudnn = per_run("fwd").cudnn
    return cudnn.max() / cudnn.min() - 1


def best_run() -> str:
    """The fastest forward+backward run of the course's kernels alone (Triton forward and backward)."""
    t = per_run("fwd_bwd")
    return str(t[t.kernels == ALL_TRITON].ours.idxmin())


def runs_with_forward(kernel: str) -> pd.DataFrame:
    t = per_run("fwd")
    return t[t.kernels.str.startswith(f"{kernel} forward")]


def in_words(rows: pd.DataFrame) -> pd.DataFrame:
    """Leaderboard rows with implementation and mode in words, forward+backward first, fastest first."""
    return rows.assign(implementation=rows.impl.map(IMPL_NAMES), mode=rows["mode"].map(MODE_WORDS)).sort_values(
        ["mode", "mean_ms"], ascending=[False, True])


def leaderboard_table() -> str:
    run = in_words(headline_rows())
    names = {"mean_ms": "mean ms", "median_ms": "median ms", "tflops": "TFLOP/s", "speed_vs_cudnn": "speed vs cuDNN"}
    shown = run[["mode", "implementation", *names]].rename(columns=names)
    return with_source(shown, LB_BENCH, run, floatfmt=".3f", formats={"TFLOP/s": ".0f"})


def history_table() -> str:
    """One row per run: our kernels and cuDNN's, forward+backward and forward, mean ms."""
    fb, fw = per_run("fwd_bwd"), per_run("fwd")
    rep = leaderboard_rows().groupby("run").rep_ms.max() / 1000
    shown = pd.DataFrame({
        "run": fb.index, "git": fb.git, "our kernels": fb.kernels,
        "ours fwd+bwd ms": fb.ours, "cuDNN fwd+bwd ms": fb.cudnn, "speed vs cuDNN": fb.cudnn / fb.ours,
        "ours fwd ms": fw.ours, "cuDNN fwd ms": fw.cudnn, "fwd speed vs cuDNN": fw.cudnn / fw.ours,
        "rep s": rep.reindex(fb.index)})
    return with_source(shown, LB_BENCH, floatfmt=".3f", formats={"rep s": "g"})


def gpu_test_summary(log: str) -> str:
    """pytest's outcomes in a GPU test log written without -v (report/gpu_tests reads the -v ones)."""
    text = (REPO_ROOT / "results" / "attention" / "flash_gpu_tests" / log).read_text()
    summary = [line.strip("= \n") for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    # "471 passed, 26 skipped, 163 warnings in 233.29s (0:03:53)" -> "471 passed, 26 skipped"
    return re.sub(r"(, \d+ warnings?)? in [\d.]+s.*$", "", summary[-1])


FACTS = {
    "lb_ours_ms": lambda: f'{lb("ours", "fwd_bwd"):.3f}',
    "lb_cudnn_ms": lambda: f'{lb("cudnn", "fwd_bwd"):.3f}',
    "lb_speedup": lambda: f"{speed():.3f}",
    "lb_ours_fwd_ms": lambda: f'{lb("ours", "fwd"):.3f}',
    "lb_fwd_speedup": lambda: f'{speed("fwd"):.3f}',
    "lb_ours_bwd_ms": lambda: f'{backward_ms("ours"):.3f}',
    "lb_cudnn_bwd_ms": lambda: f'{backward_ms("cudnn"):.3f}',
    "lb_fwd_gap_us": lambda: f'{abs(lb("ours", "fwd") - lb("cudnn", "fwd")) * 1e3:.0f}',
    "lb_err_max": lambda: f'{max(lb("ours", "fwd_bwd", f"rel_err_{g}") for g in ERRORS):.1e}',
    "lb_runs": lambda: len(per_run("fwd_bwd")),
    "lb_first_speedup": lambda: f"{run_speedups().iloc[0]:.3f}",
    "lb_triton_speedup": lambda: f"{speed(run=best_run()):.3f}",
    "lb_triton_bwd_ms": lambda: f'{backward_ms("ours", best_run()):.3f}',
    "lb_triton_cudnn_bwd_ms": lambda: f'{backward_ms("cudnn", best_run()):.3f}',
    # the newest run with our Triton forward
    "lb_tfwd_ms": lambda: f'{lb("ours", "fwd", run=runs_with_forward("Triton").index.max()):.3f}',
    "lb_tfwd_cudnn_ms": lambda: f'{lb("cudnn", "fwd", run=runs_with_forward("Triton").index.max()):.3f}',
    "lb_fwd_margin_pct": lambda: f"{fwd_margin():.1%}",
    "lb_cudnn_fwd_spread_pct": lambda: f"{cudnn_fwd_spread():.1%}",
    "gpu_tests": lambda: "{PASSED} passed, {SKIPPED} skipped".format(**gpu_tests.counts()),
    "gpu_tests_git": lambda: gpu_tests.log_git(gpu_tests.NEWEST_RUNS[0]),  # the whole set's
    "gpu_tests_log": lambda: ", ".join(f"`{(gpu_tests.LOG_DIR / log).relative_to(REPO_ROOT)}`"
                                       for log in gpu_tests.NEWEST_RUNS),
    "gpu_tests_gluon": lambda: gpu_test_summary(GLUON_LOG),
}


def _runs_ahead_are_newest_and_gluon() -> bool:
    t, ahead = per_run("fwd_bwd"), run_speedups() >= 1
    n = int(ahead.sum())
    return n >= 1 and ahead.iloc[-n:].all() and t[ahead].kernels.str.contains("Gluon backward").all()


def _gpu_logs_pass() -> bool:
    """No test failed or was cut in the newest run, nor failed in the Gluon kernels' own log."""
    c = gpu_tests.counts()
    gluon = gpu_test_summary(GLUON_LOG)
    return (c["FAILED"] == c["ERROR"] == c["UNFINISHED"] == 0 and c["PASSED"] > 0 and "passed" in gluon
            and "failed" not in gluon)


register("flash", facts=FACTS, tables={"leaderboard": leaderboard_table, "history": history_table}, claims={
    "every_run_names_its_kernels": lambda: set(leaderboard_rows().git) <= set(KERNELS_BY_GIT),
    "ours_at_least_cudnns_speed": lambda: speed() > 1 and speed("fwd") >= 1,
    "headline_run_is_all_gluon": lambda: per_run("fwd_bwd").kernels[headline_run(leaderboard_rows())] == ALL_GLUON,
    "triton_alone_stays_below_cudnn": lambda: (run_speedups()[per_run("fwd_bwd").kernels == ALL_TRITON] < 1).all(),
    "difference_is_the_backward": lambda: abs(backward_ms("ours") - backward_ms("cudnn"))
    > abs(lb("ours", "fwd") - lb("cudnn", "fwd")),
    "forwards_are_level": lambda: fwd_margin() < cudnn_fwd_spread() < 0.03,
    "runs_at_cudnns_speed_are_newest_and_gluon": _runs_ahead_are_newest_and_gluon,
    "we_pass_the_others": lambda: all(lb("ours", "fwd_bwd") < lb(i, "fwd_bwd") for i in ("flash", "flex", "naive")),
    # bf16 keeps 8 significant bits: two kernels that each round once differ by up to about 2 * 2^-8 relative
    "errors_are_bf16_rounding": lambda: all(lb("ours", "fwd_bwd", f"rel_err_{g}") < 2 * 2**-8 for g in ERRORS),
    "gpu_tests_pass": _gpu_logs_pass,
    # the predictions written before the first run: forward about 1.5 ms, forward+backward 6.5 ms
    "predictions_were_pessimistic": lambda: per_run("fwd").ours.max() < 1.5 and per_run("fwd_bwd").ours.max() < 6.5,
    "gluon_forward_beats_triton_forward": lambda: runs_with_forward("Gluon").ours.max()
    < runs_with_forward("Triton").ours.min(),
})
