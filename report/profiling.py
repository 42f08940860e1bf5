"""The profiling chapter: end-to-end timings, the warm-up study and the per-kernel profiles.

Everything here reads committed rows (results/end-to-end/, results/profiling/) and returns a
DataFrame, a Markdown table with its provenance line, a figure, or a fact for a hand-written
sentence. The helpers at the top (`ok`, `newest`, `value`, `with_source`) are shared by the other
Part 1 report modules (mixed_precision, memory, attention).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from cs336_systems.bench.device import peak_flops
from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.model.config import PRESETS
from cs336_systems.profiling.sweeps import warmup_stats
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


def with_source(table: pd.DataFrame, bench: str, used: pd.DataFrame | None = None,
                floatfmt: str = ".3g", formats: dict | None = None) -> str:
    """The table plus the provenance of the rows it shows (`used`), else of the whole file."""
    return (markdown_table(table, floatfmt=floatfmt, formats=formats) + "\n\n"
            + provenance_line(used if used is not None else load_results(bench), SRC.format(bench)))


def span(values, fmt: str = ".0f", unit: str = "") -> str:
    """'lo to hi' of some values, each formatted: a range quoted in a sentence."""
    s = pd.Series(values)
    return f"{s.min():{fmt}}{unit} to {s.max():{fmt}}{unit}"


def register(facts: dict[str, Callable[[], object]]) -> None:
    """Register a module's facts, name -> function, with report.facts."""
    for name, fn in facts.items():
        fact(name)(fn)


def parameter_tensors(size: str) -> int:
    return len(list(TransformerLM.from_config(get_config(size), device="meta").parameters()))


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


def _bwd_ms(size: str) -> float:
    t = timings()
    return t.loc[(size, "forward-backward"), "mean_ms"] - t.loc[(size, "forward"), "mean_ms"]


def _w5_vs_w1(small: bool) -> float:
    w = warmup_rows()
    return w[(w["size"] == "small") == small].w5_vs_w1.max()


register({
    "profiling.peak_fp32_tflops": lambda: f"{peak_flops('NVIDIA H200', 'fp32') / 1e12:.0f}",
    "profiling.peak_bf16_tflops": lambda: f"{peak_flops('NVIDIA H200', 'bf16') / 1e12:.0f}",
    # (b)
    "profiling.fb_cv_max": lambda: f"{e2e_ratios().fb_cv.max():.1%}",
    "profiling.time_ratio_large_small": lambda: f"{e2e_ratios().fb_ms['2.7B'] / e2e_ratios().fb_ms['small']:.0f}",
    "profiling.param_ratio_large_small": lambda: f"{e2e_ratios().params['2.7B'] / e2e_ratios().params['small']:.0f}",
    "profiling.fwd_ms_small": lambda: f"{timings().loc[('small', 'forward'), 'mean_ms']:.0f}",
    "profiling.fwd_ms_large": lambda: f"{timings().loc[('2.7B', 'forward'), 'mean_ms']:.0f}",
    "profiling.bwd_ms_small": lambda: f"{_bwd_ms('small'):.0f}",
    "profiling.bwd_ms_large": lambda: f"{_bwd_ms('2.7B'):.0f}",
    # (c)
    "profiling.first_extra_fb_ms": lambda: span(_warm("forward-backward").extra_ms),
    "profiling.first_extra_fwd_ms": lambda: span(_warm("forward").extra_ms),
    "profiling.first_over_steady_small_fwd": lambda: f"{_warm('forward').set_index('size').first_over_steady['small']:.0f}",
    "profiling.cuda_context_ms": lambda: span(warmup_rows().context_ms),
    "profiling.w1_vs_w2_max": lambda: f"{warmup_rows().w1_vs_w2.max():.1%}",
    "profiling.std_w1_over_w2": lambda: span(warmup_rows().std_w1_over_w2, ".2f"),
    "profiling.w5_vs_w1_max_big": lambda: f"{_w5_vs_w1(small=False):.1%}",
    "profiling.w5_vs_w1_max_small": lambda: f"{_w5_vs_w1(small=True):.0%}",
})
