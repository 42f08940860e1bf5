"""The grid sweep (`just bench flash-grid`, results/attention/flash_grid): ours against cuDNN on every
cell a model meets, and which launch plan each cell ran.

A cell is (d, mask, batch x heads, seq), bf16; `speed_vs_cudnn` is cuDNN's median time over the
implementation's, both timed in one run (the goal, issue 18: at least 1 for ours in every cell). The
plan table reads `fast/tuned_configs.py` through the lookup rule the autograd Function uses.
"""

from __future__ import annotations

import functools

import matplotlib.pyplot as plt
import pandas as pd
import torch

from cs336_systems.attention.benchmarks.grid_sweep import KEY as GRID_KEY
from cs336_systems.attention.fast.table import SIZE_FALLBACK, _entry, size_class, table_key
from cs336_systems.attention.fast.tuned_configs import TUNED
from report import gpu_tests
from report.flash import IMPL_NAMES, MODE_WORDS
from report.flash_ab import HOST_BENCH
from report.registry import register
from report.results import format_value, load_results, markdown_table, newest, where, with_source
from report.units import span

GRID_BENCH = "attention/flash_grid"
CELL = ["d", "mask", "batch x heads", "seq"]
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
STEP_CELL = (128, "causal", "1 x 32", 32768)  # the 2026 training step's attention, as a CELL
CELL_16x4096 = (128, "causal", "1 x 16", 4096)
FULL_4096 = [(128, "full", f"1 x {h}", 4096) for h in (16, 32)]
LONG = 8192  # the page's "long sequences" start here
SHORT_MS = 1.5  # a cell under this in every run is one the host's time sets (the page's "short" cells)
EAGER_STEP = "ours: forward+backward step (Fn.apply, eager)"
EAGER_DISPATCH = "ours: forward+backward step (Fn.apply, eager, Triton's dispatch)"  # every launch dispatched
CUDNN_STEP = "cudnn: forward+backward step"
EAGER_LANE = "870951a1fa15"  # the first grid run whose eager d = 128 calls took fast/eager_lane.py
HOST_LANE = "94e6108c9dfa"  # the first flash-host run whose (batch, seq, d) eager step took the lane


@functools.cache
def _read(bench: str) -> pd.DataFrame:
    """Every row of a results file, read once (the results do not change during a build)."""
    return load_results(bench)


def _ok(bench: str) -> pd.DataFrame:
    df = _read(bench)
    return df[df["status"] == "ok"]


def _in_words(df: pd.DataFrame) -> pd.DataFrame:
    """The cell's columns in words: mask ("causal"/"full"), "batch x heads"."""
    return df.assign(mask=df.causal.map({True: "causal", False: "full"}),
                     **{"batch x heads": [f"{b} x {h}" for b, h in zip(df.batch, df.heads)]})


def level(s: pd.Series, name: str) -> pd.Index:
    return s.index.get_level_values(name)


def grid_rows(status: str | None = "ok") -> pd.DataFrame:
    """The sweep's newest row per cell (`--remeasure` after a new table adds rows), in words."""
    df = newest(_read(GRID_BENCH), GRID_KEY)
    return _in_words(df if status is None else df[df["status"] == status])


def newest_git(d: int | None = None) -> str:
    """The code of the grid's newest run, or of the newest that measured ours at head dim d."""
    rows = grid_rows() if d is None else where(grid_rows(), d=d, impl="ours")
    return str(rows.loc[rows.time_utc.idxmax(), "git"])


def _current(git: pd.Series, d: pd.Series) -> pd.Series:
    """Whether each row is from its head dim's newest version of ours."""
    return pd.Series([g == newest_git(int(x)) for g, x in zip(git, d)], index=git.index)


def earlier_cells() -> pd.Index:
    """Cells whose newest row of ours is from an earlier run than its head dim's newest (index as speeds())."""
    ours = where(grid_rows(), impl="ours", mode="fwd_bwd")
    return ours[~_current(ours.git, ours.d)].set_index(CELL).index.sort_values()


def run_gits() -> list[str]:
    """The grid runs' code, oldest first (the first: the table before the grid's keys were tuned)."""
    return list(newest(_ok(GRID_BENCH), ["git"], keep="first").git)


def speeds(impl: str = "ours", mode: str = "fwd_bwd", what: str = "speed_vs_cudnn",
           git: str | None = None) -> pd.Series:
    """Speed vs cuDNN (or `what`) per cell (index d, mask, batch x heads, seq) for one implementation and
    mode: the grid's newest rows, or the newest of one run's code (`git`)."""
    rows = grid_rows() if git is None else _in_words(newest(where(_ok(GRID_BENCH), git=git), GRID_KEY))
    return where(rows, impl=impl, mode=mode).set_index(CELL)[what].astype(float).sort_index()


