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
from cs336_systems.attention.fast.table import (
    SIZE_FALLBACK,
    _entry,
    size_class,
    table_key,
)
from cs336_systems.attention.fast.tuned_configs import TUNED
from report import gpu_tests
from report.flash import MODE_WORDS, register
from report.flash_ab import HOST_BENCH
from report.results import REPO_ROOT, format_value, load_results, markdown_table, provenance_line

GRID_BENCH = "attention/flash_grid"
SOURCE = f"results/{GRID_BENCH}/nvidia-h200.jsonl"
TUNE_BENCH = "attention/flash_tune"
CELL = ["d", "mask", "batch x heads", "seq"]
STEP_CELL = {"d": 128, "mask": "causal", "batch x heads": "1 x 32", "seq": 32768}  # the 2026 training step's attention
LONG = 8192  # the page's "long sequences" start here
IMPL_WORDS = {"ours": "ours", "cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2 CUDA)", "flex": "flex_attention"}


def grid_rows(status: str | None = "ok") -> pd.DataFrame:
    """The sweep's rows with the cell's columns in words: mask ("causal"/"full"), "batch x heads".
    A cell measured again (`--remeasure`, after a new table) counts by its newest row."""
    df = load_results(GRID_BENCH)
    df = df.sort_values("time_utc", kind="stable").drop_duplicates(list(GRID_KEY), keep="last")
    if status is not None:
        df = df[df["status"] == status]
    return df.assign(mask=df.causal.map({True: "causal", False: "full"}),
                     **{"batch x heads": [f"{b} x {h}" for b, h in zip(df.batch, df.heads)]})


def newest_git() -> str:
    """The code of the grid's newest run (the git of its newest row)."""
    df = grid_rows()
    return str(df.loc[df.time_utc.idxmax(), "git"])


def earlier_cells() -> pd.Index:
    """Cells whose newest row of ours is from an earlier run than the newest (index as speeds())."""
    df = grid_rows()
    ours = df[(df.impl == "ours") & (df["mode"] == "fwd_bwd")].set_index(CELL)
    return ours[ours.git != newest_git()].index.sort_values()



def run_gits() -> list[str]:
    """The grid runs' code, oldest first (the first: the table before the grid's keys were tuned)."""
    df = load_results(GRID_BENCH, status="ok")
    return list(df.sort_values("time_utc").drop_duplicates("git").git)


def run_speeds(git: str, mode: str = "fwd_bwd", what: str = "speed_vs_cudnn") -> pd.Series:
    """Ours' speed vs cuDNN (or `what`: median_ms) per cell in the rows of one run's code."""
    df = load_results(GRID_BENCH, status="ok")
    df = df[(df.git == git) & (df.impl == "ours") & (df["mode"] == mode)].sort_values("time_utc", kind="stable")
    df = df.drop_duplicates(list(GRID_KEY), keep="last")
    df = df.assign(mask=df.causal.map({True: "causal", False: "full"}),
                   **{"batch x heads": [f"{b} x {h}" for b, h in zip(df.batch, df.heads)]})
    return df.set_index(CELL)[what].astype(float).sort_index()


SHORT_MS = 1.5  # a cell under this in every run is one the host's time sets (the page's "short" cells)


def short_cells_across_runs(below_ms: float = SHORT_MS) -> pd.DataFrame:
    """Ours' forward+backward ms per run (columns: git, oldest first) in the cells that took under
    `below_ms` in every run that measured them: the cells the host's time sets."""
    ms = pd.DataFrame({git: run_speeds(git, what="median_ms") for git in run_gits()})
    return ms[(ms.max(axis=1) < below_ms) & (ms.notna().sum(axis=1) >= 2)]


def tuned_table_runs() -> list[str]:
    """The runs with the grid's keys tuned: every run but the first (whose non-causal cells ran
    heuristic tiles), so that a cell's plan is the same in each."""
    return run_gits()[1:]


def host_runs(piece: str, seq: int = 1024) -> pd.Series:
    """Host µs of one flash-host piece in every run at this sequence length (index: run)."""
    df = load_results(HOST_BENCH, status="ok")
    df = df[(df.seq == seq) & (df.piece == piece)]
    return df.set_index("run").host_us.astype(float).sort_index()


def speeds(impl: str = "ours", mode: str = "fwd_bwd") -> pd.Series:
    """speed vs cuDNN per cell (index d, mask, batch x heads, seq) for one implementation and mode."""
    df = grid_rows()
    hit = df[(df.impl == impl) & (df["mode"] == mode)]
    return hit.set_index(CELL).speed_vs_cudnn.astype(float).sort_index()


