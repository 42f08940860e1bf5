"""The attention and torch.compile chapter: naive attention alone (eager and compiled), its memory
against the hand count, and the whole model compiled.

Rows: results/attention/pytorch_attention/ (the sweep, eager and compiled, plus the two longer
sequences it probes at d = 64) and results/end-to-end/compile/. Named attention_* / compile_* so the
FlashAttention chapter's report modules (report/flash*) stay apart.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.attention.benchmarks.pytorch_sweep import attention_memory
from cs336_systems.model.config import PRESETS
from report.facts import register
from report.figures import plt
from report.profiling import SIZES, kernel_cells
from report.results import load_results, newest, ok, with_source
from report.units import pm, span

BENCH = "attention/pytorch_attention"
KEY = ["impl", "d", "seq"]
GRID_SEQS = (256, 1024, 4096, 8192, 16384)  # the course's grid; longer sequences are OOM probes
GiB, MiB = 2**30, 2**20


# ---- pytorch_attention ----------------------------------------------------------------------------

def attention_rows(impl: str = "eager", status: str | None = "ok") -> pd.DataFrame:
    df = newest(load_results(BENCH) if status is None else ok(BENCH), KEY)
    return df[df["impl"] == impl].sort_values(["d", "seq"]).reset_index(drop=True)


def attention_pivot(metric: str, impl: str = "eager", fmt: str = ".3g") -> str:
    """d down, seq across; a cell that did not run shows its status (OOM), one never tried 'not run'."""
    df = attention_rows(impl, status=None)
    cells = {(r.d, r.seq): format(r[metric], fmt) if r.status == "ok" else str(r.status).upper()
             for _, r in df.iterrows()}
    seqs = sorted({s for _, s in cells})
    rows = [{"d": d, **{f"seq {s}": cells.get((d, s), "not run") for s in seqs}} for d in sorted({d for d, _ in cells})]
    return with_source(pd.DataFrame(rows), BENCH, used=df)


def capacity_gib() -> float:
    return float(load_results(BENCH)["device_total_mib"].dropna().iloc[0]) / 1024


def attention_figure():
    """Time and peak memory against sequence length, eager and compiled, one line per d."""
    df = newest(ok(BENCH), KEY)
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
    return fig


def growth_per_doubling() -> pd.Series:
    """Forward+backward time ratio between consecutive doublings of the sequence, from seq 4096 on."""
    e = attention_rows()
    e = e[e.seq >= 4096].assign(total=lambda x: x.forward_ms + x.backward_ms)
    return pd.concat([g.total.iloc[1:].reset_index(drop=True) / g.total.iloc[:-1].reset_index(drop=True)
                      for _, g in e.groupby("d")], ignore_index=True)


def memory_check() -> pd.DataFrame:
    """Measured memory before the backward and peak against the hand count (eager, every cell)."""
    e = attention_rows()
    return pd.DataFrame({
        "d": e.d, "seq": e.seq, "score matrix MiB": e.predicted_one_score_matrix_mib,
        # what the forward added: allocated before the backward minus the inputs Q, K, V
        "forward added: measured MiB": e.graph_mib,
        "by hand (O + P) MiB": e.predicted_before_backward_mib - e.predicted_inputs_qkv_mib,
        "peak: measured MiB": e.peak_mib, "peak by hand MiB": e.predicted_backward_peak_mib,
        "peak / score matrix": e.peak_mib / e.predicted_one_score_matrix_mib})


def memory_check_table() -> str:
    return with_source(memory_check(), BENCH, floatfmt=",.4g", used=attention_rows())


def oom_probes() -> pd.DataFrame:
    """The sequences beyond the grid (d = 64, eager), with the hand count of what they need."""
    df = newest(load_results(BENCH), KEY)
    p = df[(df["impl"] == "eager") & (df["seq"] > max(GRID_SEQS))].sort_values("seq")
    rows = []
    for _, r in p.iterrows():
        a = attention_memory(8, int(r.seq), int(r.d))
        rows.append({"seq": int(r.seq), "d": int(r.d), "status": str(r.status).upper(),
                     "one score matrix GiB": a["one_score_matrix"] / GiB,
                     "forward peak by hand GiB": a["forward_peak"] / GiB,
                     "backward peak by hand GiB": a["backward_peak"] / GiB, "card GiB": capacity_gib()})
    return pd.DataFrame(rows)


def oom_probes_table() -> str:
    return with_source(oom_probes(), BENCH, floatfmt=".1f")


def largest_run(d: int = 64):
    return attention_rows().query("d == @d").sort_values("seq").iloc[-1]


def _eager(seq: int, d: int):
    e = attention_rows()
    return e[(e.seq == seq) & (e.d == d)].iloc[0]


FACTS = {
    "attention.small_fwd_ms": lambda: span(attention_rows().query("seq <= 1024").forward_ms, ".2f"),
    "attention.growth": lambda: f"{growth_per_doubling().min():.1f}x to {growth_per_doubling().max():.1f}x",
    "attention.d_ratio_16384": lambda: "{:.2f}".format(
        (_eager(16384, 128).forward_ms + _eager(16384, 128).backward_ms)
        / (_eager(16384, 16).forward_ms + _eager(16384, 16).backward_ms)),
    "attention.card_gib": lambda: f"{capacity_gib():.1f}",
    "attention.peak_offset_mib": lambda: f"{(attention_rows().peak_mib - attention_rows().predicted_backward_peak_mib).median():g}",
    "attention.largest_seq": lambda: f"{int(largest_run().seq):,}",
    "attention.largest_peak_gib": lambda: f"{largest_run().peak_mib / 1024:.1f}",
    "attention.largest_saved_gib": lambda: f"{largest_run().graph_mib / 1024:.1f}",
    "attention.oom_seq": lambda: f"{int(oom_probes().seq.min()):,}",
    "attention.oom_backward_gib": lambda: f"{oom_probes().iloc[0]['backward peak by hand GiB']:.1f}",
    "attention.oom_score_gib": lambda: f"{oom_probes().iloc[0]['one score matrix GiB']:.0f}",
}


# ---- torch_compile (a): compiled attention -----------------------------------------------------------

def compiled_vs_eager() -> pd.DataFrame:
    e, c = attention_rows("eager"), attention_rows("compiled")
    m = e.merge(c, on=["d", "seq"], suffixes=("_e", "_c")).sort_values(["d", "seq"])
    return m.assign(fwd_speedup=m.forward_ms_e / m.forward_ms_c, bwd_speedup=m.backward_ms_e / m.backward_ms_c,
                    peak_ratio=m.peak_mib_c / m.peak_mib_e)


def compare_table() -> str:
    m = compiled_vs_eager()
    shown = pd.DataFrame({"d": m.d, "seq": m.seq, "fwd eager ms": m.forward_ms_e, "fwd compiled ms": m.forward_ms_c,
                          "fwd speed-up": m.fwd_speedup, "bwd eager ms": m.backward_ms_e,
                          "bwd compiled ms": m.backward_ms_c, "bwd speed-up": m.bwd_speedup,
                          "peak MiB eager": m.peak_mib_e, "peak MiB compiled": m.peak_mib_c})
    return with_source(shown, BENCH, used=newest(ok(BENCH), KEY))


def _long():
    m = compiled_vs_eager()
    return m[m.seq >= 4096]


def _short():
    m = compiled_vs_eager()
    return m[m.seq < 4096]


FACTS |= {
    "attention.compiled_fwd_speedup": lambda: span(_long().fwd_speedup, ".2f", "x"),
    "attention.compiled_bwd_speedup": lambda: span(_long().bwd_speedup, ".2f", "x"),
    "attention.compiled_peak_ratio": lambda: span(_long().peak_ratio, ".2f"),
    "attention.compiled_short_speedup": lambda: span(pd.concat([_short().fwd_speedup, _short().bwd_speedup]), ".2f", "x"),
    "attention.compiled_short_slower": lambda: f"{(_short().fwd_speedup < 1).sum() + (_short().bwd_speedup < 1).sum()} of {2 * len(_short())}",
}


# ---- torch_compile (b): the whole model ------------------------------------------------------------

COMPILE_KEY = ["size", "mode", "dtype", "compile"]


def compile_rows() -> pd.DataFrame:
    """One row per compile cell: the earliest. A re-run on the same machine finds Inductor's on-disk
    cache warm, so only the first run's first step is a cold compile."""
    return ok("end-to-end/compile").sort_values("time_utc").drop_duplicates(COMPILE_KEY, keep="first")


