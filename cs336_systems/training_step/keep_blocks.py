"""How many blocks the training step can keep (run without activation checkpointing) on its GPUs:
the largest k whose memory estimate (memory_budget.py) stays under a share of each GPU's memory.
On two GPUs, what sharding frees per rank, spent on fewer recomputed blocks.

    python -m cs336_systems.training_step.keep_blocks --world-size 2 --variant stock ours --shard fsdp2
    6                                  # (for example) the k that every named variant fits with

The estimate is the bench's own (its rows hold it beside the measured peak); the share left out
(--headroom) covers what it does not count: the CUDA context, torch.compile's workspaces, NCCL's
buffers, and the allocator's reserved memory above what it allocated.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import torch

from cs336_systems.bench.cli import Parser, at_least, positive
from cs336_systems.model import ModelConfig, get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

from .memory_budget import GIB, SHARDS, budget
from .rows import DTYPES
from .train_step import StepOptions
from .variants import VARIANTS, recipe_of

HEADROOM = 0.85  # the share of a rank's memory the estimate may fill


def estimate_bytes(cfg: ModelConfig, variant: str, options: StepOptions, world: int,
                   batch_per_rank: int, device_type: str = "cuda") -> float:
    """The memory arithmetic's likely peak per rank of `variant` with `options`."""
    recipe = recipe_of(variant, replace(options, compile=False), cfg, world, device_type)
    return budget(cfg, recipe.layout(options.dtype), world, batch_per_rank, cfg.context_length).estimate


def most_kept_blocks(cfg: ModelConfig, variants: list[str], options: StepOptions, world: int,
                     batch_per_rank: int, capacity_bytes: float, headroom: float = HEADROOM,
                     device_type: str = "cuda") -> int:
    """The largest k in [0, L] with every variant's estimate at keep_blocks=k within
    headroom x capacity; 0 if none fits even fully checkpointed (the bench's fit check decides)."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    best = 0
    for k in range(cfg.num_layers + 1):  # the estimate grows with k: the first miss ends it
        opts = replace(options, keep_blocks=k)
        if any(estimate_bytes(cfg, v, opts, world, batch_per_rank, device_type) > headroom * capacity_bytes
               for v in variants):
            break
        best = k
    return best


def build_parser() -> Parser:
    p = Parser(prog="keep_blocks", description=__doc__.split("\n")[0])
    p.add_argument("--variant", nargs="+", choices=[v for v in VARIANTS if v != "plain"],
                   default=["stock", "ours"], help="every one must fit with the k printed")
    p.add_argument("--size", default="8B", choices=[*PRESETS, *PRESETS_EXTRA])
    p.add_argument("--batch", type=at_least(1), default=2, help="global batch, split over the ranks")
    p.add_argument("--context", type=at_least(1), default=None, help="default: the preset's")
    p.add_argument("--world-size", type=at_least(1), default=2)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default bf16 on cuda, fp32 on cpu")
    p.add_argument("--shard", choices=SHARDS, default=None, help="ours: as the bench's --shard")
    p.add_argument("--loss-chunk", type=at_least(1), default=4096)
    p.add_argument("--memory-per-rank-gib", type=positive(float), default=None,
                   help="default: the first GPU's memory (cuda), RAM / ranks (cpu)")
    p.add_argument("--headroom", type=positive(float), default=HEADROOM,
                   help=f"share of that memory the estimate may fill (default {HEADROOM})")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.headroom > 1:
        parser.error(f"--headroom {args.headroom}: a share, at most 1")
    if args.batch % args.world_size:
        parser.error(f"--batch {args.batch} must split evenly over {args.world_size} ranks")
    if args.memory_per_rank_gib is not None:
        capacity = args.memory_per_rank_gib * GIB
    elif args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no GPU visible; give --memory-per-rank-gib")
        capacity = torch.cuda.get_device_properties(0).total_memory
    else:
        capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / args.world_size
    dtype = DTYPES[args.dtype or ("bf16" if args.device == "cuda" else "fp32")]
    cfg = get_config(args.size, args.context)
    options = StepOptions(dtype=dtype, shard=args.shard, loss_chunk=args.loss_chunk)
    print(most_kept_blocks(cfg, args.variant, options, args.world_size, args.batch // args.world_size,
                           capacity, args.headroom, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
