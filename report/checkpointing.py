"""The gradient-checkpointing page: the strategies' modelled costs, the H200 sweep, and facts.

Modelled: cs336_systems/profiling/checkpoint_theory.py, with the per-block saved bytes A counted
by sharding.accounting.transformer_activation_bytes for the 2026 handout's xl (our 2.7B preset),
batch 4, context 2048, fp32. Measured: results/memory/checkpointing/<device>.jsonl, one row per
block size k of TransformerLM.checkpoint_every (0 = none), from
`python -m cs336_systems.bench checkpointing`.

    ```python exec="on"
    import report.checkpointing
    print(report.checkpointing.block_size_table())
    ```
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.profiling import checkpoint_theory as theory
from cs336_systems.sharding.accounting import transformer_activation_bytes
from report.facts import register
from report.figures import new_figure
from report.results import load_results, markdown_table, newest, with_source

DEVICE = "nvidia-h200"
SIZE, BATCH, CONTEXT = "2.7B", 4, 2048  # the 2026 handout's xl, batch 4, context 2048
GIB = 2**30
CFG = get_config(SIZE, CONTEXT)
L = CFG.num_layers


# -- the model: per-block residuals A, one checkpoint c ----------------------------------------

def block_bytes() -> float:
    """A: bytes autograd saves for one block (the count's difference between 2 layers and 1)."""
    one, two = (dataclasses.replace(CFG, num_layers=n) for n in (1, 2))
    return transformer_activation_bytes(two, BATCH, CONTEXT) - transformer_activation_bytes(one, BATCH, CONTEXT)


def checkpoint_bytes() -> float:
    """c: one segment input, the fp32 residual stream (batch, context, d_model)."""
    return 4 * BATCH * CONTEXT * CFG.d_model


def k_star(A_gib: float) -> float:
    """The continuous optimum sqrt(L c / A) of ceil(L/k) c + k A."""
    return math.sqrt(L * checkpoint_bytes() / GIB / A_gib)


def no_checkpointing_need_gib() -> float:
    """Parameters and gradients (fp32) plus every saved activation: what k = 0 would hold."""
    params = count_parameters(CFG)["total"]
    return (8 * params + transformer_activation_bytes(CFG, BATCH, CONTEXT)) / GIB


def capacity_gib(device: str = DEVICE) -> float:
    """The GPU's capacity as its own out-of-memory message states it (the attention chapter's run)."""
    df = load_results("attention/oom_checks", device)
    return float(df["capacity_mib"].dropna().iloc[0]) / 1024


def strategy_table() -> str:
    """Problem (a)'s strategies at the 2026 xl's L, A and c: modelled peak and block forwards."""
    df = pd.DataFrame(theory.strategy_table(L, block_bytes(), checkpoint_bytes()))
    df["peak_bytes"] = df["peak_bytes"] / GIB
    df = df.rename(columns={"memory": "peak memory", "forwards": "block forwards",
                            "peak_bytes": "peak (GiB, modelled)", "block_forwards": f"block forwards, L = {L}"})
    return markdown_table(df, floatfmt=".2f")


# -- facts: "{{ checkpointing.<name> }}" in docs/memory/checkpointing.md -------------------------------

FACTS = {
    "checkpointing.layers": lambda: f"{L}",
    "checkpointing.capacity_gib": lambda: f"{capacity_gib():.1f}",
    "checkpointing.none_need_gib": lambda: f"{no_checkpointing_need_gib():.0f}",
    "checkpointing.a_count_gib": lambda: f"{block_bytes() / GIB:.2f}",
    "checkpointing.c_mib": lambda: f"{checkpoint_bytes() / 2**20:.0f}",
    "checkpointing.k_star_count": lambda: f"{k_star(block_bytes() / GIB):.2f}",
    "checkpointing.binary_forwards": lambda: f"{theory.nested_forwards(L, 'binary')}",
    "checkpointing.peel_forwards": lambda: f"{theory.nested_forwards(L, 'peel')}",
}
register(FACTS)


# -- the H200 sweep: results/memory/checkpointing/<device>.jsonl -----------------------------------

BENCH = "memory/checkpointing"


def rows(device: str = DEVICE) -> pd.DataFrame:
    """The newest row per block size at the handout's setting, in order of k."""
    df = load_results(BENCH, device)
    df = df[(df["size"] == SIZE) & (df["batch"] == BATCH) & (df["context"] == CONTEXT)]
    df = newest(df, ["checkpoint_every", "dtype", "attention", "mode"])
    return df.sort_values("checkpoint_every").reset_index(drop=True)


def ok_rows(device: str = DEVICE) -> pd.DataFrame:
    df = rows(device)
    return df[df["status"] == "ok"].reset_index(drop=True)


def block_size_table(device: str = DEVICE) -> str:
    df = rows(device)
    table = pd.DataFrame({
        "k (blocks per segment)": df["checkpoint_every"].map(lambda k: "none" if k == 0 else str(k)),
        "segments": df["checkpoint_every"].map(lambda k: math.ceil(L / k) if k else 0),
        "status": df["status"],
        "peak (GiB)": df["peak_mem_gib"],
        "allocated at the cell's start (GiB)": df["params_gib"],
        "saved after forward (GiB)": df["saved_after_forward_gib"],
        "step (s)": df["median_ms"] / 1e3})
    return with_source(table, BENCH, used=df, floatfmt=".2f")


def measured_block_gib(device: str = DEVICE) -> float:
    """A from the measurements: the slope, in k, of the peak minus ceil(L/k) c."""
    df = ok_rows(device)
    k = df["checkpoint_every"].to_numpy(float)
    y = df["peak_mem_gib"] - np.ceil(L / k) * checkpoint_bytes() / GIB
    return float(np.polyfit(k, y, 1)[0])


def best(device: str = DEVICE) -> pd.Series:
    df = ok_rows(device)
    return df.loc[df["peak_mem_gib"].idxmin()]


def neighbour(offset: int, device: str = DEVICE) -> pd.Series:
    """The block size `offset` places from the best among every k the sweep ran."""
    df = rows(device)
    i = int(df.index[df["checkpoint_every"] == best(device)["checkpoint_every"]][0]) + offset
    return df.iloc[i]


def peak_figure(device: str = DEVICE):
    """Measured peak per block size, the capacity, and the cells that ran out of memory."""
    df = rows(device)
    ok = df[df["status"] == "ok"]
    fig, ax = new_figure(7.0, 3.6)
    ax.plot(ok["checkpoint_every"], ok["peak_mem_gib"], "o-", label="allocator peak, forward + backward")
    cap = capacity_gib(device)
    ax.axhline(cap, color="grey", linestyle=":", linewidth=1, label="the H200's capacity")
    oom = df[df["status"] == "oom"]
    ax.plot(oom["checkpoint_every"], [cap] * len(oom), "x", color="C3", markersize=10, label="out of memory")
    ax.set_xscale("symlog", base=2, linthresh=1)
    ks = sorted(df["checkpoint_every"].unique())
    ax.set_xticks(ks, ["none" if k == 0 else str(k) for k in ks])
    ax.set_xlabel("k: blocks per checkpointed segment")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_ylim(0, cap * 1.1)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(0.02, 0.62))
    return fig