def compile_cells() -> pd.DataFrame:
    """Per (size, mode): eager and compiled time, the fraction compiling removes, the first step."""
    df = compile_rows().set_index(COMPILE_KEY)
    rows = []
    for size in SIZES:
        for mode in ("forward", "train"):
            e, c = df.loc[(size, mode, "fp32", False)], df.loc[(size, mode, "fp32", True)]
            rows.append({"size": size, "mode": mode, "eager_ms": e.mean_ms, "eager_std": e.std_ms,
                         "compiled_ms": c.mean_ms, "compiled_std": c.std_ms, "cut": 1 - c.mean_ms / e.mean_ms,
                         "first_step_s": c.first_step_ms / 1e3, "mfu_eager": e.mfu, "mfu_compiled": c.mfu})
    return pd.DataFrame(rows)


def compile_table() -> str:
    c = compile_cells()
    shown = pd.DataFrame({"size": c["size"], "mode": c["mode"], "eager ms": [pm(m, s) for m, s in zip(c.eager_ms, c.eager_std)],
                          "compiled ms": [pm(m, s) for m, s in zip(c.compiled_ms, c.compiled_std)],
                          "speed-up": c.eager_ms / c.compiled_ms, "first compiled step s": c.first_step_s,
                          "MFU eager": c.mfu_eager.map("{:.0%}".format), "MFU compiled": c.mfu_compiled.map("{:.0%}".format)})
    return with_source(shown, "end-to-end/compile", used=compile_rows())