def met(mode: str, d: int | None = None) -> pd.Series:
    """Ours' cells at cuDNN's speed or faster (at head dim d only, if given)."""
    s = speeds("ours", mode)
    s = s[s >= 1.0]
    return s if d is None else s[level(s, "d") == d]


def long_cells(mode: str = "fwd_bwd", git: str | None = None, **levels) -> pd.Series:
    """Ours' speed vs cuDNN in the cells from seq LONG whose levels equal the keywords (as speeds())."""
    s = speeds("ours", mode, git=git)
    for name, value in levels.items():
        s = s[level(s, name) == value]
    return s[level(s, "seq") >= LONG]


def beats(impl: str, mode: str = "fwd_bwd") -> pd.Series:
    """Per cell where `impl` was timed: is ours faster than it? (index: seq first)."""
    theirs = speeds(impl, mode)
    ours = speeds("ours", mode).reindex(theirs.index)
    return (ours > theirs).reorder_levels(["seq", "d", "mask", "batch x heads"]).sort_index()


def beats_from(impl: str, mode: str = "fwd_bwd") -> int:
    """The shortest sequence from which ours beats `impl` in every cell of every longer sequence too."""
    won = beats(impl, mode).groupby(level="seq").all()
    losing = won[~won].index
    return int(won.index[won.index > losing.max()].min()) if len(losing) else int(won.index.min())


def step(impl: str, mode: str, git: str | None = None) -> float:
    """Median ms at the step's cell: the grid's newest row, or the newest of the run of code `git`."""
    return float(speeds(impl, mode, "median_ms", git).loc[STEP_CELL])


def _by_seq(values: pd.DataFrame | pd.Series) -> pd.DataFrame:
    """Cells as rows (d, mask, batch x heads) and seq as columns."""
    wide = values.unstack("seq")
    wide.columns = [f"{n:,}" for n in wide.columns]
    return wide.reset_index()


def speed_table(impl: str = "ours", mode: str = "fwd_bwd") -> str:
    """impl's speed vs cuDNN per cell (columns: seq). OOM where the implementation ran out of memory;
    an empty cell: not timed (flex only at two lengths)."""
    df = where(grid_rows(status=None), impl=impl)
    # A failed row (status oom/error) stands for every mode of its cell that has no timing: the sweep
    # writes one such row when either mode fails.
    failed = df[df.status != "ok"].set_index(CELL).status.str.upper()
    ok = where(df, status="ok", mode=mode).set_index(CELL)
    # † marks a cell whose row is from an earlier run than its head dim's newest (a run stopped before it)
    current = _current(ok.git, level(ok, "d").to_series(index=ok.index))
    shown = pd.Series([format_value(float(v), ".2f") + ("" if c else " †")
                       for v, c in zip(ok.speed_vs_cudnn, current)], index=ok.index, dtype=object)
    shown = pd.concat([shown, failed[~failed.index.isin(shown.index)]])
    earlier = sorted(set(ok.git[~current]))
    return with_source(_by_seq(shown.sort_index()), GRID_BENCH, df[df.git.isin(set(ok.git))],
                       note=f"{IMPL_NAMES[impl]}, {MODE_WORDS[mode]}: cuDNN's time over this implementation's, same run;"
                       " above 1 is faster than cuDNN." + (f" † from an earlier run (git {', '.join(earlier)})." if earlier else ""))


