"""The profiling chapter: end-to-end timings, the warm-up study and the per-kernel profiles.

Everything here reads committed rows (results/end-to-end/, results/profiling/) and returns a
DataFrame, a Markdown table with its provenance line, a figure, or a fact for a hand-written
sentence. The helpers at the top (`ok`, `newest`, `value`, `with_source`) are shared by the other
Part 1 report modules (mixed_precision, memory, attention).
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.bench.device import peak_flops
from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.model.config import PRESETS
from cs336_systems.profiling.kernel_attribution import RANGE_TOLERANCE
from cs336_systems.profiling.nvtx import attention_flops
from cs336_systems.profiling.sweeps import warmup_stats
from cs336_systems.profiling.torch_profile import is_matmul, short_name
from report.facts import fact
from report.figures import new_figure
from report.results import load_results, markdown_table, provenance_line

SIZES = list(PRESETS)  # small ... 2.7B
SRC = "results/{}/nvidia-h200.jsonl"
PHASES = {"fwd": "forward", "bwd": "backward", "opt": "optimizer"}


# ---- shared helpers --------------------------------------------------------------------------------

def ok(bench: str) -> pd.DataFrame:
    return load_results(bench, status="ok")


def newest(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """The newest row of each cell (re-measured cells keep their older rows in the file)."""
    return df.sort_values("time_utc").drop_duplicates(key, keep="last")


def by_size(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in preset order (small ... 2.7B), the order within a size kept."""
    return df.assign(_o=df["size"].map(SIZES.index)).sort_values("_o", kind="stable").drop(columns="_o")


def pm(mean: float, std: float) -> str:
    return f"{mean:.1f} ± {std:.1f}"


def value(bench: str, column: str, **where) -> float:
    """One measured number: the newest ok row matching `where`."""
    df = ok(bench)
    for k, v in where.items():
        df = df[df[k] == v]
    if df.empty:
        raise LookupError(f"no ok row in {bench} with {where}")
    return float(df.sort_values("time_utc")[column].iloc[-1])


def with_source(table: pd.DataFrame, bench: str, used: pd.DataFrame | None = None,
                floatfmt: str = ".3g", formats: dict | None = None) -> str:
    """The table plus the provenance of the rows it shows (`used`), else of the whole file."""
    return (markdown_table(table, floatfmt=floatfmt, formats=formats) + "\n\n"
            + provenance_line(used if used is not None else load_results(bench), SRC.format(bench)))


def parameter_tensors(size: str) -> int:
    return len(list(TransformerLM.from_config(get_config(size), device="meta").parameters()))


@fact("profiling.peak_fp32_tflops")
def _() -> str:
    return f"{peak_flops('NVIDIA H200', 'fp32') / 1e12:.0f}"


@fact("profiling.peak_bf16_tflops")
def _() -> str:
    return f"{peak_flops('NVIDIA H200', 'bf16') / 1e12:.0f}"


# ---- benchmarking_script (b): five sizes -----------------------------------------------------------

def timings(dtype: str = "fp32") -> pd.DataFrame:
    """Newest row per (size, mode) of the timing grid at one dtype, indexed by (size, mode)."""
    t = newest(ok("end-to-end/timings"), ["size", "mode", "dtype"])
    return t[t["dtype"] == dtype].set_index(["size", "mode"])


def e2e_table(dtype: str = "fp32") -> str:
    t = timings(dtype)
    rows = []
    for size in SIZES:
        f, b, s = (t.loc[(size, m)] for m in ("forward", "forward-backward", "train"))
        rows.append({"size": size, "params (M)": f"{count_parameters(get_config(size))['total'] / 1e6:,.1f}",
                     "forward ms": pm(f.mean_ms, f.std_ms), "fwd+bwd ms": pm(b.mean_ms, b.std_ms),
                     "train step ms": pm(s.mean_ms, s.std_ms),
                     "bwd / fwd": (b.mean_ms - f.mean_ms) / f.mean_ms,
                     "MFU fwd+bwd": f"{b.mfu:.0%}", "peak GiB (train)": s.peak_mem_gib})
    return with_source(pd.DataFrame(rows), "end-to-end/timings", used=t.reset_index())


