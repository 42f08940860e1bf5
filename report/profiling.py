"""The profiling chapter's numbers (docs/profiling.md, docs/profiling/double-count.md), read from
results/end-to-end/{timings,warmup,phases}/ and results/profiling/ (the kernel grid, the 2026 cells)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.bench.device import peak_flops
from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.model.config import PRESETS, edition_presets
from cs336_systems.profiling.context_probe import BENCH as PROBE_BENCH
from cs336_systems.profiling.kernel_attribution import ATTRIBUTION, RANGE_TOLERANCE
from cs336_systems.profiling.kernel_sweep import LONGEST_CELLS, LONGEST_KERNELS
from cs336_systems.profiling.nvtx import attention_flops
from cs336_systems.profiling.phase_timing import step_memory
from cs336_systems.profiling.sweeps import warmup_stats
from cs336_systems.profiling.torch_profile import is_matmul, short_name
from report.figures import new_figure
from report.memory import capacity_gib  # the H200's memory, as its own out-of-memory message states it
from report.registry import register
from report.results import load_results, newest, ok, where, with_source
from report.units import listed, pm, span

SIZES = list(PRESETS)  # small ... 2.7B
PHASES = {"fwd": "forward", "bwd": "backward", "opt": "optimizer"}


# ---- helpers the Part 1 modules share -------------------------------------------------------------

def by_size(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in preset order (small ... 2.7B), the order within a size kept."""
    return df.assign(_o=df["size"].map(SIZES.index)).sort_values("_o", kind="stable").drop(columns="_o")


def pm_each(means, stds) -> list[str]:
    """'mean ± std' for each pair: a table column of timings."""
    return [pm(m, s) for m, s in zip(means, stds)]


def parameter_tensors(size: str) -> int:
    return len(list(TransformerLM.from_config(get_config(size), device="meta").parameters()))


# ---- benchmarking_script (b): five sizes -----------------------------------------------------------

def timings(dtype: str = "fp32", keep: str = "last") -> pd.DataFrame:
    """Newest row (keep="first": first) per (size, mode) of the timing grid at one dtype, indexed by (size, mode)."""
    t = newest(ok("end-to-end/timings"), ["size", "mode", "dtype"], keep=keep)
    return t[t["dtype"] == dtype].set_index(["size", "mode"])


def e2e_rows() -> pd.DataFrame:
    """Per size, fp32: the three modes side by side (f_, fb_, train_), the backward alone, the parameters."""
    t = timings("fp32")
    modes = {"forward": "f_", "forward-backward": "fb_", "train": "train_"}
    r = pd.concat([t.xs(m, level="mode").add_prefix(p) for m, p in modes.items()], axis=1).loc[SIZES]
    return r.assign(bwd_ms=r.fb_mean_ms - r.f_mean_ms, fb_cv=r.fb_std_ms / r.fb_mean_ms,
                    params=[count_parameters(get_config(s))["total"] for s in SIZES])


def e2e_table() -> str:
    r = e2e_rows()
    shown = pd.DataFrame({"size": SIZES, "params (M)": r.params / 1e6, "forward ms": pm_each(r.f_mean_ms, r.f_std_ms),
                          "fwd+bwd ms": pm_each(r.fb_mean_ms, r.fb_std_ms),
                          "train step ms": pm_each(r.train_mean_ms, r.train_std_ms),
                          "bwd / fwd": r.bwd_ms / r.f_mean_ms, "MFU fwd+bwd": r.fb_mfu, "peak GiB (train)": r.train_peak_mem_gib})
    return with_source(shown, "end-to-end/timings", used=timings("fp32").reset_index(),
                       formats={"params (M)": ",.1f", "MFU fwd+bwd": ".0%"})


# ---- benchmarking_script (c): warm-up -------------------------------------------------------------

def warmup_traces() -> pd.DataFrame:
    """The newest fresh-process trace (every step's time) per (size, mode)."""
    return by_size(newest(ok("end-to-end/warmup"), ["size", "mode"]))


def steady_ms(trace: list[float]) -> float:
    return pd.Series(trace[3:]).median()  # from step 4 on, past the start-up


