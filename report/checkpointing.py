"""The gradient-checkpointing page: the strategies' modelled costs and the facts it quotes.

Modelled: cs336_systems/profiling/checkpoint_theory.py, with the per-block saved bytes A counted
by sharding.accounting.transformer_activation_bytes for the 2026 handout's xl (our 2.7B preset),
batch 4, context 2048, fp32. Measured (pending): results/memory/checkpointing/<device>.jsonl from
`python -m cs336_systems.bench checkpointing`; the first H200 run was withdrawn (its saved-tensor
counter leaked each cell's graph into the next cell's peak), and the page quotes no measured
number until the re-run is committed.

    ```python exec="on"
    import report.checkpointing
    print(report.checkpointing.strategy_table())
    ```
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.profiling import checkpoint_theory as theory
from cs336_systems.sharding.accounting import transformer_activation_bytes
from report.profiling import register
from report.results import load_results, markdown_table

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

def modelled_peak_gib(k: int) -> float:
    """Activation bytes at the peak of single-level checkpointing with segments of k (0: none)."""
    return theory.single_level_peak(L, k, block_bytes(), checkpoint_bytes()) / GIB


FACTS = {
    "checkpointing.layers": lambda: f"{L}",
    "checkpointing.capacity_gib": lambda: f"{capacity_gib():.1f}",
    "checkpointing.none_need_gib": lambda: f"{no_checkpointing_need_gib():.0f}",
    "checkpointing.a_count_gib": lambda: f"{block_bytes() / GIB:.2f}",
    "checkpointing.c_mib": lambda: f"{checkpoint_bytes() / 2**20:.0f}",
    "checkpointing.k_star_count": lambda: f"{k_star(block_bytes() / GIB):.2f}",
    "checkpointing.k_best_model": lambda: f"{theory.best_block_size(L, block_bytes(), checkpoint_bytes())['k_best']}",
    "checkpointing.model_peak_k1_gib": lambda: f"{modelled_peak_gib(1):.1f}",
    "checkpointing.model_peak_k2_gib": lambda: f"{modelled_peak_gib(2):.1f}",
    "checkpointing.binary_forwards": lambda: f"{theory.nested_forwards(L, 'binary')}",
    "checkpointing.peel_forwards": lambda: f"{theory.nested_forwards(L, 'peel')}",
}
register(FACTS)