def compile_vs_profile() -> pd.DataFrame:
    """Per size: what compiling removes from the forward, next to the eager forward's kernel time
    outside the matmuls (the nsys_profile profile at the same context, 512)."""
    c = compile_cells()
    k = kernel_cells()
    k = k[k["context"] == 512].set_index("size")
    fwd = c[c["mode"] == "forward"].set_index("size")
    return pd.DataFrame({"size": list(PRESETS), "compile removes (forward)": [fwd.loc[s, "cut"] for s in PRESETS],
                         "eager forward outside matmuls": [1 - k.loc[s, "fwd_matmul_share"] for s in PRESETS]})


def compile_vs_profile_table() -> str:
    return with_source(compile_vs_profile(), "end-to-end/compile", formats={
        "compile removes (forward)": ".0%", "eager forward outside matmuls": ".0%"}, used=compile_rows())


def compiled_twice() -> pd.DataFrame:
    """Compiled cells measured more than once on one machine: the first (cold) and the last first step."""
    every = ok("end-to-end/compile")
    twice = every[every["compile"]].sort_values("time_utc").groupby(["size", "mode"]).filter(lambda g: len(g) > 1)
    return pd.DataFrame([{"size": s, "mode": m, "first compiled step, first run s": g.first_step_ms.iloc[0] / 1e3,
                          "first compiled step, again s": g.first_step_ms.iloc[-1] / 1e3,
                          "steady step, first run ms": g.mean_ms.iloc[0], "steady step, again ms": g.mean_ms.iloc[-1]}
                         for (s, m), g in twice.groupby(["size", "mode"])])


def compiled_twice_table() -> str:
    return with_source(compiled_twice(), "end-to-end/compile", floatfmt=".1f")


FACTS |= {
    "attention.compile_cut": lambda: span(compile_cells().cut, ".0%"),
    "attention.compile_first_s": lambda: span(compile_cells().first_step_s),
    "attention.compile_cut_fwd_small": lambda: f"{compile_vs_profile().set_index('size').iloc[0, 0]:.0%}",
    "attention.compile_cut_fwd_large": lambda: f"{compile_vs_profile().set_index('size').iloc[-1, 0]:.0%}",
}
register(FACTS)