def warmup_rows() -> pd.DataFrame:
    """Per trace: first step against steady state; 0, 1, 2 warm-ups off it and the grid's 5 (another process)."""
    five = timings("fp32")
    out = []
    for _, r in warmup_traces().iterrows():
        stats = {k: warmup_stats(r.step_ms, k, len(r.step_ms) - 2) for k in (0, 1, 2)}
        out.append({"size": r["size"], "mode": r["mode"], "context_ms": r.context_init_ms, "first_ms": r.step_ms[0],
                    "steady_ms": steady_ms(r.step_ms),
                    **{f"w{k}_{m}": s[f"{m}_ms"] for k, s in stats.items() for m in ("mean", "std")},
                    "w5_mean": five.mean_ms[(r["size"], r["mode"])], "w5_std": five.std_ms[(r["size"], r["mode"])]})
    df = pd.DataFrame(out)
    return df.assign(extra_ms=df.first_ms - df.steady_ms, first_over_steady=df.first_ms / df.steady_ms,
                     w1_vs_w2=(df.w1_mean / df.w2_mean - 1).abs(), std_w1_over_w2=df.w1_std / df.w2_std,
                     w5_vs_w1=(df.w5_mean / df.w1_mean - 1).abs())


def warmup_table() -> str:
    w = warmup_rows()
    shown = pd.DataFrame({"size": w["size"], "mode": w["mode"], "CUDA context ms": w.context_ms,
                          "first step ms": w.first_ms,
                          **{f"{k} warm-up: mean ± std": pm_each(w[f"w{k}_mean"], w[f"w{k}_std"]) for k in (0, 1, 2)},
                          "5 warm-up (own run)": pm_each(w.w5_mean, w.w5_std)})
    return with_source(shown, "end-to-end/warmup", formats={"CUDA context ms": ",.0f", "first step ms": ",.0f"})


