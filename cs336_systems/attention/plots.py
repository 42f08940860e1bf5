"""Plots of the FlashAttention measurements, drawn from the committed results (CPU is fine).

    python -m cs336_systems.attention.flash_sweep --plot

Writes docs/flash-attention/sweep-<dtype>.png (TFLOP/s against sequence length, one panel per head
dim and mode, one line per implementation) and leaderboard.png (the latest leaderboard run).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..bench.store import REPO_ROOT, ResultStore

PLOT_DIR = REPO_ROOT / "docs" / "flash-attention"
LABELS = {"triton": "ours, Triton FA2", "pytorch": "ours, PyTorch FA2 (compiled bwd)",
          "naive": "plain PyTorch", "sdpa": "SDPA cuDNN"}
COLORS = {"triton": "C0", "pytorch": "C1", "naive": "C2", "sdpa": "C3"}  # fixed: panels lack some lines
MODE_TITLES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}


def _rows(bench: str, device: str, root: str | Path | None) -> pd.DataFrame:
    store = ResultStore(bench, key=["impl"], device=device, root=root if root is not None else REPO_ROOT / "results")
    if not store.path.exists():
        raise FileNotFoundError(f"no results at {store.path}")
    return pd.DataFrame(store.rows())


def plot_sweep(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"]
    paths = []
    for dtype in sorted(ok["dtype"].unique()):
        sub = ok[ok["dtype"] == dtype]
        dims = sorted(sub["d"].unique())
        fig, axes = plt.subplots(len(MODE_TITLES), len(dims), figsize=(3.2 * len(dims), 2.6 * len(MODE_TITLES)),
                                 sharex=True, squeeze=False)
        for (r, mode), (c, d) in ((rm, cd) for rm in enumerate(MODE_TITLES) for cd in enumerate(dims)):
            ax = axes[r][c]
            for impl, label in LABELS.items():
                line = sub[(sub["impl"] == impl) & (sub["mode"] == mode) & (sub["d"] == d)].sort_values("seq")
                if not line.empty:
                    ax.plot(line["seq"], line["tflops"], marker="o", ms=3, label=label, color=COLORS[impl])
            ax.set_xscale("log", base=2)
            ax.set_title(f"{MODE_TITLES[mode]}, d={d}", fontsize=9)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("TFLOP/s")
            if r == len(MODE_TITLES) - 1:
                ax.set_xlabel("sequence length")
        from matplotlib.lines import Line2D

        present = [i for i in LABELS if i in set(sub["impl"])]
        handles = [Line2D([], [], color=COLORS[i], marker="o", ms=3) for i in present]
        fig.suptitle(f"causal attention, batch 1, {dtype}: TFLOP/s (FA convention) against sequence length",
                     y=0.995, fontsize=10)
        fig.legend(handles, [LABELS[i] for i in present], loc="upper center", bbox_to_anchor=(0.5, 0.965),
                   ncol=len(present), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        path = out_dir / f"sweep-{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_leaderboard(df: pd.DataFrame, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"]
    latest = ok[ok["run"] == ok["run"].max()]
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    modes = ["fwd_bwd", "fwd"]
    impls = [i for i in ("ours", "cudnn", "flash", "flex", "naive") if i in set(latest["impl"])]
    width = 0.38
    for j, mode in enumerate(modes):
        vals = [latest[(latest["impl"] == i) & (latest["mode"] == mode)]["mean_ms"].min() for i in impls]
        ys = [y + j * width for y in range(len(impls))]
        ax.barh(ys, vals, height=width, label=MODE_TITLES[mode])
        for y, val in zip(ys, vals):
            ax.annotate(f"{val:.2f}", (val, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks([y + width / 2 for y in range(len(impls))], impls)
    ax.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.xaxis.set_major_locator(FixedLocator([1, 2, 5, 10, 20, 50]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlim(right=ax.get_xlim()[1] * 1.3)
    ax.set_xlabel(f"ms, do_bench mean over {latest['rep_ms'].iloc[0] / 1000:g} s (lower is better); run {latest['run'].iloc[0]}")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path = out_dir / "leaderboard.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(root: str | Path | None = None, device: str = "nvidia-h200", out_dir: Path = PLOT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    from .sweep_tables import SWEEP_CELL

    # a re-measured cell keeps its old rows in the file; the newest one is plotted
    paths = plot_sweep(_rows("attention/flash_sweep", device, root).drop_duplicates(SWEEP_CELL, keep="last"), out_dir)
    try:
        paths.append(plot_leaderboard(_rows("attention/flash_leaderboard", device, root), out_dir))
    except FileNotFoundError:
        pass
    return paths
