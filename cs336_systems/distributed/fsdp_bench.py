"""fsdp_accounting: step time and peak memory per GPU of every data-parallel variant, side by side
in one run (the same model, batch and ranks), and a profiled FSDP step.

    python -m cs336_systems.bench fsdp --device cuda --world-size 2      # xl, 2 GPUs, NCCL
    python -m cs336_systems.bench fsdp --device cpu --size tiny          # the same path on gloo
    torchrun --nproc-per-node 2 -m cs336_systems.distributed.fsdp_bench --device cuda
    python -m cs336_systems.bench fsdp --device cuda --backend gloo --ranks-per-gpu 2 --size 2.7B
                                                   # ONE GPU: two gloo ranks share it (memory only)

Variants (all torch.optim.AdamW, lr 1e-4, weight decay 0.01, fp32 master weights):
    ddp          our DDPBucketed (25 MB buckets), fp32                    nothing sharded
    sharded      DDPBucketed + the course's ShardedOptimizer               optimizer state / N
    zero1        our ZeRO1Optimizer on the bare module                     optimizer state / N
    fsdp         our FSDP, fp32 compute                                    everything / N
    fsdp-bf16    our FSDP, compute_dtype bf16 (gathers and reduce-scatters in bf16)
    fsdp2        torch's fully_shard on every block, then the root, fp32
    fsdp2-bf16   fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16):
                 the same precision as fsdp-bf16, which reduce-scatters in its compute dtype

Rows (results/fsdp/steps/<device>.jsonl), one per variant: step time (the slowest rank's, per
step; median, mean, std, min over the timed steps after warm-up, each step CUDA-synchronised),
peak memory allocated per GPU during the timed steps (max over ranks, and each rank's), memory
after building, and the expected per-rank bytes of weights + gradients + AdamW state from the
shard arithmetic (sharding/accounting.py) beside the measured ones. On CUDA, our FSDP's rows also
hold `gathered_memory`: one more step with the allocator's history recorded, reduced by
fsdp/memory_timeline.py to how many gathered weights each rank's allocator held at once in forward
and backward, and how many were left when each ended (the design's bound: 2, then 0).
Each variant runs in its own fresh process group (spawn): clean memory counters, and a rank out of
memory ends its variant with an "oom" row instead of leaving the other rank blocked in a collective.
(Under torchrun, one group runs every variant in turn.)

--ranks-per-gpu 2 (with --backend gloo): two ranks share each GPU, each capped at half its memory
(launch.py). Each rank's peak (torch.cuda.max_memory_allocated of its own process) is a real
measurement of what a rank of that variant needs; time is not (the ranks take turns on one GPU and
gloo copies every collective through the host), so such rows record no step times, say
`ranks_per_gpu` and why (`step_times`), and are kept apart from two-GPU rows by their key.
--trace-dir DIR: rank 0 also profiles one more step of each --trace-variants variant, writes the
chrome trace to DIR/fsdp_<variant>.json.gz, and a row to results/fsdp/trace/<device>.jsonl with
compute/communication intervals (step_trace.timeline) and, for our FSDP, per layer when its
all-gather ran against when the layer computed (fsdp/timeline.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from cs336_systems.bench import fit
from cs336_systems.bench.cli import (
    Parser,
    at_least,
    check_cuda,
    given,
    open_store,
    positive,
    refuse_duplicates,
    timeout_s,
)
from cs336_systems.distributed.fsdp_measure import (  # noqa: F401  (VARIANTS, row: the bench's names)
    BENCH,
    GLOBAL_BATCH,
    KEY,
    TRACE_BENCH,
    VARIANTS,
    base_config,
    measure,
    open_stores,
    row,
    write,
)
from cs336_systems.distributed.launch import (
    RankFailed,
    Worker,
    gpus_needed,
    in_torchrun,
    run_from_env,
    spawn,
)
from cs336_systems.model import (
    get_config,
)
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA


def run_all(worker: Worker, args: argparse.Namespace) -> None:
    """Under torchrun: every variant in this one process group, in turn; rank 0 writes each row."""
    cfg = get_config(args.size, args.context_length)
    base = base_config(args, worker.backend, worker.world_size)
    stores = open_stores(args) if worker.rank == 0 else None
    todo = [[v for v in args.variants if not stores[0].has({**base, "variant": v})]
            if stores else None]
    dist.broadcast_object_list(todo, src=0)  # every rank runs the same variants, in order
    for variant in todo[0]:
        try:
            got = measure(worker, variant, cfg, args)
        except torch.cuda.OutOfMemoryError:  # a rank that did not run out waits in a collective
            got = None
            gc.collect()
            torch.cuda.empty_cache()
        if stores is not None:
            write(stores, {**base, "variant": variant}, cfg, args, worker.world_size, got)


def _out_of_memory(exc: RankFailed) -> bool:
    text = str(exc)
    return "OutOfMemoryError" in text or "out of memory" in text.lower()


def spawn_each(args: argparse.Namespace, backend: str, world: int) -> None:
    """Each variant on `world` fresh ranks; this process writes the rows. A rank out of memory
    ends its variant (the others are terminated) with an "oom" row; any other failure is raised."""
    cfg = get_config(args.size, args.context_length)
    base = base_config(args, backend, world)
    stores = open_stores(args)
    for variant in [v for v in args.variants if not stores[0].has({**base, "variant": v})]:
        try:
            got, error = spawn(measure, world, variant, cfg, args, backend=backend,
                               device=args.device, timeout_s=args.timeout_s,
                               ranks_per_gpu=args.ranks_per_gpu)[0], None
        except RankFailed as exc:
            if not _out_of_memory(exc):
                raise
            lines = [line for line in str(exc).splitlines() if "out of memory" in line.lower()]
            got, error = None, f"rank {exc.rank}: {(lines or [str(exc)])[-1].strip()}"
        write(stores, {**base, "variant": variant}, cfg, args, world, got, error)


def check_args(parser: Parser, args: argparse.Namespace, world: int, local: int) -> None:
    """Flags that would do nothing in this combination, duplicates, and the fit check: each a
    one-line error before any rank starts."""
    refuse_duplicates(parser, args, "variants", "trace_variants")
    if given(parser, "trace_variants"):
        if args.trace_dir is None:
            parser.error("--trace-variants picks the variants --trace-dir profiles; give --trace-dir")
        if missing := [v for v in args.trace_variants if v not in args.variants]:
            parser.error(f"--trace-variants {' '.join(missing)}: not among --variants {' '.join(args.variants)}")
    # The least memory any chosen variant holds per rank (bench.fit): FSDP shards everything, the
    # sharded optimizer and ZeRO-1 the AdamW moments, DDP nothing.
    cfg = get_config(args.size, args.context_length)
    per_variant = [fit.step_memory(cfg, "train", batch=args.batch_size // world, context=cfg.context_length,
                                   world_size=world, shard_weights=v.startswith("fsdp"),
                                   optimizer_shards=world if v in ("sharded", "zero1") else 1,
                                   bf16=v.endswith("bf16"))
                   for v in args.variants]
    have, where = fit.capacity_bytes(args.device, local)
    if args.device == "cuda" and args.ranks_per_gpu > 1:  # each rank's allocator is capped at 1/k of its GPU
        have, where = have / args.ranks_per_gpu, f"{where} / {args.ranks_per_gpu} ranks sharing it"
    fit.refuse_unless_fits(parser, args, min(per_variant, key=lambda m: m.lower_bound), have, where,
                           f"--size {args.size} --batch-size {args.batch_size} over {world} ranks "
                           f"--context-length {cfg.context_length}")


def build_parser() -> Parser:
    p = Parser(prog="fsdp", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                   help="default: nccl on cuda, gloo on cpu")
    p.add_argument("--ranks-per-gpu", type=at_least(1), default=1,
                   help="ranks sharing each GPU (> 1 needs --backend gloo): per-rank memory is "
                        "measured, step times are not recorded (on cpu: a rehearsal, rows marked alike)")
    p.add_argument("--size", default=None, choices=[*PRESETS, *PRESETS_EXTRA],
                   help="model preset (default: xl on cuda, tiny on cpu; the 2026 handout's xl is 2.7B)")
    p.add_argument("--world-size", type=at_least(2), default=2,
                   help="ranks to spawn, >= 2 for data parallelism (torchrun: its own)")
    p.add_argument("--batch-size", type=at_least(1), default=GLOBAL_BATCH,
                   help="global batch in sequences, split over the ranks (the DDP chapter's: 4)")
    p.add_argument("--context-length", type=at_least(1), default=None, help="default: the preset's")
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--bucket-size-mb", type=positive(float), default=25.0, help="DDP's bucket cap")
    p.add_argument("--warmup", type=at_least(1), default=3,
                   help="untimed steps per variant, >= 1 (the first step builds AdamW's state)")
    p.add_argument("--steps", type=at_least(1), default=10, help="timed steps per variant")
    p.add_argument("--trace-dir", default=None,
                   help="also profile one step per --trace-variants variant; chrome traces here")
    p.add_argument("--trace-variants", nargs="+", default=["fsdp", "fsdp-bf16"], choices=VARIANTS)
    p.add_argument("--no-memory-timeline", dest="memory_timeline", action="store_false",
                   help="skip the extra step of our FSDP with the CUDA allocator's history recorded")
    p.add_argument("--timeout-s", type=timeout_s, default=900.0)
    p.add_argument("--results-dir", default=None, help="root of the results tree (default: results/)")
    fit.add_allow_oom(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = "xl" if args.device == "cuda" else "tiny"
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl needs --device cuda")
    if args.ranks_per_gpu > 1 and args.backend != "gloo":
        parser.error(f"--ranks-per-gpu {args.ranks_per_gpu} needs --backend gloo "
                     "(NCCL refuses two ranks on one GPU)")
    world = int(os.environ["WORLD_SIZE"]) if in_torchrun() else args.world_size
    if world < 2:
        parser.error(f"--world-size: data parallelism needs at least 2 ranks, got {world}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if in_torchrun() else world
    if local % args.ranks_per_gpu:
        parser.error(f"--ranks-per-gpu {args.ranks_per_gpu} must divide the {local} ranks of a host")
    need, have = gpus_needed(local, args.ranks_per_gpu), torch.cuda.device_count()
    if args.device == "cuda" and 0 < have < need and args.backend == "gloo" and local % have == 0:
        parser.error(f"--device cuda: {local} ranks need {need} GPU(s), {have} visible; gloo ranks "
                     f"can share them: --ranks-per-gpu {local // have}")
    check_cuda(parser, args.device, gpus=need)
    if args.batch_size < world or args.batch_size % world:
        parser.error(f"--batch-size {args.batch_size} must split evenly over {world} ranks")
    if args.trace_dir is not None and args.ranks_per_gpu > 1:
        parser.error("--trace-dir: a timeline of ranks sharing one GPU says nothing about overlap "
                     "(drop --trace-dir or --ranks-per-gpu)")
    if args.trace_dir is not None and Path(args.trace_dir).exists() and not Path(args.trace_dir).is_dir():
        parser.error(f"--trace-dir {args.trace_dir} exists and is not a directory")
    check_args(parser, args, world, local)
    device = "cpu" if args.device == "cpu" else None  # the paths the stores open, checked first
    open_store(parser, BENCH, KEY, device=device, root=args.results_dir)
    open_store(parser, TRACE_BENCH, KEY, device=device, root=args.results_dir)
    if args.trace_dir is not None:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    if in_torchrun():
        run_from_env(run_all, args, backend=args.backend, device=args.device,
                     timeout_s=args.timeout_s, ranks_per_gpu=args.ranks_per_gpu)
    else:
        spawn_each(args, args.backend, world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
