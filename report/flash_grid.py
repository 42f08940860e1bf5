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
from report.flash import MODE_WORDS, register
from report.flash_ab import host_us
from report.results import format_value, load_results, markdown_table, provenance_line

GRID_BENCH = "attention/flash_grid"
SOURCE = f"results/{GRID_BENCH}/nvidia-h200.jsonl"
TUNE_BENCH = "attention/flash_tune"
CELL = ["d", "mask", "batch x heads", "seq"]
STEP_CELL = {"d": 128, "mask": "causal", "batch x heads": "1 x 32", "seq": 32768}  # the 2026 training step's attention
GLUON_FLOOR_CELL = (64, "causal", "1 x 16")  # runs the tuned Gluon kernels from seq 4,096
LONG = 8192  # the page's "long sequences" start here
IMPL_WORDS = {"ours": "ours", "cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2 CUDA)", "flex": "flex_attention"}


def grid_rows(status: str | None = "ok") -> pd.DataFrame:
    """The sweep's rows with the cell's columns in words: mask ("causal"/"full"), "batch x heads".
    A cell measured again (`--remeasure`, after a new table) counts by its newest row."""
    df = load_results(GRID_BENCH)
    df = df.drop_duplicates(list(GRID_KEY), keep="last")
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


def earlier_speeds(mode: str = "fwd_bwd") -> pd.Series:
    """Ours' speed vs cuDNN per cell in the earlier run (rows of a git other than the newest run's;
    the newest such row per cell), for before/after comparisons."""
    df = load_results(GRID_BENCH, status="ok")
    df = df[(df.git != newest_git()) & (df.impl == "ours") & (df["mode"] == mode)].drop_duplicates(list(GRID_KEY), keep="last")
    df = df.assign(mask=df.causal.map({True: "causal", False: "full"}),
                   **{"batch x heads": [f"{b} x {h}" for b, h in zip(df.batch, df.heads)]})
    return df.set_index(CELL).speed_vs_cudnn.astype(float).sort_index()


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
    return (markdown_table(_by_seq(shown.sort_index()))
            + "\n\n" + provenance_line(df, SOURCE) + f" *{IMPL_WORDS[impl]}, {MODE_WORDS[mode]}: cuDNN's time over"
            " this implementation's, same run; above 1 is faster than cuDNN. † from the earlier run (git "
            + ", ".join(sorted(set(ok.git) - {newest_git()})) + ", the table before the grid's keys were tuned).*")


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


def tuned_misses(mode: str) -> pd.Series:
    """Cells of the tuned class (causal, d = 64, seq >= LONG) where ours is below cuDNN."""
    s = long_range(mode, d=64, mask="causal")
    return s[s < 1.0]


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


def flex_oom_gib() -> float:
    """The allocation flex's one failed row asked for (GiB), read from its error message."""
    df = grid_rows(status="oom")
    err = df[df.impl == "flex"].error
    if len(err) != 1:
        raise KeyError(f"expected one flex OOM row in {SOURCE}, found {len(err)}")
    return float(re.search(r"Tried to allocate ([0-9.]+) GiB", err.iloc[0]).group(1))


def step(impl: str, mode: str) -> float:
    return float(times(impl, mode).loc[tuple(STEP_CELL[c] for c in CELL)])


def step_backward_ms(impl: str) -> float:
    """The backward alone at the step's cell: forward+backward minus forward (same run)."""
    return step(impl, "fwd_bwd") - step(impl, "fwd")


def short_ms(impl: str, mode: str, seq: int = 1024) -> pd.Series:
    return _at(times(impl, mode), seq=seq)


def host_step_us(impl: str) -> float:
    """Host µs of one eager forward+backward step at the grid's short shape (16 x 1,024, d = 64)."""
    piece = "ours: forward+backward step (Fn.apply, eager)" if impl == "ours" else "cudnn: forward+backward step"
    return host_us(piece, seq=1024)


