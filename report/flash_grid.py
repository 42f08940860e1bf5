"""The grid sweep (`just bench flash-grid`, results/attention/flash_grid): ours against cuDNN on every
cell a model meets, and which launch plan each cell ran.

A cell is (d, mask, batch x heads, seq), bf16. Each row carries `speed_vs_cudnn`: cuDNN's median time
over the implementation's, both timed in the same run and process (above 1: faster than cuDNN). The
goal (issue 18) is a speed of at least 1 for ours in every cell, forward+backward and forward alone.
The plan table reads `fast/tuned_configs.py` through the lookup rule the autograd Function uses.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import pandas as pd
import torch

from cs336_systems.attention.benchmarks.grid_sweep import KEY as GRID_KEY
from cs336_systems.attention.fast.table import SIZE_FALLBACK, _entry, size_class, table_key
from cs336_systems.attention.fast.tuned_configs import TUNED
from report import gpu_tests
from report.flash import IMPL_NAMES, MODE_WORDS, first_value, low_high
from report.flash_ab import HOST_BENCH
from report.registry import register
from report.results import REPO_ROOT, format_value, load_results, markdown_table, newest, where, with_source

GRID_BENCH = "attention/flash_grid"
TUNE_BENCH = "attention/flash_tune"
CELL = ["d", "mask", "batch x heads", "seq"]
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
STEP_CELL = (128, "causal", "1 x 32", 32768)  # the 2026 training step's attention, as a CELL
STEP_KEY = "bf16-d128-causal-huge"  # the table key the step's cell runs (plans_table)
LONG = 8192  # the page's "long sequences" start here
SHORT_MS = 1.5  # a cell under this in every run is one the host's time sets (the page's "short" cells)
PROFILE = REPO_ROOT / "results" / "attention" / "host_overhead" / "profile-eager-step-b21f8afc27ee.txt"
EAGER_STEP = "ours: forward+backward step (Fn.apply, eager)"
EAGER_DISPATCH = "ours: forward+backward step (Fn.apply, eager, Triton's dispatch)"  # every launch dispatched
CUDNN_STEP = "cudnn: forward+backward step"
DISABLE_ONLY_COMPILING = "07cdfe8b4e59"  # the code whose Function calls torch.compiler.disable only while compiling
EAGER_LANE = "870951a1fa15"  # the first grid run whose eager d = 128 calls took fast/eager_lane.py
HOST_LANE = "94e6108c9dfa"  # the first flash-host run whose (batch, seq, d) eager step took the lane
FWD_GROUPS = "82b5ddff372c"  # the first grid run with the d = 128 forward's head groups by mask


def _in_words(df: pd.DataFrame) -> pd.DataFrame:
    """The cell's columns in words: mask ("causal"/"full"), "batch x heads"."""
    return df.assign(mask=df.causal.map({True: "causal", False: "full"}),
                     **{"batch x heads": [f"{b} x {h}" for b, h in zip(df.batch, df.heads)]})


def by_cell(rows: pd.DataFrame, what: str = "speed_vs_cudnn") -> pd.Series:
    return rows.set_index(CELL)[what].astype(float).sort_index()


def level(s: pd.Series, name: str) -> pd.Index:
    return s.index.get_level_values(name)


def grid_rows(status: str | None = "ok") -> pd.DataFrame:
    """The sweep's newest row per cell (`--remeasure` after a new table adds rows), in words."""
    df = newest(load_results(GRID_BENCH), GRID_KEY)
    return _in_words(df if status is None else df[df["status"] == status])


def newest_git_of(rows: pd.DataFrame) -> str:
    """The git of the newest of these rows."""
    return str(rows.loc[rows.time_utc.idxmax(), "git"])


def newest_git(d: int | None = None) -> str:
    """The code of the grid's newest run (the git of its newest row), or of the newest that measured
    ours at head dim d (a run may measure one head dim alone)."""
    return newest_git_of(grid_rows() if d is None else where(grid_rows(), d=d, impl="ours"))


def _current(git: pd.Series, d: pd.Series) -> pd.Series:
    """Whether each row is from its head dim's newest version of ours."""
    return pd.Series([g == newest_git(int(x)) for g, x in zip(git, d)], index=git.index)


