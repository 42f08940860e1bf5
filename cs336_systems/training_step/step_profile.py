"""`training-step --profile`: one step of a built variant under torch.profiler, broken down by
category (breakdown.py), instead of do_bench's timing.

    rows = profile_breakdown(step, device, trace_path=None)   # one dict per category

The step runs twice first (the first compiles; the second warms the allocator and the autotuners),
then once more inside `torch.profiler.profile` with the step's named ranges on (annotate.py) and a
synchronize on each side of the `step` range, so its wall time is the GPU's span of the step.
On a GPU the kernels are the trace's device events, each counted once and placed by its launch
(profiling/kernel_attribution.py); on a CPU each op's self time stands in (breakdown.cpu_stand_in).
Rows go to results/training-step-profile/<device>.jsonl, one per (variant, plan, category).
"""

from __future__ import annotations

from pathlib import Path

import torch

from cs336_systems.bench.timing import synchronize
from cs336_systems.profiling.kernel_attribution import from_kineto

from .annotate import step_range
from .breakdown import breakdown, cpu_stand_in
from .train_step import TrainingStep

BENCH = "training-step-profile"
KEY = ("variant", "size", "dtype", "batch", "context", "world_size", "flags", "category")
WARM_STEPS = 1  # after the first (compiling) step, before the profiled one


def profile_breakdown(step: TrainingStep, device: torch.device, trace_path: str | Path | None = None) -> list[dict]:
    """Warm `step` up, profile one call of it, return breakdown()'s rows (the step already ran once)."""
    for _ in range(WARM_STEPS):
        step()
    synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    step.annotate = True
    try:
        with torch.profiler.profile(activities=activities) as prof:
            synchronize(device)
            with step_range("step"):
                step()
                synchronize(device)
    finally:
        step.annotate = False
    if trace_path is not None:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    if device.type == "cuda":
        events = from_kineto(prof.profiler.kineto_results.events())
    else:
        events = cpu_stand_in(prof.events())
    return breakdown(events)