def grid_figure() -> plt.Figure:
    """Ours' speed vs cuDNN against seq, forward+backward and forward: a colour per (d, mask), dashed 1 x 16."""
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.8), sharey=True)
    colours = dict(zip([(64, "causal"), (64, "full"), (128, "causal"), (128, "full")], plt.cm.tab10.colors))
    for ax, mode in zip(axes, ("fwd_bwd", "fwd")):
        s = speeds("ours", mode)
        for (d, mask, bh), line in s.groupby(level=["d", "mask", "batch x heads"]):
            ax.plot(level(line, "seq"), line.values, marker="o", ms=3,
                    color=colours[(d, mask)], ls="-" if bh == "1 x 32" else "--", label=f"d = {d}, {mask}, {bh}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        seqs = sorted(set(level(s, "seq")))
        ax.set_xticks(seqs, labels=[f"{n // 1024}k" for n in seqs])
        ax.set_xlabel("sequence length")
        ax.set_title(f"ours, {MODE_WORDS[mode]}")
    axes[0].set_ylabel("speed vs cuDNN (above 1: faster)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


# -- which launch plan each cell ran ---------------------------------------------------------------

def plan_label(kind: str, d: int, causal: bool, n_bh: int, seq: int) -> str:
    """Where a cell's launch plan comes from, by the Function's lookup rule (on a GPU)."""
    size = size_class(n_bh, seq, seq)
    entry = _entry(TUNED, kind, torch.bfloat16, d, causal, size)
    if entry is None:
        return "heuristic tiles"
    used = next(s for s in SIZE_FALLBACK[size] if table_key(torch.bfloat16, d, causal, s) in TUNED[kind])
    gluon = entry.get("gluon_ws") and d in (64, 128)  # the head dims the Gluon kernels take (fast/gluon/)
    return f"{used}, {'Gluon' if gluon else 'Triton'}"


def plans() -> pd.DataFrame:
    """Per grid cell: the forward's and the backward's plan source (index as speeds())."""
    cells = where(grid_rows(), impl="ours", mode="fwd_bwd").set_index(CELL).sort_index()
    earlier = set(earlier_cells())
    rows = [{kind: "earlier table †" if c.Index in earlier else
             plan_label(kind, c.Index[0], c.causal, c.batch * c.heads, c.Index[3]) for kind in ("fwd", "bwd")}
            for c in cells.itertuples()]
    return pd.DataFrame(rows, index=cells.index)


def plans_table() -> str:
    """Each cell's plan, forward / backward where they differ."""
    p = plans()
    both = pd.Series([f if f == b else f"{f} / {b}" for f, b in zip(p.fwd, p.bwd)], index=p.index)
    return markdown_table(_by_seq(both))


# -- the short cells, which the host's time sets ---------------------------------------------------

def runs_before_the_lane() -> list[str]:
    """The grid runs whose every eager call took the general path (oldest first)."""
    gits = run_gits()
    return gits[:gits.index(EAGER_LANE)]


def short_cells_across_runs() -> pd.DataFrame:
    """Ours' forward+backward ms per run before the eager lane (columns: git, oldest first) in the
    cells that took under SHORT_MS in every such run that measured them: the cells the host's time set."""
    ms = pd.DataFrame({git: speeds(what="median_ms", git=git) for git in runs_before_the_lane()})
    return ms[(ms.max(axis=1) < SHORT_MS) & (ms.notna().sum(axis=1) >= 2)]


HOST_SHAPE = {"batch": 16, "seq": 1024, "d": 64}  # batch 16 x 1,024, one head, d = 64
# What took host time off (the page's table): (change, shape, whether the run is the newest before
# the eager lane took the shape (else the newest), our piece, cuDNN's or None)
HOST_CHANGES = (
    ("the Gluon backward's launch, direct", HOST_SHAPE, False, "ours: Gluon backward launch, {}", None),
    ("the Gluon forward's launch, direct", HOST_SHAPE, False, "ours: Gluon forward launch, {}", None),
    ("every launch direct: the eager step", {"batch": 32, "seq": 1024, "d": 128}, False, EAGER_STEP, CUDNN_STEP),
    ("the C launcher called directly", {"batch": 16, "seq": 4096, "d": 128}, True, EAGER_STEP, CUDNN_STEP),
    ("the eager lane", {"batch": 16, "seq": 4096, "d": 128}, False, EAGER_STEP, CUDNN_STEP),
)


def host_changes() -> pd.DataFrame:
    """Per change: host µs of ours, of ours through Triton's dispatch, and of cuDNN's step, one run."""
    out = []
    for what, shape, before_lane, ours, cudnn in HOST_CHANGES:
        df = where(_ok(HOST_BENCH), **shape)
        if before_lane:
            df = df[df.run < df[df.git == HOST_LANE].run.min()]
        run = where(df, piece=ours.format("direct")).run.max()
        us = where(df, run=run).set_index("piece").host_us.astype(float)
        dispatch = EAGER_DISPATCH if ours == EAGER_STEP else ours.format("Triton's dispatch")
        out.append({"change": what, "shape": f"{shape['batch']} x {shape['seq']:,}, d = {shape['d']}",
                    "ours µs": us[ours.format("direct")],
                    "through the dispatch µs": float("nan") if what == "the eager lane" else us[dispatch],
                    "cuDNN's step µs": us[cudnn] if cudnn else float("nan"), "run": run})
    return pd.DataFrame(out).set_index("change")


def host_table() -> str:
    t = host_changes()
    used = _ok(HOST_BENCH)[_ok(HOST_BENCH).run.isin(t.run)]
    return with_source(t.drop(columns="run").reset_index(), HOST_BENCH, used, floatfmt=",.0f",
                       note="Host time of one call (µs, the GPU kept busy), one run a row: the newest at that shape,"
                       " the C launcher's the newest before the eager lane took it. — : not timed.")


# -- facts -----------------------------------------------------------------------------------------

FACTS = {
    "grid_cells": lambda: len(speeds()),
    "grid_met_fwd_bwd": lambda: len(met("fwd_bwd")),
    "grid_met_fwd_bwd_d128": lambda: len(met("fwd_bwd", 128)),
    "grid_met_fwd": lambda: len(met("fwd")),
    "grid_16x4096_causal_d128_before_lane": lambda: f"{before_the_lane_16x4096():.2f}",
    "grid_worst_fwd_bwd": lambda: f"{speeds().min():.2f}",
    "grid_beats_flash_from": lambda: f"{beats_from('flash'):,}",
    "grid_step_fwd_bwd": lambda: f'{step("cudnn", "fwd_bwd") / step("ours", "fwd_bwd"):.2f}',
    "grid_step_fwd": lambda: f'{step("cudnn", "fwd") / step("ours", "fwd"):.2f}',
    "grid_long_d64_full_before": lambda: span(long_cells(git=run_gits()[0], d=64, mask="full"), ".2f", "x"),
    "grid_long_d128_full_before": lambda: span(long_cells(git=run_gits()[0], d=128, mask="full"), ".2f", "x"),
    "grid_short_cells": lambda: len(short_cells_across_runs()),
    "grid_short_ms": lambda: span(short_cells_across_runs().stack(), ".2f"),
    "grid_short_below_ms": lambda: f"{SHORT_MS:.1f}",
}


# -- claims ----------------------------------------------------------------------------------------

def _fwd_bwd_met_in_gluon_cells() -> bool:
    """Forward+backward meets the goal in some cells but not all, each run by the Gluon kernels, under
    half of them at d = 128; the forward alone in some cells."""
    fb = met("fwd_bwd")
    gluon = all(p.endswith("Gluon") for p in plans().loc[fb.index].stack())
    return 0 < len(fb) < len(speeds()) and 0 < len(met("fwd_bwd", 128)) < len(fb) / 2 and gluon and len(met("fwd")) > 0


def before_the_lane_16x4096() -> float:
    """The 1 x 16 x 4,096 cell (d = 128, causal) in the last grid run before the eager lane."""
    return float(speeds(git=runs_before_the_lane()[-1]).loc[CELL_16x4096])


def _lane_levels_the_16x4096_cell() -> bool:
    """At 1 x 16 x 4,096, d = 128, causal: our backward alone (the A/B sweep) ahead of cuDNN's; the
    grid's forward+backward below 0.7x before the eager lane, at or above 1.0x with it."""
    from .flash_d128 import _over_now

    return bool(_over_now("1 x 16 x 4,096") > 1.0 and before_the_lane_16x4096() < 0.7
                and speeds().loc[CELL_16x4096] >= 1.0)


def _tuning_helped_non_causal(d: int) -> bool:
    """The long cells without the mask: faster against cuDNN than in the first run, on the large
    class's Gluon kernels; at d = 64 from under 0.9x to about even, at d = 128 still behind."""
    before, after = long_cells(git=run_gits()[0], d=d, mask="full"), long_cells(d=d, mask="full")
    return bool((after > before.reindex(after.index)).all() and set(plans().loc[after.index].fwd) == {"large, Gluon"}
                and (before.max() < 0.9 and after.min() > 0.95 if d == 64 else before.max() < after.min() and after.max() < 1))


def _short_cells_set_by_the_host() -> bool:
    """Whatever the shape: 16 times the work (seq 1,024 to 4,096, d 64, causal, 1 x 16) took less
    than twice the time in every run."""
    ms = short_cells_across_runs()
    small, big = (ms.loc[(64, "causal", "1 x 16", n)].dropna() for n in (1024, 4096))
    return len(ms) >= 12 and ms.max().max() < 3 * ms.min().min() and (big < 2 * small).all()


def _host_changes_cut_the_step() -> bool:
    """The direct launch took over 15% off the Gluon backward's launch, nothing off the forward's; the
    step-level changes under their run's dispatched step, the C launcher's further; all over 1.2x cuDNN's."""
    t = host_changes()
    cut = t["ours µs"] / t["through the dispatch µs"]
    return bool(cut.iloc[0] < 0.85 and cut.iloc[1] >= 0.95 and cut.iloc[2] < 1 and cut.iloc[3] < cut.iloc[2]
                and (t["ours µs"].iloc[2:] > 1.2 * t["cuDNN's step µs"].iloc[2:]).all())


def _d128_behind_by_the_backward() -> bool:
    """In every d = 128 cell from 4,096 that misses, the forward within 1% of cuDNN's or ahead, but the two
    4k ones without the mask; at the step's cell the backward alone behind cuDNN's, on the Gluon kernels."""
    s, f = speeds(), speeds("ours", "fwd")
    behind = s[(level(s, "d") == 128) & (level(s, "seq") >= 4096) & (s < 1.0)]
    bwd = {impl: step(impl, "fwd_bwd") - step(impl, "fwd") for impl in ("ours", "cudnn")}
    return bool(all(f.loc[c] >= 0.99 for c in behind.index if c not in FULL_4096) and bwd["cudnn"] < bwd["ours"]
                and set(plans().loc[STEP_CELL]) == {"huge, Gluon"})


register("flash", facts=FACTS, tables={
    "grid_ours_fwd_bwd": lambda: speed_table("ours", "fwd_bwd"), "grid_ours_fwd": lambda: speed_table("ours", "fwd"),
    "grid_flash": lambda: speed_table("flash", "fwd_bwd"), "grid_flex": lambda: speed_table("flex", "fwd_bwd"),
    "grid_plans": plans_table, "grid_host": host_table,
}, figures={"grid": grid_figure}, claims={
    # 2 d x 2 masks x 2 batch x heads x 6 lengths, each with ours against cuDNN
    "grid_states_every_cell": lambda: all(
        len(s) == 2 * 2 * 2 * len(SEQS) and s.notna().all() and sorted(set(level(s, "seq"))) == list(SEQS)
        for s in (speeds("ours", m) for m in ("fwd", "fwd_bwd"))),
    "goal_met_fwd_bwd_in_gluon_cells": _fwd_bwd_met_in_gluon_cells,
    # every long d = 128 cell: forward within 2% of cuDNN or faster, forward+backward behind in most
    # (at most a quarter ahead, by under 5%); the step's cell behind forward+backward, its forward not
    "d128_forward_even_backward_behind": lambda: (
        long_cells("fwd", d=128).min() > 0.98 and long_cells(d=128).max() < 1.05
        and (long_cells(d=128) >= 1).mean() <= 0.25
        and step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd") and step("ours", "fwd") <= step("cudnn", "fwd")),
    "d64_long_cells_within_5_percent": lambda: long_cells(d=64).min() > 0.95,
    "lane_levels_the_16x4096_cell": _lane_levels_the_16x4096_cell,
    "d128_step_and_long_full_cells_behind": lambda: bool(
        long_cells(d=128, mask="full").max() < 1.0 and step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd")),
    "d128_behind_by_the_backward": _d128_behind_by_the_backward,
    # the two 4k forwards without the mask short of cuDNN's, the same kernel ahead at 32,768
    "d128_full_4k_forwards_short": lambda: bool((speeds("ours", "fwd").loc[FULL_4096] < 1.0).all()
                                                and long_cells("fwd", d=128, mask="full", seq=32768).min() > 1.0),
    "short_sequences_furthest_behind": lambda: level(speeds(), "seq")[speeds().argmin()] <= 2048
    and speeds()[level(speeds(), "seq") <= 2048].min() < speeds()[level(speeds(), "seq") >= 4096].min(),
    "ours_leads_flash_and_flex_at_long_sequences": lambda: beats_from("flash") <= LONG
    and beats("flex").loc[32768].sum() > len(beats("flex").loc[32768]) / 2,
    "non_causal_d64_now_about_even": lambda: _tuning_helped_non_causal(64),
    "non_causal_d128_improved_still_behind": lambda: _tuning_helped_non_causal(128),
    "short_cells_set_by_the_host": _short_cells_set_by_the_host,
    "host_changes_cut_the_step_not_to_cudnn": _host_changes_cut_the_step,
    "gpu_tests_ran_the_grid_code": lambda: gpu_tests.log_git(gpu_tests.NEWEST_RUNS[0]) == newest_git(64) == newest_git(128),
    # the skips are the combinations the kernels do not take: fp32 tiles beyond shared memory, and
    # causal with n_q != n_k in the Gluon backwards
    "skips_are_untaken_combinations": lambda: {
        t.split("[")[0] for t in gpu_tests.outcomes().query("outcome == 'SKIPPED'").test} <= {
        "tests/test_flash_attention.py::test_gpu_one_pass_backward", "tests/test_flash_attention.py::test_gpu_tma",
        "tests/test_onepass_ws.py::test_gpu_gradients_match_the_reference",
        "tests/test_bwd128_ws.py::test_gpu_gradients_match_the_reference"},
})
