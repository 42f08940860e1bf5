"""The attention and torch.compile chapter (docs/attention.md, docs/attention/runs.md): naive attention
eager and compiled (attention/pytorch_attention), the allocator checks (attention/oom_checks), the compiled model.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.attention.benchmarks.pytorch_sweep import attention_memory
from cs336_systems.profiling.attention_oom import DEFAULT
from report.figures import plt
from report.memory import capacity_gib
from report.profiling import SIZES, kernel_cells, pm_each
from report.registry import register
from report.results import load_results, newest, ok, where, with_source
from report.units import GiB, MiB, near, span

BENCH = "attention/pytorch_attention"
KEY = ["impl", "d", "seq"]
GRID_SEQS = (256, 1024, 4096, 8192, 16384)  # the course's grid; longer sequences are OOM probes
SPEEDUPS = ["fwd_speedup", "bwd_speedup"]  # compiled over eager speed, forward and backward


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


def attention_figure():
    df = newest(ok(BENCH), KEY)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for impl, ls in (("eager", "-"), ("compiled", "--")):
        for d in sorted(df["d"].unique()):
            s = where(df, impl=impl, d=d).sort_values("seq")
            axes[0].plot(s["seq"], s["forward_ms"] + s["backward_ms"], ls, marker="o", ms=3, label=f"{impl} d={d}")
            axes[1].plot(s["seq"], s["peak_mib"] / 1024, ls, marker="o", ms=3, label=f"{impl} d={d}")
    for ax, label in zip(axes, ("forward + backward ms", "peak GiB")):
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel=label)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, ncols=2)
    fig.suptitle("naive attention, batch 8, fp32: quadratic in seq, barely dependent on d", fontsize=10)
    return fig


def growth_per_doubling() -> pd.Series:
    """Forward+backward time ratio between consecutive doublings of the sequence, from seq 4096 on."""
    e = attention_rows().query("seq >= 4096")
    total = e.forward_ms + e.backward_ms
    return (total / total.groupby(e.d).shift()).dropna()


def memory_check() -> pd.DataFrame:
    e = attention_rows()
    return pd.DataFrame({
        "d": e.d, "seq": e.seq, "score matrix MiB": e.predicted_one_score_matrix_mib,
        # what the forward added: allocated before the backward minus the inputs Q, K, V
        "forward added: measured MiB": e.graph_mib,
        "by hand (O + P) MiB": e.predicted_before_backward_mib - e.predicted_inputs_qkv_mib,
        "peak: measured MiB": e.peak_mib, "peak by hand MiB": e.predicted_backward_peak_mib,
        "peak / score matrix": e.peak_mib / e.predicted_one_score_matrix_mib})


def oom_probes() -> pd.DataFrame:
    """The sequences beyond the grid (d = 64, eager), with the hand count of what they need."""
    p = attention_rows(status=None)
    p = p[p.seq > max(GRID_SEQS)].sort_values("seq").reset_index(drop=True)
    need = pd.DataFrame([attention_memory(8, int(r.seq), int(r.d)) for r in p.itertuples()]) / GiB
    return pd.DataFrame({"seq": p.seq, "d": p.d, "status": p.status.str.upper(),
                         "one score matrix GiB": need.one_score_matrix, "forward peak by hand GiB": need.forward_peak,
                         "backward peak by hand GiB": need.backward_peak, "card GiB": capacity_gib()})


def _eager_ms(seq: int, d: int) -> float:
    r = where(attention_rows(), seq=seq, d=d).iloc[0]
    return r.forward_ms + r.backward_ms


def _grid_fits_first_probe_does_not() -> bool:
    """Every grid cell ran, every probe ran out of memory, the first although its hand count fits the card."""
    every, probes = newest(load_results(BENCH), KEY), oom_probes()
    return ((every[every.seq.isin(GRID_SEQS)].status == "ok").all() and (probes.status == "OOM").all()
            and attention_rows().query("d == 64").seq.max() == max(GRID_SEQS) < probes.seq.min()
            and probes.iloc[0]["backward peak by hand GiB"] < capacity_gib())


def _memory_as_counted() -> bool:
    """The forward leaves O + P exactly, quadrupling per doubling; the peak is four score matrices plus one offset."""
    c = memory_check().set_index(["d", "seq"])
    saved, offset = c["forward added: measured MiB"], c["peak: measured MiB"] - c["peak by hand MiB"]
    return ((saved == c["by hand (O + P) MiB"]).all() and offset.nunique() == 1 and 0 < offset.iloc[0] < 256
            and all(saved[(d, 16384)] > 3.9 * saved[(d, 8192)] for d in (16, 32, 64, 128)))


# ---- attention/runs.md: why seq 32,768 ran out of memory -------------------------------------------

SPLIT = "max_split_size_mb:1024"


def checks() -> pd.DataFrame:
    """The newest row per check cell (batch 8, d = 64), its peaks and stranded memory (at an OOM) in score matrices."""
    df = load_results("attention/oom_checks")
    df = df[df["status"].isin(["ok", "oom"]) & (df["batch"] == 8) & (df["d"] == 64)]
    df = newest(df, ["batch", "d", "seq", "alloc_conf"]).sort_values(["seq", "alloc_conf"])
    peaks = [r if r["status"] == "ok" else r["at_oom"] for r in df.to_dict("records")]
    score = pd.Series([attention_memory(8, seq, 64)["one_score_matrix"] / MiB for seq in df.seq], df.index)
    return df.assign(**{f"{kind}_scores": pd.Series([p[f"peak_{kind}_mib"] for p in peaks], df.index) / score
                        for kind in ("allocated", "reserved")}, stranded_scores=df.reserved_unallocated_mib / score)


def checks_table() -> str:
    c = checks()
    oom = c.status == "oom"
    shown = pd.DataFrame({
        "seq": c.seq, "allocator": c.alloc_conf.map(lambda a: "default" if a == DEFAULT else f"`{a}`"),
        "result": oom.map({True: "out of memory", False: "ran"}),
        "peak allocated (score matrices)": c.allocated_scores, "peak reserved (score matrices)": c.reserved_scores,
        "asked for GiB": c.tried_mib.where(oom) / 1024, "free on the card GiB": c.free_mib.where(oom) / 1024,
        "reserved but unallocated GiB": c.reserved_unallocated_mib.where(oom) / 1024})
    return with_source(shown, "attention/oom_checks", floatfmt=".2f", formats={"seq": ","})


def stranded_block_confirmed() -> bool:
    """At 16,384 the default allocator reserves a fifth score matrix, unsplit blocks not; at 32,768 one is stranded."""
    c = checks()
    d16, s16, d32, s32 = (where(c, seq=seq, alloc_conf=conf).iloc[0] for seq in (16384, 32768) for conf in (DEFAULT, SPLIT))
    return bool(d16["status"] == "ok" and d16.reserved_scores >= 4.5 > s16.reserved_scores and d32["status"] == "oom"
                and near(d32.stranded_scores, 1, 0.02)
                and near(s32.allocated_scores, 4, 0.02) and s32["status"] == "ok")


# ---- torch_compile -------------------------------------------------------------------------------

def compiled_vs_eager(long: bool | None = None) -> pd.DataFrame:
    """Eager (_e) and compiled (_c) rows side by side: every cell, or those from seq 4096 on (long) or below."""
    e, c = attention_rows("eager"), attention_rows("compiled")
    m = e.merge(c, on=["d", "seq"], suffixes=("_e", "_c")).sort_values(["d", "seq"])
    m = m if long is None else m[(m.seq >= 4096) == long]
    return m.assign(fwd_speedup=m.forward_ms_e / m.forward_ms_c, bwd_speedup=m.backward_ms_e / m.backward_ms_c,
                    peak_ratio=m.peak_mib_c / m.peak_mib_e)


def compare_table() -> str:
    m = compiled_vs_eager()
    shown = pd.DataFrame({"d": m.d, "seq": m.seq, "fwd compiled ms": m.forward_ms_c, "fwd speed-up": m.fwd_speedup,
                          "bwd compiled ms": m.backward_ms_c, "bwd speed-up": m.bwd_speedup,
                          "peak MiB eager": m.peak_mib_e, "peak MiB compiled": m.peak_mib_c})
    return with_source(shown, BENCH, used=newest(ok(BENCH), KEY))


def compile_rows() -> pd.DataFrame:
    """The earliest row per cell: a re-run on one machine finds Inductor's disk cache warm (not a cold compile)."""
    return newest(ok("end-to-end/compile"), ["size", "mode", "dtype", "compile"], keep="first")


