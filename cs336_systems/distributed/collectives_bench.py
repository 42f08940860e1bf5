"""distributed_communication_single_node: all-reduce time over size x backend x process count.

    python -m cs336_systems.bench collectives                       # gloo+CPU, 2/4/6 ranks (here)
    python -m cs336_systems.bench collectives --backend nccl        # nccl+GPU, one GPU per rank
    python -m cs336_systems.bench collectives --backend gloo-cuda   # gloo on CUDA tensors
    torchrun --nproc-per-node 4 -m cs336_systems.distributed.collectives_bench --backend nccl

Without torchrun, each (backend, world size, size) cell spawns its own ranks, so a cell that dies
(out of host memory, say) costs only its own row. Under torchrun the world size is torchrun's, and
only the cells with that world size run.

Per cell: 5 warm-up all-reduces, then `iters` timed ones. Each timed iteration starts after a
barrier, and ends after a device synchronize (an async collective's return only means "queued").
Every rank times every iteration; the times are gathered with all_gather_object, and an iteration
lasts as long as its slowest rank. Reported: the median (and mean, std, min) over iterations of
that maximum; `algbw` = bytes / time; `busbw` = algbw x 2(n-1)/n, the bytes each rank's link
carries in a ring all-reduce (the nccl-tests convention), comparable across process counts.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.bench.cli import Parser, add_resume, at_least, open_store, refuse_duplicates, results_root, timeout_s
from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import EXIT_INCOMPLETE, exit_code, run_sweep, worst
from cs336_systems.bench.timing import synchronize
from cs336_systems.distributed.launch import Worker, in_torchrun, run_from_env, spawn

BENCH = "collectives/all_reduce"
KEY = ["backend", "device_type", "world_size", "size_mb"]
MIB = 1024 * 1024
SIZES_MB = [1, 10, 100, 1024]  # fp32 tensors of 1 MB, 10 MB, 100 MB, 1 GB (MiB units)
# Beyond the course's grid: a 4 KB all-reduce, all fixed cost and no bandwidth. It pins down the
# per-call overhead o of the bucket model (bucket_model.py), which 1 MB on loopback cannot.
LATENCY_PROBE_MB = 4 / 1024
WORLD_SIZES = [2, 4, 6]
# --backend choice -> (process-group backend, tensor device). gloo-cuda: gloo on CUDA tensors
# (it stages them through host memory), the comparison the course asks for beside nccl.
BACKENDS = {"gloo": ("gloo", "cpu"), "nccl": ("nccl", "cuda"), "gloo-cuda": ("gloo", "cuda")}


def bus_factor(world_size: int) -> float:
    """Bytes each rank sends (and receives) per byte of payload in a ring all-reduce: 2(n-1)/n."""
    return 2 * (world_size - 1) / world_size


# --8<-- [start:measure]
def measure_all_reduce(worker: Worker, size_mb: float, warmup: int, iters: int) -> dict[str, Any]:
    """Time `iters` all-reduces of `size_mb` MiB of fp32 on every rank; aggregate over ranks."""
    n = worker.world_size
    numel = int(size_mb * MIB) // 4
    # 1/n everywhere: the sum stays 1, so repeated in-place reductions never overflow.
    tensor = torch.full((numel,), 1.0 / n, dtype=torch.float32, device=worker.device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    synchronize(worker.device)
    times = []
    for _ in range(iters):
        dist.barrier()  # start together, so the slowest rank's time is the collective's time
        start = time.perf_counter()
        dist.all_reduce(tensor)
        synchronize(worker.device)  # async_op=False means queued on GPU, not finished
        times.append(time.perf_counter() - start)
    per_rank: list[list[float]] = [None] * n  # type: ignore[list-item]
    dist.all_gather_object(per_rank, times)  # ranks drift: every rank's view counts
    slowest = [max(rank_times[i] for rank_times in per_rank) for i in range(iters)]
    spread = [max(r[i] for r in per_rank) - min(r[i] for r in per_rank) for i in range(iters)]
    # --8<-- [end:measure]
    rss = [None] * n
    dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    seconds = statistics.median(slowest)
    size_bytes = numel * 4
    algbw = size_bytes / seconds / 1e9
    return {
        "size_bytes": size_bytes, "warmup": warmup, "iters": iters,
        "time_ms": seconds * 1e3,
        "time_ms_mean": statistics.fmean(slowest) * 1e3,
        "time_ms_std": (statistics.stdev(slowest) if iters > 1 else 0.0) * 1e3,
        "time_ms_min": min(slowest) * 1e3,
        "rank_spread_ms": statistics.median(spread) * 1e3,
        "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(n),
        "peak_rss_mb_max_rank": max(rss),
        "threads_per_rank": torch.get_num_threads(),
    }


def iterations_for(size_mb: float, requested: int | None) -> int:
    """Fewer timed iterations for the big tensors (a 1 GB gloo all-reduce takes seconds on CPU)."""
    if requested is not None:
        return requested
    return 50 if size_mb < 1 else 20 if size_mb <= 10 else 10 if size_mb <= 100 else 5


def host_context(world_size: int) -> dict[str, Any]:
    """What shares the host with the ranks: cores, how oversubscribed, the load when we started."""
    cores = os.cpu_count() or 1
    return {"cpu_cores": cores, "ranks_per_core": world_size / cores,
            "loadavg_1m": os.getloadavg()[0]}


def mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gpus_missing(backends: list[str], world_sizes: list[int]) -> str | None:
    """Why this machine cannot run the CUDA backends asked for (one GPU per rank), or None."""
    cuda = [b for b in backends if BACKENDS[b][1] == "cuda"]
    have, need = torch.cuda.device_count(), max(world_sizes)
    if cuda and have < need:
        return (f"{' and '.join(cuda)} needs one GPU per rank: {need} ranks, {have} GPU(s) visible "
                f"(lower --world-sizes, or run on a GPU node)")
    return None


def host_memory_short(world_size: int, size_mb: float) -> str | None:
    """Why the host cannot hold a CPU cell's ranks and tensors, or None if it can."""
    # Measured here: a rank holds the tensor plus ~0.25 GB of PyTorch; gloo adds no full copy.
    need = world_size * (size_mb * MIB + 0.5 * 1024 * MIB)
    have = mem_available_bytes()
    if have is not None and need > 0.8 * have:
        return (f"{world_size} ranks x {size_mb} MB need ~{need / 1e9:.1f} GB of host memory, "
                f"{have / 1e9:.1f} GB available")
    return None


