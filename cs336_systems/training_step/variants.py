"""The three training steps the leaderboard bench compares, each built on one rank.

                plain                   stock (the PyTorch anchor)          ours
    attention   naive (the (h, S, S)    SDPA, is_causal                     FlashAttentionFast (Triton);
                scores)                                                     SDPA with --ours-attention sdpa
    LM head +   full logits, fp32 copy, chunks of 4,096 positions under     fused_linear_cross_entropy
    loss        F.cross_entropy         checkpoint, fp32 cross-entropy      (chunks, Triton)
    optimizer   torch.optim.AdamW       torch.optim.AdamW(fused=True) on    FusedAdamW (Triton)
                                        a GPU (CPU: the default)
    activation  none                    a plan: per block none, selective   the same (--checkpoint;
    checkpoints                         or full (--checkpoint; default      selective keeps our op's
                                        every block but the last            O and L)
                                        --keep-blocks k full); selective
                                        keeps SDPA's outputs
    compile     no                      each block's forward (--compile)    each block's forward (--compile)
    sharding    DDP on > 1 rank         FSDP2 on > 1 rank                   --shard: none, ddp, fsdp2
                                                                            (default on > 1 rank), fsdp (ours)

All three compute the same function of the same weights (train_step.init_lm, one seed) on the same
batch; parameters, gradients and AdamW moments in the parameter dtype (bf16 for the leaderboard).

    recipe = recipe_of("ours", options, cfg, world_size=2, device_type="cuda")   # what, before building
    step = build(recipe, options, cfg, worker, batch=2)                          # a TrainingStep
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from cs336_systems.distributed.launch import Worker
from cs336_systems.model import ModelConfig

from .checkpoint_plan import parse_plan, plan_of_keep_blocks
from .heads import ChunkedLossHead, FusedLossHead
from .lm_loss import LanguageModelLoss, PlainLoss
from .memory_budget import Layout
from .sharding import SHARDS, shard
from .train_step import StepOptions, TrainingStep, init_lm, rank_batch

VARIANTS = ("plain", "stock", "ours")
ATTENTION = {"plain": "naive", "stock": "sdpa", "ours": "flash-triton"}
# What ours may run its attention with: our FlashAttention (the default), or SDPA (cuDNN's kernels
# on an H200) with everything else of ours, to tell what our attention costs or buys in the step
# from what the rest of ours does (--ours-attention; the row's flags.attention says which).
OURS_ATTENTIONS = ("flash-triton", "sdpa")
LOSS = {"plain": "full-logits", "stock": "chunked", "ours": "fused"}


def sdpa_backend(cfg: ModelConfig, batch_per_rank: int, dtype: torch.dtype, device: torch.device) -> str:
    """The kernel SDPA picks for the step's causal attention on this device (FLASH_ATTENTION,
    CUDNN_ATTENTION, EFFICIENT_ATTENTION, MATH): the stock variant does not pin one, and its speed
    depends on which. Asked of PyTorch's own selection on empty tensors of the step's shape."""
    from torch.nn.attention import SDPBackend

    shape = (batch_per_rank, cfg.num_heads, cfg.context_length, cfg.d_model // cfg.num_heads)
    q = torch.empty(shape, dtype=dtype, device=device)  # (batch, heads, seq, d_head), never read
    return SDPBackend(torch._fused_sdp_choice(q, q, q, None, 0.0, True)).name


@dataclass(frozen=True)
class Recipe:
    """What a variant runs with, decided before anything is built (the row's flags)."""

    variant: str
    attention: str             # the model's attention (cs336_systems.model.attention names)
    loss: str                  # full-logits, chunked, fused
    optimizer: str             # torch.optim.AdamW, torch.optim.AdamW(fused=True), FusedAdamW
    checkpointed_blocks: int   # blocks under torch.utils.checkpoint (full or selective)
    keep_blocks: int           # blocks not checkpointed
    compile: bool              # torch.compile each block's forward
    shard: str                 # none, ddp, fsdp2, fsdp
    loss_chunk: int | None     # positions per chunk of the chunked / fused loss
    checkpoint: str = ""       # the checkpoint plan, canonical (checkpoint_plan.py): full:30,none:4
    expandable_segments: bool = False  # the CUDA caching allocator's expandable segments

    def flags(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "variant"}

    def layout(self, dtype: torch.dtype) -> Layout:
        """What the memory arithmetic needs (memory_budget.py)."""
        return Layout(attention="naive" if self.attention == "naive" else "fused", loss=self.loss,
                      checkpointed_blocks=self.checkpointed_blocks, shard=self.shard,
                      param_bytes=torch.tensor([], dtype=dtype).element_size(),
                      loss_chunk=self.loss_chunk or 4096, plan=self.plan_modes(), compiled=self.compile)

    def plan_modes(self) -> tuple[str, ...]:
        return parse_plan(self.checkpoint, self.checkpointed_blocks + self.keep_blocks).modes


def recipe_of(variant: str, options: StepOptions, cfg: ModelConfig, world_size: int,
              device_type: str) -> Recipe:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    L = cfg.num_layers
    if not 0 <= options.keep_blocks <= L:
        raise ValueError(f"keep_blocks must be in [0, {L}], got {options.keep_blocks}")
    plan = (parse_plan(options.checkpoint, L) if options.checkpoint is not None
            else plan_of_keep_blocks(L, options.keep_blocks))  # BadPlan (a ValueError) says why not
    replicated = "ddp" if world_size > 1 else "none"
    sharded = "fsdp2" if world_size > 1 else "none"
    if variant == "plain":  # the model as written: nothing on
        return Recipe(variant, ATTENTION[variant], LOSS[variant], "torch.optim.AdamW", 0, L, False,
                      replicated, None, plan_of_keep_blocks(L, L).text, options.expandable_segments)
    how = sharded if variant == "stock" or options.shard is None else options.shard
    if how not in SHARDS:
        raise ValueError(f"shard must be one of {', '.join(SHARDS)}, got {how!r}")
    if how == "fsdp" and options.compile:
        raise ValueError("our FSDP (shard fsdp) and compile do not mix: its per-layer hooks run inside each "
                         "block, so torch.compile traces them and recompiles for every layer (it guards on "
                         "the layer's index and name) until its recompile limit, then runs the block eagerly")
    attention = ATTENTION[variant]
    if variant == "ours" and options.attention is not None:
        if options.attention not in OURS_ATTENTIONS:
            raise ValueError(f"ours' attention must be one of {', '.join(OURS_ATTENTIONS)}, got {options.attention!r}")
        attention = options.attention
    optimizer = ("FusedAdamW" if variant == "ours" else
                 "torch.optim.AdamW(fused=True)" if device_type == "cuda" else "torch.optim.AdamW")
    return Recipe(variant, attention, LOSS[variant], optimizer, plan.checkpointed_blocks,
                  plan.kept_blocks, options.compile, how, options.loss_chunk, plan.text,
                  options.expandable_segments)


def with_plan(recipe: Recipe, text: str) -> Recipe:
    """`recipe` (stock or ours) with the checkpoint plan `text` instead of its own."""
    if recipe.variant == "plain":
        raise ValueError("the plain variant has no checkpoint plan (it is the model as written)")
    plan = parse_plan(text, recipe.checkpointed_blocks + recipe.keep_blocks)
    return replace(recipe, checkpoint=plan.text, checkpointed_blocks=plan.checkpointed_blocks,
                   keep_blocks=plan.kept_blocks)


def _optimizer(name: str, params: list[torch.Tensor], lr: float):
    if name == "FusedAdamW":
        from torch.distributed.tensor import DTensor

        from .fused_adamw import FusedAdamW
        from .local_shards import LocalShardOptimizer

        if any(isinstance(p, DTensor) for p in params):
            return LocalShardOptimizer(params, FusedAdamW, lr=lr)
        return FusedAdamW(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, fused=True if name.endswith("(fused=True)") else None)


def build(recipe: Recipe, options: StepOptions, cfg: ModelConfig, worker: Worker, batch: int) -> TrainingStep:
    """The variant on this rank, with this rank's rows of the global `batch` (cfg.context_length
    tokens each). Needs a process group when the recipe shards."""
    lm = init_lm(cfg, worker.device, options.dtype, options.seed)
    if recipe.variant == "plain":
        module = PlainLoss(lm)
    else:
        head_cls = FusedLossHead if recipe.loss == "fused" else ChunkedLossHead
        # each block's forward compiled (recipe.compile), its checkpointing inside (selective.py)
        module = LanguageModelLoss(lm, head_cls(lm.lm_head.weight, recipe.loss_chunk),
                                   parse_plan(recipe.checkpoint, cfg.num_layers), compile=recipe.compile)
    called, after_backward = shard(module, recipe.shard, worker.device, worker.world_size)
    optimizer = _optimizer(recipe.optimizer, list(called.parameters()), options.lr)
    tokens, targets = rank_batch(cfg, batch, cfg.context_length, worker.rank, worker.world_size,
                                 worker.device, options.seed)
    return TrainingStep(recipe.variant, module, called, optimizer, recipe.attention, tokens, targets,
                        recipe.flags(), after_backward)