def compile_cells() -> pd.DataFrame:
    """Per (size, mode), fp32: eager (_e) and compiled (_c) side by side, and the fraction compiling removes."""
    df = compile_rows().query("dtype == 'fp32'").assign(size=lambda d: pd.Categorical(d["size"], SIZES))
    m = df[~df["compile"]].merge(df[df["compile"]], on=["size", "mode"], suffixes=("_e", "_c"))
    m = m.sort_values(["size", "mode"]).reset_index(drop=True)
    return m.assign(cut=1 - m.mean_ms_c / m.mean_ms_e, first_step_s=m.first_step_ms_c / 1e3)


def compile_table() -> str:
    c = compile_cells()
    shown = pd.DataFrame({"size": c["size"].astype(str), "mode": c["mode"],
                          "eager ms": pm_each(c.mean_ms_e, c.std_ms_e), "compiled ms": pm_each(c.mean_ms_c, c.std_ms_c),
                          "speed-up": c.mean_ms_e / c.mean_ms_c, "first compiled step s": c.first_step_s,
                          "MFU eager": c.mfu_e, "MFU compiled": c.mfu_c})
    return with_source(shown, "end-to-end/compile", used=compile_rows(),
                       formats={"MFU eager": ".0%", "MFU compiled": ".0%"})