def e2e_ratios() -> pd.DataFrame:
    """Per size: backward / forward time, forward+backward std / mean, parameters."""
    t = timings("fp32")
    return pd.DataFrame([{
        "size": s, "bwd_over_fwd": (t.loc[(s, "forward-backward"), "mean_ms"] - t.loc[(s, "forward"), "mean_ms"])
        / t.loc[(s, "forward"), "mean_ms"],
        "fb_cv": t.loc[(s, "forward-backward"), "std_ms"] / t.loc[(s, "forward-backward"), "mean_ms"],
        "fb_ms": t.loc[(s, "forward-backward"), "mean_ms"], "params": count_parameters(get_config(s))["total"],
        "mfu": t.loc[(s, "forward-backward"), "mfu"]} for s in SIZES]).set_index("size")


@fact("profiling.fb_cv_max")
def _() -> str:
    return f"{e2e_ratios().fb_cv.max():.1%}"


@fact("profiling.time_ratio_large_small")
def _() -> str:
    r = e2e_ratios()
    return f"{r.fb_ms['2.7B'] / r.fb_ms['small']:.0f}"


@fact("profiling.param_ratio_large_small")
def _() -> str:
    r = e2e_ratios()
    return f"{r.params['2.7B'] / r.params['small']:.0f}"


@fact("profiling.fwd_ms_small")
def _() -> str:
    return f"{timings().loc[('small', 'forward'), 'mean_ms']:.0f}"


@fact("profiling.fwd_ms_large")
def _() -> str:
    return f"{timings().loc[('2.7B', 'forward'), 'mean_ms']:.0f}"


@fact("profiling.bwd_ms_small")
def _() -> str:
    t = timings()
    return f"{t.loc[('small', 'forward-backward'), 'mean_ms'] - t.loc[('small', 'forward'), 'mean_ms']:.0f}"


@fact("profiling.bwd_ms_large")
def _() -> str:
    t = timings()
    return f"{t.loc[('2.7B', 'forward-backward'), 'mean_ms'] - t.loc[('2.7B', 'forward'), 'mean_ms']:.0f}"


# ---- benchmarking_script (c): warm-up -------------------------------------------------------------

def warmup_rows() -> pd.DataFrame:
    """One row per (size, mode) of the fresh-process traces: the first step against the steady state
    (median of steps 4 on), and mean/std with 0, 1, 2 warm-up steps read off the same trace, next to
    the 5-warm-up timing of the grid (a different process)."""
    w = by_size(newest(ok("end-to-end/warmup"), ["size", "mode"]))
    five = timings("fp32")
    out = []
    for _, r in w.iterrows():
        steady = pd.Series(r.step_ms[3:]).median()
        row = {"size": r["size"], "mode": r["mode"], "context_ms": r.context_init_ms,
               "first_ms": r.step_ms[0], "steady_ms": steady}
        for k in (0, 1, 2):
            s = warmup_stats(r.step_ms, k, len(r.step_ms) - 2)
            row[f"w{k}_mean"], row[f"w{k}_std"] = s["mean_ms"], s["std_ms"]
        row["w5_mean"] = five.loc[(r["size"], r["mode"]), "mean_ms"]
        row["w5_std"] = five.loc[(r["size"], r["mode"]), "std_ms"]
        out.append(row)
    df = pd.DataFrame(out)
    return df.assign(extra_ms=df.first_ms - df.steady_ms, first_over_steady=df.first_ms / df.steady_ms,
                     w1_vs_w2=(df.w1_mean / df.w2_mean - 1).abs(), std_w1_over_w2=df.w1_std / df.w2_std,
                     w5_vs_w1=(df.w5_mean / df.w1_mean - 1).abs())


def warmup_table() -> str:
    w = warmup_rows()
    shown = pd.DataFrame({"size": w["size"], "mode": w["mode"], "CUDA context ms": w.context_ms,
                          "first step ms": w.first_ms,
                          **{f"{k} warm-up: mean ± std": [pm(m, s) for m, s in zip(w[f"w{k}_mean"], w[f"w{k}_std"])]
                             for k in (0, 1, 2)},
                          "5 warm-up (own run)": [pm(m, s) for m, s in zip(w.w5_mean, w.w5_std)]})
    return with_source(shown, "end-to-end/warmup", formats={"CUDA context ms": ",.0f", "first step ms": ",.0f"})