def earlier_cells() -> pd.Index:
    """Cells whose newest row of ours is from an earlier run than its head dim's newest (index as speeds())."""
    ours = where(grid_rows(), impl="ours", mode="fwd_bwd")
    return ours[~_current(ours.git, ours.d)].set_index(CELL).index.sort_values()


def version_rows() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grid's rows by the run that made them: ours and cuDNN (measured again with each new
    table), then SDPA-flash and flex (an earlier run; their speeds are against its cuDNN)."""
    df = grid_rows()
    mine = df.impl.isin(["ours", "cudnn"])
    return df[mine], df[~mine]


def grid_sweeps(rows: pd.DataFrame) -> int:
    """How many sweeps (separate invocations, one per GPU call) measured these rows: rows more than
    5 minutes apart start a new sweep."""
    t = pd.to_datetime(rows.time_utc).sort_values()
    return int((t.diff() > pd.Timedelta(minutes=5)).sum()) + 1


def run_gits() -> list[str]:
    """The grid runs' code, oldest first (the first: the table before the grid's keys were tuned)."""
    return list(newest(load_results(GRID_BENCH, status="ok"), ["git"], keep="first").git)


def run_speeds(git: str, mode: str = "fwd_bwd", what: str = "speed_vs_cudnn", impl: str = "ours") -> pd.Series:
    """Ours' (or impl's) speed vs cuDNN (or `what`: median_ms) per cell in the rows of one run's code."""
    rows = where(load_results(GRID_BENCH, status="ok"), git=git, impl=impl, mode=mode)
    return by_cell(_in_words(newest(rows, GRID_KEY)), what)


def speeds(impl: str = "ours", mode: str = "fwd_bwd", what: str = "speed_vs_cudnn") -> pd.Series:
    """Speed vs cuDNN (or `what`) per cell (index d, mask, batch x heads, seq) for one implementation and mode."""
    return by_cell(where(grid_rows(), impl=impl, mode=mode), what)


def met(mode: str) -> pd.Series:
    s = speeds("ours", mode)
    return s[s >= 1.0]


def long_cells(s: pd.Series, **levels) -> pd.Series:
    """The cells with seq >= LONG whose index levels equal the values given (level names as keywords)."""
    for name, value in levels.items():
        s = s[level(s, name) == value]
    return s[level(s, "seq") >= LONG]


def long_range(mode: str, **levels) -> pd.Series:
    """Ours' speed vs cuDNN in the long cells (and the levels given)."""
    return long_cells(speeds("ours", mode), **levels)


def first_run_long(**levels) -> pd.Series:
    """As long_range, forward+backward, in the first run (before the grid's keys were tuned)."""
    return long_cells(run_speeds(run_gits()[0]), **levels)


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
    ms = speeds(impl, mode, "median_ms") if git is None else run_speeds(git, mode, "median_ms", impl)
    return float(ms.loc[STEP_CELL])


def step_backward_ms(impl: str) -> float:
    """The backward alone at the step's cell: forward+backward minus forward (same run)."""
    return step(impl, "fwd_bwd") - step(impl, "fwd")


def cell_words(cell: tuple) -> str:
    d, mask, bh, seq = cell
    return f"{bh} x {seq:,}, d = {d}, {'causal' if mask == 'causal' else 'non-causal'}"


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
    """Ours' speed vs cuDNN against seq: forward+backward and forward panels, one colour per (d, mask),
    solid for 1 x 32 and dashed for 1 x 16."""
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


def tuned_best_ms(key: str, kernel: str) -> float:
    """The fastest median the tuner's newest run of (key, kernel) measured (confirmation rounds
    where it has them), ms."""
    t = where(load_results(TUNE_BENCH, status="ok"), key=key, kernel=kernel)
    t = t[t.run == t.run.max()]
    if "phase" in t and (t.phase == "confirm").any():
        t = t[t.phase == "confirm"]
    return float(t.groupby(t.config.astype(str)).ms.median().min())


# -- the short cells, which the host's time sets ---------------------------------------------------

def runs_before_the_lane() -> list[str]:
    """The grid runs whose every eager call took the general path (oldest first)."""
    gits = run_gits()
    return gits[:gits.index(EAGER_LANE)]


