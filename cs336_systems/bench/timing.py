"""Timers. CUDA calls are asynchronous: every timed region ends in a synchronize."""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work; a no-op on CPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


@dataclass(frozen=True)
class StepTimes:
    """Per-step wall-clock times in seconds, with the summary the tables use."""

    times: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def std(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.times)


# --8<-- [start:time_steps]
def time_steps(step: Callable[[], object], *, warmup: int, steps: int,
               device: torch.device | str | None = None) -> StepTimes:
    """Run `step` `warmup` times untimed, then `steps` times, each timed to completion.

    timeit.default_timer is the highest-resolution wall clock; synchronize() after each step so the
    timer measures the GPU work, not how fast Python queued it.
    """
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(steps):
        start = timeit.default_timer()
        step()
        synchronize(device)
        times.append(timeit.default_timer() - start)
    return StepTimes(tuple(times))
# --8<-- [end:time_steps]


def gpu_bench(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100,
              return_mode: str = "median") -> float:
    """Milliseconds per call by triton.testing.do_bench (CUDA events, L2 flushed between calls)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode=return_mode))
