"""The flash_benchmarking sweep: one row per cell (implementation, dtype, d, seq, mode). A cell re-measured
after a kernel change (`--remeasure`) keeps its old rows in the file; everything here shows the newest.
"""

from __future__ import annotations

import pandas as pd

from report import flash
from report.figures import plt  # the site's figure backend (Agg), set before anything draws
from report.flash import MODE_WORDS, first_value
from report.registry import register
from report.results import load_results, markdown_table, newest, where, with_source
from report.units import span

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
    df = where(sweep_rows(), dtype=dtype, mode=mode)
    cells = {(r["d"], r["seq"], r["impl"]): _cell_text(r) for r in df.to_dict("records")}
    impls = [i for i in SWEEP_NAMES if i in set(df.impl)]
    rows = [{"d": d, "seq": n, **{SWEEP_NAMES[i]: cells.get((d, n, i), "not run") for i in impls}}
            for d in sorted(set(df.d)) for n in sorted(set(df.seq))]
    return with_source(pd.DataFrame(rows), SWEEP_BENCH, df, formats={"d": "d", "seq": ","})


def _ms(impl: str, dtype: str, d: int, seq: int, mode: str, column: str = "ms") -> float:
    cell = where(sweep_rows(), impl=impl, dtype=dtype, d=d, seq=seq, mode=mode, status="ok")
    return first_value(cell, column, f"no measured sweep cell {impl} {dtype} d={d} seq={seq} {mode}")


def speed_vs(other: str, d: int, mode: str, dtype: str = "bf16", seq: int = LARGEST) -> float:
    """`other`'s time over ours (above 1: ours is faster)."""
    return _ms(other, dtype, d, seq, mode) / _ms("triton", dtype, d, seq, mode)


def vs_table(other: str, dtype: str) -> str:
    """Our speed as a multiple of `other`'s at the largest n: rows d, columns mode."""
    rows = [{"d": d, **{MODE_WORDS[m]: speed_vs(other, d, m, dtype) for m in MODE_WORDS}} for d in DIMS]
    return markdown_table(pd.DataFrame(rows), formats={w: ".2f" for w in MODE_WORDS.values()})


def small_cells() -> pd.DataFrame:
    """(d, seq, mode) x impl ms up to OVERHEAD_BOUND, bf16, for ours, plain PyTorch and cuDNN."""
    df = sweep_rows()
    df = df[(df.status == "ok") & (df.dtype == "bf16") & (df.seq <= OVERHEAD_BOUND) & (df.impl != "pytorch")]
    return df.pivot_table(index=["d", "seq", "mode"], columns="impl", values="ms")


def code_table() -> str:
    """Which commit timed the cells the tables show, and the older rows a re-timing replaced (not shown)."""
    every = load_results(SWEEP_BENCH)
    replaced = pd.Series(~every.index.isin(newest(every, SWEEP_CELL).index), index=every.index)
    whose = every.impl.map(lambda i: "ours Triton" if i == "triton" else "the other columns")
    rows = every.assign(rows=whose + replaced.map({False: ", shown", True: ", replaced"}))
    return markdown_table(rows.groupby(["rows", "git"], as_index=False).size().rename(columns={"size": "cells"}))


def sweep_figure(dtype: str) -> plt.Figure:
    """TFLOP/s against sequence length: one panel per (mode, d), one line per implementation."""
    ok = sweep_rows().query("status == 'ok' and dtype == @dtype")
    dims, handles = sorted(ok.d.unique()), {}  # handles: one line per implementation, for the legend
    fig, axes = plt.subplots(len(MODE_WORDS), len(dims), figsize=(3.2 * len(dims), 2.6 * len(MODE_WORDS)),
                             sharex=True, squeeze=False)
    for ax, (mode, d) in zip(axes.flat, [(mode, d) for mode in MODE_WORDS for d in dims]):
        for impl, label in SWEEP_NAMES.items():
            line = ok[(ok.impl == impl) & (ok["mode"] == mode) & (ok.d == d)].sort_values("seq")
            if not line.empty:
                handles[label] = ax.plot(line.seq, line.tflops, marker="o", ms=3, color=COLORS[impl])[0]
        ax.set_xscale("log", base=2)
        ax.set_title(f"{MODE_WORDS[mode]}, d={d}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.supxlabel("sequence length", fontsize=10)
    fig.supylabel("TFLOP/s", fontsize=10)
    fig.suptitle(f"causal attention, batch 1, {dtype}: TFLOP/s (FA convention) against sequence length",
                 y=0.995, fontsize=10)
    fig.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.965),
               ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _peak_gib(impl: str) -> float:
    """fp32 forward+backward at d = 64 and the largest n: GiB (`peak_mem_gb` divides bytes by 2**30)."""
    return _ms(impl, "fp32", 64, LARGEST, "fwd_bwd", "peak_mem_gb")