def short_cells_across_runs(below_ms: float = SHORT_MS) -> pd.DataFrame:
    """Ours' forward+backward ms per run before the eager lane (columns: git, oldest first) in the
    cells that took under `below_ms` in every such run that measured them: the cells the host's
    time set."""
    ms = pd.DataFrame({git: run_speeds(git, what="median_ms") for git in runs_before_the_lane()})
    return ms[(ms.max(axis=1) < below_ms) & (ms.notna().sum(axis=1) >= 2)]


def short_spread() -> pd.Series:
    """Per host-bound cell: its slowest run's time over its fastest's, among the runs with the grid's
    keys tuned (all but the first, whose non-causal cells ran heuristic tiles): only the run differs."""
    ms = short_cells_across_runs()[runs_before_the_lane()[1:]].dropna()
    return ms.max(axis=1) / ms.min(axis=1)


HOST_SHAPE = {"batch": 16, "seq": 1024, "d": 64}  # the page's step: batch 16 x 1,024, one head, d = 64
HOST_D128 = {"batch": 32, "seq": 1024, "d": 128}  # 1 x 32 heads x 1,024, d = 128: the host-path changes
HOST_16x4096 = {"batch": 16, "seq": 4096, "d": 128}  # 1 x 16 heads x 4,096, d = 128: the C launcher called directly


def host_runs(piece: str, shape: dict = HOST_SHAPE) -> pd.Series:
    """Host µs of one flash-host piece in every run at this shape (index: run)."""
    df = where(load_results(HOST_BENCH, status="ok"), piece=piece, **shape)
    return df.set_index("run").host_us.astype(float).sort_index()


def host_runs_before_the_lane(piece: str, shape: dict) -> pd.Series:
    """`host_runs` of the runs before flash-host's eager step took the eager lane."""
    df = where(load_results(HOST_BENCH, status="ok"), **shape)
    lane_run = df[df.git == HOST_LANE].run.min()
    runs = host_runs(piece, shape)
    return runs[runs.index < lane_run]


def gluon_launch_us(kind: str, way: str) -> float:
    """Host µs of one Gluon launch (kind fwd/bwd) through Triton's dispatch or directly (newest run)."""
    piece = f"ours: Gluon {'forward' if kind == 'fwd' else 'backward'} launch, " + (
        "Triton's dispatch" if way == "dispatch" else "direct")
    return float(host_runs(piece).iloc[-1])


def profile() -> dict:
    """The committed cProfile of eager steps: what its first line says it profiled (steps, batch, seq,
    git), its total, its pstats rows (ncalls tottime percall cumtime percall filename:lineno(function),
    by tottime), the engine's own time and Triton's dispatch (JITFunction.run) with all it calls, s."""
    text = PROFILE.read_text()
    head = re.search(r"cProfile of (\d+) eager .* at batch (\d+) x (\d+),.* git ([0-9a-f]{12})", text.splitlines()[0])
    steps, batch, seq, git = head.groups()
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit() and "function calls" not in line]
    total = float(re.search(r"in ([0-9.]+) seconds", text).group(1))
    return {"steps": int(steps), "batch": int(batch), "seq": int(seq), "git": git, "rows": rows, "total": total,
            "step_us": total / int(steps) * 1e6, "engine_own": next(float(r[1]) for r in rows if "run_backward" in " ".join(r)),
            "dispatch_cum": next(float(r[3]) for r in rows if "jit.py" in " ".join(r) and "(run)" in " ".join(r))}


def profiled_call_step_us() -> float:
    """The eager step's host µs without the profiler, in the flash-host run of the profile's commit
    and shape (a run repeated at that commit: its newest)."""
    shape = {k: profile()[k] for k in ("batch", "seq", "git")}
    hit = where(load_results(HOST_BENCH, status="ok"), piece=EAGER_STEP, **shape)
    return first_value(hit.sort_values("time_utc", kind="stable").tail(1), "host_us",
                       f"results/{HOST_BENCH}: no eager-step row at {shape}")


FULL_4096 = [(128, "full", f"1 x {h}", 4096) for h in (16, 32)]


