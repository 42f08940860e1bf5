"""The 2026 leaderboard's training step: one step (forward, loss, backward, AdamW) of the 8B model
at batch 2 x context 32,768 in bf16, timed by triton.testing.do_bench. Ours against stock PyTorch.

    just bench training-step                                   # 8B, every GPU, stock then ours
    just bench training-step --variant ours --keep-blocks 4    # ours alone, last 4 blocks kept
    just bench training-step --variant plain --allow-oom       # the plain model: an OOM row
    just bench training-step --size tiny --device cpu --dtype fp32 --variant plain stock ours
    torchrun --nproc-per-node 2 -m cs336_systems.bench training-step      # or --world-size 2

The variants (variants.py): plain (the model as written, DDP), stock (SDPA, chunked loss under
checkpoint, fused torch AdamW, per-block checkpointing and compile, FSDP2), ours (our
FlashAttention, fused LM head + cross-entropy, FusedAdamW, per-block checkpointing and compile,
--shard). Several run one after another in one process group (memory freed between), so their
ratios come from one run on the same machines. The global batch (--batch) is split over the ranks.

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
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist

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
from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import free_memory, is_oom
from cs336_systems.bench.timing import synchronize
from cs336_systems.distributed.launch import RankFailed, Worker, in_torchrun, run_from_env, spawn
from cs336_systems.model import get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

from .memory_budget import GIB, budget
from .rows import BENCH, CACHE_VARIABLES, DTYPES, KEY, REP_MS, WARMUP_MS, Plan, config_of, row_extras, row_metrics
from .sharding import SHARDS
from .train_step import StepOptions
from .variants import VARIANTS, Recipe, recipe_of


def _say(worker: Worker, message: str) -> None:
    if worker.rank == 0:
        print(f"[{BENCH}] {message}", file=sys.stderr, flush=True)


def _gather(worker: Worker, obj: Any) -> list[Any]:
    if worker.world_size == 1:
        return [obj]
    out: list[Any] = [None] * worker.world_size
    dist.all_gather_object(out, obj)
    return out


def _gib(device: torch.device, what: str) -> float | None:
    return getattr(torch.cuda, what)(device) / GIB if device.type == "cuda" else None


def measure(worker: Worker, plan: Plan, recipe: Recipe) -> dict[str, Any]:
    """Build the variant, run its first step, time it: this rank's numbers."""
    from .timing import time_train_step
    from .variants import build, sdpa_backend

    dev, started = worker.device, time.time()
    _say(worker, f"{recipe.variant}: building ({plan.size}, {plan.dtype_name}, batch {plan.batch}, "
                 f"context {plan.cfg.context_length}, {worker.world_size} rank(s))")
    step = build(recipe, plan.options, plan.cfg, worker, plan.batch)
    sdpa = (sdpa_backend(plan.cfg, plan.batch // worker.world_size, DTYPES[plan.dtype_name], dev)
            if recipe.attention == "sdpa" else None)  # before the peak reset: its empty q is no step's
    synchronize(dev)
    after_build = _gib(dev, "memory_allocated")
    if dev.type == "cuda":  # the fp32 initialisation's transient is not the step's
        torch.cuda.reset_peak_memory_stats(dev)
    _say(worker, f"{recipe.variant}: first step" + (" (compiling)" if recipe.compile else ""))
    t = time.perf_counter()
    step()
    synchronize(dev)
    first_step_s = time.perf_counter() - t
    loss_first = float(step.last_loss)
    wall_to_first, since_start_first = time.time() - started, time.time() - plan.started
    first_peak = _gib(dev, "max_memory_allocated")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    _say(worker, f"{recipe.variant}: first step {first_step_s:.2f} s; timing (warmup {plan.warmup_ms:g} ms, "
                 f"rep {plan.rep_ms:g} ms)")
    timing = time_train_step(step, worker, warmup_ms=plan.warmup_ms, rep_ms=plan.rep_ms,
                             first_step_s=first_step_s)
    return {**timing.summary(), "sdpa_backend": sdpa,
            "loss_first_step": loss_first, "loss_last": float(step.last_loss),
            "steps_taken": step.steps_taken,
            "first_step_s": first_step_s, "wall_to_first_step_s": wall_to_first,
            "since_start_to_first_step_s": since_start_first,
            "wall_total_s": time.time() - started, "since_start_s": time.time() - plan.started,
            "after_build_gib": after_build, "first_step_peak_gib": first_peak,
            "peak_allocated_gib": _gib(dev, "max_memory_allocated"),
            "peak_reserved_gib": _gib(dev, "max_memory_reserved")}


def _attempt(worker: Worker, plan: Plan, recipe: Recipe) -> dict[str, Any]:
    """measure(), with a failure turned into a status; memory freed after, either way."""
    try:
        return {"status": "ok", "metrics": measure(worker, plan, recipe)}
    except Exception as exc:  # a row says what failed; the next variant still runs
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return {"status": "oom" if is_oom(exc) else "error", "error": message[0] if message else ""}
    finally:
        torch._dynamo.reset()  # the next variant compiles afresh (its first step counts the compile)
        free_memory()


def run_variants(worker: Worker, plan: Plan) -> list[str]:
    """Every variant in turn on this rank; rank 0 writes each row as it finishes. Returns the statuses."""
    store = ResultStore(BENCH, KEY, device=plan.device_slug, root=plan.results_dir) if worker.rank == 0 else None
    statuses = []
    for recipe in plan.recipes:
        if worker.world_size > 1:
            dist.barrier()
        got = _gather(worker, _attempt(worker, plan, recipe))
        failed = [(r, g) for r, g in enumerate(got) if g["status"] != "ok"]
        status = "ok" if not failed else ("oom" if any(g["status"] == "oom" for _, g in failed) else "error")
        statuses.append(status)
        if store is None:
            continue
        config, extras = config_of(plan, recipe, worker.world_size), row_extras(plan, recipe, worker.world_size)
        if failed:
            rank, g = failed[0]
            store.append(config, extras, status=status, error=f"rank {rank}: {g['error']}")
            _say(worker, f"{recipe.variant}: {status}: rank {rank}: {g['error']}")
            continue
        metrics = row_metrics(plan, recipe, worker.world_size, [g["metrics"] for g in got], worker.device)
        r = store.append(config, {**metrics, **extras})
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] else ""
        peak = f", peak {r['peak_allocated_gib']:.1f} GiB/GPU" if r["peak_allocated_gib"] else ""
        _say(worker, f"{recipe.variant}: {r['step_ms']:.1f} ms/step (median of {r['n_timed']}){mfu}{peak}; "
                     f"loss {r['loss_first_step']:.4f} -> {r['loss_last']:.4f}")
    return statuses


