"""The mixed-precision chapter's history page: the bf16 timing cells measured twice.

The end-to-end timing grid (results/end-to-end/timings/) keeps every run of a cell; the chapter's
table uses the newest. Here: the first run against the newest with the GPU clock record of the
re-run, the same cells in fp32 timed by two sweeps, and the launch-time estimate behind our reading.
"""

from __future__ import annotations

import pandas as pd

from report.facts import register
from report.mixed_precision import KEY, speedups
from report.profiling import by_size, kernel_cells
from report.results import markdown_table, newest, ok, with_source
from report.units import pm, span


def remeasured_rows() -> pd.DataFrame:
    """One row per timing cell measured more than once: its first and newest run and, where the newest
    sampled the GPU (--record-clocks), the SM clock's range, its maximum and the power's range."""
    out = []
    for cell, g in ok("end-to-end/timings").sort_values("time_utc").groupby(KEY, sort=False):
        if len(g) < 2:
            continue
        a, b = g.iloc[0], g.iloc[-1]
        samples = b.get("clock_samples") if isinstance(b.get("clock_samples"), list) else []
        sm = [x[1] for x in samples if x[1] is not None]
        top = [x[2] for x in samples if x[2] is not None] or sm
        watts = [x[3] for x in samples if x[3] is not None]
        out.append({**dict(zip(KEY, cell)), "first_ms": a.mean_ms, "first_std_ms": a.std_ms,
                    "new_ms": b.mean_ms, "new_std_ms": b.std_ms, "change": b.mean_ms / a.mean_ms - 1,
                    "samples": len(samples), "sm_min": min(sm, default=None), "sm_max": max(sm, default=None),
                    "sm_top": max(top, default=None), "w_min": min(watts, default=None),
                    "w_max": max(watts, default=None)})
    df = pd.DataFrame(out)
    return by_size(df) if not df.empty else df


def _span(lo, hi) -> str:
    if lo is None or pd.isna(lo):
        return "—"
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"


def remeasured_table() -> str:
    r = remeasured_rows()
    shown = pd.DataFrame({
        "size": r["size"], "mode": r["mode"], "dtype": r["dtype"],
        "first run ms": [pm(m, s) for m, s in zip(r.first_ms, r.first_std_ms)],
        "re-run ms (in the table)": [pm(m, s) for m, s in zip(r.new_ms, r.new_std_ms)],
        "change": r["change"].map("{:+.0%}".format),
        "SM clock MHz (re-run)": [_span(a, b) for a, b in zip(r.sm_min, r.sm_max)],
        "power W (re-run)": [_span(a, b) for a, b in zip(r.w_min, r.w_max)], "clock samples": r["samples"]})
    every = ok("end-to-end/timings")
    used = every.merge(r[KEY], on=KEY)
    return with_source(shown, "end-to-end/timings", used=used)


def first_run_speedups() -> pd.DataFrame:
    """The speed-ups with the first row of each re-measured cell instead of the newest."""
    return speedups(ok("end-to-end/timings").sort_values("time_utc").drop_duplicates(KEY, keep="first"))


def fp32_repeats() -> pd.DataFrame:
    """The same fp32 cell timed by two sweeps in separate processes: the timing grid and the eager
    cells of the torch.compile sweep (context 512, batch 4, 5 warm-up and 10 steps in both)."""
    from report.attention import (
        compile_rows,  # the compile sweep's rows live with that chapter
    )

    t = newest(ok("end-to-end/timings"), KEY)
    t = t[t["dtype"] == "fp32"].set_index(["size", "mode"]).mean_ms
    c = compile_rows()
    c = c[~c["compile"] & (c["dtype"] == "fp32")].set_index(["size", "mode"]).mean_ms
    both = [i for i in c.index if i in t.index]
    df = pd.DataFrame([{"size": s, "mode": m, "timing grid ms": t[(s, m)], "compile sweep (eager) ms": c[(s, m)],
                        "difference": c[(s, m)] / t[(s, m)] - 1} for s, m in both])
    return by_size(df)


def fp32_repeats_table() -> str:
    return markdown_table(fp32_repeats(), floatfmt=",.1f", formats={"difference": "+.1%"})


def python_us_per_launch() -> float:
    """Python time per kernel launch where launches set the pace: the small model at its shortest
    context, its unprofiled fp32 forward over its launches in the profile."""
    k = kernel_cells()
    small = k[k["size"] == "small"].sort_values("context").iloc[0]
    return small.fwd_python_ms * 1e3 / small.fwd_launches


def launch_estimate() -> pd.DataFrame:
    """What launching an fp32 forward's kernels alone would take at context 512, at the Python time
    per launch of the launch-bound small model at context 128, next to the bf16 forwards measured."""
    us = python_us_per_launch()
    k = kernel_cells()
    k512 = k[k["context"] == 512].set_index("size")
    r = remeasured_rows()
    fwd = r[(r["mode"] == "forward") & (r["dtype"] == "bf16")].set_index("size")
    return pd.DataFrame([{"size": s, "fp32 forward launches": int(k512.loc[s, "fwd_launches"]),
                          "launch time ms (estimate)": k512.loc[s, "fwd_launches"] * us / 1e3,
                          "bf16 forward, first run ms": fwd.loc[s, "first_ms"],
                          "bf16 forward, re-run ms": fwd.loc[s, "new_ms"]} for s in fwd.index])


def launch_estimate_table() -> str:
    return markdown_table(launch_estimate(), floatfmt=".0f")


def _fp32_repeat(sizes: list[str]) -> float:
    f = fp32_repeats()
    return f[f["size"].isin(sizes)].difference.abs().max()


register({
    "mixed_precision.launch_us": lambda: f"{python_us_per_launch():.0f}",
    "mixed_precision.remeasured_change": lambda: span(remeasured_rows().change, "+.0%"),
    "mixed_precision.remeasured_change_max": lambda: f"{remeasured_rows().change.abs().max():.0%}",
    "mixed_precision.rerun_cv_max": lambda: f"{(remeasured_rows().new_std_ms / remeasured_rows().new_ms).max():.0%}",
    "mixed_precision.clock_samples": lambda: str(int(remeasured_rows().samples.sum())),
    "mixed_precision.sm_clock_range": lambda: f"{remeasured_rows().sm_min.min():.0f} to {remeasured_rows().sm_max.max():.0f}",
    "mixed_precision.sm_clock_top": lambda: f"{remeasured_rows().sm_top.max():.0f}",
    "mixed_precision.fp32_repeat_big": lambda: f"{_fp32_repeat(['large', 'xl', '2.7B']):.1%}",
    "mixed_precision.fp32_repeat_small": lambda: f"{_fp32_repeat(['small']):.0%}",
})