register({
    "checkpointing.k_best": lambda: f"{int(best()['checkpoint_every'])}",
    "checkpointing.peak_best_gib": lambda: f"{best()['peak_mem_gib']:.1f}",
    "checkpointing.k_larger": lambda: f"{int(neighbour(1)['checkpoint_every'])}",
    "checkpointing.peak_larger_gib": lambda: f"{neighbour(1)['peak_mem_gib']:.1f}",
    "checkpointing.warmup": lambda: f"{int(ok_rows()['warmup'].iloc[0])}",
    "checkpointing.steps": lambda: f"{int(ok_rows()['steps'].iloc[0])}",
    "checkpointing.k_max": lambda: f"{int(rows()['checkpoint_every'].max())}",
    "checkpointing.a_measured_gib": lambda: f"{measured_block_gib():.2f}",
    "checkpointing.k_star_measured": lambda: f"{k_star(measured_block_gib()):.2f}",
    "checkpointing.step_s_min": lambda: f"{ok_rows()['median_ms'].min() / 1e3:.2f}",
    "checkpointing.step_s_max": lambda: f"{ok_rows()['median_ms'].max() / 1e3:.2f}",
    "checkpointing.step_spread_pct": lambda: f"{100 * (ok_rows()['median_ms'].max() / ok_rows()['median_ms'].min() - 1):.0f}",
})
