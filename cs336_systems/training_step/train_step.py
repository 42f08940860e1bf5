"""One training step of a built variant, and what every variant is built from.

    step = TrainingStep(...)     # variants.py builds one per variant
    step()                       # zero_grad, forward + loss, backward, (sync), AdamW: what do_bench times

Every variant starts from the same weights (`init_lm`: a seeded fp32 initialisation, then cast, so
the bf16, fp32 and float64 models of one seed hold the same numbers up to that one rounding) and
trains on the same batch (`rank_batch`: one seeded global batch, each rank its rows). So their
losses can be compared, and tests can hold one variant against another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cs336_systems.model import ModelConfig, TransformerLM, use_attention

from .annotate import step_range

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}


@dataclass(frozen=True)
class StepOptions:
    """The knobs of a variant (each variant reads the ones it has; the row records them)."""

    dtype: torch.dtype = torch.bfloat16   # parameters, gradients, AdamW moments, activations
    keep_blocks: int = 0                  # the last k blocks run without activation checkpointing
    checkpoint: str | None = None         # a checkpoint plan (checkpoint_plan.py); None: keep_blocks'
    compile: bool = False                 # torch.compile each block's forward
    shard: str | None = None              # ours: none, ddp, fsdp2, fsdp; None: fsdp2 on >1 rank
    loss_chunk: int = 4096                # positions per chunk of the chunked / fused loss
    lr: float = 1e-3                      # AdamW, torch's defaults otherwise (betas, eps, wd 0.01)
    expandable_segments: bool = False     # the CUDA caching allocator's expandable segments
    attention: str | None = None          # ours: OURS_ATTENTIONS (variants.py); None: flash-triton
    seed: int = 0


@dataclass(eq=False)
class TrainingStep:
    """A variant built on this rank: call it to run one training step."""

    variant: str
    loss_module: nn.Module        # PlainLoss or LanguageModelLoss (lm_loss.py), unwrapped
    module: nn.Module             # what the step calls: loss_module or its DDP / FSDP wrapper
    optimizer: Any                # a torch.optim.Optimizer, or one run on local shards
    attention: str                # the model's attention during forward and backward (use_attention)
    tokens: torch.Tensor          # (batch per rank, context) int64
    targets: torch.Tensor         # (batch per rank, context) int64: tokens shifted by one
    flags: dict[str, Any]         # which optimisations are on: the row records them
    after_backward: Callable[[], None] | None = None  # our FSDP's gradient sync
    last_loss: torch.Tensor | None = field(default=None, repr=False)
    steps_taken: int = 0          # optimizer steps so far: last_loss is the loss before the last one
    annotate: bool = False        # named ranges around the phases and the loss head (annotate.py)

    def _range(self, name: str):
        return step_range(name) if self.annotate else contextlib.nullcontext()

    def forward_backward(self) -> torch.Tensor:
        """Loss and gradients, no optimizer step. The attention swap covers the backward too: a
        checkpointed block recomputes its forward there."""
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_module.annotate = self.annotate
        with use_attention(self.attention):
            with self._range("forward"):
                loss = self.module(self.tokens, self.targets)
            with self._range("backward"):
                loss.backward()
        if self.after_backward is not None:
            self.after_backward()
        return loss.detach()

    def __call__(self) -> None:
        self.last_loss = self.forward_backward()
        with self._range("optimizer"):
            self.optimizer.step()
        self.steps_taken += 1


def init_lm(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> TransformerLM:
    """The model of `seed`: initialised in fp32 on `device` (the same numbers in every dtype), then
    cast. At 8B on a GPU the fp32 copy is 32 GB for a moment, before any step."""
    torch.manual_seed(seed)
    lm = TransformerLM.from_config(cfg, device=device, dtype=torch.float32)
    return lm.to(dtype)


def rank_batch(cfg: ModelConfig, batch: int, context: int, rank: int, world_size: int,
               device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the global batch of `seed`: (tokens, targets), each (batch/world, context)."""
    if batch % world_size:
        raise ValueError(f"batch {batch} does not split evenly over {world_size} ranks")
    g = torch.Generator().manual_seed(10_000 + seed)
    sequences = torch.randint(cfg.vocab_size, (batch, context + 1), generator=g)  # (batch, context + 1)
    per = batch // world_size
    mine = sequences[rank * per:(rank + 1) * per]
    return mine[:, :-1].to(device), mine[:, 1:].to(device)
