"""The flash_benchmarking sweep (`just bench flash-sweep`): tables, figures and facts.

One row per cell (implementation, dtype, d, seq, mode); a cell re-measured after a kernel change
(`--remeasure`) keeps its old rows in the file, and everything here shows the newest.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.lines import Line2D

from cs336_systems.attention.fast.tuned_configs import TUNED
from report import flash
from report.figures import plt  # the site's figure backend (Agg), set before anything draws
from report.flash import MODE_WORDS, first_value, fwd_margin, low_high
from report.registry import register
from report.results import load_results, markdown_table, newest, where, with_source

SWEEP_BENCH = "attention/flash_sweep"
SWEEP_NAMES = {"triton": "ours Triton", "pytorch": "ours PyTorch", "naive": "plain PyTorch", "sdpa": "SDPA cuDNN"}
SWEEP_CELL = ["impl", "dtype", "d", "seq", "mode"]
DIMS = (16, 32, 64, 128)
LARGEST, OVERHEAD_BOUND = 65536, 4096  # the grid's largest n; up to this n per-call costs dominate
COLORS = {"triton": "C0", "pytorch": "C1", "naive": "C2", "sdpa": "C3"}  # fixed: panels lack some lines


def sweep_rows() -> pd.DataFrame:
    """One row per cell: the newest."""
    return newest(load_results(SWEEP_BENCH), SWEEP_CELL).reset_index(drop=True)


def _cell_text(r: dict) -> str:
    if r["status"] == "ok":
        return f"{r['ms']:.3g}"
    if r["status"] == "unsupported":  # skipped by design, or no such kernel (cuDNN has no fp32)
        return "skip" if str(r.get("error", "")).startswith("skipped") else "n/a"
    return r["status"].upper()


def sweep_table(dtype: str, mode: str) -> str:
    """Rows (d, seq), one column per implementation, ms; OOM and skips shown as such."""
    df = sweep_rows()
    df = df[(df.dtype == dtype) & (df["mode"] == mode)]
    cells = {(r["d"], r["seq"], r["impl"]): _cell_text(r) for r in df.to_dict("records")}
    impls = [i for i in SWEEP_NAMES if i in set(df.impl)]
    rows = [{"d": d, "seq": n, **{SWEEP_NAMES[i]: cells.get((d, n, i), "not run") for i in impls}}
            for d in sorted(set(df.d)) for n in sorted(set(df.seq))]
    return with_source(pd.DataFrame(rows), SWEEP_BENCH, df, formats={"d": "d", "seq": ","})


def _cell(impl: str, dtype: str, d: int, seq: int, mode: str) -> pd.DataFrame:
    return where(sweep_rows(), impl=impl, dtype=dtype, d=d, seq=seq, mode=mode, status="ok")


def _ms(impl: str, dtype: str, d: int, seq: int, mode: str) -> float:
    return first_value(_cell(impl, dtype, d, seq, mode), "ms", f"no measured sweep cell {impl} {dtype} d={d} seq={seq} {mode}")


def speed_vs_cudnn(d: int, mode: str, seq: int = LARGEST) -> float:
    """cuDNN's time over ours, bf16 (above 1: ours is faster)."""
    return _ms("sdpa", "bf16", d, seq, mode) / _ms("triton", "bf16", d, seq, mode)


def vs_cudnn_table(seq: int = LARGEST) -> str:
    """Our speed as a multiple of cuDNN's at one sequence length, bf16: rows d, columns mode."""
    rows = [{"d": d, **{MODE_WORDS[m]: speed_vs_cudnn(d, m, seq) for m in MODE_WORDS}} for d in DIMS]
    return markdown_table(pd.DataFrame(rows), formats={w: ".2f" for w in MODE_WORDS.values()})


def fastest(dtype: str = "bf16", impls: tuple[str, ...] = ("triton", "naive", "sdpa")) -> pd.Series:
    """(d, seq, mode) -> the fastest of `impls` in that cell (cells where all of them ran)."""
    df = sweep_rows()
    df = df[(df.status == "ok") & (df.dtype == dtype) & df.impl.isin(impls)]
    return df.pivot_table(index=["d", "seq", "mode"], columns="impl", values="ms").dropna().idxmin(axis=1)