def run_here(plan: Plan, device: str, backend: str, needs_group: bool) -> list[str]:
    """One rank in this process; a one-rank process group only if a variant shards."""
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    worker = Worker(0, 1, 0, backend, dev)
    if not needs_group:
        return run_variants(worker, plan)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        return run_variants(worker, plan)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def run_environment(cold_cache: bool, interpret: bool):
    """The environment of the run, put back after it (the ranks spawned meanwhile inherit it):
    fresh empty Triton and Inductor cache directories (--cold-cache), and TRITON_INTERPRET=1 for
    ours' Triton kernels on the CPU. Triton reads that variable once, when it is imported, so it
    reaches only processes that import triton afterwards: the ranks spawned here."""
    root = tempfile.mkdtemp(prefix="cs336-cold-cache-") if cold_cache else None
    before = {k: os.environ.get(k) for k in (*CACHE_VARIABLES, "TRITON_INTERPRET")}
    if root is not None:
        os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def record_lost_ranks(plan: Plan, world: int, why: str) -> None:
    """After ranks died (a rank killed, a collective timed out): an error row for each variant that
    has none from this run."""
    store = ResultStore(BENCH, KEY, device=plan.device_slug, root=plan.results_dir)
    done = {r["variant"] for r in store.rows() if r.get("run_id") == plan.run_id}
    for recipe in plan.recipes:
        if recipe.variant not in done:
            store.append(config_of(plan, recipe, world), row_extras(plan, recipe, world), status="error", error=why)


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
    p.add_argument("--keep-blocks", type=at_least(0), default=0,
                   help="stock and ours: the last k blocks run without activation checkpointing (default 0)")
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


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_duplicates(parser, args, "variant")  # argument checks (issue 28)
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
    if args.keep_blocks > cfg.num_layers:
        parser.error(f"--keep-blocks {args.keep_blocks}: the {args.size} model has {cfg.num_layers} blocks")
    dtype_name = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.device == "cpu" and dtype_name == "bf16" and "ours" in args.variant:
        parser.error("--dtype bf16: ours runs its Triton kernels under the interpreter on the CPU, which "
                     "has no bf16; use --dtype fp32")
    options = StepOptions(dtype=DTYPES[dtype_name], keep_blocks=args.keep_blocks,
                          compile=args.compile if args.compile is not None else args.device == "cuda",
                          shard=args.shard, loss_chunk=args.loss_chunk, seed=args.seed)
    if options.compile and args.shard == "fsdp" and "ours" in args.variant:
        parser.error("--shard fsdp: our FSDP's per-layer hooks make torch.compile recompile every block "
                     "until its limit (then it runs eagerly); add --no-compile (compiling is the default on cuda)")
    recipes = tuple(recipe_of(v, options, cfg, world, args.device) for v in dict.fromkeys(args.variant))
    if args.memory_per_rank_gib is not None:
        capacity, where = args.memory_per_rank_gib * GIB, "--memory-per-rank-gib"
    else:
        capacity, where = _capacity_bytes(args.device, local)
    for recipe in recipes:
        need = budget(cfg, recipe.layout(options.dtype), world, args.batch // world, cfg.context_length)
        if need.lower_bound > capacity and not args.allow_oom:
            parser.error(f"--variant {recipe.variant} cannot fit: it needs {need.explain()}, more than "
                         f"{capacity / GIB:.1f} GiB ({where}); --allow-oom runs it anyway")
    slug = "cpu" if args.device == "cpu" else device_slug("cuda")
    open_store(parser, BENCH, KEY, device=slug, root=args.results_dir)
    # Ours on the CPU: its Triton kernels run under the interpreter, which a process chooses when it
    # imports triton. A machine without CUDA has no other mode (tests/conftest.py sets the same); on
    # one with CUDA this process keeps its mode and the ranks, spawned, interpret.
    interpret = args.device == "cpu" and any(r.variant == "ours" for r in recipes)
    if interpret and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    plan = Plan(args.size, cfg, dtype_name, args.batch, recipes, options, args.warmup_ms, args.rep_ms,
                args.cold_cache, args.results_dir, slug, started, uuid.uuid4().hex[:12])
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
