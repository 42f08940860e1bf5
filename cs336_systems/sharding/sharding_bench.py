"""optimizer_state_sharding_accounting: memory at three points of a step, and time per step, for
four ways to train data-parallel with AdamW, in one run.

    python -m cs336_systems.bench sharding                  # here: gloo, 2 CPU processes, cpu-small
    torchrun --nproc-per-node 2 -m cs336_systems.sharding.sharding_bench \
        --device cuda --backend nccl --size xl              # the course's setting: xl on 2 GPUs

Methods (all torch.optim.AdamW inside):
    ddp              DistributedDataParallel + AdamW                 (nothing sharded)
    sharded          DDP + the course's ShardedOptimizer             (state / N; + broadcasts)
    zero1            bare module + our ZeRO1Optimizer                (state / N; RS + AG, no DDP)
    zero_redundancy  DDP + torch's ZeroRedundancyOptimizer           (PyTorch's own, the anchor)
`--ddp bucketed` uses the project's DDPBucketed (25 MB buckets) instead of torch's DDP.

Memory (results/sharding/memory): per rank, after building model + optimizer ("after_init"),
after forward + backward of the first step ("before_step"), after its optimizer step
("after_step"). Each row: bytes of parameter, gradient and optimizer-state tensors (distinct
storages), the activations autograd saved in that step's forward (before_step only) and, on CUDA,
the allocator's current bytes and its peak since the previous point. On CPU there is no allocator
to ask; the tensor bytes are the measurement.
Time (results/sharding/step_time): `steps` timed steps after `warmup`; a step lasts as long as
its slowest rank; also the optimizer step alone (where the sharded methods communicate).
Collectives (results/sharding/collectives): each method's communication pattern timed alone on the
model's sizes (all-reduce; per-parameter broadcasts; reduce-scatter; all-gather).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.bench import fit
from cs336_systems.bench.cli import (
    Parser,
    add_resume,
    at_least,
    check_cuda,
    given,
    open_store,
    refuse_duplicates,
    results_root,
    timeout_s,
)
from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import exit_code, run_sweep
from cs336_systems.bench.timing import synchronize
from cs336_systems.distributed.launch import Worker, in_torchrun, run_from_env, spawn
from cs336_systems.distributed.rank_times import slowest_per_step
from cs336_systems.model import ModelConfig, TransformerLM, cross_entropy, get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

from .accounting import MemoryProbe, saved_activation_bytes
from .sharded_optimizer import ShardedOptimizer, assign_to_ranks
from .zero1 import ZeRO1Optimizer, _all_gather, _reduce_scatter

MEMORY_BENCH, TIME_BENCH, COMM_BENCH = "sharding/memory", "sharding/step_time", "sharding/collectives"
METHODS = ["ddp", "sharded", "zero1", "zero_redundancy"]
CELL_KEY = ["method", "ddp", "size", "world_size", "backend", "device_type", "batch", "context"]
COMM_KEY = ["op", "size", "world_size", "backend", "device_type"]
# Small enough for 2 CPU processes on 2 cores, large enough that optimizer state is visible (9.3M params).
CPU_SMALL = ModelConfig(vocab_size=10_000, context_length=128, d_model=256, num_layers=4,
                        num_heads=8, d_ff=1024)


def model_config(size: str, context: int) -> ModelConfig:
    return CPU_SMALL.with_context(context) if size == "cpu-small" else get_config(size, context)


# --8<-- [start:build]
def build(method: str, model: torch.nn.Module, ddp: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """(the module to call, the optimizer) for one method."""
    adamw = dict(lr=1e-3, weight_decay=0.01)
    if method == "zero1":  # does its own reduce-scatter: no DDP wrapper (it broadcasts rank 0's weights)
        return model, ZeRO1Optimizer(model.parameters(), torch.optim.AdamW, **adamw)
    if ddp == "torch":
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model)
    else:
        from cs336_systems.distributed.ddp.bucketed import DDPBucketed
        wrapped = DDPBucketed(model, bucket_size_mb=25.0)
    if method == "ddp":
        return wrapped, torch.optim.AdamW(model.parameters(), **adamw)
    if method == "sharded":
        return wrapped, ShardedOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
    if method == "zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return wrapped, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                                **adamw)
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
# --8<-- [end:build]


def _finish(module: torch.nn.Module) -> None:
    """Our DDP wrappers finish their gradient all-reduces here; torch's DDP already did."""
    finish = getattr(module, "finish_gradient_synchronization", None)
    if finish is not None:
        finish()