def fwd_groups_speeds(cell: tuple) -> tuple[float, float]:
    """The forward's speed vs cuDNN at `cell` in the grid run before FWD_GROUPS and in it."""
    gits = run_gits()
    before = gits[gits.index(FWD_GROUPS) - 1]
    return tuple(float(run_speeds(git, "fwd").loc[cell]) for git in (before, FWD_GROUPS))


def d128_from_4096() -> pd.Series:
    """Ours' forward+backward speed vs cuDNN in the d = 128 cells from 4,096 positions."""
    s = speeds()
    return s[(level(s, "d") == 128) & (level(s, "seq") >= 4096)]


def d128_behind() -> pd.Series:
    """Those of the d = 128 cells from 4,096 positions that are behind cuDNN's (speed < 1)."""
    s = d128_from_4096()
    return s[s < 1.0]


# -- facts -----------------------------------------------------------------------------------------

FACTS = {
    "grid_cells": lambda: len(speeds()),
    "grid_met_fwd_bwd": lambda: len(met("fwd_bwd")),
    "grid_met_fwd_bwd_d64": lambda: int((level(met("fwd_bwd"), "d") == 64).sum()),
    "grid_met_fwd_bwd_d128": lambda: int((level(met("fwd_bwd"), "d") == 128).sum()),
    "grid_met_fwd_bwd_d128_cells": lambda: "; ".join(cell_words(c).replace(", d = 128", "")
                                                     for c in met("fwd_bwd")[level(met("fwd_bwd"), "d") == 128].index),
    "grid_met_fwd": lambda: len(met("fwd")),
    "grid_met_fwd_d128": lambda: int((level(met("fwd"), "d") == 128).sum()),
    "grid_16x4096_causal_d128": lambda: f"{speeds().loc[CELL_16x4096]:.2f}",
    "grid_16x4096_causal_d128_before_lane": lambda: f"{before_the_lane_16x4096():.2f}",
    "grid_worst_fwd_bwd": lambda: f"{speeds().min():.2f}",
    "grid_worst_fwd_bwd_cell": lambda: cell_words(speeds().idxmin()),
    "grid_beats_flash_from": lambda: f"{beats_from('flash'):,}",
    "grid_beats_flex_32k": lambda: int(beats('flex').loc[32768].sum()),
    "grid_flex_32k_cells": lambda: len(beats('flex').loc[32768]),
    **low_high("grid_long_d128_full_{}", lambda: long_range("fwd_bwd", d=128, mask="full")),
    "grid_step_fwd_bwd": lambda: f'{step("cudnn", "fwd_bwd") / step("ours", "fwd_bwd"):.2f}',
    "grid_step_fwd": lambda: f'{step("cudnn", "fwd") / step("ours", "fwd"):.2f}',
    "grid_step_ours_bwd_ms": lambda: f'{step_backward_ms("ours"):.1f}',
    "grid_step_cudnn_bwd_ms": lambda: f'{step_backward_ms("cudnn"):.1f}',
    "grid_git": lambda: newest_git(),
    "grid_others_git": lambda: newest_git_of(version_rows()[1]),
    "grid_others_sweeps": lambda: grid_sweeps(version_rows()[1]),
    **low_high("grid_long_d128_fwd_{}", lambda: long_range("fwd", d=128)),
    "grid_step_ws_ms": lambda: f'{tuned_best_ms(STEP_KEY, "ws"):.1f}',
    **{f"gpu_now_{k.lower()}": lambda k=k: gpu_tests.counts()[k] for k in ("PASSED", "SKIPPED")},
    **low_high("grid_long_d64_full_{}", lambda: long_range("fwd_bwd", d=64, mask="full")),
    **low_high("grid_long_d128_{}", lambda: long_range("fwd_bwd", d=128)),
    **low_high("grid_long_d64_{}", lambda: long_range("fwd_bwd", d=64)),
    "grid_first_git": lambda: run_gits()[0],
    **low_high("grid_long_d64_full_before_{}", lambda: first_run_long(d=64, mask="full")),
    **low_high("grid_long_d128_full_before_{}", lambda: first_run_long(d=128, mask="full")),
    "grid_short_cells": lambda: len(short_cells_across_runs()),
    "grid_short_min_ms": lambda: f"{short_cells_across_runs().min().min():.2f}",
    "grid_short_max_ms": lambda: f"{short_cells_across_runs().max().max():.2f}",
    "grid_short_below_ms": lambda: f"{SHORT_MS:.1f}",
    "grid_short_spread": lambda: f"{short_spread().max():.1f}",
    "grid_host_runs": lambda: len(host_runs(EAGER_STEP)),
    "grid_host128_direct_us": lambda: f"{host_runs(EAGER_STEP, HOST_D128).iloc[-1]:,.0f}",
    "grid_host128_dispatch_us": lambda: f"{host_runs(EAGER_DISPATCH, HOST_D128).iloc[-1]:,.0f}",
    "grid_host128_cudnn_us": lambda: f"{host_runs(CUDNN_STEP, HOST_D128).iloc[-1]:,.0f}",
    "grid_host16_direct_us": lambda: f"{host_runs_before_the_lane(EAGER_STEP, HOST_16x4096).iloc[-1]:,.0f}",
    "grid_host16_dispatch_us": lambda: f"{host_runs_before_the_lane(EAGER_DISPATCH, HOST_16x4096).iloc[-1]:,.0f}",
    "grid_host16_cudnn_us": lambda: f"{host_runs_before_the_lane(CUDNN_STEP, HOST_16x4096).iloc[-1]:,.0f}",
    "grid_host16_runs": lambda: len(host_runs_before_the_lane(EAGER_STEP, HOST_16x4096)),
    "grid_host16_lane_git": lambda: HOST_LANE,
    "grid_d128_behind": lambda: len(d128_behind()),
    "grid_d128_from_4096": lambda: len(d128_from_4096()),
    **low_high("grid_d128_behind_{}", d128_behind),
    **{f"grid_fwd_groups_{name}_{when}": lambda cell=cell, i=i: f"{fwd_groups_speeds(cell)[i]:.2f}"
       for name, cell in (("16x4096", FULL_4096[0]), ("32x4096", FULL_4096[1]), ("step", STEP_CELL))
       for i, when in enumerate(("before", "after"))},
    "grid_host16_lane_us": lambda: f"{host_runs(EAGER_STEP, HOST_16x4096).iloc[-1]:,.0f}",
    "grid_host16_lane_cudnn_us": lambda: f"{host_runs(CUDNN_STEP, HOST_16x4096).iloc[-1]:,.0f}",
    "grid_profile_total_s": lambda: f'{profile()["total"]:.3f}',
    "grid_profile_step_us": lambda: f'{profile()["step_us"]:.0f}',
    "grid_profile_unprofiled_us": lambda: f"{profiled_call_step_us():.0f}",
    "grid_profile_engine_s": lambda: f'{profile()["engine_own"]:.3f}',
    "grid_profile_dispatch_s": lambda: f'{profile()["dispatch_cum"]:.3f}',
    "grid_short_spread_cell": lambda: cell_words(short_spread().idxmax()),
    **low_high("grid_host_step_{}_us", lambda: host_runs(EAGER_STEP), ".0f"),
    **low_high("grid_host_cudnn_{}_us", lambda: host_runs(CUDNN_STEP), ".0f"),
    **{f"grid_gluon_{kind}_{way}_us": lambda kind=kind, way=way: f"{gluon_launch_us(kind, way):.0f}"
       for kind in ("fwd", "bwd") for way in ("dispatch", "direct")},
}