def compile_vs_profile() -> pd.DataFrame:
    """Per size: what compiling removes from the forward, beside the eager forward's time outside matmuls (nsys)."""
    fwd = compile_cells().query("mode == 'forward'").set_index("size")
    k = where(kernel_cells(), context=512).set_index("size")
    return pd.DataFrame({"size": SIZES, "compile removes (forward)": [fwd.loc[s, "cut"] for s in SIZES],
                         "eager forward outside matmuls": [1 - k.loc[s, "fwd_matmul_share"] for s in SIZES]})


def compiled_twice() -> pd.DataFrame:
    """Compiled cells measured more than once on one machine: the first (cold) and the last first step."""
    every = ok("end-to-end/compile")
    twice = every[every["compile"]].sort_values("time_utc").groupby(["size", "mode"]).filter(lambda g: len(g) > 1)
    return pd.DataFrame([{"size": s, "mode": m, "first compiled step, first run s": g.first_step_ms.iloc[0] / 1e3,
                          "first compiled step, again s": g.first_step_ms.iloc[-1] / 1e3,
                          "steady step, first run ms": g.mean_ms.iloc[0], "steady step, again ms": g.mean_ms.iloc[-1]}
                         for (s, m), g in twice.groupby(["size", "mode"])])


def _compile_cut_shrinks() -> bool:
    c, v = compile_cells(), compile_vs_profile().set_index("size")
    exceeds = v[v["compile removes (forward)"] > v["eager forward outside matmuls"]].index
    return (all(c[c["mode"] == m].cut.is_monotonic_decreasing for m in ("forward", "train")) and (c.cut > 0).all()
            and v["eager forward outside matmuls"].is_monotonic_decreasing and list(exceeds) == ["small"])


def _second_compile_is_warm() -> bool:
    t = compiled_twice()
    return len(t) > 0 and (t["first compiled step, again s"] < 0.5 * t["first compiled step, first run s"]).all() \
        and (t["steady step, again ms"] / t["steady step, first run ms"]).between(0.95, 1.05).all()