def times(impl: str, mode: str) -> pd.Series:
    """Median ms per cell."""
    df = grid_rows()
    hit = df[(df.impl == impl) & (df["mode"] == mode)]
    return hit.set_index(CELL).median_ms.astype(float).sort_index()


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
    df = grid_rows(status=None)
    df = df[df.impl == impl]
    # A failed row (status oom/error) stands for every mode of its cell that has no timing: the sweep
    # writes one such row when either mode fails.
    failed = df[df.status != "ok"].set_index(CELL).status.str.upper()
    ok = df[(df.status == "ok") & (df["mode"] == mode)].set_index(CELL)
    # † marks a cell whose row is from the earlier run (the newest run stopped before it)
    shown = pd.Series([format_value(float(v), ".2f") + ("" if g == newest_git() else " †")
                       for v, g in zip(ok.speed_vs_cudnn, ok.git)], index=ok.index, dtype=object)
    shown = pd.concat([shown, failed[~failed.index.isin(shown.index)]])
    earlier = sorted(set(ok.git) - {newest_git()})
    return (markdown_table(_by_seq(shown.sort_index()))
            + "\n\n" + provenance_line(df[df.git.isin(set(ok.git))], SOURCE)
            + f" *{IMPL_WORDS[impl]}, {MODE_WORDS[mode]}: cuDNN's time over this implementation's, same run;"
            " above 1 is faster than cuDNN." + (f" † from an earlier run (git {', '.join(earlier)})." if earlier else "")
            + "*")


