"""Timing a training step the leaderboard's way: `triton.testing.do_bench(train_step)`.

    timing = time_train_step(step, worker, warmup_ms=25, rep_ms=100, first_step_s=...)
    timing.times_ms      # per timed call, the slowest rank's milliseconds

One GPU: do_bench itself (return_mode="all": every timed call, so the row has median and mean).
It calls the step once, times 5 calls (L2 flushed before each) to estimate one, then runs
warmup / estimate calls untimed and rep / estimate calls timed, each at least once.

Several GPUs: each rank runs that procedure, but the counts must agree. Every call of the step
holds collectives, so a rank that ran one call more than the others would wait forever; do_bench
derives the counts from each rank's own estimate, which can land on different sides of an integer.
So here the ranks use do_bench's procedure (the code below follows triton's line by line) with the
one change that the estimate is the maximum over the ranks. A call's end is a collective's end,
the same moment on every rank, so the per-call times differ little between ranks; the row keeps the
slowest rank's per call.

CPU: the project's `time_steps` (wall clock), with counts from the same rule, the estimate being
the first step's time (maximum over ranks).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.bench.timing import time_steps
from cs336_systems.distributed.launch import Worker
from cs336_systems.distributed.rank_times import slowest_per_step

DO_BENCH = "triton.testing.do_bench"
DO_BENCH_AGREED = "do_bench's procedure, counts agreed over ranks"
TIME_STEPS = "time_steps (CPU wall clock)"


@dataclass(frozen=True)
class StepTiming:
    times_ms: list[float]   # per timed call, the slowest rank's
    timer: str
    n_warmup: int | None    # None: do_bench chose it and does not say

    def summary(self) -> dict[str, Any]:
        t = self.times_ms
        return {"step_ms": statistics.median(t), "step_ms_mean": statistics.fmean(t),
                "step_ms_min": min(t), "step_ms_max": max(t), "n_timed": len(t),
                "n_warmup": self.n_warmup, "timer": self.timer}


def _counts(warmup_ms: float, rep_ms: float, estimate_ms: float) -> tuple[int, int]:
    """do_bench's rule: each at least 1."""
    return max(1, int(warmup_ms / estimate_ms)), max(1, int(rep_ms / estimate_ms))


def _max_over_ranks(value: float, device: torch.device) -> float:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _do_bench_agreed(fn, warmup_ms: float, rep_ms: float, device: torch.device) -> tuple[list[float], int]:
    """triton.testing.do_bench(fn, warmup, rep, return_mode="all") with the estimate maxed over ranks."""
    from triton import runtime

    driver = runtime.driver.active
    di = driver.get_device_interface()
    clear = getattr(driver, "clear_cache", None) or (lambda cache: cache.zero_())  # older triton: zero_()
    fn()
    di.synchronize()
    cache = driver.get_empty_cache_for_benchmark()
    start, end = di.Event(enable_timing=True), di.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        clear(cache)
        fn()
    end.record()
    di.synchronize()
    estimate_ms = _max_over_ranks(start.elapsed_time(end) / 5, device)
    n_warmup, n_repeat = _counts(warmup_ms, rep_ms, estimate_ms)
    starts = [di.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [di.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for i in range(n_repeat):
        clear(cache)
        starts[i].record()
        fn()
        ends[i].record()
    di.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], n_warmup


def time_train_step(step, worker: Worker, *, warmup_ms: float, rep_ms: float,
                    first_step_s: float) -> StepTiming:
    """Time `step` (already run once: `first_step_s`) on every rank; a collective, every rank calls it."""
    if worker.device.type == "cuda" and worker.world_size == 1:
        from triton.testing import do_bench

        times = do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        return StepTiming([float(t) for t in times], DO_BENCH, None)
    if worker.device.type == "cuda":
        times, n_warmup = _do_bench_agreed(step, warmup_ms, rep_ms, worker.device)
        return StepTiming(slowest_per_step(worker, times), DO_BENCH_AGREED, n_warmup)
    estimate_ms = _max_over_ranks(first_step_s * 1e3, worker.device)
    n_warmup, n_repeat = _counts(warmup_ms, rep_ms, estimate_ms)
    times = time_steps(step, warmup=n_warmup, steps=n_repeat, device=worker.device).times
    if worker.world_size > 1:
        times = slowest_per_step(worker, list(times))
    return StepTiming([t * 1e3 for t in times], TIME_STEPS, n_warmup)