def small_cells(dtype: str = "bf16") -> pd.DataFrame:
    """(d, seq, mode) x impl ms up to OVERHEAD_BOUND, for ours, plain PyTorch and cuDNN."""
    df = sweep_rows()
    df = df[(df.status == "ok") & (df.dtype == dtype) & (df.seq <= OVERHEAD_BOUND) & (df.impl != "pytorch")]
    return df.pivot_table(index=["d", "seq", "mode"], columns="impl", values="ms")


def code_table() -> str:
    """Which commit timed the cells the tables show (ours apart from the other columns), and the
    older rows of our cells that a re-timing replaced (kept in the file, not shown)."""
    df, every = sweep_rows(), load_results(SWEEP_BENCH)
    shown = df.assign(rows=df.impl.map(lambda i: "ours Triton, shown" if i == "triton" else "the other columns, shown"))
    old = every[every.duplicated(SWEEP_CELL, keep="last")]
    old = old.assign(rows=old.impl.map(lambda i: "ours Triton, replaced" if i == "triton" else "the other columns, replaced"))
    counts = pd.concat([shown, old]).groupby(["rows", "git"], as_index=False).size().rename(columns={"size": "cells"})
    return markdown_table(counts)


def sweep_figure(dtype: str) -> plt.Figure:
    """TFLOP/s against sequence length: one panel per (mode, d), one line per implementation."""
    ok = sweep_rows().query("status == 'ok' and dtype == @dtype")
    dims = sorted(ok.d.unique())
    fig, axes = plt.subplots(len(MODE_WORDS), len(dims), figsize=(3.2 * len(dims), 2.6 * len(MODE_WORDS)),
                             sharex=True, squeeze=False)
    for r, mode in enumerate(MODE_WORDS):
        for c, d in enumerate(dims):
            ax = axes[r][c]
            for impl, label in SWEEP_NAMES.items():
                line = ok[(ok.impl == impl) & (ok["mode"] == mode) & (ok.d == d)].sort_values("seq")
                if not line.empty:
                    ax.plot(line.seq, line.tflops, marker="o", ms=3, label=label, color=COLORS[impl])
            ax.set_xscale("log", base=2)
            ax.set_title(f"{MODE_WORDS[mode]}, d={d}", fontsize=9)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("TFLOP/s")
            if r == len(MODE_WORDS) - 1:
                ax.set_xlabel("sequence length")
    present = [i for i in SWEEP_NAMES if i in set(ok.impl)]
    fig.suptitle(f"causal attention, batch 1, {dtype}: TFLOP/s (FA convention) against sequence length",
                 y=0.995, fontsize=10)
    fig.legend([Line2D([], [], color=COLORS[i], marker="o", ms=3) for i in present],
               [SWEEP_NAMES[i] for i in present], loc="upper center", bbox_to_anchor=(0.5, 0.965),
               ncol=len(present), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


# -- facts ----------------------------------------------------------------------------------------

def _peak_gib(impl: str, dtype: str) -> float:
    """Peak allocated at d = 64 and the largest n, forward+backward: GiB (the sweep's `peak_mem_gb`
    column divides bytes by 2**30)."""
    return float(_cell(impl, dtype, 64, LARGEST, "fwd_bwd").peak_mem_gb.iloc[0])


def _vs_naive(dtype: str, seq: int, d: int = 64, mode: str = "fwd_bwd") -> float:
    """Our speed as a multiple of plain PyTorch's (forward+backward unless `mode` says)."""
    return _ms("naive", dtype, d, seq, mode) / _ms("triton", dtype, d, seq, mode)


_fp32_d128_over_d16 = lambda impl: _ms(impl, "fp32", 128, LARGEST, "fwd") / _ms(impl, "fp32", 16, LARGEST, "fwd")
_small_fastest = lambda: fastest()[fastest().index.get_level_values("seq") <= OVERHEAD_BOUND]
_ours_fwd_bwd_small = lambda: small_cells()["triton"].xs("fwd_bwd", level="mode")

FACTS = {
    "sweep_small_min_ms": lambda: f"{small_cells().min().min():.2f}",
    "sweep_small_max_ms": lambda: f"{small_cells().max().max():.2f}",
    "sweep_small_cells": lambda: len(_small_fastest()),
    "sweep_small_cudnn_fastest": lambda: int((_small_fastest() == "sdpa").sum()),
    "sweep_small_naive_beats_ours": lambda: int((small_cells().naive < small_cells().triton).sum()),
    **low_high("sweep_ours_small_{}_ms", _ours_fwd_bwd_small),
    **{f"sweep_ours_d64_{n // 1024}k_ms": lambda n=n: f'{_ms("triton", "bf16", 64, n, "fwd_bwd"):.2f}'
       for n in (8192, 16384, 32768, 65536)},
    "sweep_vs_cudnn_d64_fwd": lambda: f"{speed_vs_cudnn(64, 'fwd'):.2f}",
    "sweep_ours_tflops_d64_fwd": lambda: f'{_cell("triton", "bf16", 64, LARGEST, "fwd").tflops.iloc[0]:.0f}',
    "sweep_cudnn_tflops_d64_fwd": lambda: f'{_cell("sdpa", "bf16", 64, LARGEST, "fwd").tflops.iloc[0]:.0f}',
    **{f"sweep_vs_naive_bf16_{n // 1024}k": lambda n=n: f'{_vs_naive("bf16", n):.1f}' for n in (16384, 65536)},
    **{f"sweep_vs_naive_fp32_{n // 1024}k": lambda n=n: f'{_vs_naive("fp32", n):.2f}' for n in (16384, 65536)},
    "sweep_vs_naive_fp32_d128_64k": lambda: f'{_vs_naive("fp32", LARGEST, d=128):.2f}',
    "sweep_vs_naive_fp32_d16_64k": lambda: f'{_vs_naive("fp32", LARGEST, d=16):.1f}',
    "sweep_naive_fp32_fwd_d128_over_d16": lambda: f'{_fp32_d128_over_d16("naive"):.1f}',
    "sweep_ours_fp32_fwd_d128_over_d16": lambda: f'{_fp32_d128_over_d16("triton"):.1f}',
    **{f"sweep_fp32_d64_{m}_vs_naive": lambda m=m: f'{_vs_naive("fp32", LARGEST, mode=m):.2f}' for m in ("fwd", "bwd")},
    "sweep_mem_naive_fp32_gib": lambda: f'{_peak_gib("naive", "fp32"):.0f}',
    "sweep_mem_ours_fp32_gib": lambda: f'{_peak_gib("triton", "fp32"):.2f}',
    "sweep_oom_cells": lambda: int((sweep_rows().status == "oom").sum()),
    "sweep_pytorch_cells": lambda: int(((sweep_rows().impl == "pytorch") & (sweep_rows().status == "ok")).sum()),
    "sweep_pytorch_fwd_4k_ms": lambda: f'{_ms("pytorch", "bf16", 64, 4096, "fwd"):.1f}',
    "sweep_ours_fwd_4k_ms": lambda: f'{_ms("triton", "bf16", 64, 4096, "fwd"):.2f}',
}


def _vs_cudnn_falls_with_d() -> bool:
    """Faster than cuDNN at d = 16, 32, 64, slower at 128, the margin shrinking as d grows."""
    speeds = [[speed_vs_cudnn(d, mode) for d in DIMS] for mode in MODE_WORDS]
    return all(min(r[:3]) > 1 > r[3] and r == sorted(r, reverse=True) for r in speeds)


def _fp32_margin_shrinks_with_d() -> bool:
    v = [_vs_naive("fp32", LARGEST, d=d) for d in DIMS]
    return v == sorted(v, reverse=True) and v[0] > 2 > 1 > v[-1]


def _fp32_tuned_at_16k() -> bool:
    """Every fp32 key of the table is a medium key whose tuning rows took true fp32 products at
    16,384 positions; no other fp32 size class; our fp32 cells were timed after that tuning."""
    tune = load_results("attention/flash_tune")
    fp32 = tune[tune.key.str.startswith("fp32") & (tune.get("fp32_dots") == "ieee")]
    ours = sweep_rows().query("impl == 'triton' and dtype == 'fp32'")
    keys = [{k for k in TUNED[kind] if k.startswith("fp32")} for kind in ("fwd", "bwd")]
    return (all(k == {f"fp32-d{d}-causal-medium" for d in DIMS} and k <= set(fp32.key) for k in keys)
            and set(fp32.seq) == {16384} and len(ours) == 120 and (pd.to_datetime(ours.time_utc) > pd.to_datetime(fp32.time_utc).max()).all())


def _lb_key_cells_ran_gluon() -> bool:
    """The sweep's cells at the leaderboard key were timed after the first leaderboard run of the Gluon kernels."""
    rows = sweep_rows().query("impl == 'triton' and dtype == 'bf16' and d == 64 and seq == @LARGEST")
    lb = flash.leaderboard_rows()
    first = lb[lb.git.map(flash.KERNELS_BY_GIT) == flash.ALL_GLUON].time_utc.min()
    return pd.to_datetime(rows.time_utc, utc=True).min() >= pd.to_datetime(first, utc=True)


register("flash", facts=FACTS, tables={
    "vs_cudnn": vs_cudnn_table, "sweep_code": code_table,
    **{f"sweep_{dt}_{m}": (lambda dt=dt, m=m: sweep_table(dt, m)) for dt in ("bf16", "fp32") for m in MODE_WORDS},
}, figures={"sweep_bf16": lambda: sweep_figure("bf16"), "sweep_fp32": lambda: sweep_figure("fp32")}, claims={
    "pytorch_fa2_is_no_fast_path": lambda: _ms("pytorch", "bf16", 64, 4096, "fwd") > 10 * _ms("triton", "bf16", 64, 4096, "fwd"),
    # most of both: the sentences read as the common case
    "cudnn_wins_most_small_cells": lambda: (_small_fastest() == "sdpa").mean() > 0.5,
    "plain_pytorch_beats_ours_in_most_small_cells": lambda: (small_cells().naive < small_cells().triton).mean() > 0.5,
    "d64_leaves_the_band_at_65536": lambda: all(_ms("triton", "bf16", 64, n, "fwd_bwd") <= _ours_fwd_bwd_small().max()
                                                for n in (8192, 16384, 32768))
    and _ms("triton", "bf16", 64, LARGEST, "fwd_bwd") > _ours_fwd_bwd_small().max(),
    "faster_than_cudnn_up_to_d64": _vs_cudnn_falls_with_d,
    "sweep_forward_margin_is_wider": lambda: speed_vs_cudnn(64, "fwd") - 1 > fwd_margin(),
    "bf16_clear_fp32_barely": lambda: all(_vs_naive("bf16", n) > 2 and 1 < _vs_naive("fp32", n) < 1.2  # under 20%
                                          and _vs_naive("fp32", n, d=128) < 1 for n in (16384, LARGEST)),
    "fp32_needs_less_memory": lambda: _peak_gib("triton", "fp32") < _peak_gib("naive", "fp32"),
    "fp32_margin_shrinks_with_d": _fp32_margin_shrinks_with_d,
    "fp32_near_tie_hides_a_split": lambda: _vs_naive("fp32", LARGEST, mode="fwd") > 1 > _vs_naive("fp32", LARGEST, mode="bwd"),
    "fp32_plain_flat_in_d_ours_grows": lambda: _fp32_d128_over_d16("naive") < 1.5 and _fp32_d128_over_d16("triton") > 8,
    "fp32_backward_crosses_over_first": lambda: _vs_naive("fp32", LARGEST, d=32, mode="bwd") > 1 > _vs_naive("fp32", LARGEST, d=64, mode="bwd")
    and _vs_naive("fp32", LARGEST, d=64, mode="fwd") > 1 > _vs_naive("fp32", LARGEST, d=128, mode="fwd"),
    "fp32_tiles_tuned_at_16384": _fp32_tuned_at_16k,
    "no_sweep_cell_ran_out_of_memory": lambda: (sweep_rows().status == "oom").sum() == 0,
    "lb_key_cells_ran_the_gluon_kernels": _lb_key_cells_ran_gluon,
})