register("attention", facts={
    "growth": lambda: span(growth_per_doubling(), ".1f", "x"),
    "d_ratio_16384": lambda: f"{_eager_ms(16384, 128) / _eager_ms(16384, 16):.2f}",
    "card_gib": lambda: f"{capacity_gib():.1f}",
    "largest_seq": lambda: f'{attention_rows().query("d == 64").seq.max():,}',  # the longest that ran
    "oom_seq": lambda: f"{int(oom_probes().seq.min()):,}",
    "oom_backward_gib": lambda: f"{oom_probes().iloc[0]['backward peak by hand GiB']:.1f}",
    "oom_score_gib": lambda: f"{oom_probes().iloc[0]['one score matrix GiB']:.0f}",
    "compiled_fwd_speedup": lambda: span(compiled_vs_eager(long=True).fwd_speedup, ".2f", "x"),
    "compiled_bwd_speedup": lambda: span(compiled_vs_eager(long=True).bwd_speedup, ".2f", "x"),
    "compiled_peak_ratio": lambda: span(compiled_vs_eager(long=True).peak_ratio, ".2f"),
    "compile_cut": lambda: span(compile_cells().cut, ".0%"),
    "compile_first_s": lambda: span(compile_cells().first_step_s),
    # runs.md
    "oom_margin_gib": lambda: f"{capacity_gib() - attention_memory(8, 32768, 64)['backward_peak'] / GiB:.1f}",
    "oom_output_mib": lambda: f"{attention_memory(8, 32768, 64)['inputs_qkv'] / 3 / MiB:.0f}",
}, tables={
    "forward": lambda: attention_pivot("forward_ms"), "backward": lambda: attention_pivot("backward_ms"),
    "before_backward": lambda: attention_pivot("mem_before_backward_mib", fmt=".5g"),
    "memory_check": lambda: with_source(memory_check(), BENCH, floatfmt=",.4g", used=attention_rows()),
    "oom_probes": lambda: with_source(oom_probes(), BENCH, floatfmt=".1f"),
    "compiled": compare_table, "compile": compile_table, "checks": checks_table,
    "compile_vs_profile": lambda: with_source(compile_vs_profile(), "end-to-end/compile", used=compile_rows(),
                                              formats=dict.fromkeys(["compile removes (forward)",
                                                                     "eager forward outside matmuls"], ".0%")),
    "compiled_twice": lambda: with_source(compiled_twice(), "end-to-end/compile", floatfmt=".1f"),
}, figures={"sweep": attention_figure}, claims={
    "quadratic_from_4096": lambda: growth_per_doubling().between(3.0, 4.5).all(),
    "flat_up_to_1024": lambda: (lambda f: f.max() < 2 * f.min())(attention_rows().query("seq <= 1024").forward_ms),
    "head_dimension_matters_little": lambda: _eager_ms(16384, 128) / _eager_ms(16384, 16) < 4,
    "grid_fits_first_probe_does_not": _grid_fits_first_probe_does_not,
    "memory_as_counted": _memory_as_counted,
    "allocator_set_the_boundary": stranded_block_confirmed,
    "compile_pays_from_4096": lambda: (compiled_vs_eager(long=True)[SPEEDUPS] > 1).all().all()
    and compiled_vs_eager(long=True).peak_ratio.between(0.4, 0.6).all(),
    "compile_does_not_pay_short": lambda: (compiled_vs_eager(long=False)[SPEEDUPS] < 1).stack().mean() > 0.5,
    "compile_keeps_memory_before_backward": lambda: compiled_vs_eager(long=True).pipe(
        lambda m: (m.mem_before_backward_mib_c == m.mem_before_backward_mib_e).all()),
    "compile_gains_less_with_size": _compile_cut_shrinks,
    "second_compile_is_warm": _second_compile_is_warm,
})
