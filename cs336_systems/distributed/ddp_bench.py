"""Problems 13, 14, 16, 18: time per step and time communicating for every DDP stage, beside
torch's DistributedDataParallel, in one run (one process group, the same model and data).

    python -m cs336_systems.bench ddp                                   # here: gloo, CPU, 2 ranks
    python -m cs336_systems.bench ddp --device cuda --backend nccl --size xl     # 2 GPUs
    torchrun --nproc-per-node 2 -m cs336_systems.distributed.ddp_bench --device cuda --backend nccl --size xl

Rows (results/ddp/steps/<device>.jsonl), one per configuration:
- `step_ms`: a whole training step (zero_grad, forward, backward, gradient sync, AdamW step),
  started together after a barrier, the slowest rank's time; median over the timed steps of all
  rounds (the grid is run `--rounds` times round-robin, so load drift hits every stage alike).
- `sync_ms`: time inside finish_gradient_synchronization(), from "backward done" to "gradients
  averaged" (the compute stream synchronized at both ends). For naive and flat this is all of their
  communication; for the overlapped stages it is the tail that backward did not hide.
- `comm_alone_ms`: the stage's own communication (same calls, same sizes) with no backward to hide
  behind: what the step would pay if nothing overlapped.
- `compute-only` is the same step with no wrapper and no communication: step_ms minus its step_ms
  is the cost of data parallelism.
A second file (results/ddp/trace/<device>.jsonl) holds one profiled step per stage, reduced by
step_trace.timeline to compute and communication intervals and the overlap fraction.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.bench import fit
from cs336_systems.bench.cli import (
    Parser,
    at_least,
    check_cuda,
    given,
    open_store,
    positive,
    refuse_duplicates,
    results_root,
    timeout_s,
)
from cs336_systems.bench.store import ResultStore
from cs336_systems.distributed import step_trace
from cs336_systems.distributed.ddp import STAGES
from cs336_systems.distributed.launch import Worker, in_torchrun, run_from_env, spawn
from cs336_systems.distributed.rank_times import slowest_per_step
from cs336_systems.model import ModelConfig, TransformerLM, cross_entropy, get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

BENCH, TRACE_BENCH = "ddp/steps", "ddp/trace"
KEY = ["size", "backend", "device_type", "world_size", "batch_size", "context_length", "stage",
       "bucket_size_mb"]
BUCKET_SIZES_MB = [1, 10, 100, 1000]
# The CPU stand-in for xl: 13.5 M parameters (52 MB of fp32 gradients) in 75 tensors, so 1, 10,
# 100 and 1000 MB caps make 43, 6, 1 and 1 buckets. It steps only 32 tokens per rank, so that on 2
# cores communication is a visible share of the step rather than lost in the computation's noise.
CPU_CONFIG = ModelConfig(vocab_size=10_000, context_length=32, d_model=256, num_layers=8,
                         num_heads=4, d_ff=1024)
CPU_BATCH = 2  # global: 1 sequence per rank on 2 ranks
GPU_BATCH = 4  # the course: batch 4 for every model size


def model_config(size: str, context_length: int | None) -> ModelConfig:
    cfg = CPU_CONFIG if size == "ddp-cpu" else get_config(size)
    return cfg.with_context(context_length) if context_length else cfg


def stage_grid(bucket_sizes: list[float], stages: list[str]) -> list[dict[str, Any]]:
    grid = []
    for stage in stages:
        sizes = bucket_sizes if stage == "bucketed" else [None]
        grid += [{"stage": stage, "bucket_size_mb": b} for b in sizes]
    return grid


def stream_sync(device: torch.device) -> None:
    """Wait for this stream's work only: collectives in flight on NCCL's stream keep running."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def wrap(stage: str, bucket_size_mb: float | None, module: nn.Module, worker: Worker) -> nn.Module:
    if stage == "compute-only":
        return module
    if stage == "torch-ddp":
        ids = [worker.device.index] if worker.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=ids)
    kwargs = {"bucket_size_mb": bucket_size_mb} if stage == "bucketed" else {}
    return STAGES[stage](module, **kwargs)


def communicate_alone(model: nn.Module, stage: str) -> None:
    """The stage's communication on the current gradients, with no backward running."""
    if stage in ("naive", "flat"):
        model.finish_gradient_synchronization()
    elif stage in ("overlap", "bucketed"):
        params = model.params if stage == "overlap" else [p for b in model.buckets for p in b]
        for p in (reversed(params) if stage == "overlap" else params):  # arrival order
            model._on_grad_ready(p)
        model.finish_gradient_synchronization()


