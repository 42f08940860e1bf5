"""The training-step page's tables and facts: the step's arithmetic and memory budget, computed by
the package's formulas (cs336_systems/training_step/arithmetic.py, memory_budget.py). No GPU rows
yet: `just bench training-step` writes results/training-step/ when it runs on the GPUs."""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import get_config
from cs336_systems.training_step import arithmetic
from cs336_systems.training_step.memory_budget import GIB, Layout, budget
from report.flash import register
from report.results import markdown_table

CFG = get_config("8B")
BATCH, CONTEXT, GPUS = 2, 32_768, 2
GOAL_S, STRETCH_S = 4.5, 4.0  # the goal this project set itself for the step on two H200s

# (variant, layout) as the bench's variants build them at the leaderboard's size, one sequence per GPU
LAYOUTS = {
    "plain (naive attention, full logits, DDP)": Layout("naive", "full-logits", 0, "ddp", 2),
    "stock PyTorch (SDPA, checkpointed loss chunks, FSDP2, every block checkpointed)": Layout("fused", "chunked", 34, "fsdp2", 2),
    "ours (FlashAttention, fused loss, FSDP2, every block checkpointed)": Layout("fused", "fused", 34, "fsdp2", 2),
    "ours, no sharding (DDP), every block checkpointed": Layout("fused", "fused", 34, "ddp", 2),
    "ours, FSDP2, last 10 blocks kept": Layout("fused", "fused", 24, "fsdp2", 2),
}


def flops() -> int:
    return arithmetic.step_flops(CFG, BATCH, CONTEXT)


def seconds_at(mfu: float) -> float:
    """The step time two H200s need at this MFU (of the bf16 dense datasheet rate)."""
    return flops() / (mfu * GPUS * arithmetic.H200_BF16_DENSE_FLOPS)


def mfu_at(seconds: float) -> float:
    return arithmetic.mfu(flops(), seconds, GPUS)


def arithmetic_table() -> str:
    rows = [("parameters", f"{arithmetic.params(CFG):,}"),
            ("matmul parameters (every Linear, the LM head included)", f"{arithmetic.matmul_params(CFG):,}"),
            ("tokens per step (batch x context)", f"{BATCH * CONTEXT:,}"),
            ("model FLOPs, weights (6 x tokens x matmul parameters)", f"{arithmetic.weight_flops(CFG, BATCH, CONTEXT):.3e}"),
            ("model FLOPs, causal attention", f"{arithmetic.attention_flops(CFG, BATCH, CONTEXT):.3e}"),
            ("model FLOPs per step", f"{flops():.3e}"),
            ("step at 100% MFU on two H200s (989 TFLOP/s bf16 dense each)", f"{seconds_at(1.0):.2f} s"),
            (f"MFU of a {GOAL_S} s step (the goal)", f"{mfu_at(GOAL_S):.1%}"),
            (f"MFU of a {STRETCH_S} s step (the stretch)", f"{mfu_at(STRETCH_S):.1%}")]
    return markdown_table(pd.DataFrame(rows, columns=["quantity", "value"]))


def budget_of(layout: Layout):
    return budget(CFG, layout, world_size=GPUS, batch_per_rank=BATCH // GPUS, context=CONTEXT)


def budget_table() -> str:
    rows = []
    for name, layout in LAYOUTS.items():
        g = budget_of(layout).as_gib()
        rows.append({"variant": name, "weights, grads, AdamW (DDP: + buckets)": g["params"] + g["grads"] + g["optimizer_state"]
                     + g["ddp_buckets"], "saved activations": g["saved_activations"],
                     "largest transient": g["working_set"], "estimated peak": g["estimate"]})
    df = pd.DataFrame(rows)
    return (markdown_table(df, formats={c: ".1f" for c in df.columns if c != "variant"})
            + "\n\n*GiB per GPU, by formula (`training_step/memory_budget.py`), one sequence of 32,768 per "
              "GPU; an H200 has about 139 GiB. Not counted: the CUDA context, compile workspaces, NCCL "
              "buffers, fragmentation.*")


FACTS = {
    "training_step.params_b": (lambda: arithmetic.params(CFG) / 1e9, ".2f"),
    "training_step.flops": (lambda: f"{flops() / 1e15:.2f} x 10^15", ""),
    "training_step.ideal_s": (lambda: seconds_at(1.0), ".2f"),
    "training_step.goal_mfu": (lambda: mfu_at(GOAL_S), ".0%"),
    "training_step.stretch_mfu": (lambda: mfu_at(STRETCH_S), ".0%"),
    "training_step.plain_gib": (lambda: budget_of(LAYOUTS["plain (naive attention, full logits, DDP)"]).lower_bound / GIB, ".0f"),
    "training_step.plain_probs_gib": (
        lambda: budget_of(LAYOUTS["plain (naive attention, full logits, DDP)"]).attention_probabilities / GIB, ".0f"),
    "training_step.ours_fsdp_gib": (
        lambda: budget_of(LAYOUTS["ours (FlashAttention, fused loss, FSDP2, every block checkpointed)"]).estimate / GIB, ".0f"),
    "training_step.ours_ddp_gib": (
        lambda: budget_of(LAYOUTS["ours, no sharding (DDP), every block checkpointed"]).estimate / GIB, ".0f"),
}
register(FACTS)
