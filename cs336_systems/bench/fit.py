"""Does a run fit in memory? Decided before any process starts or any cell is measured.

    need = step_memory(cfg, "train", batch=4, context=2048)           # bytes some moment holds
    have, where = capacity_bytes("cuda")                              # the GPU's memory
    refuse_unless_fits(p, args, need, have, where, "--size 2.7B --context 2048 --mode train")

The arithmetic is the training step's (training_step/memory_budget.py: parameters, gradients, AdamW
moments, what autograd saves per token of each block), applied to the model the Part 1 and
distributed benchmarks build: naive attention (its (h, S) probability row per token), full logits,
fp32 parameters (bf16 autocast saves bf16 activations), our AdamW's two fp32 moments. Each number is
a *lower bound*: bytes that some moment of the step certainly holds at once (the end of the
forward, with every saved activation; the end of the backward, with every gradient). Above the
memory there is, the run cannot finish whatever the allocator does, so the CLI refuses it in one
line naming the flags; `--allow-oom` tries anyway (a CUDA OOM becomes the cell's row; on a CPU the
kernel's OOM killer may end the process instead, which is why the check exists).

Capacity: the GPU's total memory with --device cuda; on a CPU this host's RAM shared by the ranks
it runs at once.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cs336_systems.training_step.memory_budget import GIB, Layout, budget

if TYPE_CHECKING:
    from cs336_systems.model.config import ModelConfig

MODES = ("forward", "forward-backward", "train")


@dataclass(frozen=True)
class StepMemory:
    """Bytes one rank certainly holds at the step's fullest moment, and how they add up."""

    lower_bound: float
    parts: dict[str, float]

    def explain(self) -> str:
        shown = " + ".join(f"{name} {b / GIB:.1f}" for name, b in self.parts.items() if b)
        return f"at least {self.lower_bound / GIB:.1f} GiB per rank ({shown})"


def step_memory(cfg: ModelConfig, mode: str, *, batch: int, context: int, bf16: bool = False,
                world_size: int = 1, shard_weights: bool = False, optimizer_shards: int = 1,
                checkpointed_blocks: int = 0, attention: str = "naive") -> StepMemory:
    """The lower bound of one step of `mode` (forward: inference under no_grad; forward-backward;
    train: with AdamW) on `batch` sequences of `context` tokens per rank.

    shard_weights: parameters, gradients and moments divided over `world_size` (FSDP);
    optimizer_shards: the moments alone divided (a sharded optimizer, ZeRO-1)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    shard = "fsdp" if shard_weights else "none"
    fused = "fused" if attention != "naive" else "naive"
    # Parameters, gradients and moments are fp32; activations are bf16 under autocast.
    weights = budget(cfg, Layout(fused, "full-logits", checkpointed_blocks, shard, 4), world_size, batch, context)
    acts = budget(cfg, Layout(fused, "full-logits", checkpointed_blocks, shard, 2 if bf16 else 4),
                  world_size, batch, context)
    params = weights.params
    if mode == "forward":  # nothing saved; the logits at the end, or one block's scores, at once
        elem = 2 if bf16 else 4
        logits = batch * context * cfg.vocab_size * elem
        kept_blocks = cfg.num_layers - checkpointed_blocks
        scores = acts.attention_probabilities / kept_blocks if kept_blocks else 0.0
        return StepMemory(params + max(logits, scores),
                          {"params": params, "logits or one block's scores": max(logits, scores)})
    moments = weights.optimizer_state / optimizer_shards if mode == "train" else 0.0
    saved, grads = acts.saved_activations, weights.grads
    if saved >= grads:  # the end of the forward is the fuller moment
        return StepMemory(params + moments + saved,
                          {"params": params, "AdamW state": moments, "saved activations": saved})
    return StepMemory(params + moments + grads, {"params": params, "AdamW state": moments, "grads": grads})


def capacity_bytes(device: str, ranks_here: int = 1) -> tuple[float, str]:
    """(bytes one rank may use, where that comes from): the GPU's memory, or RAM / ranks."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev.index or 0).total_memory
        return float(total), f"{total / GIB:.1f} GiB, the GPU's memory"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram / ranks_here, f"{ram / ranks_here / GIB:.1f} GiB, this host's RAM / {ranks_here} rank(s)"


def add_allow_oom(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-oom", action="store_true",
                   help="run what the memory arithmetic says cannot fit (its OOM becomes its row)")


def refuse_unless_fits(p: argparse.ArgumentParser, args: argparse.Namespace, need: StepMemory,
                       have: float, where: str, what: str) -> None:
    """One-line CLI error (exit 2) if `need` exceeds `have` and --allow-oom was not given."""
    if need.lower_bound > have and not getattr(args, "allow_oom", False):
        p.error(f"{what} cannot fit: it needs {need.explain()}, more than {where}; "
                f"--allow-oom runs it anyway")