def _measure_cells(worker: Worker, cells: list[dict], warmup: int, iters: int | None) -> list[dict]:
    return [measure_all_reduce(worker, c["size_mb"], warmup, iterations_for(c["size_mb"], iters))
            for c in cells]


def runnable(cells: list[dict]) -> list[dict]:
    """The cells this host has the memory for. The others are not run and leave no row (a row is
    a measurement); each is named on stderr."""
    keep = []
    for cell in cells:
        reason = host_memory_short(cell["world_size"], cell["size_mb"]) if cell["device_type"] == "cpu" else None
        if reason is None:
            keep.append(cell)
        else:
            print(f"[{BENCH}] not running {cell}: {reason}", file=sys.stderr)
    return keep


def build_parser() -> Parser:
    p = Parser(prog="collectives", description=__doc__.split("\n")[0])
    p.add_argument("--backend", nargs="+", default=["gloo"], choices=list(BACKENDS),
                   help="gloo: CPU tensors; nccl: one GPU per rank; gloo-cuda: gloo on one GPU "
                        "per rank (default: gloo)")
    p.add_argument("--world-sizes", nargs="+", type=at_least(2), default=WORLD_SIZES,
                   help="ranks per cell, each >= 2 (default: 2 4 6)")
    p.add_argument("--sizes-mb", nargs="+", type=at_least(4 / MIB, float, why=" MiB, one fp32 element"),
                   default=[LATENCY_PROBE_MB, *SIZES_MB],
                   help="MiB per tensor, at least one fp32 element (default: a 4 KB latency probe, then 1, "
                        "10, 100, 1024)")
    p.add_argument("--warmup", type=at_least(0), default=5)
    p.add_argument("--iters", type=at_least(1), default=None,
                   help="timed iterations per cell (default: 50 below 1 MB, 20 to 10 MB, 10 to "
                        "100 MB, 5 above)")
    p.add_argument("--timeout-s", type=timeout_s, default=300.0, help="collective timeout per cell")
    p.add_argument("--results-dir", type=results_root, default=None, help="root of the results tree (default: results/)")
    add_resume(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_duplicates(parser, args, "backend", "world_sizes", "sizes_mb")
    if in_torchrun() and len(args.backend) != 1:
        parser.error("--backend: under torchrun pass exactly one")
    # Ranks on this host: torchrun's local ones, or every rank we spawn.
    local = [int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))] if in_torchrun() else args.world_sizes
    if reason := gpus_missing(args.backend, local):
        parser.error(f"--backend: {reason}")
    store = open_store(parser, BENCH, KEY, root=args.results_dir)
    if in_torchrun():
        return _main_torchrun(args, store)
    cells = [{"backend": BACKENDS[b][0], "device_type": BACKENDS[b][1], "world_size": w,
              "size_mb": s if s != int(s) else int(s)}
             for b in args.backend for w in args.world_sizes for s in args.sizes_mb]
    todo = runnable(cells)

    def measure(cell: dict) -> dict:
        context = host_context(cell["world_size"])
        rows = spawn(_measure_cells, cell["world_size"], [cell], args.warmup, args.iters,
                     backend=cell["backend"], device=cell["device_type"],
                     timeout_s=args.timeout_s,
                     threads_per_rank=1 if cell["device_type"] == "cpu" else None)
        return {**rows[0][0], **context}

    code = exit_code(run_sweep(store, todo, measure, desc="all-reduce"), BENCH)
    return worst(code, EXIT_INCOMPLETE if len(todo) < len(cells) else 0)


def _main_torchrun(args: argparse.Namespace, rank0_store: ResultStore) -> int:
    """One rank of a torchrun job: the cells whose world size is torchrun's; rank 0 writes."""
    world = int(os.environ["WORLD_SIZE"])
    backend, device_type = BACKENDS[args.backend[0]]
    cells = [{"backend": backend, "device_type": device_type, "world_size": world,
              "size_mb": s if s != int(s) else int(s)} for s in args.sizes_mb]

    def body(worker: Worker) -> None:
        store = rank0_store if worker.rank == 0 else None
        todo = [[c for c in cells if not store.has(c)] if store else None]
        dist.broadcast_object_list(todo, src=0)  # every rank runs the same cells, in order
        for cell in todo[0]:
            metrics = _measure_cells(worker, [cell], args.warmup, args.iters)[0]
            if store is not None:
                store.append(cell, {**metrics, **host_context(world)})
                print(f"[{BENCH}] {cell}: {metrics['time_ms']:.3f} ms, "
                      f"busbw {metrics['busbw_gbps']:.2f} GB/s", file=sys.stderr)

    run_from_env(body, backend=backend, device=device_type, timeout_s=args.timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