# --8<-- [start:measure]
def measure_method(worker: Worker, method: str, ddp: str, cfg: ModelConfig, batch: int,
                   warmup: int, steps: int) -> dict[str, Any]:
    """Memory at the three points of the first step, then the time of `steps` more steps."""
    torch.manual_seed(0)
    model = TransformerLM.from_config(cfg, device=worker.device)
    gen = torch.Generator().manual_seed(1000 + worker.rank)  # each rank its own batch
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1), generator=gen)
    x, y = tokens[:, :-1].to(worker.device), tokens[:, 1:].to(worker.device)
    module, opt = build(method, model, ddp)
    probe = MemoryProbe(model, opt)
    memory = [probe.record("after_init")]
    opt.zero_grad(set_to_none=True)
    with saved_activation_bytes(model.parameters()) as saved:
        loss = cross_entropy(module(x), y)
    loss.backward()
    _finish(module)
    memory.append(probe.record("before_step", activations=saved["bytes"]))
    opt.step()
    memory.append(probe.record("after_step"))

    step_times, opt_times = [], []
    for i in range(warmup + steps):
        synchronize(worker.device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        cross_entropy(module(x), y).backward()
        _finish(module)
        synchronize(worker.device)
        t1 = time.perf_counter()
        opt.step()
        synchronize(worker.device)
        t2 = time.perf_counter()
        if i >= warmup:
            step_times.append(t2 - t0)
            opt_times.append(t2 - t1)
    step_times, opt_times = slowest_per_step(worker, step_times), slowest_per_step(worker, opt_times)
    # --8<-- [end:measure]
    n_params = sum(p.numel() for p in model.parameters())
    del module, opt, model, loss
    gc.collect()
    if worker.device.type == "cuda":
        torch.cuda.empty_cache()
    return {"memory": memory, "time": {
        "n_params": n_params, "warmup": warmup, "steps": steps,
        "step_ms": statistics.median(step_times) * 1e3,
        "step_ms_mean": statistics.fmean(step_times) * 1e3,
        "step_ms_std": (statistics.stdev(step_times) if steps > 1 else 0.0) * 1e3,
        "step_ms_min": min(step_times) * 1e3,
        "optimizer_step_ms": statistics.median(opt_times) * 1e3,
        "optimizer_step_ms_min": min(opt_times) * 1e3,
        "threads_per_rank": torch.get_num_threads(),
        "cpu_cores": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}}  # was the host busy?


# --8<-- [start:collectives]
def measure_collectives(worker: Worker, cfg: ModelConfig, reps: int = 5) -> list[dict[str, Any]]:
    """The communication of one optimizer step of each method, alone, on the model's fp32 sizes:
    DDP's all-reduce of all gradients; the course's per-parameter broadcasts from the owners;
    ZeRO-1's reduce-scatter and all-gather of the flat buffer."""
    with torch.device("meta"):
        shapes = [p.shape for p in TransformerLM.from_config(cfg).parameters()]
    N, dev = worker.world_size, worker.device
    numel = sum(math.prod(s) for s in shapes)
    shard = -(-numel // N)
    flat = torch.randn(shard * N, device=dev)
    part = torch.empty(shard, device=dev)
    tensors = [torch.randn(s, device=dev) for s in shapes]
    owners = assign_to_ranks([t.numel() for t in tensors], N)

    def broadcasts():
        for h in [dist.broadcast(t, src=o, async_op=True) for t, o in zip(tensors, owners)]:
            h.wait()

    ops = {"all_reduce": lambda: dist.all_reduce(flat),
           "reduce_scatter": lambda: _reduce_scatter(part, flat),
           "all_gather": lambda: _all_gather(flat, part),
           "broadcast_per_parameter": broadcasts}
    rows = []
    for op, fn in ops.items():
        fn()
        times = []
        for _ in range(reps):
            dist.barrier()
            synchronize(dev)
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            times.append(time.perf_counter() - t0)
        times = slowest_per_step(worker, times)
        rows.append({"op": op, "bytes": numel * 4, "tensors": len(tensors) if op.startswith("broadcast") else 1,
                     "reps": reps, "ms": statistics.median(times) * 1e3,
                     "ms_min": min(times) * 1e3, "loadavg_1m": os.getloadavg()[0]})
    return rows
# --8<-- [end:collectives]


def _measure_all(worker: Worker, cells: list[dict], cfg: ModelConfig, warmup: int,
                 steps: int) -> list[dict]:
    return [measure_method(worker, c["method"], c["ddp"], cfg, c["batch"], warmup, steps)
            for c in cells]


def _write(memory_store: ResultStore, cell: dict, result: dict) -> None:
    for row in result["memory"]:
        point = row.pop("point")
        memory_store.append({**cell, "point": point}, row)


def build_parser() -> Parser:
    p = Parser(prog="sharding", description=__doc__.split("\n")[0])
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--ddp", default="torch", choices=["torch", "bucketed"],
                   help="the DDP wrapper of the ddp / sharded / zero_redundancy methods")
    p.add_argument("--size", default=None, choices=["cpu-small", *PRESETS, *PRESETS_EXTRA],
                   help="cpu-small (CPU default) or a preset: small ... xl (cuda default: xl)")
    p.add_argument("--context", type=at_least(1), default=None, help="tokens per sequence (default: "
                   "128 on cpu, 512 on cuda)")
    p.add_argument("--batch", type=at_least(1), default=2, help="sequences per rank (default 2: the "
                   "course's batch 4 over 2 ranks)")
    p.add_argument("--world-size", type=at_least(2), default=2, help="ranks to spawn, >= 2 (ignored "
                   "under torchrun)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="default: gloo on cpu, nccl on cuda")
    p.add_argument("--no-collectives", dest="collectives", action="store_false",
                   help="skip timing the four communication patterns alone on the model's sizes")
    p.add_argument("--warmup", type=at_least(0), default=2)
    p.add_argument("--steps", type=at_least(1), default=10)
    p.add_argument("--timeout-s", type=timeout_s, default=600.0)
    p.add_argument("--results-dir", type=results_root, default=None, help="root of the results tree (default: results/)")
    add_resume(p)
    fit.add_allow_oom(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # `is None`, not `or`: an explicit value is never swapped for the default.
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.size is None:
        args.size = "xl" if args.device == "cuda" else "cpu-small"
    if args.context is None:
        args.context = 512 if args.device == "cuda" else 128
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl needs --device cuda")
    refuse_duplicates(parser, args, "methods")
    if given(parser, "ddp") and set(args.methods) <= {"zero1"}:
        parser.error("--ddp picks the wrapper of ddp, sharded and zero_redundancy; --methods has none of them")
    try:
        cfg = model_config(args.size, args.context)
    except ValueError as exc:
        parser.error(f"--size/--context: {exc}")
    world = int(os.environ["WORLD_SIZE"]) if in_torchrun() else args.world_size
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if in_torchrun() else world
    check_cuda(parser, args.device, gpus=local)
    have, where = fit.capacity_bytes(args.device, local)
    shards = world if set(args.methods) - {"ddp"} else 1  # the least any method asked for holds
    need = fit.step_memory(cfg, "train", batch=args.batch, context=args.context, optimizer_shards=shards)
    fit.refuse_unless_fits(parser, args, need, have, where,
                           f"--size {args.size} --context {args.context} --batch {args.batch} (per rank)")
    cells = [{"method": m, "ddp": "none" if m == "zero1" else args.ddp, "size": args.size,
              "world_size": world, "backend": args.backend, "device_type": args.device,
              "batch": args.batch, "context": args.context} for m in args.methods]
    device = "cpu" if args.device == "cpu" else None  # None: the store names the GPU
    times = open_store(parser, TIME_BENCH, CELL_KEY, device=device, root=args.results_dir)
    memory = open_store(parser, MEMORY_BENCH, CELL_KEY + ["point"], device=device, root=args.results_dir)
    comm = open_store(parser, COMM_BENCH, COMM_KEY, device=device, root=args.results_dir)
    comm_cell = {"size": args.size, "world_size": world, "backend": args.backend,
                 "device_type": args.device}
    if in_torchrun():
        return _main_torchrun(args, cells, cfg, times, memory, comm, comm_cell)

    def measure(cell: dict) -> dict:  # one fresh process group per method: clean memory counters
        result = spawn(_measure_all, world, [cell], cfg, args.warmup, args.steps,
                       backend=args.backend, device=args.device, timeout_s=args.timeout_s)[0][0]
        _write(memory, cell, result)
        return result["time"]

    code = exit_code(run_sweep(times, cells, measure, desc="sharding"), TIME_BENCH)
    if args.collectives and not comm.has({**comm_cell, "op": "all_reduce"}):
        for row in spawn(measure_collectives, world, cfg, backend=args.backend, device=args.device,
                         timeout_s=args.timeout_s)[0]:
            comm.append({**comm_cell, "op": row.pop("op")}, row)
    return code


def _main_torchrun(args, cells, cfg, times: ResultStore, memory: ResultStore, comm: ResultStore,
                   comm_cell: dict) -> int:
    """One rank of a torchrun job: every method in turn in one process group; rank 0 writes."""

    def body(worker: Worker) -> None:
        todo = [[c for c in cells if not times.has(c)] if worker.rank == 0 else None,
                args.collectives and not comm.has({**comm_cell, "op": "all_reduce"})]
        dist.broadcast_object_list(todo, src=0)  # every rank runs the same methods, in order
        if todo[1]:
            for row in measure_collectives(worker, cfg):
                if worker.rank == 0:
                    comm.append({**comm_cell, "op": row.pop("op")}, row)
        for cell in todo[0]:
            result = _measure_all(worker, [cell], cfg, args.warmup, args.steps)[0]
            if worker.rank == 0:
                _write(memory, cell, result)
                times.append(cell, result["time"])
                print(f"[sharding] {cell['method']}: {result['time']['step_ms']:.1f} ms/step",
                      file=sys.stderr)

    run_from_env(body, backend=args.backend, device=args.device, timeout_s=args.timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