class StageRun:
    """One configuration built on this rank: the wrapped model, its optimizer, its data shard."""

    def __init__(self, worker: Worker, cfg: ModelConfig, batch_size: int, stage: str,
                 bucket_size_mb: float | None):
        self.worker, self.stage, self.dev = worker, stage, worker.device
        torch.manual_seed(0)
        self.model = wrap(stage, bucket_size_mb, TransformerLM.from_config(cfg, device=self.dev), worker)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        per_rank = batch_size // worker.world_size
        g = torch.Generator(device="cpu").manual_seed(1000 + worker.rank)  # each rank its own shard
        tokens = torch.randint(cfg.vocab_size, (per_rank, cfg.context_length + 1), generator=g)
        self.x, self.y = tokens[:, :-1].to(self.dev), tokens[:, 1:].to(self.dev)
        self.ours = stage in STAGES

    # --8<-- [start:step]
    def step(self) -> float:
        """One training step; returns the seconds spent in finish_gradient_synchronization."""
        model, dev = self.model, self.dev
        if self.ours:
            model.on_train_batch_start()
        self.optimizer.zero_grad(set_to_none=True)
        with step_trace.phase("forward"):
            loss = cross_entropy(model(self.x).flatten(0, 1), self.y.flatten())
        with step_trace.phase("backward"):
            loss.backward()
        stream_sync(dev)  # backward's kernels done; collectives may still be in flight
        start = time.perf_counter()
        with step_trace.phase("sync"):
            if self.ours:
                model.finish_gradient_synchronization()
            stream_sync(dev)
        sync = time.perf_counter() - start
        with step_trace.phase("optimizer"):
            self.optimizer.step()
        return sync
    # --8<-- [end:step]

    def timed_steps(self, warmup: int, steps: int) -> tuple[list[float], list[float]]:
        """(step seconds, sync seconds) of `steps` steps after `warmup`, each started together."""
        step_times, sync_times = [], []
        for i in range(warmup + steps):
            dist.barrier()
            full_sync(self.dev)
            start = time.perf_counter()
            sync = self.step()
            full_sync(self.dev)
            if i >= warmup:
                step_times.append(time.perf_counter() - start)
                sync_times.append(sync)
        return step_times, sync_times

    def comm_alone(self, repeats: int = 3) -> list[float]:
        """The stage's own communication on the last gradients, with no backward to hide behind."""
        times = []
        for _ in range(repeats if self.ours else 0):
            dist.barrier()
            full_sync(self.dev)
            start = time.perf_counter()
            communicate_alone(self.model, self.stage)
            full_sync(self.dev)
            times.append(time.perf_counter() - start)
        return times

    def traced_step(self) -> dict:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.dev.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        dist.barrier()
        with torch.profiler.profile(activities=activities) as prof:
            with step_trace.phase("step"):
                self.step()
            full_sync(self.dev)
        return step_trace.timeline(prof)

    def calls(self) -> int | None:
        trainable = sum(1 for p in self.model.parameters() if p.requires_grad)
        return {"naive": trainable, "overlap": trainable, "flat": 1,
                "bucketed": len(getattr(self.model, "buckets", []))}.get(self.stage)


def full_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(worker: Worker, run: StageRun, step_times: list[float], sync_times: list[float],
              alone: list[float], rounds: int) -> dict[str, Any]:
    steps = slowest_per_step(worker, step_times)
    syncs = slowest_per_step(worker, sync_times)
    alone = slowest_per_step(worker, alone) if alone else []
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    return {
        "step_ms": ms(steps), "step_ms_mean": statistics.fmean(steps) * 1e3,
        "step_ms_std": (statistics.stdev(steps) if len(steps) > 1 else 0.0) * 1e3,
        "sync_ms": ms(syncs) if run.ours else None,
        "comm_alone_ms": ms(alone) if alone else None,
        "allreduce_calls": run.calls(),
        "grad_bytes": sum(p.numel() * p.element_size() for p in run.model.parameters()
                          if p.requires_grad),
        "timed_steps": len(steps), "rounds": rounds,
        "threads_per_rank": torch.get_num_threads(), "cpu_cores": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
    }