# -- claims ----------------------------------------------------------------------------------------

def _fwd_bwd_met_in_gluon_cells() -> bool:
    """Forward+backward meets the goal in some cells, at both head dims but at d = 128 in fewer than
    a quarter of the cells from 4,096, each run by the Gluon kernels; the forward at both head
    dims, at d = 128 only in Gluon cells."""
    fb, f = met("fwd_bwd"), met("fwd")
    f128 = f[level(f, "d") == 128]
    d128 = speeds()[(level(speeds(), "d") == 128) & (level(speeds(), "seq") >= 4096)]
    gluon = lambda names: all(n.endswith("Gluon") for n in names)  # noqa: E731
    return (0 < len(fb) < len(speeds()) and 0 < (level(fb, "d") == 128).sum() < len(d128) / 4
            and gluon(plans().loc[fb.index].fwd) and gluon(plans().loc[fb.index].bwd)
            and set(level(f, "d")) == {64, 128} and gluon(plans().loc[f128.index].fwd))


CELL_16x4096 = (128, "causal", "1 x 16", 4096)


def before_the_lane_16x4096() -> float:
    """The 1 x 16 x 4,096 cell (d = 128, causal) in the last grid run before the eager lane."""
    return float(run_speeds(runs_before_the_lane()[-1]).loc[CELL_16x4096])