def warmup_figure(mode: str = "forward-backward"):
    """Per-step time of a fresh process over its steady state: what the first step pays."""
    w = by_size(newest(ok("end-to-end/warmup"), ["size", "mode"]))
    fig, ax = new_figure(7, 3.2)
    for _, r in w[w["mode"] == mode].iterrows():
        steady = pd.Series(r.step_ms[3:]).median()
        ax.plot(range(1, len(r.step_ms) + 1), [t / steady for t in r.step_ms], marker="o", ms=3, label=r["size"])
    ax.set_yscale("log")
    ax.set_xlabel("step of a fresh process")
    ax.set_ylabel("time / steady-state time")
    ax.set_title(f"{mode}, context 512, fp32: the first step pays for start-up", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def _warm(mode: str) -> pd.DataFrame:
    w = warmup_rows()
    return w[w["mode"] == mode]


@fact("profiling.first_extra_fb_ms")
def _() -> str:
    w = _warm("forward-backward")
    return f"{w.extra_ms.min():.0f} to {w.extra_ms.max():.0f}"


@fact("profiling.first_extra_fwd_ms")
def _() -> str:
    w = _warm("forward")
    return f"{w.extra_ms.min():.0f} to {w.extra_ms.max():.0f}"


@fact("profiling.first_over_steady_small_fwd")
def _() -> str:
    return f"{_warm('forward').set_index('size').first_over_steady['small']:.0f}"


@fact("profiling.cuda_context_ms")
def _() -> str:
    w = warmup_rows()
    return f"{w.context_ms.min():.0f} to {w.context_ms.max():.0f}"


@fact("profiling.w1_vs_w2_max")
def _() -> str:
    return f"{warmup_rows().w1_vs_w2.max():.1%}"


@fact("profiling.std_w1_over_w2")
def _() -> str:
    w = warmup_rows()
    return f"{w.std_w1_over_w2.min():.2f} to {w.std_w1_over_w2.max():.2f}"


@fact("profiling.w5_vs_w1_max_big")
def _() -> str:
    w = warmup_rows()
    return f"{w[w['size'] != 'small'].w5_vs_w1.max():.1%}"


@fact("profiling.w5_vs_w1_max_small")
def _() -> str:
    w = warmup_rows()
    return f"{w[w['size'] == 'small'].w5_vs_w1.max():.0%}"


# ---- nsys_profile: the kernel profiles -----------------------------------------------------------

def kernel_cells() -> pd.DataFrame:
    """The newest row per (size, context) of the profiler grid, in size then context order, with the
    matmul shares of forward+backward and of the whole step, and the non-matmul share."""
    c = by_size(newest(ok("profiling/kernel_cells"), ["size", "context"]).sort_values("context"))
    mm = c.fwd_kernel_ms * c.fwd_matmul_share + c.bwd_kernel_ms * c.bwd_matmul_share
    fb = c.fwd_kernel_ms + c.bwd_kernel_ms
    return c.assign(fb_matmul_share=mm / fb, step_matmul_share=mm / (fb + c.opt_kernel_ms),
                    fb_other_share=1 - mm / fb).reset_index(drop=True)


def overcounted(r) -> list[str]:
    """Phases of one cell whose kernel time exceeds the phase's wall time: on one CUDA stream kernels
    run one after another, so a ratio above 1 means some kernels were counted twice."""
    return [p for p in PHASES if r[f"{p}_kernel_ms"] > r[f"{p}_range_ms"] * (1 + RANGE_TOLERANCE)]


def kernel_rows() -> pd.DataFrame:
    """The kernel rows of the newest profiler run of each cell. Cells whose row names its `cell_run`
    get that run's kernels only; older cells (no run id) keep the newest row per kernel."""
    k = ok("profiling/kernels")
    if "cell_run" not in k:
        k = k.assign(cell_run=None)
    parts = []
    for _, r in kernel_cells().iterrows():
        kk = k[(k["size"] == r["size"]) & (k["context"] == r.context)]
        run = r.get("cell_run")
        parts.append(kk[kk["cell_run"] == run] if isinstance(run, str) else
                     newest(kk[kk["cell_run"].isna()], ["size", "context", "phase", "region", "kernel"]))
    return pd.concat(parts, ignore_index=True) if parts else k.iloc[:0]


def phase_table() -> str:
    """(a) and (d): profiler against the Python timer, and the matmul share per phase."""
    c = kernel_cells()
    shown = pd.DataFrame({
        "size": c["size"], "ctx": c.context, "fwd kernels ms": c.fwd_kernel_ms, "fwd range ms": c.fwd_range_ms,
        "fwd Python timer ms": c.fwd_python_ms, "kernels / range": c.fwd_kernel_ms / c.fwd_range_ms,
        "matmul share fwd": c.fwd_matmul_share.map("{:.0%}".format),
        "fwd+bwd": c.fb_matmul_share.map("{:.0%}".format),
        "whole step": c.step_matmul_share.map("{:.0%}".format), "optimizer ms": c.opt_kernel_ms})
    return with_source(shown, "profiling/kernel_cells", used=c)


def top_kernels(context: int = 512) -> pd.DataFrame:
    """(b) per size: the forward's top kernel and its launches (as layers x k + rest), the backward's,
    and the top kernel of forward and backward together."""
    c = kernel_cells()
    c = c[c["context"] == context]
    k = kernel_rows()
    k = k[(k["context"] == context) & k["phase"].isin(["forward", "backward"])]
    out = []
    for _, r in c.iterrows():
        layers = get_config(r["size"]).num_layers
        both = k[k["size"] == r["size"]].groupby("kernel")["total_ms"].sum().idxmax()
        out.append({"size": r["size"], "layers": layers, "fwd_top": r.fwd_top_kernel,
                    "fwd_calls": int(r.fwd_top_calls), "per_layer": int(r.fwd_top_calls) // layers,
                    "rest": int(r.fwd_top_calls) % layers, "fwd_ms": r.fwd_top_ms,
                    "fwd_share": r.fwd_top_ms / r.fwd_kernel_ms, "bwd_top": r.bwd_top_kernel,
                    "bwd_calls": int(r.bwd_top_calls), "bwd_ms": r.bwd_top_ms, "both_top": both,
                    "both_is_fwd_top": both == r.fwd_top_kernel})
    return pd.DataFrame(out)


def top_kernel_table(context: int = 512) -> str:
    t = top_kernels(context)
    name = lambda s: f"`{short_name(s, 48)}`"  # noqa: E731
    shown = pd.DataFrame({
        "size": t["size"], "forward: top kernel": t.fwd_top.map(name), "calls": t.fwd_calls,
        "= layers x k + rest": [f"{L} x {k} + {r}" for L, k, r in zip(t.layers, t.per_layer, t.rest)],
        "ms": t.fwd_ms, "share": t.fwd_share.map("{:.0%}".format),
        "backward: top kernel": t.bwd_top.map(name), "calls ": t.bwd_calls, "ms ": t.bwd_ms,
        "top of fwd+bwd is the forward's": t.both_is_fwd_top})
    c = kernel_cells()
    return with_source(shown, "profiling/kernel_cells", used=c[c["context"] == context])


def kernel_list(size: str, context: int, phase: str, n: int = 8, matmul: bool | None = None) -> str:
    """Top kernels of one phase (regions merged), optionally only matmul or only non-matmul ones."""
    k = kernel_rows()
    k = k[(k["size"] == size) & (k["context"] == context) & (k["phase"] == phase)]
    g = k.groupby("kernel", as_index=False).agg(calls=("calls", "sum"), ms=("total_ms", "sum"))
    g["matmul"] = g["kernel"].map(is_matmul)
    if matmul is not None:
        g = g[g["matmul"] == matmul]
    g = g.sort_values("ms", ascending=False).head(n)
    g["share of phase"] = (g["ms"] / k["total_ms"].sum()).map("{:.1%}".format)
    g["kernel"] = g["kernel"].map(lambda s: f"`{short_name(s, 70)}`")
    return with_source(g[["kernel", "calls", "ms", "share of phase"]], "profiling/kernels", used=k)


@fact("profiling.cells_ran")
def _() -> str:
    c = newest(load_results("profiling/kernel_cells"), ["size", "context"])
    return f"{(c['status'] == 'ok').sum()} of {len(c)}"


def _cell(size: str, context: int):
    c = kernel_cells()
    return c[(c["size"] == size) & (c["context"] == context)].iloc[0]


@fact("profiling.large_fwd_kernel_ms")
def _() -> str:
    return f"{_cell('2.7B', 512).fwd_kernel_ms:.0f}"


@fact("profiling.large_fwd_python_ms")
def _() -> str:
    return f"{_cell('2.7B', 512).fwd_python_ms:.0f}"


@fact("profiling.small_fwd_kernel_ms")
def _() -> str:
    return f"{_cell('small', 128).fwd_kernel_ms:.1f}"


@fact("profiling.small_fwd_python_ms")
def _() -> str:
    return f"{_cell('small', 128).fwd_python_ms:.1f}"


@fact("profiling.small_fwd_range_ms")
def _() -> str:
    return f"{_cell('small', 128).fwd_range_ms:.1f}"


@fact("profiling.top_not_fwd_sizes")
def _() -> str:
    t = top_kernels()
    names = list(t[~t.both_is_fwd_top]["size"])
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@fact("profiling.other_share")
def _() -> str:
    c = kernel_cells()
    return f"{c.fb_other_share.min():.0%} to {c.fb_other_share.max():.0%}"


@fact("profiling.fwd_matmul_share")
def _() -> str:
    c = kernel_cells()
    return f"{c.fwd_matmul_share.min():.0%} to {c.fwd_matmul_share.max():.0%}"


@fact("profiling.step_matmul_share")
def _() -> str:
    c = kernel_cells()
    return f"{c.step_matmul_share.min():.0%} to {c.step_matmul_share.max():.0%}"


@fact("profiling.opt_ms_large")
def _() -> str:
    return f"{_cell('2.7B', 128).opt_kernel_ms:.0f}"


@fact("profiling.share_drop_large_128")
def _() -> str:
    r = _cell("2.7B", 128)
    return f"{r.fb_matmul_share:.0%} to {r.step_matmul_share:.0%}"


@fact("profiling.share_drop_large_1024")
def _() -> str:
    r = _cell("2.7B", 1024)
    return f"{r.fb_matmul_share:.0%} to {r.step_matmul_share:.0%}"


@fact("profiling.adamw_launches_per_tensor")
def _() -> str:
    return f"{_cell('small', 512).opt_launches / parameter_tensors('small'):.0f}"


@fact("profiling.adamw_launches_small")
def _() -> str:
    return f"{_cell('small', 512).opt_launches:,.0f}"


@fact("profiling.tensors_small")
def _() -> str:
    return str(parameter_tensors("small"))


# ---- nsys_profile (e): softmax against the matmuls inside attention ----------------------------------

def attention_region_rows() -> pd.DataFrame:
    """Per profiler cell, the forward's three attention regions; the softmax region against the two
    matmul kernels alone (the scaling kernel of the scores region left out), in time and in FLOPs."""
    k = kernel_rows()
    k = k[(k["phase"] == "forward") & k["region"].isin(["attn_scores", "attn_output"]) & k["kernel"].map(is_matmul)]
    out = []
    for _, r in kernel_cells().iterrows():
        cfg = get_config(r["size"])
        mm = k[(k["size"] == r["size"]) & (k["context"] == r.context)]["total_ms"].sum()
        f = attention_flops(4, cfg.num_heads, int(r.context), cfg.d_head)
        flop_ratio = f["attn_softmax"] / (f["attn_scores"] + f["attn_output"])
        out.append({"size": r["size"], "context": int(r.context), "scores_ms": r.attn_scores_ms,
                    "softmax_ms": r.attn_softmax_ms, "output_ms": r.attn_output_ms, "matmul_ms": mm,
                    "time_ratio": r.attn_softmax_ms / mm, "flop_ratio": flop_ratio,
                    "per_flop": r.attn_softmax_ms / mm / flop_ratio, "overcounted": bool(overcounted(r))})
    return pd.DataFrame(out)


def attention_regions_table() -> str:
    a = attention_region_rows()
    shown = pd.DataFrame({
        "size": a["size"], "ctx": a.context,
        "scores (QKᵀ, scale) ms": a.scores_ms, "softmax (mask, softmax) ms": a.softmax_ms,
        "output (PV) ms": a.output_ms, "softmax / matmul time": a.time_ratio,
        "softmax / matmul FLOPs": a.flop_ratio, "time ratio / FLOP ratio": a.per_flop})
    return with_source(shown, "profiling/kernel_cells", used=kernel_cells())


@fact("profiling.softmax_time_ratio")
def _() -> str:
    a = attention_region_rows()
    return f"{a.time_ratio.min():.0%} to {a.time_ratio.max():.0%}"


@fact("profiling.softmax_flop_ratio_d64")
def _() -> str:
    f = attention_flops(1, 1, 1, 64)
    return f"{f['attn_softmax'] / (f['attn_scores'] + f['attn_output']):.1%}"


@fact("profiling.softmax_flop_ratio_d80")
def _() -> str:
    f = attention_flops(1, 1, 1, get_config("2.7B").d_head)
    return f"{f['attn_softmax'] / (f['attn_scores'] + f['attn_output']):.1%}"


@fact("profiling.softmax_per_flop")
def _() -> str:
    a = attention_region_rows()
    return f"{a.per_flop.min():.0f} to {a.per_flop.max():.0f}"
