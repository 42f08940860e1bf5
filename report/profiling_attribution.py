"""The profiling chapter's history page: the kernels our first attribution counted twice, and the re-run.

The rows of the first attribution (no `attribution` field) stay in results/profiling/; the cells
profiled again with the fix carry `attribution`, a `cell_run` id and the self-check columns. These
tables put the two side by side.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import get_config
from cs336_systems.profiling.kernel_attribution import ATTRIBUTION, RANGE_TOLERANCE
from report.profiling import (
    PHASES,
    newest,
    ok,
    parameter_tensors,
    register,
    with_source,
)
from report.profiling_kernels import kernel_cells, kernel_rows, overcounted


def first_run_cells() -> pd.DataFrame:
    """The newest row per cell among the rows of the first attribution (no `attribution` field)."""
    c = ok("profiling/kernel_cells")
    if "attribution" in c:
        c = c[c["attribution"].isna()]
    return newest(c, ["size", "context"])


def rerun_cells() -> pd.DataFrame:
    """The cells whose newest row counts each device kernel once."""
    c = kernel_cells()
    return c[c.get("attribution", pd.Series(index=c.index, dtype=object)) == ATTRIBUTION]


def marked_rows() -> pd.DataFrame:
    """Each (cell, phase) of the first run whose kernel time exceeded the phase's wall time, with the
    same phase in the re-run."""
    new = kernel_cells().set_index(["size", "context"])
    out = []
    for _, r in first_run_cells().iterrows():
        for p in overcounted(r):
            n = new.loc[(r["size"], r.context)]
            out.append({"size": r["size"], "context": int(r.context), "phase": PHASES[p],
                        "first: kernels / range": r[f"{p}_kernel_ms"] / r[f"{p}_range_ms"],
                        "first: kernels ms": r[f"{p}_kernel_ms"], "re-run: kernels ms": n[f"{p}_kernel_ms"],
                        "re-run: range ms": n[f"{p}_range_ms"]})
    return pd.DataFrame(out)


def marked_table() -> str:
    return with_source(marked_rows(), "profiling/kernel_cells")


def silu_surplus() -> pd.DataFrame:
    """First-attribution cells listing more forward SiLU launches than the model has layers (SwiGLU
    applies SiLU once per layer in the forward)."""
    k = ok("profiling/kernels")
    if "cell_run" in k:
        k = k[k["cell_run"].isna()]
    k = newest(k, ["size", "context", "phase", "region", "kernel"])
    k = k[(k["phase"] == "forward") & k["kernel"].str.contains("silu_kernel")]
    g = k.groupby(["size", "context"], as_index=False)["calls"].sum()
    g["layers"] = g["size"].map(lambda s: get_config(s).num_layers)
    return g[g["calls"] > g["layers"]].rename(columns={"calls": "forward SiLU launches"})


def silu_table() -> str:
    return with_source(silu_surplus(), "profiling/kernels")


def rerun_checks() -> pd.DataFrame:
    """Per re-profiled cell: the self-check, what the trace held that fools a per-op sum, how much the
    old sum would have reported over the unique count, and two launch counts that need no clock."""
    k = kernel_rows()
    out = []
    for _, r in rerun_cells().iterrows():
        kk = k[(k["size"] == r["size"]) & (k["context"] == r.context)]
        silu = kk[(kk["phase"] == "forward") & kk["kernel"].str.contains("silu_kernel")]["calls"].sum()
        addcdiv = kk[(kk["phase"] == "optimizer") & kk["kernel"].str.contains("addcdiv")]["calls"].sum()
        out.append({"size": r["size"], "context": int(r.context), "check passed": bool(r.check_ok),
                    "max kernels / range": max(r[f"{p}_kernel_ms"] / r[f"{p}_range_ms"] for p in PHASES),
                    "CPU events listed twice": int(r.copied_host_events),
                    "colliding CPU ids": int(r.colliding_host_ids),
                    "device events listed twice": int(r.repeated_device_events),
                    "old sum over unique, fwd": max(r.fwd_appended_ms / r.fwd_kernel_ms - 1, 0.0),  # never below: a sum over lists
                    "SiLU launches / layers": silu / get_config(r["size"]).num_layers,
                    "addcdiv launches / tensors": addcdiv / parameter_tensors(r["size"]),
                    "placed without a launch record": int(r.launch_by_op + r.placed_by_gpu_time)})
    return pd.DataFrame(out)


def rerun_table() -> str:
    c = rerun_checks()
    return with_source(c, "profiling/kernel_cells", used=rerun_cells(),
                       formats={"old sum over unique, fwd": "+.1%", "max kernels / range": ".3f"})


def inflated(threshold: float = RANGE_TOLERANCE) -> pd.DataFrame:
    """Re-profiled cells where the old per-op sum exceeds the unique count in the forward."""
    c = rerun_checks()
    return c[c["old sum over unique, fwd"] > threshold]


register({
    "profiling.first_run_marked": lambda: str(len(marked_rows())),
    "profiling.rerun_cells": lambda: f"{len(rerun_cells())} of {len(kernel_cells())}",
    "profiling.rerun_max_ratio": lambda: f"{rerun_checks()['max kernels / range'].max():.3f}",
    "profiling.old_sum_excess_fwd_max": lambda: f"{rerun_checks()['old sum over unique, fwd'].max():+.1%}",
    "profiling.colliding_ids_total": lambda: f"{rerun_checks()['colliding CPU ids'].sum():,}",
    "profiling.inflated_cells": lambda: str(len(inflated())),
    "profiling.inflated_colliding_min": lambda: f"{inflated()['colliding CPU ids'].min():,}",
    "profiling.quiet_colliding_max": lambda: f"{rerun_checks().drop(inflated().index)['colliding CPU ids'].max():,}",
})
