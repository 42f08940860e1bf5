"""The FSDP benchmark's measuring half (`fsdp_bench.py` is its CLI): build each data-parallel
variant on a rank, time its steps, record its peak memory (and, for ours, the gathered weights the
allocator held), and turn what the ranks measured into a row.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.timing import synchronize, time_steps
from cs336_systems.distributed import step_trace
from cs336_systems.distributed.fsdp import memory_timeline
from cs336_systems.distributed.fsdp.timeline import layer_timeline
from cs336_systems.distributed.launch import (
    Worker,
    gpus_needed,
)
from cs336_systems.distributed.rank_times import slowest_per_step
from cs336_systems.model import (
    ModelConfig,
    TransformerLM,
    count_parameters,
    cross_entropy,
    get_config,
)
from cs336_systems.sharding.accounting import memory_per_rank

BENCH, TRACE_BENCH = "fsdp/steps", "fsdp/trace"
VARIANTS = ["ddp", "sharded", "zero1", "fsdp", "fsdp-bf16", "fsdp2", "fsdp2-bf16"]
KEY = ["variant", "size", "backend", "device_type", "world_size", "ranks_per_gpu", "batch_size",
       "context_length"]
GLOBAL_BATCH = 4   # the DDP chapter's: 4 sequences per step, split over the ranks
ADAMW = {"lr": 1e-4, "weight_decay": 0.01}
# Which accounting stage each variant's persistent state follows (all fp32 weights/grads/AdamW).
STAGE = {"ddp": "ddp", "sharded": "sharded", "zero1": "zero1", "fsdp": "zero3",
         "fsdp-bf16": "zero3", "fsdp2": "zero3", "fsdp2-bf16": "zero3"}
GIB = 2**30
OURS = ("fsdp", "fsdp-bf16")  # the variants whose gathered weights memory_timeline follows
SHARED_TIMES = "not recorded: {k} ranks share one GPU and gloo copies every collective through the host"


# --8<-- [start:build]
def build(variant: str, cfg: ModelConfig, worker: Worker, bucket_size_mb: float):
    """(the module to call, its optimizer, what to call after backward or None)."""
    from cs336_systems.distributed.ddp import DDPBucketed
    from cs336_systems.distributed.fsdp import FSDP
    from cs336_systems.sharding import ShardedOptimizer, ZeRO1Optimizer

    torch.manual_seed(0)
    module = TransformerLM.from_config(cfg, device=worker.device)
    if variant in ("ddp", "sharded"):
        model = DDPBucketed(module, bucket_size_mb=bucket_size_mb)
        optimizer = (torch.optim.AdamW(model.parameters(), **ADAMW) if variant == "ddp" else
                     ShardedOptimizer(model.parameters(), torch.optim.AdamW, **ADAMW))
        return model, optimizer, model.finish_gradient_synchronization
    if variant == "zero1":
        return module, ZeRO1Optimizer(module.parameters(), torch.optim.AdamW, **ADAMW), None
    bf16 = variant.endswith("-bf16")
    if variant.startswith("fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(worker.device.type, (worker.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
            if bf16 else MixedPrecisionPolicy()
        for block in module.layers:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)  # the root: embedding, final norm, head
        return module, torch.optim.AdamW(module.parameters(), **ADAMW), None
    model = FSDP(module, compute_dtype=torch.bfloat16 if bf16 else None)
    return model, torch.optim.AdamW(model.parameters(), **ADAMW), model.finish_gradient_synchronization
# --8<-- [end:build]


class Run:
    """One variant built on this rank, with its shard of the batch."""

    def __init__(self, worker: Worker, variant: str, cfg: ModelConfig, args: argparse.Namespace):
        self.worker, self.variant = worker, variant
        self.model, self.optimizer, self.finish = build(variant, cfg, worker, args.bucket_size_mb)
        per_rank = args.batch_size // worker.world_size
        g = torch.Generator().manual_seed(1000 + worker.rank)  # each rank its own sequences
        tokens = torch.randint(cfg.vocab_size, (per_rank, cfg.context_length + 1), generator=g)
        self.x, self.y = tokens[:, :-1].to(worker.device), tokens[:, 1:].to(worker.device)

    def step(self, mark=None) -> None:
        """One training step; `mark(name)`, if given, is called as forward, backward (gradients
        synchronised) and the optimizer step end (memory_timeline.AllocatorTrace.mark)."""
        mark = mark or (lambda name: None)
        self.optimizer.zero_grad(set_to_none=True)
        with step_trace.phase("forward"):
            loss = cross_entropy(self.model(self.x).flatten(0, 1), self.y.flatten())
        mark("forward")
        with step_trace.phase("backward"):
            loss.backward()
        with step_trace.phase("sync"):
            if self.finish is not None:
                self.finish()
        mark("backward")
        with step_trace.phase("optimizer"):
            self.optimizer.step()
        mark("step")

    def gathered_memory(self) -> dict:
        """One more step with the allocator's history recorded: our FSDP's gathered weights alive."""
        with memory_timeline.AllocatorTrace(self.worker.device) as trace:
            self.step(mark=trace.mark)
        summary = memory_timeline.gathered_alive(trace.entries, trace.marks)
        expected = expected_gathers(self.model)
        return {**summary, "expected_gathers": expected,
                "within_bound": memory_timeline.within_bound(summary, expected)}

    def traced_step(self, path: Path) -> dict:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.worker.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            with step_trace.phase("step"):
                self.step()
            synchronize(self.worker.device)
        prof.export_chrome_trace(str(path))  # .json.gz: written compressed
        # the same origin as step_trace.timeline's: the start of the step's range on the host
        t0_ms = min(e.time_range.start for e in prof.events() if e.name == "ddp:step"
                    and e.device_type == torch.autograd.DeviceType.CPU) / 1e3
        return {**step_trace.timeline(prof), **layer_timeline(prof, t0_ms), "trace_file": path.name}


def expected_gathers(model) -> int:
    """All-gathers of one step of our FSDP: one per forward use of each sharded layer, and one per
    backward use of those whose backward needs the weight (all but embedding lookups)."""
    used = [type(model.layers[i].module).__name__ for i in model._order]  # the last forward's uses
    return 2 * len(used) - used.count("Embedding")  # torch's, ours and the course's share the name


def _memory(device: torch.device, what: str) -> float | None:
    if device.type != "cuda":
        return None
    return getattr(torch.cuda, what)(device) / GIB


def _cap_gib(worker: Worker) -> float | None:
    """The memory this rank may use when ranks share its GPU (launch.py caps each at 1/k)."""
    if worker.device.type != "cuda" or worker.ranks_per_gpu == 1:
        return None
    return torch.cuda.get_device_properties(worker.device).total_memory / worker.ranks_per_gpu / GIB


def measure(worker: Worker, variant: str, cfg: ModelConfig, args: argparse.Namespace) -> dict:
    """Build, warm up, time `steps` steps; peak memory of the timed steps. Every rank returns it."""
    dev = worker.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    run = Run(worker, variant, cfg, args)
    after_init = _memory(dev, "memory_allocated")
    for _ in range(args.warmup):  # the first step also creates AdamW's state
        run.step()
    synchronize(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    dist.barrier()
    times = time_steps(run.step, warmup=0, steps=args.steps, device=dev).times
    peak = [_memory(dev, "max_memory_allocated"), _memory(dev, "max_memory_reserved"), after_init]
    steps = slowest_per_step(worker, list(times))
    gathered = None
    if dev.type == "cuda" and args.memory_timeline and variant in OURS:
        gathered = run.gathered_memory()  # after the peak is read: this step is not a timed one
    mine = {"peak": peak, "gathered_memory": gathered, "memory_cap_gib": _cap_gib(worker),
            "threads": torch.get_num_threads()}
    per_rank: list[Any] = [None] * worker.world_size
    dist.all_gather_object(per_rank, mine)
    trace = None
    if args.trace_dir and variant in args.trace_variants:
        path = Path(args.trace_dir) / f"fsdp_{variant}.json.gz"
        trace = run.traced_step(path) if worker.rank == 0 else None
        if worker.rank != 0:
            run.step()  # the other ranks take part in the profiled step's collectives
    del run
    gc.collect()  # the wrappers' hooks form reference cycles: free the model before the next one
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"steps": steps, "per_rank": per_rank, "trace": trace}


def step_time_fields(ms: list[float], ranks_per_gpu: int) -> dict:
    """The step-time columns, or none of them when ranks share a GPU (their times mean nothing)."""
    if ranks_per_gpu > 1:
        return {"step_ms": None, "step_ms_mean": None, "step_ms_std": None, "step_ms_min": None,
                "step_times": SHARED_TIMES.format(k=ranks_per_gpu)}
    return {"step_ms": statistics.median(ms), "step_ms_mean": statistics.fmean(ms),
            "step_ms_std": statistics.stdev(ms) if len(ms) > 1 else 0.0, "step_ms_min": min(ms),
            "step_times": "measured"}


def gathered_fields(per_rank: list[dict]) -> dict:
    """Our FSDP's gathered weights per rank (memory_timeline.py), and the worst rank's counts."""
    got = [r["gathered_memory"] for r in per_rank]
    if any(g is None for g in got):
        return {}
    worst = lambda phase, what: max(g["phases"][phase][what] for g in got)  # noqa: E731
    left = lambda mark: max(g["at_mark"][mark]["alive"] for g in got)  # noqa: E731
    return {"gathered_memory": got,
            "gathered_within_bound": all(g["within_bound"] for g in got),
            "gathers_seen": [g["gathers"] for g in got], "gathers_expected": got[0]["expected_gathers"],
            "gathered_max_alive_forward": worst("forward", "max_alive"),
            "gathered_max_alive_backward": worst("backward", "max_alive"),
            "gathered_left_at_forward_end": left("forward"),
            "gathered_left_at_backward_end": left("backward")}


def row(variant: str, cfg: ModelConfig, args: argparse.Namespace, world: int, got: dict) -> dict:
    n_params = count_parameters(cfg)["total"]
    expected = memory_per_rank(n_params, world, STAGE[variant])
    ms = [t * 1e3 for t in got["steps"]]
    per_rank = got["per_rank"]
    peaks = [r["peak"][0] for r in per_rank]
    on_gpu = peaks[0] is not None
    bf16 = variant.endswith("-bf16")
    return {
        "compute_dtype": "bf16" if bf16 else "fp32", "reduce_dtype": "bf16" if bf16 else "fp32",
        **step_time_fields(ms, args.ranks_per_gpu),
        "gpus": gpus_needed(world, args.ranks_per_gpu) if on_gpu else None,
        "peak_allocated_gib": max(peaks) if on_gpu else None,
        "peak_allocated_gib_per_rank": peaks if on_gpu else None,
        "peak_reserved_gib": max(r["peak"][1] for r in per_rank) if on_gpu else None,
        "after_init_gib": max(r["peak"][2] for r in per_rank) if on_gpu else None,
        "memory_cap_gib": per_rank[0]["memory_cap_gib"],
        **gathered_fields(per_rank),
        "expected_state_gib": expected.total / GIB,  # weights + grads + AdamW, per rank
        "expected_state_gib_parts": {k: v / GIB for k, v in expected.as_dict().items()
                                     if k in ("params", "grads", "optimizer_state")},
        "n_params": n_params, "warmup": args.warmup, "timed_steps": len(ms),
        "bucket_size_mb": args.bucket_size_mb if variant in ("ddp", "sharded") else None,
        "threads_per_rank": per_rank[0]["threads"], "cpu_cores": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
    }


def open_stores(args: argparse.Namespace) -> tuple[ResultStore, ResultStore]:
    device = "cpu" if args.device == "cpu" else None  # None: the store names the GPU
    return (ResultStore(BENCH, KEY, device=device, root=args.results_dir),
            ResultStore(TRACE_BENCH, KEY, device=device, root=args.results_dir))


def base_config(args: argparse.Namespace, backend: str, world: int) -> dict:
    cfg = get_config(args.size, args.context_length)
    return {"size": args.size, "backend": backend, "device_type": args.device, "world_size": world,
            "ranks_per_gpu": args.ranks_per_gpu, "batch_size": args.batch_size,
            "context_length": cfg.context_length}


def write(stores: tuple[ResultStore, ResultStore], config: dict, cfg: ModelConfig,
          args: argparse.Namespace, world: int, got: dict | None, error: str | None = None) -> None:
    """One variant's rows (got None: it ran out of memory), and a line on stderr."""
    variant = config["variant"]
    if got is None:
        stores[0].append(config, status="oom", error=error)
        print(f"[{BENCH}] {variant}: out of memory", file=sys.stderr, flush=True)
        return
    r = stores[0].append(config, row(variant, cfg, args, world, got))
    if got["trace"] is not None:
        stores[1].append(config, got["trace"])
    shown = f"{r['step_ms']:.1f} ms/step" if r["step_ms"] is not None else "no step time (shared GPU)"
    peak = f", peak {r['peak_allocated_gib']:.2f} GiB/rank" if r["peak_allocated_gib"] else ""
    gathered = (f", gathered alive <= {r['gathered_max_alive_forward']}/"
                f"{r['gathered_max_alive_backward']} (fwd/bwd)" if "gathered_within_bound" in r else "")
    print(f"[{BENCH}] {variant}: {shown}{peak}{gathered} (expected state "
          f"{r['expected_state_gib']:.2f} GiB)", file=sys.stderr, flush=True)