def _lane_levels_the_16x4096_cell() -> bool:
    """At 1 x 16 x 4,096, d = 128, causal: our backward alone (the A/B sweep) ahead of cuDNN's; the
    grid's forward+backward below 0.7x before the eager lane, at or above 1.0x with it."""
    from .flash_d128 import _vs_cudnn_now

    return bool(_vs_cudnn_now("1 x 16 x 4,096") > 1.0 and before_the_lane_16x4096() < 0.7
                and speeds().loc[CELL_16x4096] >= 1.0)


def _ours_one_version() -> bool:
    """Ours and cuDNN: one code version, one sweep, every cell; SDPA-flash and flex: an earlier
    version in two sweeps, the second measuring only cells the first had not. All on one H200."""
    df = grid_rows()
    mine, others = version_rows()
    t = pd.to_datetime(others.time_utc)
    second = t >= t[t.sort_values().diff().idxmax()]
    cells = lambda rows: set(map(tuple, rows[CELL].to_numpy().tolist()))
    return (set(mine.git) == {newest_git()} and set(others.git) == {newest_git_of(others)} != {newest_git()}
            and grid_sweeps(mine) == 1 and len(cells(mine)) == len(cells(df)) and set(df.device) == {"NVIDIA H200"}
            and len(earlier_cells()) == 0 and grid_sweeps(others) == 2
            and cells(others[second]).isdisjoint(cells(others[~second])))


def _tuner_shapes_as_described() -> bool:
    """Non-causal keys at a shape of the grid (16 x 2,048 medium, 32 x 8,192 large) and the step's
    own class, huge, searched widely."""
    from cs336_systems.attention.fast.tuning.tune import tune_shapes

    shapes = {s[0]: s for s in tune_shapes("grid")}
    return (all(shapes[f"bf16-d{d}-full-medium"][1:3] == (16, 2048) and shapes[f"bf16-d{d}-full-large"][1:3] == (32, 8192)
                for d in (64, 128))
            and shapes[STEP_KEY][1:3] == (32, 32768) and bool(shapes[STEP_KEY][5])
            and {"bf16-d64-full-large", STEP_KEY} <= {k for kind in TUNED.values() for k in kind})


def _non_causal_d64_now_even() -> bool:
    before, after = first_run_long(d=64, mask="full"), long_range("fwd_bwd", d=64, mask="full")
    return (before.max() < 0.9 and after.min() > 0.95 and (after > before.reindex(after.index)).all()
            and set(plans().loc[after.index].fwd) == {"large, Gluon"})


def _non_causal_d128_improved_still_behind() -> bool:
    after = long_range("fwd_bwd", d=128, mask="full")
    return (first_run_long(d=128, mask="full").max() < after.min() and after.max() < 1
            and set(plans().loc[after.index].fwd) == {"large, Gluon"})


def _short_cells_set_by_the_host() -> bool:
    """Whatever the shape: 16 times the work (seq 1,024 to 4,096, d 64, causal, 1 x 16) took less
    than twice the time in every run; with the same table a cell moved by over 1.3x between runs."""
    ms = short_cells_across_runs()
    small, big = (ms.loc[(64, "causal", "1 x 16", n)].dropna() for n in (1024, 4096))
    return (len(ms) >= 12 and ms.max().max() < 3 * ms.min().min() and (big < 2 * small).all()
            and short_spread().max() > 1.3)


def _host_step_did_not_move() -> bool:
    """Ours' eager step above cuDNN's in every run and above some whole cells; skipping
    torch.compiler.disable did not move it beyond the spread (10%)."""
    ours, cudnn = host_runs(EAGER_STEP), host_runs(CUDNN_STEP)
    git = load_results(HOST_BENCH, status="ok").drop_duplicates("run").set_index("run").git
    before, after = ours[git[ours.index] != DISABLE_ONLY_COMPILING], ours[git[ours.index] == DISABLE_ONLY_COMPILING]
    return (ours.min() > cudnn.max() and ours.min() / 1000 > speeds("ours", "fwd_bwd", "median_ms").min()
            and len(before) >= 1 and len(after) >= 1 and after.min() > before.min() * 0.9)