def grid_figure() -> plt.Figure:
    """Ours' speed vs cuDNN against seq: forward+backward and forward panels, one colour per (d, mask),
    solid for 1 x 32 and dashed for 1 x 16."""
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.8), sharey=True)
    colours = dict(zip([(64, "causal"), (64, "full"), (128, "causal"), (128, "full")], plt.cm.tab10.colors))
    for ax, mode in zip(axes, ("fwd_bwd", "fwd")):
        s = speeds("ours", mode)
        for (d, mask, bh), line in s.groupby(level=["d", "mask", "batch x heads"]):
            ax.plot(line.index.get_level_values("seq"), line.values, marker="o", ms=3,
                    color=colours[(d, mask)], ls="-" if bh == "1 x 32" else "--", label=f"d = {d}, {mask}, {bh}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        seqs = sorted(set(s.index.get_level_values("seq")))
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
    gluon = entry.get("gluon_ws") and d == 64  # the Gluon kernels take head dim 64 only (fast/gluon/)
    return f"{used}, {'Gluon' if gluon else 'Triton'}"


def plans() -> pd.DataFrame:
    """Per grid cell: the forward's and the backward's plan source (index as speeds())."""
    df = grid_rows()
    cells = df[(df.impl == "ours") & (df["mode"] == "fwd_bwd")].set_index(CELL).sort_index()
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


def tuned_keys() -> list[str]:
    return sorted({k for kind in TUNED.values() for k in kind})


def tuned_at(key: str) -> str:
    """The shapes (batch x heads x seq) at which a key's entries were timed by the tuner."""
    t = load_results(TUNE_BENCH, status="ok")
    shapes = sorted({(int(z), int(n)) for z, n in zip(t[t.key == key].Z, t[t.key == key].seq)})
    return " and ".join(f"{z} x {n:,}" for z, n in shapes)


# -- facts -----------------------------------------------------------------------------------------

def met(mode: str) -> pd.Series:
    s = speeds("ours", mode)
    return s[s >= 1.0]


def _at(s: pd.Series, **where) -> pd.Series:
    """The cells whose index levels equal the values given (level names as keywords)."""
    for level, value in where.items():
        s = s[s.index.get_level_values(level) == value]
    return s


def long_range(mode: str, **where) -> pd.Series:
    """Ours' speed vs cuDNN in the cells with seq >= LONG (and the levels given)."""
    s = _at(speeds("ours", mode), **where)
    return s[s.index.get_level_values("seq") >= LONG]



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



def step(impl: str, mode: str) -> float:
    return float(times(impl, mode).loc[tuple(STEP_CELL[c] for c in CELL)])


def step_backward_ms(impl: str) -> float:
    """The backward alone at the step's cell: forward+backward minus forward (same run)."""
    return step(impl, "fwd_bwd") - step(impl, "fwd")




FACTS = {  # name -> (function of nothing, format)
    "flash.grid_cells": (lambda: len(speeds()), "d"),
    "flash.grid_met_fwd_bwd": (lambda: len(met("fwd_bwd")), "d"),
    "flash.grid_met_fwd": (lambda: len(met("fwd")), "d"),
    "flash.grid_worst_fwd_bwd": (lambda: speeds().min(), ".2f"),
    "flash.grid_worst_fwd_bwd_cell": (lambda: cell_words(speeds().idxmin()), ""),
    "flash.grid_beats_flash_from": (lambda: f"{beats_from('flash'):,}", ""),
    "flash.grid_beats_flex_32k": (lambda: int(beats('flex').loc[32768].sum()), "d"),
    "flash.grid_flex_32k_cells": (lambda: len(beats('flex').loc[32768]), "d"),
    "flash.grid_long_d128_full_min": (lambda: long_range("fwd_bwd", d=128, mask="full").min(), ".2f"),
    "flash.grid_long_d128_full_max": (lambda: long_range("fwd_bwd", d=128, mask="full").max(), ".2f"),
    "flash.grid_step_fwd_bwd": (lambda: step("cudnn", "fwd_bwd") / step("ours", "fwd_bwd"), ".2f"),
    "flash.grid_step_fwd": (lambda: step("cudnn", "fwd") / step("ours", "fwd"), ".2f"),
    "flash.grid_step_ours_ms": (lambda: step("ours", "fwd_bwd"), ".1f"),
    "flash.grid_step_cudnn_ms": (lambda: step("cudnn", "fwd_bwd"), ".1f"),
    "flash.grid_step_ours_bwd_ms": (lambda: step_backward_ms("ours"), ".1f"),
    "flash.grid_step_cudnn_bwd_ms": (lambda: step_backward_ms("cudnn"), ".1f"),
    "flash.grid_d128_tuned_at": (lambda: tuned_at(table_key(torch.bfloat16, 128, True, "large")), ""),
    "flash.grid_new_git": (newest_git, ""),
    "flash.gpu_now_git": (lambda: gpu_tests.log_git(gpu_tests.NEWEST_RUNS[0]), ""),
    **{f"flash.gpu_now_{k.lower()}": (lambda k=k: gpu_tests.counts()[k], "d")
       for k in ("PASSED", "SKIPPED", "total")},
    "flash.grid_long_d64_full_min": (lambda: long_range("fwd_bwd", d=64, mask="full").min(), ".2f"),
    "flash.grid_long_d64_full_max": (lambda: long_range("fwd_bwd", d=64, mask="full").max(), ".2f"),
    "flash.grid_long_d128_min": (lambda: long_range("fwd_bwd", d=128).min(), ".2f"),
    "flash.grid_long_d128_max": (lambda: long_range("fwd_bwd", d=128).max(), ".2f"),
    "flash.grid_long_d64_min": (lambda: long_range("fwd_bwd", d=64).min(), ".2f"),
    "flash.grid_first_git": (lambda: run_gits()[0], ""),
    "flash.grid_long_d64_full_before_min": (lambda: _long(run_speeds(run_gits()[0]), d=64, mask="full").min(), ".2f"),
    "flash.grid_long_d64_full_before_max": (lambda: _long(run_speeds(run_gits()[0]), d=64, mask="full").max(), ".2f"),
    "flash.grid_long_d128_full_before_min": (lambda: _long(run_speeds(run_gits()[0]), d=128, mask="full").min(), ".2f"),
    "flash.grid_long_d128_full_before_max": (lambda: _long(run_speeds(run_gits()[0]), d=128, mask="full").max(), ".2f"),
    "flash.grid_step_two_pass_ms": (lambda: tuned_best_ms(STEP_KEY, "dkdv") + tuned_best_ms(STEP_KEY, "dq"), ".1f"),
    "flash.grid_step_one_pass_ms": (lambda: tuned_best_ms(STEP_KEY, "onepass"), ".1f"),
    "flash.grid_short_cells": (lambda: len(short_cells_across_runs()), "d"),
    "flash.grid_short_min_ms": (lambda: short_cells_across_runs().min().min(), ".2f"),
    "flash.grid_short_max_ms": (lambda: short_cells_across_runs().max().max(), ".2f"),
    "flash.grid_short_below_ms": (lambda: SHORT_MS, ".1f"),
    "flash.grid_short_spread": (lambda: short_spread().max(), ".1f"),
    "flash.grid_sweeps": (lambda: grid_sweeps(), "d"),
    "flash.grid_host_runs": (lambda: len(host_runs(EAGER_STEP)), "d"),
    "flash.grid_profile_total_s": (lambda: profile_seconds()["total"], ".3f"),
    "flash.grid_profile_step_us": (lambda: profile_seconds()["total"] / profile_header()["steps"] * 1e6, ".0f"),
    "flash.grid_profile_unprofiled_us": (lambda: profiled_call_step_us(), ".0f"),
    "flash.grid_profile_engine_s": (lambda: profile_seconds()["engine_own"], ".3f"),
    "flash.grid_profile_dispatch_s": (lambda: profile_seconds()["dispatch_cum"], ".3f"),
    "flash.grid_short_spread_cell": (lambda: cell_words(short_spread().idxmax()), ""),
    "flash.grid_host_step_min_us": (lambda: host_runs(EAGER_STEP).min(), ".0f"),
    "flash.grid_host_step_max_us": (lambda: host_runs(EAGER_STEP).max(), ".0f"),
    "flash.grid_host_cudnn_min_us": (lambda: host_runs(CUDNN_STEP).min(), ".0f"),
    "flash.grid_host_cudnn_max_us": (lambda: host_runs(CUDNN_STEP).max(), ".0f"),
    **{f"flash.grid_gluon_{kind}_{way}_us": (lambda kind=kind, way=way: gluon_launch_us(kind, way), ".0f")
       for kind in ("fwd", "bwd") for way in ("dispatch", "direct")},
}

STEP_KEY = "bf16-d128-causal-huge"  # the table key the step's cell runs (plans_table)
PROFILE = REPO_ROOT / "results" / "attention" / "host_overhead" / "profile-eager-step-b21f8afc27ee.txt"
EAGER_STEP = "ours: forward+backward step (Fn.apply, eager)"
CUDNN_STEP = "cudnn: forward+backward step"


def short_spread() -> pd.Series:
    """Per host-bound cell: its slowest run's time over its fastest's, among the runs with the same
    table (`tuned_table_runs`), so that only the run, not the plan, differs."""
    ms = short_cells_across_runs()[tuned_table_runs()].dropna()
    return ms.max(axis=1) / ms.min(axis=1)


def grid_sweeps() -> int:
    """How many sweeps (separate invocations, one per GPU call) measured the newest code's cells:
    rows more than 5 minutes apart start a new sweep."""
    t = pd.to_datetime(grid_rows().time_utc).sort_values()
    return int((t.diff() > pd.Timedelta(minutes=5)).sum()) + 1


def profile_header() -> dict:
    """What the profile's first line says it profiled: steps, batch, seq and the commit."""
    head = PROFILE.read_text().splitlines()[0]
    m = re.search(r"cProfile of (\d+) eager .* at batch (\d+) x (\d+),.* git ([0-9a-f]{12})", head)
    if m is None:
        raise ValueError(f"{PROFILE.name}: its first line does not say steps, batch x seq and git: {head!r}")
    steps, batch, seq, git = m.groups()
    return {"steps": int(steps), "batch": int(batch), "seq": int(seq), "git": git}


def profiled_call_step_us() -> float:
    """The eager step's host µs without the profiler, in the flash-host run of the profile's commit
    and shape."""
    h = profile_header()
    df = load_results(HOST_BENCH, status="ok")
    hit = df[(df.batch == h["batch"]) & (df.seq == h["seq"]) & (df.piece == EAGER_STEP) & (df.git == h["git"])]
    if hit.empty:
        raise ValueError(f"results/{HOST_BENCH}: no eager-step row at {h}")
    hit = hit.sort_values("time_utc", kind="stable").tail(1)  # a run repeated at that commit: its newest
    return float(hit.host_us.iloc[0])


def profile_seconds() -> dict[str, float]:
    """From the committed cProfile of 50 eager steps: the engine's own time, and Triton's dispatch
    (JITFunction.run) with everything it calls, in seconds; and the profile's total."""
    text = PROFILE.read_text()
    total = float(re.search(r"in ([0-9.]+) seconds", text).group(1))
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit() and "function calls" not in line]
    engine = next(float(r[1]) for r in rows if "run_backward" in " ".join(r))
    dispatch = next(float(r[3]) for r in rows if "jit.py" in " ".join(r) and "(run)" in " ".join(r))
    return {"engine_own": engine, "dispatch_cum": dispatch, "total": total}


def gluon_launch_us(kind: str, way: str) -> float:
    """Host µs of one Gluon launch (kind fwd/bwd) through Triton's dispatch or directly (newest run)."""
    piece = f"ours: Gluon {'forward' if kind == 'fwd' else 'backward'} launch, " + (
        "Triton's dispatch" if way == "dispatch" else "direct")
    return float(host_runs(piece).iloc[-1])


def tuned_best_ms(key: str, kernel: str) -> float:
    """The fastest median the tuner's newest run of (key, kernel) measured (confirmation rounds
    where it has them), ms."""
    t = load_results(TUNE_BENCH, status="ok")
    t = t[(t.key == key) & (t.kernel == kernel)]
    t = t[t.run == t.run.max()]
    if "phase" in t and (t.phase == "confirm").any():
        t = t[t.phase == "confirm"]
    return float(t.groupby(t.config.astype(str)).ms.median().min())


def _long(s: pd.Series, **where) -> pd.Series:
    s = _at(s, **where)
    return s[s.index.get_level_values("seq") >= LONG]
register(FACTS)
