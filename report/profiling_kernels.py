"""The profiling chapter's kernel profiles (problem nsys_profile, answered with torch.profiler).

Rows: results/profiling/kernel_cells/ (one per size and context: phase totals, matmul shares, the top
kernels, the attention regions, the attribution's self-checks) and results/profiling/kernels/ (one
per kernel, phase and region of a profiled step).
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import get_config
from cs336_systems.profiling.kernel_attribution import RANGE_TOLERANCE
from cs336_systems.profiling.nvtx import attention_flops
from cs336_systems.profiling.torch_profile import is_matmul, short_name
from report.profiling import (
    PHASES,
    by_size,
    newest,
    ok,
    parameter_tensors,
    register,
    span,
    with_source,
)
from report.results import load_results

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
    name = lambda s: f"`{short_name(s, 48)}`"
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


def _cell(size: str, context: int):
    c = kernel_cells()
    return c[(c["size"] == size) & (c["context"] == context)].iloc[0]


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


def _words(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _flop_ratio(d_head: int) -> float:
    f = attention_flops(1, 1, 1, d_head)
    return f["attn_softmax"] / (f["attn_scores"] + f["attn_output"])


def _cells_ran() -> str:
    c = newest(load_results("profiling/kernel_cells"), ["size", "context"])
    return f"{(c['status'] == 'ok').sum()} of {len(c)}"


register({
    "profiling.cells_ran": _cells_ran,
    # (a)
    "profiling.large_fwd_kernel_ms": lambda: f"{_cell('2.7B', 512).fwd_kernel_ms:.0f}",
    "profiling.large_fwd_python_ms": lambda: f"{_cell('2.7B', 512).fwd_python_ms:.0f}",
    "profiling.small_fwd_kernel_ms": lambda: f"{_cell('small', 128).fwd_kernel_ms:.1f}",
    "profiling.small_fwd_python_ms": lambda: f"{_cell('small', 128).fwd_python_ms:.1f}",
    "profiling.small_fwd_range_ms": lambda: f"{_cell('small', 128).fwd_range_ms:.1f}",
    # (b), (c), (d)
    "profiling.top_not_fwd_sizes": lambda: _words(list(top_kernels().query("not both_is_fwd_top")["size"])),
    "profiling.other_share": lambda: span(kernel_cells().fb_other_share, ".0%"),
    "profiling.fwd_matmul_share": lambda: span(kernel_cells().fwd_matmul_share, ".0%"),
    "profiling.step_matmul_share": lambda: span(kernel_cells().step_matmul_share, ".0%"),
    "profiling.opt_ms_large": lambda: f"{_cell('2.7B', 128).opt_kernel_ms:.0f}",
    "profiling.share_drop_large_128": lambda: "{:.0%} to {:.0%}".format(*_cell("2.7B", 128)[["fb_matmul_share", "step_matmul_share"]]),
    "profiling.share_drop_large_1024": lambda: "{:.0%} to {:.0%}".format(*_cell("2.7B", 1024)[["fb_matmul_share", "step_matmul_share"]]),
    "profiling.adamw_launches_per_tensor": lambda: f"{_cell('small', 512).opt_launches / parameter_tensors('small'):.0f}",
    "profiling.adamw_launches_small": lambda: f"{_cell('small', 512).opt_launches:,.0f}",
    "profiling.tensors_small": lambda: str(parameter_tensors("small")),
    # (e)
    "profiling.softmax_time_ratio": lambda: span(attention_region_rows().time_ratio, ".0%"),
    "profiling.softmax_flop_ratio_d64": lambda: f"{_flop_ratio(64):.1%}",
    "profiling.softmax_flop_ratio_d80": lambda: f"{_flop_ratio(get_config('2.7B').d_head):.1%}",
    "profiling.softmax_per_flop": lambda: span(attention_region_rows().per_flop),
})
