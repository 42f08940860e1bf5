"""Tables and figures of the Part 1 chapters, computed from results/ at site-build time.

Each function reads committed results (report.load_results, which fails the build if a file is
missing) and returns Markdown (or inline SVG) with a provenance line, so no number on the pages is
typed by hand.
"""

from __future__ import annotations

import io

import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.model.config import PRESETS
from report.results import load_results, markdown_table, provenance_line

from .kernel_attribution import ATTRIBUTION, RANGE_TOLERANCE
from .nvtx import attention_flops
from .sweeps import warmup_stats
from .torch_profile import is_matmul, short_name

SIZES = list(PRESETS)
SRC = "results/{}/nvidia-h200.jsonl"


def _ok(bench: str) -> pd.DataFrame:
    return load_results(bench, status="ok")


def _latest(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    return df.sort_values("time_utc").drop_duplicates(key, keep="last")


def _by_size(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in preset order (small ... 2.7B), keeping the existing order within a size."""
    return df.assign(_o=df["size"].map(SIZES.index)).sort_values(["_o"], kind="stable").drop(columns="_o")


def pm(mean: float, std: float) -> str:
    return f"{mean:.1f} ± {std:.1f}"


def _done(df: pd.DataFrame, bench: str, floatfmt: str = ".3g", formats: dict | None = None,
          used: pd.DataFrame | None = None) -> str:
    """The table plus its provenance line: of `used` (the rows the table shows, where it picks one
    run per cell), else of the whole results file."""
    return (markdown_table(df, floatfmt=floatfmt, formats=formats) + "\n\n"
            + provenance_line(used if used is not None else load_results(bench), SRC.format(bench)))


def value(bench: str, column: str, **where) -> float:
    """One measured number, for prose: the newest ok row matching `where`."""
    df = _ok(bench)
    for k, v in where.items():
        df = df[df[k] == v]
    if df.empty:
        raise LookupError(f"no ok row in {bench} with {where}")
    return float(df.sort_values("time_utc")[column].iloc[-1])


# ---- benchmarking_script / benchmarking_mixed_precision ---------------------------------------

def e2e_table(dtype: str = "fp32") -> str:
    df = _latest(_ok("end-to-end/timings"), ["size", "mode", "dtype"])
    df = df[df["dtype"] == dtype]
    out = []
    for size in SIZES:
        r = {m: df[(df["size"] == size) & (df["mode"] == m)] for m in ("forward", "forward-backward", "train")}
        if any(v.empty for v in r.values()):
            continue
        f, b, t = (r[m].iloc[0] for m in ("forward", "forward-backward", "train"))
        out.append({"size": size, "params (M)": f"{count_parameters(get_config(size))['total'] / 1e6:,.1f}",
                    "forward ms": pm(f.mean_ms, f.std_ms), "fwd+bwd ms": pm(b.mean_ms, b.std_ms),
                    "train step ms": pm(t.mean_ms, t.std_ms),
                    "bwd / fwd": (b.mean_ms - f.mean_ms) / f.mean_ms,
                    "MFU fwd+bwd": f"{b.mfu:.0%}", "peak GiB (train)": t.peak_mem_gib})
    return _done(pd.DataFrame(out), "end-to-end/timings", used=df)


def precision_table() -> str:
    df = _latest(_ok("end-to-end/timings"), ["size", "mode", "dtype"])
    out = []
    for size in SIZES:
        for mode in ("forward", "forward-backward", "train"):
            a = df[(df["size"] == size) & (df["mode"] == mode) & (df["dtype"] == "fp32")]
            b = df[(df["size"] == size) & (df["mode"] == mode) & (df["dtype"] == "bf16")]
            if a.empty or b.empty:
                continue
            a, b = a.iloc[0], b.iloc[0]
            out.append({"size": size, "mode": mode, "fp32 ms": pm(a.mean_ms, a.std_ms),
                        "bf16 ms": pm(b.mean_ms, b.std_ms), "speed-up": a.mean_ms / b.mean_ms,
                        "fp32 TFLOP/s": a.tflops, "bf16 TFLOP/s": b.tflops,
                        "MFU fp32": f"{a.mfu:.0%}", "MFU bf16": f"{b.mfu:.0%}"})
    return _done(pd.DataFrame(out), "end-to-end/timings", used=df)


def warmup_table() -> str:
    w = _by_size(_latest(_ok("end-to-end/warmup"), ["size", "mode"]))
    t = _latest(_ok("end-to-end/timings"), ["size", "mode", "dtype"])
    out = []
    for _, r in w.iterrows():
        five = t[(t["size"] == r["size"]) & (t["mode"] == r["mode"]) & (t["dtype"] == "fp32")]
        row = {"size": r["size"], "mode": r["mode"], "CUDA context ms": r.context_init_ms,
               "first step ms": r.step_ms[0]}
        for k in (0, 1, 2):
            s = warmup_stats(r.step_ms, k, len(r.step_ms) - 2)
            row[f"{k} warm-up: mean ± std"] = pm(s["mean_ms"], s["std_ms"])
        row["5 warm-up (own run)"] = pm(five.iloc[0].mean_ms, five.iloc[0].std_ms) if not five.empty else "—"
        out.append(row)
    return _done(pd.DataFrame(out), "end-to-end/warmup", formats={"CUDA context ms": ",.0f", "first step ms": ",.0f"})


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE


def warmup_svg(mode: str = "forward-backward") -> str:
    """Per-step time of a fresh process, normalised by its steady state: the first-step cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = _by_size(_latest(_ok("end-to-end/warmup"), ["size", "mode"]))
    w = w[w["mode"] == mode]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for _, r in w.iterrows():
        steady = pd.Series(r.step_ms[3:]).median()
        ax.plot(range(1, len(r.step_ms) + 1), [t / steady for t in r.step_ms], marker="o", ms=3, label=r["size"])
    ax.set_yscale("log")
    ax.set_xlabel("step of a fresh process")
    ax.set_ylabel("time / steady-state time")
    ax.set_title(f"{mode}, context 512, fp32: the first step pays for start-up", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _svg(fig)


COMPILE_KEY = ["size", "mode", "dtype", "compile"]


def compile_rows() -> pd.DataFrame:
    """One row per compile cell: the earliest measurement. A re-run on the same machine finds
    inductor's on-disk cache warm, so only the first run's first step is a cold compile."""
    return _ok("end-to-end/compile").sort_values("time_utc").drop_duplicates(COMPILE_KEY, keep="first")


def compile_table() -> str:
    df = compile_rows()
    out = []
    for size in SIZES:
        for mode in ("forward", "train"):
            e = df[(df["size"] == size) & (df["mode"] == mode) & (~df["compile"])]
            c = df[(df["size"] == size) & (df["mode"] == mode) & (df["compile"])]
            if e.empty or c.empty:
                continue
            e, c = e.iloc[0], c.iloc[0]
            out.append({"size": size, "mode": mode, "dtype": e["dtype"], "eager ms": pm(e.mean_ms, e.std_ms),
                        "compiled ms": pm(c.mean_ms, c.std_ms), "speed-up": e.mean_ms / c.mean_ms,
                        "first compiled step s": c.first_step_ms / 1e3,
                        "MFU eager": f"{e.mfu:.0%}", "MFU compiled": f"{c.mfu:.0%}"})
    return _done(pd.DataFrame(out), "end-to-end/compile", used=df)


# ---- nsys_profile, answered with torch.profiler -----------------------------------------------

def kernel_cells() -> pd.DataFrame:
    """The newest row per (size, context) of the profiler grid, in size then context order."""
    return _by_size(_latest(_ok("profiling/kernel_cells"), ["size", "context"]).sort_values("context"))


def overcounted(r, rel_tol: float = RANGE_TOLERANCE) -> list[str]:
    """Phases of one profiler cell whose attributed kernel time exceeds the phase's wall time.

    On one CUDA stream kernels run one after another, so their summed time cannot exceed the
    (synchronised) range that launched them: a ratio above 1 means some kernels were counted twice.
    Cells profiled before the attribution counted each device kernel once can show it.
    """
    return [p for p in ("fwd", "bwd", "opt") if r[f"{p}_kernel_ms"] > r[f"{p}_range_ms"] * (1 + rel_tol)]


def counted_once(r) -> bool:
    """Was this cell profiled with the attribution that counts each device kernel once?"""
    return r.get("attribution") == ATTRIBUTION


def kernel_rows() -> pd.DataFrame:
    """The kernel rows of the newest profiler run of each cell. Cells whose row names its
    `cell_run` get that run's kernel rows only, so a re-measured cell mixes in no kernel of an
    earlier run; older cells (no run id) keep the newest row per kernel."""
    k = _ok("profiling/kernels")
    runs = {(r["size"], r.context): r.get("cell_run") for _, r in kernel_cells().iterrows()}
    if "cell_run" not in k:
        k = k.assign(cell_run=None)
    parts = []
    for (size, ctx), run in runs.items():
        kk = k[(k["size"] == size) & (k["context"] == ctx)]
        if isinstance(run, str):
            parts.append(kk[kk["cell_run"] == run])
        else:
            parts.append(_latest(kk[kk["cell_run"].isna()], ["size", "context", "phase", "region", "kernel"]))
    return pd.concat(parts, ignore_index=True) if parts else k.iloc[:0]


OVERCOUNT_MARK = " †"


def phase_table() -> str:
    """(a) and (d): per cell, profiler vs Python timer, and the matmul share per phase."""
    out, cells = [], kernel_cells()
    for _, r in cells.iterrows():
        step = r.fwd_kernel_ms + r.bwd_kernel_ms + r.opt_kernel_ms
        mm = (r.fwd_kernel_ms * r.fwd_matmul_share + r.bwd_kernel_ms * r.bwd_matmul_share)
        out.append({"size": r["size"] + (OVERCOUNT_MARK if overcounted(r) else ""), "ctx": r.context,
                    "fwd kernels ms": r.fwd_kernel_ms, "fwd range ms": r.fwd_range_ms,
                    "fwd Python timer ms": r.fwd_python_ms,
                    "kernels / range": r.fwd_kernel_ms / r.fwd_range_ms,
                    "matmul share fwd": f"{r.fwd_matmul_share:.0%}",
                    "fwd+bwd": f"{mm / (r.fwd_kernel_ms + r.bwd_kernel_ms):.0%}",
                    "whole step": f"{mm / step:.0%}", "optimizer ms": r.opt_kernel_ms})
    return _done(pd.DataFrame(out), "profiling/kernel_cells", used=cells)


def top_kernel_table(context: int = 512) -> str:
    """(b): the kernel with the most GPU time in the forward and in the backward, with its calls."""
    c = _latest(_ok("profiling/kernel_cells"), ["size", "context"])
    c = _by_size(c[c["context"] == context])
    out = []
    for _, r in c.iterrows():
        out.append({"size": r["size"], "layers": get_config(r["size"]).num_layers,
                    "forward: top kernel": f"`{short_name(r.fwd_top_kernel, 48)}`", "calls": r.fwd_top_calls,
                    "ms": r.fwd_top_ms, "share": f"{r.fwd_top_ms / r.fwd_kernel_ms:.0%}",
                    "backward: top kernel": f"`{short_name(r.bwd_top_kernel, 48)}`", "calls ": r.bwd_top_calls,
                    "ms ": r.bwd_top_ms})
    return _done(pd.DataFrame(out), "profiling/kernel_cells", used=c)


def kernel_list(size: str, context: int, phase: str, n: int = 10, matmul: bool | None = None) -> str:
    """Top kernels of one phase (regions merged), optionally only matmul or only non-matmul."""
    k = kernel_rows()
    k = k[(k["size"] == size) & (k["context"] == context) & (k["phase"] == phase)]
    total = k["total_ms"].sum()
    g = k.groupby("kernel", as_index=False).agg(calls=("calls", "sum"), ms=("total_ms", "sum"))
    g["matmul"] = g["kernel"].map(is_matmul)
    if matmul is not None:
        g = g[g["matmul"] == matmul]
    g = g.sort_values("ms", ascending=False).head(n)
    g["share of phase"] = (g["ms"] / total).map(lambda x: f"{x:.1%}")
    g["kernel"] = g["kernel"].map(lambda s: f"`{short_name(s, 70)}`")
    return _done(g[["kernel", "calls", "ms", "share of phase", "matmul"]], "profiling/kernels", used=k)


def attention_region_rows() -> pd.DataFrame:
    """(e), one row per profiler cell: the three attention regions' kernel time, the softmax region
    against the two matmul kernels alone (the scaling kernel of the scores region left out), and the
    same ratio in FLOPs. `overcounted`: the cell fails the kernels <= wall-time check."""
    k = kernel_rows()
    out = []
    for _, r in kernel_cells().iterrows():
        cfg = get_config(r["size"])
        kk = k[(k["size"] == r["size"]) & (k["context"] == r.context) & (k["phase"] == "forward")]
        mm = kk[kk["region"].isin(["attn_scores", "attn_output"]) & kk["kernel"].map(is_matmul)]["total_ms"].sum()
        flops = attention_flops(4, cfg.num_heads, int(r.context), cfg.d_head)
        flop_ratio = flops["attn_softmax"] / (flops["attn_scores"] + flops["attn_output"])
        time_ratio = r.attn_softmax_ms / mm if mm else float("nan")
        out.append({"size": r["size"], "context": int(r.context), "scores_ms": r.attn_scores_ms,
                    "softmax_ms": r.attn_softmax_ms, "output_ms": r.attn_output_ms, "matmul_ms": mm,
                    "time_ratio": time_ratio, "flop_ratio": flop_ratio,
                    "per_flop": time_ratio / flop_ratio, "overcounted": bool(overcounted(r))})
    return pd.DataFrame(out)


def attention_regions_table() -> str:
    """(e): inside the forward's attention, softmax time vs the two matmuls, against their FLOPs."""
    df = attention_region_rows()
    out = df.apply(lambda r: pd.Series({
        "size": r["size"] + (OVERCOUNT_MARK if r.overcounted else ""), "ctx": r.context,
        "scores (QKᵀ, scale) ms": r.scores_ms, "softmax (mask, softmax) ms": r.softmax_ms,
        "output (PV) ms": r.output_ms, "softmax / matmul time": r.time_ratio,
        "softmax / matmul FLOPs": r.flop_ratio, "time ratio / FLOP ratio": r.per_flop}), axis=1)
    return _done(out, "profiling/kernel_cells", used=kernel_cells())


# ---- memory_profiling --------------------------------------------------------------------------

def memory_peaks_table() -> str:
    m = _latest(_ok("memory/peaks"), ["context", "mode", "dtype"])
    out = []
    for ctx in sorted(m["context"].unique()):
        row = {"context": ctx}
        for mode, label in (("forward", "forward only"), ("train", "full step")):
            for dt in ("fp32", "bf16"):
                r = m[(m["context"] == ctx) & (m["mode"] == mode) & (m["dtype"] == dt)]
                row[f"{label}, {dt} (MiB)"] = r.iloc[0].peak_mib if not r.empty else None
        out.append(row)
    return _done(pd.DataFrame(out), "memory/peaks", ",.0f")


def memory_start_table() -> str:
    m = _latest(_ok("memory/peaks"), ["context", "mode", "dtype"])
    m = m.sort_values(["mode", "dtype", "context"], ascending=[True, False, True])
    df = m[["mode", "dtype", "context", "before_mib", "peak_mib", "peak_reserved_mib"]].assign(
        **{"peak - before (MiB)": m["peak_mib"] - m["before_mib"]})
    return _done(df.rename(columns={"before_mib": "allocated before (MiB)", "peak_mib": "peak (MiB)",
                                    "peak_reserved_mib": "reserved peak (MiB)"}), "memory/peaks", ",.0f")


def largest_table(mode: str, n: int = 10) -> str:
    df = _latest(_ok("memory/largest"), ["context", "mode", "dtype", "rank"])
    df = df[df["mode"] == mode].sort_values("rank").head(n)
    df = df.assign(site=df["site"].map(lambda s: f"`{s}`"))
    return _done(df[["size_mib", "count", "site", "phases"]].rename(
        columns={"size_mib": "size (MiB)", "count": "times allocated", "site": "allocated at", "phases": "phase"}),
        "memory/largest")


def residual_rows() -> pd.DataFrame:
    return _latest(_ok("memory/residual"), ["context", "mode", "dtype"])


# ---- pytorch_attention / torch_compile (a) -------------------------------------------------------

def attention_pivot(metric: str, impl: str, fmt: str = ".3g") -> str:
    df = _latest(load_results("attention/pytorch_attention"), ["impl", "d", "seq"])
    df = df[df["impl"] == impl]
    cells = {}
    for _, r in df.iterrows():
        v = r.get(metric)
        cells[(r.d, r.seq)] = format(v, fmt) if r.status == "ok" and pd.notna(v) else str(r.status).upper()
    seqs = sorted({s for _, s in cells})
    out = [{"d": d, **{f"seq {s}": cells.get((d, s), "not run") for s in seqs}}
           for d in sorted({d for d, _ in cells})]
    return _done(pd.DataFrame(out), "attention/pytorch_attention")


def attention_compare_table() -> str:
    df = _latest(_ok("attention/pytorch_attention"), ["impl", "d", "seq"])
    e, c = df[df["impl"] == "eager"], df[df["impl"] == "compiled"]
    m = e.merge(c, on=["d", "seq"], suffixes=("_e", "_c"))
    out = m.sort_values(["d", "seq"]).apply(lambda r: pd.Series({
        "d": r.d, "seq": r.seq, "fwd eager ms": r.forward_ms_e, "fwd compiled ms": r.forward_ms_c,
        "fwd speed-up": r.forward_ms_e / r.forward_ms_c, "bwd eager ms": r.backward_ms_e,
        "bwd compiled ms": r.backward_ms_c, "bwd speed-up": r.backward_ms_e / r.backward_ms_c,
        "peak MiB eager": r.peak_mib_e, "peak MiB compiled": r.peak_mib_c}), axis=1)
    return _done(out, "attention/pytorch_attention")


def attention_memory_check() -> str:
    """Measured memory before backward and peak vs the accounting by hand (eager, all cells)."""
    df = _latest(_ok("attention/pytorch_attention"), ["impl", "d", "seq"])
    df = df[df["impl"] == "eager"].sort_values(["d", "seq"])
    out = df.apply(lambda r: pd.Series({
        "d": r.d, "seq": r.seq, "score matrix MiB": r.predicted_one_score_matrix_mib,
        # measured: allocated just before backward minus the inputs (Q, K, V), i.e. what the
        # forward added: its output O and the saved P; by hand: the same two tensors
        "forward added: measured MiB": r.graph_mib,
        "by hand (O + P) MiB": r.predicted_before_backward_mib - r.predicted_inputs_qkv_mib,
        "peak: measured MiB": r.peak_mib, "peak by hand MiB": r.predicted_backward_peak_mib,
        "peak / score matrix": r.peak_mib / r.predicted_one_score_matrix_mib}), axis=1)
    return _done(out, "attention/pytorch_attention", ",.4g")


def attention_svg() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = _latest(_ok("attention/pytorch_attention"), ["impl", "d", "seq"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for impl, ls in (("eager", "-"), ("compiled", "--")):
        for d in sorted(df["d"].unique()):
            s = df[(df["impl"] == impl) & (df["d"] == d)].sort_values("seq")
            if len(s) < 2:
                continue
            axes[0].plot(s["seq"], s["forward_ms"] + s["backward_ms"], ls, marker="o", ms=3, label=f"{impl} d={d}")
            axes[1].plot(s["seq"], s["peak_mib"] / 1024, ls, marker="o", ms=3, label=f"{impl} d={d}")
    for ax, label in zip(axes, ("forward + backward ms", "peak GiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, ncols=2)
    fig.suptitle("naive attention, batch 8, fp32: quadratic in seq, barely dependent on d", fontsize=10)
    return _svg(fig)