def warmup_figure(mode: str = "forward-backward"):
    """Per-step time of a fresh process over its steady state: what the first step pays."""
    fig, ax = new_figure(7, 3.2)
    for _, r in where(warmup_traces(), mode=mode).iterrows():
        steady = steady_ms(r.step_ms)
        ax.plot(range(1, len(r.step_ms) + 1), [t / steady for t in r.step_ms], marker="o", ms=3, label=r["size"])
    ax.set(yscale="log", xlabel="step of a fresh process", ylabel="time / steady-state time")
    ax.set_title(f"{mode}, context 512, fp32: the first step pays for start-up", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


# ---- nsys_profile: the kernel profiles -----------------------------------------------------------

GRID = ("profiling/kernel_cells", "profiling/kernels")  # the 2025 grid: every size, contexts 128 to 1,024
LONGEST = (LONGEST_CELLS, LONGEST_KERNELS)  # the 2026 cells: two sizes up to the longest context that fits


def kernel_cells(grid: tuple[str, str] = GRID) -> pd.DataFrame:
    """The newest row per (size, context) of a profiler grid, in size then context order, with its matmul shares."""
    c = by_size(newest(ok(grid[0]), ["size", "context"]).sort_values("context"))
    mm = c.fwd_kernel_ms * c.fwd_matmul_share + c.bwd_kernel_ms * c.bwd_matmul_share
    fb = c.fwd_kernel_ms + c.bwd_kernel_ms
    return c.assign(fb_matmul_share=mm / fb, step_matmul_share=mm / (fb + c.opt_kernel_ms)).reset_index(drop=True)


def overcounted(r) -> list[str]:
    """Phases of one cell with more kernel time than wall time: on one stream, kernels counted twice."""
    return [p for p in PHASES if r[f"{p}_kernel_ms"] > r[f"{p}_range_ms"] * (1 + RANGE_TOLERANCE)]


def kernel_rows(grid: tuple[str, str] = GRID) -> pd.DataFrame:
    """The kernel rows of each cell's newest profiler run (its `cell_run`; without one, the newest per kernel)."""
    k = ok(grid[1])
    if "cell_run" not in k:
        k = k.assign(cell_run=None)
    parts = []
    for _, r in kernel_cells(grid).iterrows():
        kk, run = where(k, size=r["size"], context=r.context), r.get("cell_run")
        parts.append(kk[kk["cell_run"] == run] if isinstance(run, str) else
                     newest(kk[kk["cell_run"].isna()], ["size", "context", "phase", "region", "kernel"]))
    return pd.concat(parts, ignore_index=True) if parts else k.iloc[:0]


def _cell(size: str, context: int):
    return where(kernel_cells(), size=size, context=context).iloc[0]


def profile_table(grid: tuple[str, str] = GRID) -> str:
    """(a) and (d): forward kernels against range and timer, the matmul shares; at the 2026 cells also (e)."""
    c = kernel_cells(grid)
    shown = pd.DataFrame({
        "size": c["size"], "ctx": c.context, "fwd kernels ms": c.fwd_kernel_ms, "fwd range ms": c.fwd_range_ms,
        "fwd Python timer ms": c.fwd_python_ms, "kernels / timer": c.fwd_kernel_ms / c.fwd_python_ms,
        "matmul share fwd": c.fwd_matmul_share, "fwd+bwd": c.fb_matmul_share, "whole step": c.step_matmul_share,
        "optimizer ms": c.opt_kernel_ms})
    if grid == LONGEST:  # the 2026 cells answer (e) in the same table
        a = attention_region_rows(grid)
        shown = shown.assign(**{"softmax / matmul time": a.time_ratio, "softmax / matmul FLOPs": a.flop_ratio})
    shares = ("kernels / timer", "matmul share fwd", "fwd+bwd", "whole step", "softmax / matmul time")
    times = ("fwd kernels ms", "fwd range ms", "fwd Python timer ms")
    return with_source(shown, grid[0], used=c, formats={"ctx": ",", "optimizer ms": ".1f", "softmax / matmul FLOPs": ".1%",
                                                         **dict.fromkeys(times, ",.1f"), **dict.fromkeys(shares, ".0%")})


def top_kernels(context: int | None = 512, grid: tuple[str, str] = GRID) -> pd.DataFrame:
    """(b) per cell at one context (None: every cell): the top kernels of forward, backward and both."""
    c = kernel_cells(grid)
    c = c if context is None else where(c, context=context)
    k = kernel_rows(grid)
    both = k[k["phase"].isin(["forward", "backward"])].groupby(["size", "context", "kernel"])["total_ms"].sum()
    top = both.groupby(level=["size", "context"]).idxmax().map(lambda i: i[2])
    layers = c["size"].map(lambda s: get_config(s).num_layers)
    return c.assign(layers=layers, per_layer=c.fwd_top_calls // layers, rest=c.fwd_top_calls % layers,
                    fwd_share=c.fwd_top_ms / c.fwd_kernel_ms,
                    both_top=[top[(s, x)] for s, x in zip(c["size"], c.context)]).assign(
                    both_is_fwd_top=lambda t: t.both_top == t.fwd_top_kernel)


def _top_is_fp32_simt_gemm(t: pd.DataFrame) -> bool:
    """The top forward kernel is the fp32 SIMT GEMM, launched the same number of times in every layer."""
    return t.fwd_top_kernel.str.startswith("sm80_xmma_gemm_f32f32").all() and set(t.rest) <= {0, 1}


def top_kernel_table() -> str:
    t = top_kernels(512)
    name = lambda s: f"`{short_name(s, 48)}`"
    shown = pd.DataFrame({
        "size": t["size"], "forward: top kernel": t.fwd_top_kernel.map(name), "calls": t.fwd_top_calls,
        "= layers x k + rest": [f"{L} x {k:.0f} + {r:.0f}" for L, k, r in zip(t.layers, t.per_layer, t.rest)],
        "ms": t.fwd_top_ms, "share": t.fwd_share, "backward: top kernel": t.bwd_top_kernel.map(name),
        "calls ": t.bwd_top_calls, "ms ": t.bwd_top_ms, "top of fwd+bwd is the forward's": t.both_is_fwd_top})
    return with_source(shown, GRID[0], used=t, formats={"share": ".0%"})


def other_kernels(phase: str, size: str = "xl", context: int = 512, n: int = 8) -> str:
    """The top non-matmul kernels of one phase (regions merged) and their share of its kernel time."""
    k = where(kernel_rows(), size=size, context=context, phase=phase)
    g = k.groupby("kernel", as_index=False).agg(calls=("calls", "sum"), ms=("total_ms", "sum"))
    g = g[~g["kernel"].map(is_matmul)].sort_values("ms", ascending=False).head(n)
    g["share of phase"] = g["ms"] / k["total_ms"].sum()
    g["kernel"] = g["kernel"].map(lambda s: f"`{short_name(s, 70)}`")
    return with_source(g, GRID[1], used=k, formats={"share of phase": ".1%"})


def flop_ratio(d_head: int) -> float:
    """Softmax FLOPs over the two attention matmuls' (independent of batch, heads and context)."""
    f = attention_flops(1, 1, 1, d_head)
    return f["attn_softmax"] / (f["attn_scores"] + f["attn_output"])


def attention_region_rows(grid: tuple[str, str] = GRID) -> pd.DataFrame:
    """(e) per cell: the forward's softmax region against the two matmul kernels alone, in time and FLOPs."""
    k = kernel_rows(grid)
    k = k[(k["phase"] == "forward") & k["region"].isin(["attn_scores", "attn_output"]) & k["kernel"].map(is_matmul)]
    c = kernel_cells(grid)
    mm = pd.Series([where(k, size=s, context=x)["total_ms"].sum() for s, x in zip(c["size"], c.context)])
    flops = c["size"].map(lambda s: flop_ratio(get_config(s).d_head))
    return pd.DataFrame({"size": c["size"], "context": c.context, "scores_ms": c.attn_scores_ms,
                         "softmax_ms": c.attn_softmax_ms, "output_ms": c.attn_output_ms,
                         "time_ratio": c.attn_softmax_ms / mm, "flop_ratio": flops, "per_flop": c.attn_softmax_ms / mm / flops})


def attention_regions_table() -> str:
    shown = attention_region_rows().rename(columns={
        "context": "ctx", "scores_ms": "scores (QKᵀ, scale) ms", "softmax_ms": "softmax (mask, softmax) ms",
        "output_ms": "output (PV) ms", "time_ratio": "softmax / matmul time", "flop_ratio": "softmax / matmul FLOPs",
        "per_flop": "time ratio / FLOP ratio"})
    return with_source(shown, GRID[0], used=kernel_cells())


# ---- the double count of the first attribution (profiling/double-count.md) ----------------------

def first_attribution(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows without `column`, a field only the re-run writes."""
    return df[df[column].isna()] if column in df else df


def rerun_cells() -> pd.DataFrame:
    """The cells whose newest row counts each device kernel once."""
    c = kernel_cells()
    return c[c.get("attribution", pd.Series(index=c.index, dtype=object)) == ATTRIBUTION]


def marked_rows() -> pd.DataFrame:
    """Each (cell, phase) the first run overcounted, with the same phase in the re-run."""
    new = kernel_cells().set_index(["size", "context"])
    out = []
    for _, r in newest(first_attribution(ok(GRID[0]), "attribution"), ["size", "context"]).iterrows():
        for p in overcounted(r):
            n = new.loc[(r["size"], r.context)]
            out.append({"size": r["size"], "context": int(r.context), "phase": PHASES[p],
                        "first: kernels / range": r[f"{p}_kernel_ms"] / r[f"{p}_range_ms"],
                        "first: kernels ms": r[f"{p}_kernel_ms"], "re-run: kernels ms": n[f"{p}_kernel_ms"],
                        "re-run: range ms": n[f"{p}_range_ms"]})
    return pd.DataFrame(out)


def silu_surplus() -> pd.DataFrame:
    """First-attribution cells with more forward SiLU launches than layers (SwiGLU has one per layer)."""
    k = newest(first_attribution(ok(GRID[1]), "cell_run"), ["size", "context", "phase", "region", "kernel"])
    k = k[(k["phase"] == "forward") & k["kernel"].str.contains("silu_kernel")]
    g = k.groupby(["size", "context"], as_index=False)["calls"].sum()
    g["layers"] = g["size"].map(lambda s: get_config(s).num_layers)
    return g[g["calls"] > g["layers"]].rename(columns={"calls": "forward SiLU launches"})


def rerun_checks() -> pd.DataFrame:
    """Per re-profiled cell: the self-check, what fools a per-op sum and two launch counts that need no clock."""
    k = kernel_rows()
    out = []
    for _, r in rerun_cells().iterrows():
        kk = where(k, size=r["size"], context=r.context)
        calls = lambda phase, kernel: kk[(kk["phase"] == phase) & kk["kernel"].str.contains(kernel)]["calls"].sum()
        out.append({"size": r["size"], "context": int(r.context), "check passed": bool(r.check_ok),
                    "max kernels / range": max(r[f"{p}_kernel_ms"] / r[f"{p}_range_ms"] for p in PHASES),
                    "CPU events listed twice": int(r.copied_host_events),
                    "colliding CPU ids": int(r.colliding_host_ids),
                    "device events listed twice": int(r.repeated_device_events),
                    "old sum over unique, fwd": max(r.fwd_appended_ms / r.fwd_kernel_ms - 1, 0.0),  # a sum over lists
                    "SiLU launches / layers": calls("forward", "silu_kernel") / get_config(r["size"]).num_layers,
                    "addcdiv launches / tensors": calls("optimizer", "addcdiv") / parameter_tensors(r["size"]),
                    "placed without a launch record": int(r.launch_by_op + r.placed_by_gpu_time)})
    return pd.DataFrame(out)


def _most_collisions_most_inflation() -> bool:
    """The cells whose old per-op sum exceeds the unique count hold more colliding ids than any other."""
    c = rerun_checks()
    up = c["old sum over unique, fwd"] > RANGE_TOLERANCE
    return up.any() and c[up]["colliding CPU ids"].min() > c[~up]["colliding CPU ids"].max()


# ---- the 2026 edition: every size's phases, 10B among them ----------------------------------------

SIZES_2026 = edition_presets("2026")  # small, medium, large, 2.7B (the 2026 "xl"), 10B
PHASES_BENCH = "end-to-end/phases"


def phase_rows() -> pd.DataFrame:
    """The newest row per (size, mode, dtype) of the phases sweep, whatever its status, indexed so."""
    return newest(load_results(PHASES_BENCH), ["size", "mode", "dtype"]).set_index(["size", "mode", "dtype"]).sort_index()


def phase_cells() -> pd.DataFrame:
    """Per (size, dtype): the training step, its phases from the forward+backward step's (fb_*) where it failed."""
    r = phase_rows()
    cells = pd.MultiIndex.from_product([SIZES_2026, ["fp32", "bf16"]], names=["size", "dtype"])
    train, fb = (r.xs(m, level="mode").reindex(cells) for m in ("train", "forward-backward"))
    ran = train.status == "ok"
    c = train.assign(**{k: train[k].where(ran, fb[k]) for k in ("forward_mean_ms", "forward_std_ms", "backward_mean_ms",
                                                                 "backward_std_ms")},
                     fb_status=fb.status, fb_peak_gib=fb.peak_mem_gib, fb_ms=fb.step_mean_ms)
    c = c.reset_index().set_index(["size", "dtype"], drop=False)
    return c.assign(bwd_over_fwd=c.backward_mean_ms / c.forward_mean_ms, opt_share=c.optimizer_mean_ms / c.step_mean_ms)


def phases_2026_table() -> str:
    c = phase_cells()
    timed = lambda ph: ["—" if pd.isna(m) else pm(m, s) for m, s in zip(c[f"{ph}_mean_ms"], c[f"{ph}_std_ms"])]
    oom = [f"out of memory ({g:.1f} GiB allocated)" for g in c.peak_mib_at_oom / 1024]
    ran = c.status == "ok"
    shown = pd.DataFrame({"size": c["size"], "dtype": c["dtype"], "forward ms": timed("forward"),
                          "backward ms": timed("backward"),
                          "optimizer ms": [t if r else o for t, o, r in zip(timed("optimizer"), oom, ran)],
                          "training step ms": timed("step"), "peak GiB": c.peak_mem_gib.where(ran).to_numpy()})
    return with_source(shown, PHASES_BENCH, used=phase_rows().reset_index(), formats={"peak GiB": ".1f"})


def ten_b_memory() -> dict:
    """The 10B training step's fp32 arithmetic at the phases part's cell (batch 4, context 512)."""
    return step_memory(get_config("10B"), mode="train", batch=4, context=512)


def _ten_b_training_cannot_fit() -> bool:
    """fp32 weights, gradients and AdamW's two moments (16 bytes a parameter) exceed the H200, the first two do not;
    so in both dtypes the forward+backward ran, peaking (fp32) at those two, and the first optimizer step ran out."""
    m, n, c = ten_b_memory(), count_parameters(get_config("10B"))["total"], phase_cells().loc["10B"]
    wg, state = m["weights_gib"] + m["grads_gib"], m["weights_gib"] + m["grads_gib"] + m["adamw_gib"]
    ran_out = (c.fb_status == "ok") & (c.status == "oom") & (c.oom_phase == "optimizer") & (c.oom_step == 0)
    return abs(state * 2**30 - 16 * n) < 1 and wg < capacity_gib() < state and ran_out.all() \
        and abs(c.fb_peak_gib["fp32"] / wg - 1) < 0.02


def _optimizer_ignores_the_dtype() -> bool:
    """AdamW's time is the same in both dtypes, within 15% (the small to large bf16 cells are noisy)."""
    c = where(phase_cells(), status="ok")
    t = c.optimizer_mean_ms.unstack("dtype").dropna()
    share = c.opt_share["2.7B"]
    return ((t.bf16 / t.fp32 - 1).abs() < 0.15).all() and share["bf16"] > 4 * share["fp32"]


# ---- the 2026 edition: the longest context that fits, and the kernel tables there ------------------

def probe_rows() -> pd.DataFrame:
    """The newest row per (size, context) of the context probe, whatever its status, in order."""
    return by_size(newest(load_results(PROBE_BENCH), ["size", "context"]).sort_values("context")).reset_index(drop=True)


def longest_fit(size: str, status: str = "ok") -> int:
    """The longest context that fit; with status "oom", the shortest that ran out of memory."""
    c = where(probe_rows(), size=size, status=status).context
    return int(c.max() if status == "ok" else c.min())


def probe_table() -> str:
    p = probe_rows()
    result = lambda r: ("fits" if r.status == "ok" else
                        f"out of memory: asked for {r.tried_mib:,.0f} MiB with {r.allocated_by_pytorch_mib / 1024:.1f} GiB allocated")
    shown = pd.DataFrame({"size": p["size"], "context": p.context, "result": [result(r) for r in p.itertuples()],
                          "second step ms": [r.step_ms[-1] if r.status == "ok" else None for r in p.itertuples()],
                          "peak GiB": [r.peak_mib / 1024 if r.status == "ok" else None for r in p.itertuples()]})
    return with_source(shown, PROBE_BENCH, used=p, formats={"context": ",", "second step ms": ",.0f", "peak GiB": ".1f"})


def _longest_fit_as_probed() -> bool:
    """Contexts doubling from 256 until one more fp32 score matrix (batch 4) did not fit, then profiled."""
    cells = kernel_cells(LONGEST)
    good = True
    for size, q in probe_rows().groupby("size"):
        ctx, last, n = list(q.context), q.iloc[-1], longest_fit(size)
        score_mib = 4 * get_config(size).num_heads * last.context**2 * 4 / 2**20
        good &= (ctx == [256 * 2**i for i in range(len(ctx))] and (q.status.iloc[:-1] == "ok").all()
                 and last.status == "oom" and last.tried_mib == score_mib
                 and list(where(cells, size=size).context) == [n // 4, n // 2, n])
    return bool(good)


def _long_contexts_as_answered() -> bool:
    """(a) kernels within 10% of the timer; (b) the fp32 SIMT GEMM on top; (d) the matmul share falls, (e) softmax
    over matmul time rises with the context, above 1 only in small's two longest cells, under 2% of the FLOPs."""
    c, a = kernel_cells(LONGEST), attention_region_rows(LONGEST)
    slow = a[a.time_ratio > 1]
    return ((c.fwd_kernel_ms / c.fwd_python_ms).between(0.9, 1.0).all() and _top_is_fp32_simt_gemm(top_kernels(None, LONGEST))
            and all(where(c, size=s).fwd_matmul_share.is_monotonic_decreasing for s in ("small", "2.7B"))
            and all(where(a, size=s).time_ratio.is_monotonic_increasing for s in ("small", "2.7B"))
            and set(slow.context) == {longest_fit("small") // 2, longest_fit("small")}
            and (slow["size"] == "small").all() and (a.flop_ratio < 0.02).all())

register("profiling", facts={
    "peak_fp32_tflops": lambda: f"{peak_flops('NVIDIA H200', 'fp32') / 1e12:.0f}",
    "peak_bf16_tflops": lambda: f"{peak_flops('NVIDIA H200', 'bf16') / 1e12:.0f}",
    "params_10b_b": lambda: f"{count_parameters(get_config('10B'))['total'] / 1e9:.2f}",
    "train_state_10b_gib": lambda: f"{ten_b_memory()['end_of_backward_gib']:.0f}",
    "h200_capacity_gib": lambda: f"{capacity_gib():.1f}",
    # (b), 2026
    "bwd_over_fwd_2026": lambda: span(where(phase_cells(), dtype="fp32").bwd_over_fwd, ".1f"),
    "opt_share_27b_fp32": lambda: f"{phase_cells().opt_share[('2.7B', 'fp32')]:.0%}",
    "opt_share_27b_bf16": lambda: f"{phase_cells().opt_share[('2.7B', 'bf16')]:.0%}",
    "fb_peak_10b_gib": lambda: f"{phase_cells().fb_peak_gib[('10B', 'fp32')]:.1f}",
    # nsys_profile, 2026
    "longest_small": lambda: f"{longest_fit('small'):,}",
    "first_oom_small": lambda: f"{longest_fit('small', 'oom'):,}",
    "longest_27b": lambda: f"{longest_fit('2.7B'):,}",
    "first_oom_27b": lambda: f"{longest_fit('2.7B', 'oom'):,}",
    "lf_kernels_over_timer": lambda: span(kernel_cells(LONGEST).eval("fwd_kernel_ms / fwd_python_ms"), ".0%"),
    # (b)
    "fwd_ms": lambda: span(e2e_rows().f_mean_ms),
    "bwd_ms": lambda: span(e2e_rows().bwd_ms),
    "fb_cv_max": lambda: f"{e2e_rows().fb_cv.max():.1%}",
    # (c)
    "first_extra_fb_ms": lambda: span(where(warmup_rows(), mode="forward-backward").extra_ms),
    "first_over_steady_small_fwd": lambda: f"{where(warmup_rows(), mode='forward', size='small').first_over_steady.iloc[0]:.0f}",
    "w1_vs_w2_max": lambda: f"{warmup_rows().w1_vs_w2.max():.1%}",
    "std_w1_over_w2": lambda: span(warmup_rows().std_w1_over_w2, ".2f"),
    "w5_vs_w1_max_small": lambda: f"{where(warmup_rows(), size='small').w5_vs_w1.max():.0%}",
    # nsys_profile
    "large_fwd_kernel_ms": lambda: f"{_cell('2.7B', 512).fwd_kernel_ms:.0f}",
    "large_fwd_python_ms": lambda: f"{_cell('2.7B', 512).fwd_python_ms:.0f}",
    "small_fwd_kernel_ms": lambda: f"{_cell('small', 128).fwd_kernel_ms:.1f}",
    "small_fwd_python_ms": lambda: f"{_cell('small', 128).fwd_python_ms:.1f}",
    "top_not_fwd_sizes": lambda: listed(top_kernels().query("not both_is_fwd_top")["size"]),
    "other_share": lambda: span(1 - kernel_cells().fb_matmul_share, ".0%"),
    "fwd_matmul_share": lambda: span(kernel_cells().fwd_matmul_share, ".0%"),
    "step_matmul_share": lambda: span(kernel_cells().step_matmul_share, ".0%"),
    "adamw_launches_per_tensor": lambda: f"{_cell('small', 512).opt_launches / parameter_tensors('small'):.0f}",
    "softmax_time_ratio": lambda: span(attention_region_rows().time_ratio, ".0%"),
    "softmax_flop_ratio_d64": lambda: f"{flop_ratio(64):.1%}",
    "softmax_per_flop": lambda: span(attention_region_rows().per_flop),
}, tables={
    "e2e": e2e_table, "warmup": warmup_table, "phases": profile_table, "phases_2026": phases_2026_table,
    "probe": probe_table, "longest_fit": lambda: profile_table(LONGEST), "top_kernels": top_kernel_table,
    "xl_forward_other": lambda: other_kernels("forward"), "xl_backward_other": lambda: other_kernels("backward"),
    "attention_regions": attention_regions_table,
    "marked": lambda: with_source(marked_rows(), GRID[0]),
    "silu": lambda: with_source(silu_surplus(), GRID[1]),
    "rerun": lambda: with_source(rerun_checks(), GRID[0], used=rerun_cells(),
                                 formats={"old sum over unique, fwd": "+.1%", "max kernels / range": ".3f"}),
}, figures={"warmup": warmup_figure}, claims={
    # (b): a spread under 5% would not hide a 10% effect
    "steps_are_steady": lambda: e2e_rows().fb_cv.max() < 0.05,
    "backward_twice_forward": lambda: (e2e_rows().bwd_ms / e2e_rows().f_mean_ms).between(1.5, 2.5).all(),
    "small_model_leaves_gpu_idle": lambda: (lambda r: (r.fb_mean_ms / r.params).idxmax() == r.fb_mfu.idxmin()
                                            == "small")(e2e_rows()),
    # (c): without warm-up the first step dominates the spread; one warm-up step removes it
    "first_step_is_slow": lambda: (warmup_rows().first_over_steady > 1.2).all()
    and (warmup_rows().w0_std > 10 * warmup_rows().w1_std).all(),
    "one_warmup_step_is_enough": lambda: warmup_rows().w1_vs_w2.max() < 0.02,
    "small_model_moves_between_processes": lambda: warmup_rows().set_index("size").w5_vs_w1.idxmax() == "small",
    # nsys_profile
    "no_cell_ran_out_of_memory": lambda: (newest(load_results(GRID[0]), ["size", "context"])["status"] == "ok").all(),
    "every_cell_profiled_again": lambda: len(rerun_cells()) == len(kernel_cells())
    and not any(overcounted(r) for _, r in kernel_cells().iterrows()),
    "busy_gpu_timer_agrees": lambda: abs(_cell("2.7B", 512).fwd_kernel_ms / _cell("2.7B", 512).fwd_python_ms - 1) < 0.05,
    "small_cells_wait_for_launches": lambda: _cell("small", 128).fwd_kernel_ms < 0.5 * _cell("small", 128).fwd_python_ms,
    "profiled_range_is_longer": lambda: _cell("small", 128).fwd_range_ms > _cell("small", 128).fwd_python_ms,
    "top_kernel_is_fp32_simt_gemm": lambda: _top_is_fp32_simt_gemm(top_kernels()),
    "top_of_both_is_a_matmul_not_always_the_forwards": lambda: top_kernels().both_top.map(is_matmul).all()
    and 0 < (~top_kernels().both_is_fwd_top).sum() < len(top_kernels()),
    "matmul_share_falls_in_training": lambda: (kernel_cells().step_matmul_share < kernel_cells().fwd_matmul_share).all(),
    # AdamW's kernels cost the same at every context, so they cut the share least where the rest is longest
    "optimizer_cost_ignores_context": lambda: all(
        (g.fb_matmul_share - g.step_matmul_share)[1024] < (g.fb_matmul_share - g.step_matmul_share)[128]
        and g.opt_kernel_ms.max() < 1.05 * g.opt_kernel_ms.min()
        for _, g in kernel_cells().set_index("context").groupby("size")),
    "adamw_launches_whole_kernels_per_tensor": lambda: _cell("small", 512).opt_launches % parameter_tensors("small") == 0,
    "forward_other_kernels_as_named": lambda: all(name in other_kernels("forward")
                                                  for name in ("softmax_warp_forward", "elementwise_kernel", "Memcpy DtoD")),
    "softmax_is_memory_bound": lambda: (attention_region_rows().per_flop > 10).all()
    and (attention_region_rows().flop_ratio < 0.05).all(),
    # the 2026 edition: its sizes are our presets, its xl our 2.7B, its 10B 4608 wide, d_ff 12288, 50 layers, 36 heads
    "the_2026_table": lambda: SIZES_2026 == ["small", "medium", "large", "2.7B", "10B"] and tuple(
        getattr(get_config("10B"), f) for f in ("d_model", "d_ff", "num_layers", "num_heads")) == (4608, 12288, 50, 36),
    "ten_b_training_cannot_fit": _ten_b_training_cannot_fit,
    # fp32 only: the bf16 phases of the small to large models swing by up to a fifth of their mean
    "backward_twice_forward_optimizer_shortest": lambda: (lambda c: c.bwd_over_fwd.between(1.5, 2.5).all()
        and (c.optimizer_mean_ms < c.forward_mean_ms)[c.status == "ok"].all())(where(phase_cells(), dtype="fp32")),
    "optimizer_ignores_the_dtype": _optimizer_ignores_the_dtype,
    "longest_fit_as_probed": _longest_fit_as_probed,
    "long_contexts_as_answered": _long_contexts_as_answered,
    # double-count.md
    "first_run_overcounted_rerun_fits": lambda: len(marked_rows()) > 0
    and (marked_rows()["re-run: kernels ms"] <= marked_rows()["re-run: range ms"]).all(),
    "first_run_surplus_of_same_ops": lambda: len(silu_surplus()) > 0,
    "rerun_traces_hold_only_colliding_ids": lambda: (lambda c: c["check passed"].all()
        and (c["colliding CPU ids"] > 0).all()
        and (c[["CPU events listed twice", "device events listed twice"]] == 0).all(axis=None))(rerun_checks()),
    "most_collisions_most_inflation": _most_collisions_most_inflation,
    "launch_counts_exact": lambda: (rerun_checks()[["SiLU launches / layers", "addcdiv launches / tensors"]] == 1)
    .all(axis=None),
})
