"""The 2026 leaderboard's training step: one step (forward, loss, backward, AdamW) of the 8B model
at batch 2 x context 32,768 in bf16, timed by triton.testing.do_bench. Ours against stock PyTorch.

    just bench training-step                                   # 8B, every GPU, stock then ours
    just bench training-step --variant ours --keep-blocks 4    # ours alone, last 4 blocks kept
    just bench training-step --checkpoint selective,none:10 full:30,none:4   # two plans, each variant
    just bench training-step --checkpoint stock=selective,none:10 ours=full   # a plan for each
    just bench training-step --sweep 3                         # 3 plans chosen for this GPU's memory
    just bench training-step --profile                         # one step under torch.profiler, by category
    just bench training-step --ours-attention flash-triton sdpa   # ours with each attention
    just bench training-step --variant plain --allow-oom       # the plain model: an OOM row
    just bench training-step --size tiny --device cpu --dtype fp32 --variant plain stock ours
    torchrun --nproc-per-node 2 -m cs336_systems.bench training-step      # or --world-size 2

The variants (variants.py): plain (the model as written, DDP), stock (SDPA, chunked loss under
checkpoint, fused torch AdamW, per-block checkpointing and compile, FSDP2), ours (our
FlashAttention, fused LM head + cross-entropy, FusedAdamW, per-block checkpointing and compile,
--shard). Several run one after another in one process group (memory freed between), so their
ratios come from one run on the same machines. The global batch (--batch) is split over the ranks.

Checkpointing (stock and ours): --checkpoint takes one or more plans, each variant runs each, or
only its own ones given as VARIANT=PLAN (checkpoint_plan.py: per block none, selective or full, as MODE:COUNT segments from the first
block: full:22,selective:8,none:4; selective keeps the attention's outputs, selective+qkv+out+w13
matmul outputs too); --keep-blocks k is the plan full,none:k; --sweep N runs N plans chosen for the
memory (plan_search.py), saying which it skipped as predicted not to fit. Every row records its
plan (flags.checkpoint). --profile runs one step under torch.profiler instead of timing it and
writes its kernel time by category (step_profile.py, breakdown.py) to
results/training-step-profile/<device>.jsonl.

Before any process starts, the memory arithmetic (memory_budget.py) refuses a variant that cannot
fit (the plain model's (h, S, S) attention scores at 32k: terabytes); --allow-oom runs it anyway
and records the out-of-memory row. A variant that fails writes a row with its status ("oom",
"error") and the message; the others still run; the exit code is then 1.

Rows (results/training-step/<device>.jsonl), one per variant: step time (median and mean over the
timed calls of the slowest rank), MFU against the datasheet peak (arithmetic.py; the H200's 989
TFLOP/s bf16) and, if results/ceilings has this GPU's measured matmul ceiling, against that too;
peak memory per GPU (max over ranks, and each rank's); the flags of what was on; do_bench's warmup
and rep; the loss of the first step (every variant starts from the same weights and batch, so
they agree) and of the last, with the number of steps taken (do_bench's count, which depends on the
step's time: the last losses of two variants are comparable only at equal counts); the wall time from the variant's start to the end of its first step
(building and compiling included) and to the end of its timing, and from the bench's start.
--cold-cache points TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR at fresh empty directories, so
the wall times are those of the course's rule (a result within 10 minutes from empty caches).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import uuid
from dataclasses import replace

import torch

from cs336_systems.attention.triton_loader import interpreting
from cs336_systems.bench.cli import (
    Parser,
    at_least,
    check_cuda,
    open_store,
    positive,
    refuse_duplicates,
    seed,
    timeout_s,
)
from cs336_systems.bench.provenance import device_slug
from cs336_systems.distributed.launch import RankFailed, in_torchrun, run_from_env, spawn
from cs336_systems.model import get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

from . import step_profile
from .checkpoint_plan import BadPlan, parse_plan
from .memory_budget import GIB, budget
from .plan_search import sweep_plans
from .rows import BENCH, DTYPES, KEY, REP_MS, WARMUP_MS, Plan
from .run_variants import record_lost_ranks, run_environment, run_here, run_variants
from .sharding import SHARDS
from .train_step import StepOptions
from .variants import OURS_ATTENTIONS, VARIANTS, Recipe, recipe_of, with_plan


def build_parser() -> Parser:
    p = Parser(prog=BENCH, description=" ".join(__doc__.split("\n")[:2]))
    p.add_argument("--variant", nargs="+", choices=VARIANTS, default=["stock", "ours"],
                   help="which to run, in this order (default: stock ours; plain does not fit at 8B x 32k)")
    p.add_argument("--size", default="8B", choices=[*PRESETS, *PRESETS_EXTRA],
                   help="model preset (default 8B, the leaderboard's; tiny and small for a CPU or a quick GPU run)")
    p.add_argument("--batch", type=at_least(1), default=2, help="global batch in sequences, split over the ranks (default 2)")
    p.add_argument("--context", type=at_least(1), default=None, help="tokens per sequence (default: the preset's)")
    p.add_argument("--world-size", type=at_least(1), default=None,
                   help="ranks (default: every visible GPU with --device cuda, 1 on the CPU; torchrun: its own)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="parameters, gradients, AdamW moments, activations (default bf16 on cuda; fp32 on "
                        "the CPU, where the Triton interpreter has no bf16)")
    p.add_argument("--checkpoint", nargs="+", default=None, metavar="PLAN",
                   help="stock and ours: checkpoint plans, each variant runs each (one row per plan): per "
                        "block none, selective or full as MODE:COUNT segments from the first block, e.g. "
                        "full:22,selective:8,none:4; one segment may leave out its count and take the rest "
                        "(selective,none:10); selective keeps the attention's outputs, selective+qkv+out+w13 "
                        "those matmuls' outputs too; VARIANT=PLAN (ours=full) is for that variant only "
                        "(default: --keep-blocks')")
    p.add_argument("--keep-blocks", type=at_least(0), default=None,
                   help="stock and ours: the last k blocks kept, the others fully checkpointed: the plan "
                        "full,none:k (default 0: every block full)")
    p.add_argument("--sweep", type=at_least(1), default=None, metavar="N",
                   help="stock and ours: run N checkpoint plans chosen for the memory (--memory-per-rank-gib or "
                        "the GPU's) by the memory arithmetic, around the predicted best; plans predicted not to "
                        "fit are skipped with a line")
    p.add_argument("--profile", action="store_true",
                   help="one step under torch.profiler instead of do_bench's timing: its kernel time by category "
                        "(matmul, attention, recompute, elementwise, loss, optimizer, idle), rows in "
                        "results/training-step-profile")
    p.add_argument("--trace-dir", default=None,
                   help="with --profile: write each profiled step's Chrome trace into this directory")
    p.add_argument("--ours-attention", nargs="+", choices=OURS_ATTENTIONS, default=None, metavar="ATTENTION",
                   help="ours: its attention, flash-triton (ours, the default) or sdpa (SDPA's kernels with "
                        "the rest of ours); several: each plan of ours runs with each, one row apiece")
    p.add_argument("--expandable-segments", action="store_true",
                   help="the CUDA caching allocator's expandable segments (less fragmentation; in the flags)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="stock and ours: torch.compile each block (default: on with cuda, off on the CPU)")
    p.add_argument("--shard", choices=SHARDS, default=None,
                   help="ours: none, ddp, fsdp2 (torch's), fsdp (ours) (default fsdp2 on > 1 rank, else none); "
                        "plain is DDP and stock FSDP2 on > 1 rank")
    p.add_argument("--loss-chunk", type=at_least(1), default=4096, help="positions per loss chunk (default 4096)")
    p.add_argument("--warmup-ms", type=positive(float), default=WARMUP_MS,
                   help="do_bench's warmup (default 25 ms, do_bench's own; at least one call is made either way)")
    p.add_argument("--rep-ms", type=positive(float), default=REP_MS,
                   help="do_bench's rep (default 100 ms, do_bench's own: one timed call of an 8B step; shorter "
                        "than do_bench's defaults is allowed by the course, and the row records both values)")
    p.add_argument("--cold-cache", action="store_true",
                   help="fresh empty TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR: the 10-minutes-from-empty-caches rule")
    p.add_argument("--allow-oom", action="store_true",
                   help="run a variant the memory arithmetic says cannot fit (and record its OOM row)")
    p.add_argument("--memory-per-rank-gib", type=positive(float), default=None,
                   help="the memory a rank may use, for the fit check (default: the GPU's; on the CPU, RAM / ranks)")
    p.add_argument("--seed", type=seed, default=0, help="weights and batch (default 0)")
    p.add_argument("--timeout-s", type=timeout_s, default=1800.0,
                   help="per collective (a compiling rank keeps the others waiting; default 1800)")
    p.add_argument("--results-dir", default=None, help="root of the results tree (default: results/)")
    return p


def _capacity_bytes(device: str, world_local: int) -> tuple[float, str]:
    if device == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory), "the GPU's memory"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram / world_local, f"this host's RAM / {world_local} rank(s)"


def _sweep(parser: Parser, base: Recipe, cfg, options: StepOptions, world: int, batch_per_rank: int,
           capacity: float, where: str, n: int) -> list[Recipe]:
    """The recipes of the plans --sweep tries for `base`'s variant (plan_search.py), with a line for
    each chosen plan and each skipped one; none predicted to fit is a CLI error."""
    def layout_of(p):
        return with_plan(base, p.text).layout(options.dtype)

    chosen, skipped = sweep_plans(cfg, layout_of, world, batch_per_rank, cfg.context_length, capacity, n)
    if not chosen:
        parser.error(f"--sweep: no plan of {base.variant} is predicted to fit {capacity / GIB:.1f} GiB ({where}): "
                     f"even {skipped[0].plan.text} needs {skipped[0].budget.estimate / GIB:.1f} GiB")
    for c in skipped:
        print(f"[{BENCH}] {base.variant}: sweep skips {c.plan.kept_blocks} kept block(s): even "
              f"{c.plan.text} is predicted to need {c.budget.estimate / GIB:.1f} GiB, more than "
              f"{capacity / GIB:.1f} GiB ({where})", file=sys.stderr)
    for i, c in enumerate(chosen):
        print(f"[{BENCH}] {base.variant}: sweep plan {i + 1}/{len(chosen)}: {c.plan.text} (predicted "
              f"{c.budget.estimate / GIB:.1f} GiB, {c.recompute_flops / 1e12:.1f} TFLOP recomputed)", file=sys.stderr)
    return [with_plan(base, c.plan.text) for c in chosen]


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_duplicates(parser, args, "variant")  # argument checks (issue 28)
    if args.ours_attention is not None:
        refuse_duplicates(parser, args, "ours_attention")
        if "ours" not in args.variant:
            parser.error("--ours-attention: only with --variant ours (it is ours' attention)")
    if in_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if args.world_size is not None and args.world_size != world:
            parser.error(f"--world-size {args.world_size}: torchrun started {world} ranks")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    else:
        world = args.world_size or (max(1, torch.cuda.device_count()) if args.device == "cuda" else 1)
        local = world
    check_cuda(parser, args.device, gpus=local)
    if args.batch % world:
        parser.error(f"--batch {args.batch} must split evenly over {world} ranks")
    cfg = get_config(args.size, args.context)
    chosen = [f for f, v in (("--checkpoint", args.checkpoint), ("--keep-blocks", args.keep_blocks),
                             ("--sweep", args.sweep)) if v is not None]
    if len(chosen) > 1:
        parser.error(f"{chosen[0]} and {chosen[1]}: give one (--keep-blocks k is --checkpoint full,none:k)")
    if args.keep_blocks is not None and args.keep_blocks > cfg.num_layers:
        parser.error(f"--keep-blocks {args.keep_blocks}: the {args.size} model has {cfg.num_layers} blocks")
    plans: list[tuple[str | None, str]] = []  # (the variant it is for, None: every one; canonical plan)
    for text in args.checkpoint or []:
        variant, sep, plan_text = text.partition("=")
        if not sep:
            variant, plan_text = None, text
        elif variant not in args.variant or variant == "plain":
            parser.error(f"--checkpoint {text}: {variant!r} is not a --variant of this run that takes a plan "
                         f"({', '.join(v for v in args.variant if v != 'plain')})")
        try:
            plans.append((variant, parse_plan(plan_text, cfg.num_layers).text))
        except BadPlan as exc:
            parser.error(f"--checkpoint {text}: {exc} (the {args.size} model has {cfg.num_layers} blocks)")
    for v in args.variant:
        if plans and v != "plain" and not any(w in (None, v) for w, _ in plans):
            parser.error(f"--checkpoint: no plan for {v} (give one for every variant, or plans without VARIANT=)")
    if args.trace_dir is not None and not args.profile:
        parser.error("--trace-dir: only with --profile (it holds the profiled steps' traces)")
    dtype_name = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.device == "cpu" and dtype_name == "bf16" and "ours" in args.variant:
        parser.error("--dtype bf16: ours runs its Triton kernels under the interpreter on the CPU, which "
                     "has no bf16; use --dtype fp32")
    options = StepOptions(dtype=DTYPES[dtype_name], keep_blocks=args.keep_blocks or 0,
                          compile=args.compile if args.compile is not None else args.device == "cuda",
                          shard=args.shard, loss_chunk=args.loss_chunk, seed=args.seed,
                          expandable_segments=args.expandable_segments)
    if options.compile and args.shard == "fsdp" and "ours" in args.variant:
        parser.error("--shard fsdp: our FSDP's per-layer hooks make torch.compile recompile every block "
                     "until its limit (then it runs eagerly); add --no-compile (compiling is the default on cuda)")
    if args.memory_per_rank_gib is not None:
        capacity, where = args.memory_per_rank_gib * GIB, "--memory-per-rank-gib"
    else:
        capacity, where = _capacity_bytes(args.device, local)
    bases = []
    for v in dict.fromkeys(args.variant):
        for attention in (args.ours_attention or [None]) if v == "ours" else [None]:
            bases.append(recipe_of(v, replace(options, attention=attention), cfg, world, args.device))
    recipes: list[Recipe] = []
    for base in bases:
        if base.variant == "plain":  # the model as written: no plan to choose
            recipes.append(base)
        elif plans:
            mine = [text for v, text in plans if v in (None, base.variant)]
            recipes.extend(with_plan(base, text) for text in dict.fromkeys(mine))
        elif args.sweep is not None:
            recipes.extend(_sweep(parser, base, cfg, options, world, args.batch // world, capacity, where, args.sweep))
        else:
            recipes.append(base)
    for recipe in recipes:
        need = budget(cfg, recipe.layout(options.dtype), world, args.batch // world, cfg.context_length)
        if need.lower_bound > capacity and not args.allow_oom:
            what = f"--variant {recipe.variant}" + (f" with --checkpoint {recipe.checkpoint}" if plans else "")
            parser.error(f"{what} cannot fit: it needs {need.explain()}, more than "
                         f"{capacity / GIB:.1f} GiB ({where}); --allow-oom runs it anyway")
    slug = "cpu" if args.device == "cpu" else device_slug("cuda")
    if args.profile:
        open_store(parser, step_profile.BENCH, step_profile.KEY, device=slug, root=args.results_dir)
    else:
        open_store(parser, BENCH, KEY, device=slug, root=args.results_dir)
    # Ours on the CPU: its Triton kernels run under the interpreter, which a process chooses when it
    # imports triton. A machine without CUDA has no other mode (tests/conftest.py sets the same); on
    # one with CUDA this process keeps its mode and the ranks, spawned, interpret.
    interpret = args.device == "cpu" and any(r.variant == "ours" for r in recipes)
    if interpret and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    plan = Plan(args.size, cfg, dtype_name, args.batch, tuple(recipes), options, args.warmup_ms, args.rep_ms,
                args.cold_cache, args.results_dir, slug, started, uuid.uuid4().hex[:12],
                profile=args.profile, trace_dir=args.trace_dir, sweep=args.sweep is not None)
    backend = "nccl" if args.device == "cuda" else "gloo"
    in_process = world == 1 and (not interpret or interpreting())  # read before run_environment sets it
    with run_environment(args.cold_cache, interpret):
        if in_torchrun():
            statuses = run_from_env(run_variants, plan, backend=backend, device=args.device, timeout_s=args.timeout_s)
        elif in_process:
            statuses = run_here(plan, args.device, backend, any(r.shard != "none" for r in recipes))
        else:
            try:
                statuses = spawn(run_variants, world, plan, backend=backend, device=args.device,
                                 timeout_s=args.timeout_s)[0]
            except (RankFailed, TimeoutError) as exc:
                why = str(exc).strip().splitlines()
                record_lost_ranks(plan, world, f"{why[0]} {why[-1]}" if why else type(exc).__name__)
                print(f"[{BENCH}] the ranks died: {why[-1] if why else exc!r}", file=sys.stderr)
                return 1
    gc.collect()
    return 0 if all(s == "ok" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