def run_grid(worker: Worker, args: argparse.Namespace, grid: list[dict]) -> None:
    """Every configuration in this one process group; rank 0 writes the rows.

    The grid is run `rounds` times, round-robin, with `steps` timed steps per configuration per
    round: on a shared machine the load drifts, and interleaving spreads the drift over every
    configuration instead of charging it to whichever ran at a bad moment. Rows are written in the
    last round, as each configuration finishes.
    """
    cfg = model_config(args.size, args.context_length)
    base = {"size": args.size, "backend": worker.backend, "device_type": worker.device.type,
            "world_size": worker.world_size, "batch_size": args.batch_size,
            "context_length": cfg.context_length}
    stores = None
    if worker.rank == 0:
        stores = (ResultStore(BENCH, KEY, root=args.results_dir),
                  ResultStore(TRACE_BENCH, KEY, root=args.results_dir))
    todo = [[c for c in grid if not stores[0].has({**base, **c})] if stores else None]
    dist.broadcast_object_list(todo, src=0)  # every rank runs the same configurations, in order
    acc: dict[int, tuple[list[float], list[float]]] = {i: ([], []) for i in range(len(todo[0]))}
    failed: set[int] = set()
    for rnd in range(args.rounds):
        last = rnd == args.rounds - 1
        for i, conf in enumerate(todo[0]):
            if i in failed:
                continue
            row, timeline, status = {}, None, "ok"
            try:
                run = StageRun(worker, cfg, args.batch_size, conf["stage"], conf["bucket_size_mb"])
                step_times, sync_times = run.timed_steps(args.warmup, args.steps)
                acc[i][0].extend(step_times)
                acc[i][1].extend(sync_times)
                if last:
                    alone = run.comm_alone()
                    timeline = run.traced_step() if args.trace else None
                    row = summarize(worker, run, *acc[i], alone, args.rounds)
                del run
            except torch.cuda.OutOfMemoryError:
                status = "oom"
                failed.add(i)
            gc.collect()  # the wrappers' hooks form reference cycles: free the model now
            if worker.device.type == "cuda":
                torch.cuda.empty_cache()
            if stores and (last or status != "ok"):
                stores[0].append({**base, **conf}, row, status=status)
                if timeline is not None:
                    stores[1].append({**base, **conf}, timeline)
            if stores:
                shown = f"{statistics.median(acc[i][0]) * 1e3:.1f} ms/step" if acc[i][0] else status
                print(f"[{BENCH}] round {rnd + 1}/{args.rounds} {conf}: {shown}", file=sys.stderr,
                      flush=True)


def build_parser() -> Parser:
    p = Parser(prog="ddp", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--size", default="ddp-cpu", choices=["ddp-cpu", *PRESETS, *PRESETS_EXTRA],
                   help="model preset (small ... 2.7B, tiny) or ddp-cpu")
    p.add_argument("--world-size", type=at_least(1), default=2, help="ranks to spawn (torchrun: its own)")
    p.add_argument("--batch-size", type=at_least(1), default=None,
                   help=f"global batch, split over the ranks (default: {CPU_BATCH} for ddp-cpu, "
                        f"{GPU_BATCH} for the presets)")
    p.add_argument("--context-length", type=at_least(1), default=None, help="default: the preset's")
    p.add_argument("--stages", nargs="+", default=["compute-only", "naive", "flat", "overlap",
                                                   "bucketed", "torch-ddp"],
                   choices=["compute-only", *STAGES, "torch-ddp"])
    p.add_argument("--bucket-sizes-mb", nargs="+", type=positive(float), default=BUCKET_SIZES_MB)
    p.add_argument("--warmup", type=at_least(0), default=2, help="untimed steps per configuration per round")
    p.add_argument("--steps", type=at_least(1), default=5, help="timed steps per configuration per round")
    p.add_argument("--rounds", type=at_least(1), default=None,
                   help="passes over the grid, round-robin, against load drift (default: 4 on "
                        "cpu; 1 on cuda, so each row is written as soon as it is measured)")
    p.add_argument("--no-trace", dest="trace", action="store_false", help="skip the profiled step")
    p.add_argument("--timeout-s", type=timeout_s, default=600.0)
    p.add_argument("--results-dir", type=results_root, default=None, help="root of the results tree (default: results/)")
    fit.add_allow_oom(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl needs --device cuda")
    refuse_duplicates(parser, args, "stages", "bucket_sizes_mb")
    if given(parser, "bucket_sizes_mb") and "bucketed" not in args.stages:
        parser.error("--bucket-sizes-mb sets the bucketed stage's caps; --stages leaves it out")
    if args.batch_size is None:
        args.batch_size = CPU_BATCH if args.size == "ddp-cpu" else GPU_BATCH
    if args.rounds is None:
        args.rounds = 4 if args.device == "cpu" else 1
    world = int(os.environ["WORLD_SIZE"]) if in_torchrun() else args.world_size
    if args.batch_size % world:
        parser.error(f"--batch-size {args.batch_size} must split evenly over {world} ranks "
                     f"(a multiple of --world-size)")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if in_torchrun() else world
    check_cuda(parser, args.device, gpus=local)
    cfg = model_config(args.size, args.context_length)
    have, where = fit.capacity_bytes(args.device, local)
    need = fit.step_memory(cfg, "train", batch=args.batch_size // world, context=cfg.context_length)
    fit.refuse_unless_fits(parser, args, need, have, where,
                           f"--size {args.size} --batch-size {args.batch_size} over --world-size {world} "
                           f"--context-length {cfg.context_length}")
    grid = stage_grid([int(b) if b == int(b) else b for b in args.bucket_sizes_mb], args.stages)
    # Rank 0 opens them again (the same paths); here they are checked before any process starts.
    open_store(parser, BENCH, KEY, root=args.results_dir)
    open_store(parser, TRACE_BENCH, KEY, root=args.results_dir)
    if in_torchrun():
        run_from_env(run_grid, args, grid, backend=args.backend, device=args.device,
                     timeout_s=args.timeout_s)
    else:
        spawn(run_grid, world, args, grid, backend=args.backend, device=args.device,
              timeout_s=args.timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