FACTS = {  # name -> (function of nothing, format)
    "flash.grid_cells": (lambda: len(speeds()), "d"),
    "flash.grid_met_fwd_bwd": (lambda: len(met("fwd_bwd")), "d"),
    "flash.grid_met_fwd": (lambda: len(met("fwd")), "d"),
    "flash.grid_worst_fwd_bwd": (lambda: speeds().min(), ".2f"),
    "flash.grid_worst_fwd_bwd_cell": (lambda: cell_words(speeds().idxmin()), ""),
    "flash.grid_tuned_miss": (lambda: tuned_misses("fwd_bwd").iloc[0], ".3f"),
    "flash.grid_tuned_miss_cell": (lambda: cell_words(tuned_misses("fwd_bwd").index[0]), ""),
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
    "flash.grid_ours_floor_ms": (lambda: times("ours", "fwd_bwd").min(), ".2f"),
    "flash.grid_short_ours_fwd_min_ms": (lambda: short_ms("ours", "fwd").min(), ".3f"),
    "flash.grid_short_ours_fwd_max_ms": (lambda: short_ms("ours", "fwd").max(), ".3f"),
    "flash.grid_short_ours_fwd_bwd_min_ms": (lambda: short_ms("ours", "fwd_bwd").min(), ".2f"),
    "flash.grid_short_ours_fwd_bwd_max_ms": (lambda: short_ms("ours", "fwd_bwd").max(), ".2f"),
    "flash.grid_short_cudnn_fwd_bwd_min_ms": (lambda: short_ms("cudnn", "fwd_bwd").min(), ".2f"),
    "flash.grid_short_cudnn_fwd_bwd_max_ms": (lambda: short_ms("cudnn", "fwd_bwd").max(), ".2f"),
    **{f"flash.grid_gluon_cell_{n // 1024}k_ms": (
        lambda n=n: times("ours", "fwd_bwd").loc[GLUON_FLOOR_CELL + (n,)], ".2f") for n in (2048, 4096, 8192)},
    "flash.grid_flex_oom_gib": (flex_oom_gib, ".0f"),
    "flash.grid_keys": (lambda: len(tuned_keys()), "d"),
    "flash.grid_d128_tuned_at": (lambda: tuned_at(table_key(torch.bfloat16, 128, True, "large")), ""),
    "flash.grid_d128_medium_tuned_at": (lambda: tuned_at(table_key(torch.bfloat16, 128, True, "medium")), ""),
    "flash.grid_host_eager_fwd_us": (lambda: host_us("ours: forward (Fn.apply, eager)"), ".0f"),
    "flash.grid_earlier_cells": (lambda: len(earlier_cells()), "d"),
    "flash.grid_new_git": (newest_git, ""),
    "flash.grid_long_d64_full_min": (lambda: long_range("fwd_bwd", d=64, mask="full").min(), ".2f"),
    "flash.grid_long_d64_full_max": (lambda: long_range("fwd_bwd", d=64, mask="full").max(), ".2f"),
    "flash.grid_long_d64_full_before_min": (lambda: _long(earlier_speeds(), d=64, mask="full").min(), ".2f"),
    "flash.grid_long_d64_full_before_max": (lambda: _long(earlier_speeds(), d=64, mask="full").max(), ".2f"),
    "flash.grid_long_d128_full16_min": (lambda: long_range("fwd_bwd", d=128, mask="full", **{"batch x heads": "1 x 16"}).min(), ".2f"),
    "flash.grid_long_d128_full16_max": (lambda: long_range("fwd_bwd", d=128, mask="full", **{"batch x heads": "1 x 16"}).max(), ".2f"),
    "flash.grid_long_d128_full16_before_min": (lambda: _long(earlier_speeds(), d=128, mask="full", **{"batch x heads": "1 x 16"}).min(), ".2f"),
    "flash.grid_long_d128_full16_before_max": (lambda: _long(earlier_speeds(), d=128, mask="full", **{"batch x heads": "1 x 16"}).max(), ".2f"),
    "flash.grid_long_d128_min": (lambda: long_range("fwd_bwd", d=128).min(), ".2f"),
    "flash.grid_long_d128_max": (lambda: long_range("fwd_bwd", d=128).max(), ".2f"),
    "flash.grid_long_d64_min": (lambda: long_range("fwd_bwd", d=64).min(), ".2f"),
    "flash.grid_gluon_full_4k_ms": (lambda: times("ours", "fwd_bwd").loc[(64, "full", "1 x 16", 4096)], ".2f"),
    "flash.grid_gluon_full_4k_before_ms": (lambda: earlier_times().loc[(64, "full", "1 x 16", 4096)], ".2f"),
    "flash.grid_host_step_us": (lambda: host_step_us("ours"), ".0f"),
    "flash.grid_host_cudnn_step_us": (lambda: host_step_us("cudnn"), ".0f"),
}


def _long(s: pd.Series, **where) -> pd.Series:
    s = _at(s, **where)
    return s[s.index.get_level_values("seq") >= LONG]


def earlier_times(mode: str = "fwd_bwd") -> pd.Series:
    """Ours' median ms per cell in the earlier run (as earlier_speeds)."""
    df = load_results(GRID_BENCH, status="ok")
    df = df[(df.git != newest_git()) & (df.impl == "ours") & (df["mode"] == mode)].drop_duplicates(list(GRID_KEY), keep="last")
    df = df.assign(mask=df.causal.map({True: "causal", False: "full"}),
                   **{"batch x heads": [f"{b} x {h}" for b, h in zip(df.batch, df.heads)]})
    return df.set_index(CELL).median_ms.astype(float).sort_index()
register(FACTS)
