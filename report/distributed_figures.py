"""Figures of the collectives and DDP chapters: matplotlib figures drawn from results DataFrames.

Each function returns a `plt.Figure`; a chapter turns it into inline SVG with `report.figures.svg`
(the site's one figure mechanism), e.g. `print(svg(report.ddp.timelines_figure("nvidia-h200")))`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import report.figures  # noqa: F401 - selects the Agg backend before any figure is drawn
from cs336_systems.distributed.bucket_model import BucketModel

COMPUTE, COMM = "#4c72b0", "#dd8452"
PHASE_COLORS = {"forward": "#a6cee3", "backward": "#1f78b4", "sync": "#fb9a99", "optimizer": "#b2df8a"}


def collectives(df: pd.DataFrame) -> plt.Figure:
    """All-reduce time and bus bandwidth against size, one line per (backend, world size)."""
    ok = df[df["status"] == "ok"].sort_values("size_bytes")
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (backend, device, world), g in ok.groupby(["backend", "device_type", "world_size"]):
        label = f"{backend}+{device.upper()}, {world} ranks"
        ax_t.plot(g["size_bytes"] / 2**20, g["time_ms"], marker="o", label=label)
        ax_b.plot(g["size_bytes"] / 2**20, g["busbw_gbps"], marker="o", label=label)
    ax_t.set(xscale="log", yscale="log", xlabel="tensor size (MB)", ylabel="all-reduce time (ms)",
             title="time (median of the slowest rank)")
    ax_b.set(xscale="log", xlabel="tensor size (MB)", ylabel="bus bandwidth (GB/s)",
             title="bus bandwidth = bytes/time x 2(n-1)/n")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
    ax_b.legend(fontsize=8)
    fig.tight_layout()
    return fig


def stage_label(row: pd.Series | dict) -> str:
    if row["stage"] == "bucketed":
        mb = row["bucket_size_mb"]
        return f"bucketed {mb:g} MB" if mb is not None and not pd.isna(mb) else "bucketed (one)"
    return str(row["stage"])


def timelines(traces: pd.DataFrame, show_compute: bool = True) -> plt.Figure:
    """One profiled step per stage: phases, compute and communication on a shared time axis.

    `show_compute=False` leaves out the compute row and the overlap labels (for traces whose compute
    intervals are known to be wrong)."""
    rows = traces.to_dict("records")
    fig, ax = plt.subplots(figsize=(10, 0.75 * len(rows) + 1.2))
    ticks, labels = [], []
    for i, row in enumerate(rows):
        y = (len(rows) - 1 - i) * 3.0
        for name, (a, b) in row["phases"].items():
            if name in PHASE_COLORS:
                ax.broken_barh([(a, b - a)], (y + 2.0, 0.7), color=PHASE_COLORS[name])
        if show_compute:
            ax.broken_barh([(a, b - a) for a, b in row["compute"]], (y + 1.0, 0.8), color=COMPUTE)
        ax.broken_barh([(a, b - a) for a, b in row["comm"]], (y, 0.8), color=COMM)
        frac = row.get("overlap_fraction") if show_compute else None
        frac = None if frac is None or pd.isna(frac) else frac  # no communication at all
        ticks.append(y + 1.3)
        labels.append(stage_label(row) + (f"\n{frac:.0%} of comm hidden" if frac is not None else ""))
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel("ms from the start of the step (rank 0)")
    shown = {**{k: c for k, c in PHASE_COLORS.items()},
             **({"compute": COMPUTE} if show_compute else {}), "all-reduce running": COMM}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in shown.values()]
    ax.legend(handles, list(shown), ncol=6,
              fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(rows)))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def bucket_model(model: BucketModel, measured: pd.DataFrame | None = None) -> plt.Figure:
    """Predicted exposed communication over bucket size, with the measured overhead beside it.

    `measured`: columns bucket_bytes and overhead_ms (step time minus compute-only step time).
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    top = model.s * 2
    if measured is not None and not measured.empty:
        top = max(top, float(measured["bucket_bytes"].max()) * 1.5)
    b = np.geomspace(model.s / 2000, top, 400)
    ax.plot(b / 2**20, [model.overhead_for_bucket(x) * 1e3 for x in b], color=COMPUTE,
            label="model: n_b·o + s/(n_b·w)")
    ax.axvline(model.optimal_bucket_bytes / 2**20, color=COMPUTE, ls="--", lw=1,
               label=f"b* = sqrt(s·w·o) = {model.optimal_bucket_bytes / 2**20:.3g} MB")
    if measured is not None and not measured.empty:
        ax.plot(measured["bucket_bytes"] / 2**20, measured["overhead_ms"], "o", color=COMM,
                label="measured: step - compute-only step")
    ax.set(xscale="log", yscale="log", xlabel="bucket size (MB)", ylabel="exposed communication (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