def _engine_first_by_own_time() -> bool:
    p = profile()
    rows = p["rows"]
    return ("run_backward" in " ".join(rows[0]) and all(float(rows[0][1]) >= float(r[1]) for r in rows)
            and p["engine_own"] == float(rows[0][1]) and p["dispatch_cum"] < p["total"])


def _skipped_tests() -> set[str]:
    return {t.split("[")[0] for t in gpu_tests.outcomes().query("outcome == 'SKIPPED'").test}


register("flash", facts=FACTS, tables={
    "grid_ours_fwd_bwd": lambda: speed_table("ours", "fwd_bwd"), "grid_ours_fwd": lambda: speed_table("ours", "fwd"),
    "grid_flash": lambda: speed_table("flash", "fwd_bwd"), "grid_flex": lambda: speed_table("flex", "fwd_bwd"),
    "grid_plans": plans_table,
}, figures={"grid": grid_figure}, claims={
    # 2 d x 2 masks x 2 batch x heads x 6 lengths, each with ours against cuDNN
    "grid_states_every_cell": lambda: all(
        len(s) == 2 * 2 * 2 * len(SEQS) and s.notna().all() and sorted(set(level(s, "seq"))) == list(SEQS)
        for s in (speeds("ours", m) for m in ("fwd", "fwd_bwd"))),
    "goal_met_fwd_bwd_in_gluon_cells": _fwd_bwd_met_in_gluon_cells,
    # every long d = 128 cell: forward within 2% of cuDNN or faster, forward+backward behind in most
    # (at most a quarter of them ahead, by under 5%); the step's cell behind forward+backward, its
    # forward at least cuDNN's
    "d128_forward_even_backward_behind": lambda: (
        long_range("fwd", d=128).min() > 0.98 and long_range("fwd_bwd", d=128).max() < 1.05
        and (long_range("fwd_bwd", d=128) >= 1).mean() <= 0.25
        and step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd") and step("ours", "fwd") <= step("cudnn", "fwd")),
    "d64_long_cells_within_5_percent": lambda: long_range("fwd_bwd", d=64).min() > 0.95,
    "grid_ours_is_one_version": _ours_one_version,
    "lane_levels_the_16x4096_cell": _lane_levels_the_16x4096_cell,
    # the forward's head groups by mask and the re-tuned huge forward: the two 4k forwards without
    # the mask and the step's forward faster against cuDNN than in the run before; the 4k ones still
    # short of it
    "fwd_groups_helped_still_short_at_4k": lambda: all(
        b < a for b, a in map(fwd_groups_speeds, (*FULL_4096, STEP_CELL)))
        and all(fwd_groups_speeds(c)[1] < 1.0 for c in FULL_4096),
    "d128_step_and_long_full_cells_behind": lambda: bool(
        long_range("fwd_bwd", d=128, mask="full").max() < 1.0 and step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd")),
    # every d = 128 cell from 4,096 behind forward+backward, but the ones the summary names; in each
    # the forward level with cuDNN's or ahead (within 1%), but the two 4k ones without the mask
    "d128_behind_by_the_backward": lambda: bool(
        len(d128_behind()) == len(d128_from_4096()) - int((level(met("fwd_bwd"), "d") == 128).sum())
        and all(speeds("ours", "fwd").loc[c] >= 0.99 for c in d128_behind().index if c not in FULL_4096)),
    "short_sequences_furthest_behind": lambda: level(speeds(), "seq")[speeds().argmin()] <= 2048
    and speeds()[level(speeds(), "seq") <= 2048].min() < speeds()[level(speeds(), "seq") >= 4096].min(),
    "ours_leads_flash_at_long_sequences": lambda: beats_from("flash") <= LONG
    and beats("flash")[level(beats("flash"), "seq") >= beats_from("flash")].all(),
    "ours_beats_flex_in_most_32k_cells": lambda: beats("flex").loc[32768].sum() > len(beats("flex").loc[32768]) / 2,
    "tuner_shapes_as_described": _tuner_shapes_as_described,
    "non_causal_d64_now_about_even": _non_causal_d64_now_even,
    "non_causal_d128_improved_still_behind": _non_causal_d128_improved_still_behind,
    # at the step's cell the backward alone is behind cuDNN's and its forward is not; both are the
    # Gluon kernels, which the tuner timed faster there than the best Triton backward
    "step_backward_behind_gluon": lambda: (
        step_backward_ms("cudnn") < step_backward_ms("ours") and step("ours", "fwd") <= step("cudnn", "fwd")
        and plans().loc[STEP_CELL, "bwd"] == "huge, Gluon" and plans().loc[STEP_CELL, "fwd"] == "huge, Gluon"
        and tuned_best_ms(STEP_KEY, "ws") < tuned_best_ms(STEP_KEY, "dkdv") + tuned_best_ms(STEP_KEY, "dq")),
    "short_cells_set_by_the_host": _short_cells_set_by_the_host,
    "host_step_did_not_move": _host_step_did_not_move,
    # the medium causal key (the 16 x 1,024 step's plan) runs neither Gluon kernel nor the one-pass
    # backward; one run timed the direct forward launch
    "direct_launch_helped_the_backward_only": lambda: (
        not any(TUNED[kind]["bf16-d64-causal-medium"].get(f) for kind in ("fwd", "bwd") for f in ("gluon_ws", "one_pass"))
        and gluon_launch_us("bwd", "direct") < 0.85 * gluon_launch_us("bwd", "dispatch")
        and gluon_launch_us("fwd", "direct") >= 0.95 * gluon_launch_us("fwd", "dispatch")
        and len(host_runs("ours: Gluon forward launch, direct")) == 1),
    "engine_first_by_own_time": _engine_first_by_own_time,
    # launching every kernel directly saved a little; the eager step still costs more than cuDNN's
    "host128_direct_helped_but_not_enough": lambda: (
        host_runs(EAGER_STEP, HOST_D128).iloc[-1] < host_runs(EAGER_DISPATCH, HOST_D128).iloc[-1]
        and host_runs(EAGER_STEP, HOST_D128).iloc[-1] > 1.2 * host_runs(CUDNN_STEP, HOST_D128).iloc[-1]),
    # the C launcher called directly: in every run the eager step under 0.7x the dispatched one's
    # host time, still above cuDNN's
    "c_launcher_cuts_the_step": lambda: bool(
        (host_runs_before_the_lane(EAGER_STEP, HOST_16x4096)
         < 0.7 * host_runs_before_the_lane(EAGER_DISPATCH, HOST_16x4096)).all()
        and (host_runs_before_the_lane(EAGER_STEP, HOST_16x4096)
             > host_runs_before_the_lane(CUDNN_STEP, HOST_16x4096)).all()),
    # with the lane the eager step is still over 1.2x cuDNN's host time (the newest run)
    "lane_step_still_above_cudnn": lambda: bool(
        host_runs(EAGER_STEP, HOST_16x4096).iloc[-1] > 1.2 * host_runs(CUDNN_STEP, HOST_16x4096).iloc[-1]
        and host_runs(EAGER_STEP, HOST_16x4096).index[-1] >= host_runs_before_the_lane(
            EAGER_STEP, HOST_16x4096).index[-1]),
    "profiler_costs_its_own_time": lambda: profile()["step_us"] > profiled_call_step_us(),
    # the tests ran the grid's code itself (ours, both head dims)
    "gpu_tests_ran_the_grid_code": lambda: gpu_tests.log_git(gpu_tests.NEWEST_RUNS[0]) == newest_git(64) == newest_git(128),
    # the skips are the combinations the kernels do not take: fp32 tiles beyond shared memory, and
    # causal with n_q != n_k in the Gluon backwards
    "skips_are_untaken_combinations": lambda: _skipped_tests() <= {
        "tests/test_flash_attention.py::test_gpu_one_pass_backward", "tests/test_flash_attention.py::test_gpu_tma",
        "tests/test_onepass_ws.py::test_gpu_gradients_match_the_reference",
        "tests/test_bwd128_ws.py::test_gpu_gradients_match_the_reference"},
})
