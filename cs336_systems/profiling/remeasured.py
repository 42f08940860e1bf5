"""Timing cells measured twice: the first run against the newest, with the GPU clock record of the
newest (`just bench end-to-end --part timings --record-clocks`), for the mixed-precision chapter.

The end-to-end tables use the newest row of each cell. This module shows the rows they replaced, what
the clocks said during the re-run, and how far the same configurations reproduce in fp32 across
processes (the eager cells of the torch.compile sweep repeat five of the timing grid's fp32 cells), so
the page can say how far a bf16 time can be trusted. Everything is computed from results/.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.model.config import PRESETS

from .tables import _by_size, _done, _latest, _ok, compile_rows, kernel_cells, pm

TIMING_KEY = ["size", "mode", "dtype"]


def _has_samples(v) -> bool:
    return isinstance(v, list) and len(v) > 0


def remeasured_rows(bench: str = "end-to-end/timings", key: list[str] = TIMING_KEY) -> pd.DataFrame:
    """One row per cell measured more than once: its first and its newest measurement and, where the
    newest sampled the GPU (--record-clocks), the SM clock's range, the power's and the sample count."""
    df = _ok(bench).sort_values("time_utc")
    out = []
    for cell, g in df.groupby(key, sort=False):
        if len(g) < 2:
            continue
        a, b = g.iloc[0], g.iloc[-1]
        samples = b.get("clock_samples") if _has_samples(b.get("clock_samples")) else []
        sm = [x[1] for x in samples if x[1] is not None]
        watts = [x[3] for x in samples if x[3] is not None]
        top = [x[2] for x in samples if x[2] is not None] or sm
        out.append({**dict(zip(key, cell)), "first_ms": a.mean_ms, "first_std_ms": a.std_ms,
                    "new_ms": b.mean_ms, "new_std_ms": b.std_ms, "change": b.mean_ms / a.mean_ms - 1,
                    "samples": len(samples),
                    "sm_min": min(sm) if sm else None, "sm_max": max(sm) if sm else None,
                    "sm_top": max(top) if top else None,
                    "w_min": min(watts) if watts else None, "w_max": max(watts) if watts else None})
    df = pd.DataFrame(out)
    return _by_size(df) if not df.empty else df


def _span(lo, hi) -> str:
    if lo is None or pd.isna(lo):
        return "—"
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"


def remeasured_table() -> str:
    """The re-measured timing cells: first run vs the newest (which the tables use)."""
    r = remeasured_rows()
    if r.empty:
        return "*No timing cell has been measured twice.*"
    out = pd.DataFrame({
        "size": r["size"], "mode": r["mode"], "dtype": r["dtype"],
        "first run ms": [pm(m, s) for m, s in zip(r.first_ms, r.first_std_ms)],
        "re-run ms (in the table)": [pm(m, s) for m, s in zip(r.new_ms, r.new_std_ms)],
        "change": r["change"].map(lambda x: f"{x:+.0%}"),
        "SM clock MHz (re-run)": [_span(a, b) for a, b in zip(r.sm_min, r.sm_max)],
        "power W (re-run)": [_span(a, b) for a, b in zip(r.w_min, r.w_max)],
        "clock samples": r["samples"]})
    every = _ok("end-to-end/timings")
    shown = set(zip(r["size"], r["mode"], r["dtype"]))
    used = every[[cell in shown for cell in zip(every["size"], every["mode"], every["dtype"])]]
    return _done(out, "end-to-end/timings", used=used)


def fp32_repeats() -> pd.DataFrame:
    """(size, mode, timing ms, compile-sweep eager ms, relative difference): the same fp32 cell timed
    by two sweeps in separate processes (context 512, batch 4, 5 warm-up and 10 steps in both)."""
    t = _latest(_ok("end-to-end/timings"), TIMING_KEY)
    t = t[t["dtype"] == "fp32"].set_index(["size", "mode"])
    c = compile_rows()
    c = c[~c["compile"] & (c["dtype"] == "fp32")].set_index(["size", "mode"])
    both = [i for i in c.index if i in t.index]
    return pd.DataFrame([{"size": s, "mode": m, "timings_ms": t.loc[(s, m), "mean_ms"],
                          "compile_ms": c.loc[(s, m), "mean_ms"],
                          "diff": c.loc[(s, m), "mean_ms"] / t.loc[(s, m), "mean_ms"] - 1} for s, m in both])


def remeasured_note() -> str:
    """Prose under the table: what moved, what the clocks said, the fp32 control, and our reading."""
    r = remeasured_rows()
    if r.empty:
        return ""
    r = r[r["dtype"] == "bf16"]
    if r.empty:
        return ""
    cells = ", ".join(dict.fromkeys(r["size"]))
    lo, hi = r.loc[r["change"].idxmin()], r.loc[r["change"].idxmax()]
    cv = (r.new_std_ms / r.new_ms).max()
    text = (f"The bf16 cells of {cells} were measured a second time, in a later run, with the GPU's SM "
            f"clock, power and temperature sampled beside them. The speed-up table uses the newest row of each "
            f"cell; the first rows stay in the results file and in this table. Between the two runs the means "
            f"moved by {lo.change:+.0%} ({lo['size']} {lo['mode']}) to {hi.change:+.0%} ({hi['size']} "
            f"{hi['mode']}), while within the re-run no standard deviation exceeds {cv:.0%} of its mean.")
    sampled = r[r["samples"] > 0]
    if not sampled.empty:
        n = int(sampled["samples"].sum())
        top = sampled["sm_top"].max()
        low = sampled["sm_min"].min()
        text += (f" The clock record ({n} samples, one every quarter second while the cells ran) says the GPU "
                 f"did not slow down: the SM clock read {low:.0f} to {sampled['sm_max'].max():.0f} MHz against "
                 f"its {top:.0f} MHz maximum, at {sampled['w_min'].min():.0f} to {sampled['w_max'].max():.0f} W. "
                 + ("Down-clocking does not explain the spread." if low >= 0.95 * top else
                    f"The clock did drop, to {low / top:.0%} of its maximum at the lowest."))
    f = fp32_repeats()
    big = f[f["size"].isin(r["size"])]
    launch = f[~f["size"].isin(r["size"])]
    if not big.empty:
        worst = launch.loc[launch["diff"].abs().idxmax()] if not launch.empty else None
        sizes = [s for s in PRESETS if s in set(big["size"])]
        text += (f" The same cells in fp32 reproduce: the torch.compile sweep's eager runs, separate processes, "
                 f"time the {', '.join(sizes[:-1])}{' and ' if len(sizes) > 1 else ''}{sizes[-1]} forward and "
                 f"training step within {big['diff'].abs().max():.1%} of this grid's fp32 rows"
                 + (f", the smaller models within {worst['diff']:+.0%} ({worst['size']} {worst['mode']}"
                    + (", the launch-bound one)" if worst["size"] == "small" else ")") if worst is not None else "")
                 + ". So the instability is particular to these bf16 runs, not a property of the GPU or of "
                 "the timer.")
    text += "\n\n" + _reading(r)
    return text


def _reading(r: pd.DataFrame) -> str:
    """Our reading of the bf16 spread, with the numbers it rests on; explicitly not measured."""
    k = kernel_cells()
    small = k[(k["size"] == "small")].sort_values("context").iloc[0]
    us = small.fwd_python_ms * 1e3 / small.fwd_launches  # Python time per launch, launch-bound cell
    big = [s for s in PRESETS if s in set(r["size"])]
    k512 = k[k["context"] == 512].set_index("size")
    fwd = r[r["mode"] == "forward"].set_index("size")
    parts = [f"{s}: {k512.loc[s, 'fwd_launches']:,.0f} launches, about {k512.loc[s, 'fwd_launches'] * us / 1e3:.0f} ms, "
             f"against bf16 forwards of {fwd.loc[s, 'first_ms']:.0f} and {fwd.loc[s, 'new_ms']:.0f} ms in the two runs"
             for s in big if s in k512.index and s in fwd.index]
    return ("*Our reading, not measured:* these bf16 steps are short enough for the CPU to set their pace. "
            f"The launch-bound small model at context {small.context} spends {us:.0f} µs of Python per kernel "
            f"launch (its unprofiled fp32 forward divided by its {small.fwd_launches:,.0f} launches in the profile). At that "
            f"rate, just launching the kernels of an fp32 forward at context 512 takes: {'; '.join(parts)}; "
            f"autocast's casts add launches on top. That is the same order as the bf16 forwards. When launching "
            f"takes about as long as the GPU's work, the step time follows the host CPU, which the GPU clock "
            f"does not record. A profile of one bf16 step (kernel time against the range, as in "
            f"`nsys_profile`) would test this; we have not run one. So read the bf16 times of these sizes, and "
            f"the speed-ups built on them, as good to about the change column above.")