def _fp32_d128_over_d16(impl: str) -> float:
    return _ms(impl, "fp32", 128, LARGEST, "fwd") / _ms(impl, "fp32", 16, LARGEST, "fwd")


def _d64_leaves_the_band() -> bool:
    ms = [_ms("triton", "bf16", 64, n, "fwd_bwd") for n in (8192, 16384, 32768, LARGEST)]
    return max(ms[:-1]) <= small_cells().max().max() < ms[-1]


def _vs_cudnn_falls_with_d() -> bool:
    """In every mode: faster than cuDNN at d = 16, 32, 64, slower at 128, the margin shrinking as d grows."""
    speeds = [[speed_vs("sdpa", d, mode) for d in DIMS] for mode in MODE_WORDS]
    return all(min(r[:3]) > 1 > r[3] and r == sorted(r, reverse=True) for r in speeds)


def _fp32_margin_shrinks_with_d() -> bool:
    """Forward+backward over plain PyTorch: bf16 above 2x at d = 64; fp32 falling with d from above 2x to below 1."""
    v = [speed_vs("naive", d, "fwd_bwd", "fp32") for d in DIMS]
    return (speed_vs("naive", 64, "fwd_bwd") > 2 and v == sorted(v, reverse=True)
            and v[0] > 2 and 1 < v[2] < 1.2 and v[-1] < 1)


def _lb_key_cells_ran_gluon() -> bool:
    """The sweep's cells at the leaderboard key were timed after the first leaderboard run of the Gluon kernels."""
    rows = sweep_rows().query("impl == 'triton' and dtype == 'bf16' and d == 64 and seq == @LARGEST")
    lb = flash.leaderboard_rows()
    first = lb[lb.git.map(flash.KERNELS_BY_GIT) == flash.ALL_GLUON].time_utc.min()
    return pd.to_datetime(rows.time_utc, utc=True).min() >= pd.to_datetime(first, utc=True)


register("flash", facts={
    "sweep_small_ms": lambda: span(small_cells().stack().dropna(), ".2f"),
    "sweep_vs_naive_bf16_64k": lambda: f'{speed_vs("naive", 64, "fwd_bwd"):.1f}',
    "sweep_vs_naive_fp32_64k": lambda: f'{speed_vs("naive", 64, "fwd_bwd", "fp32"):.2f}',
    "sweep_vs_naive_fp32_d128_64k": lambda: f'{speed_vs("naive", 128, "fwd_bwd", "fp32"):.2f}',
    "sweep_mem_naive_fp32_gib": lambda: f'{_peak_gib("naive"):.0f}',
    "sweep_mem_ours_fp32_gib": lambda: f'{_peak_gib("triton"):.2f}',
    "sweep_pytorch_fwd_4k_ms": lambda: f'{_ms("pytorch", "bf16", 64, 4096, "fwd"):.1f}',
    "sweep_ours_fwd_4k_ms": lambda: f'{_ms("triton", "bf16", 64, 4096, "fwd"):.2f}',
}, tables={
    "vs_cudnn": lambda: vs_table("sdpa", "bf16"), "vs_naive_fp32": lambda: vs_table("naive", "fp32"),
    "sweep_code": code_table,
    **{f"sweep_{dt}_{m}": (lambda dt=dt, m=m: sweep_table(dt, m)) for dt in ("bf16", "fp32") for m in MODE_WORDS},
}, figures={"sweep_bf16": lambda: sweep_figure("bf16"), "sweep_fp32": lambda: sweep_figure("fp32")}, claims={
    "pytorch_fa2_is_no_fast_path": lambda: _ms("pytorch", "bf16", 64, 4096, "fwd")
    > 10 * _ms("triton", "bf16", 64, 4096, "fwd"),
    "small_cells_go_to_cudnn_then_plain_pytorch": lambda: (small_cells().dropna().idxmin(axis=1) == "sdpa").mean()
    > 0.9 and (small_cells().naive < small_cells().triton).mean() > 0.5,
    "d64_leaves_the_band_at_65536": _d64_leaves_the_band,
    "faster_than_cudnn_up_to_d64": _vs_cudnn_falls_with_d,
    "fp32_needs_less_memory": lambda: _peak_gib("triton") < _peak_gib("naive"),
    "fp32_margin_shrinks_with_d": _fp32_margin_shrinks_with_d,
    "fp32_plain_flat_in_d_ours_grows": lambda: _fp32_d128_over_d16("naive") < 1.5 and _fp32_d128_over_d16("triton") > 8,
    "no_sweep_cell_ran_out_of_memory": lambda: (sweep_rows().status == "oom").sum() == 0,
    "lb_key_cells_ran_the_gluon_kernels": _lb_key_cells_ran_gluon,
})
