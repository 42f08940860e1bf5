"""Each phase of a step timed on its own (problem benchmarking_script (b) as the 2026 handout asks
it: "time the forward, backward, and optimizer step"), and what a step needs by arithmetic.

`measure_phases` runs the step of profiling.steps with a timer around each phase: synchronize,
timeit.default_timer, the phase, synchronize, timer again. So one train step gives the forward (with
its graph kept for the backward), the backward and the optimizer step, each with its own mean and
standard deviation over the measured steps. The synchronizes between phases cost each phase the
queue of launches the previous one would have overlapped with it: these times add up to a little
more than the unsynchronised step of the `timings` part, which is why they are a part of their own.

`step_memory` is the memory arithmetic of one cell, stored beside the measurement (and beside the
allocator's numbers when the cell runs out of memory): fp32 weights, gradients, AdamW's two moments,
and the activations the forward saves (sharding.accounting.transformer_activation_bytes: fp32,
naive attention). Cells are attempted whatever it says: an out-of-memory row is a measurement.
"""

from __future__ import annotations

import contextlib
import statistics
import timeit
from typing import Any

import torch

from cs336_systems.bench.timing import synchronize
from cs336_systems.model import count_parameters
from cs336_systems.model.config import ModelConfig
from cs336_systems.sharding.accounting import transformer_activation_bytes

from .nvtx import PHASES
from .steps import make_optimizer, make_step, random_batch

GIB = 2**30
FP32 = 4
MODE_PHASES = {"forward": ("forward",), "forward-backward": ("forward", "backward"),
               "train": ("forward", "backward", "optimizer")}


class PhaseTimer:
    """A phase factory for make_step that times each phase to completion and remembers which phase
    is running (so an out-of-memory error can say where it struck)."""

    def __init__(self, device: torch.device | str):
        self.device = device
        self.times: dict[str, list[float]] = {p: [] for p in PHASES}
        self.current: str | None = None
        self.recording = True

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.current = name
        synchronize(self.device)
        start = timeit.default_timer()
        yield
        synchronize(self.device)
        if self.recording:
            self.times[name].append(timeit.default_timer() - start)
        self.current = None


def _stats(times_s: list[float]) -> dict[str, Any]:
    ms = [t * 1e3 for t in times_s]
    return {"mean_ms": statistics.fmean(ms), "std_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
            "times_ms": ms}


# --8<-- [start:measure_phases]
def measure_phases(model: torch.nn.Module, cfg: ModelConfig, *, mode: str, dtype: str, batch: int,
                   context: int, warmup: int, steps: int, device: str | torch.device,
                   seed: int = 0) -> dict[str, Any]:
    """`warmup` untimed steps, then `steps` steps with every phase timed on its own.

    Returns per phase `<phase>_mean_ms`, `<phase>_std_ms`, `<phase>_times_ms`, the phases' sum per
    step (`step_mean_ms`, `step_std_ms`) and the allocator's peak over the measured steps. An
    out-of-memory error propagates with `oom_context` attached ({"oom_phase", "oom_step"}: the phase
    running and the step, counted from the first warm-up step, 0), for the sweep's OOM row.
    """
    dev = torch.device(device)
    x, y = random_batch(cfg, batch, context, dev, seed)
    optimizer = make_optimizer(model, mode)
    timer = PhaseTimer(dev)
    step = make_step(model, x, y, mode=mode, dtype=dtype, optimizer=optimizer, phase=timer)
    done = 0
    try:
        timer.recording = False
        for _ in range(warmup):
            step()
            done += 1
        synchronize(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        timer.recording = True
        for _ in range(steps):
            step()
            done += 1
    except Exception as exc:
        exc.oom_context = {"oom_phase": timer.current, "oom_step": done}
        raise
    finally:
        model.zero_grad(set_to_none=True)
        del optimizer
    out: dict[str, Any] = {"phases": list(MODE_PHASES[mode])}
    for phase in MODE_PHASES[mode]:
        out.update({f"{phase}_{k}": v for k, v in _stats(timer.times[phase]).items()})
    per_step = [sum(timer.times[p][i] for p in MODE_PHASES[mode]) for i in range(steps)]
    out.update({f"step_{k}": v for k, v in _stats(per_step).items() if k != "times_ms"})
    out["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / GIB if dev.type == "cuda" else None
    return out
# --8<-- [end:measure_phases]


# --8<-- [start:step_memory]
def step_memory(cfg: ModelConfig, *, mode: str, batch: int, context: int,
                capacity_bytes: float | None = None) -> dict[str, Any]:
    """The fp32 arithmetic of one cell, in GiB: what must be resident at the end of the forward
    (weights, AdamW state from the previous step, saved activations) and at the end of the backward
    (weights, gradients, AdamW state); the larger is a lower bound on the step's peak. With the
    GPU's capacity, also by how much the bound exceeds it (negative: room left).

    fp32 throughout: under bf16 autocast the weights, gradients and moments stay fp32, and the saved
    activations are partly bf16, partly the weights' bf16 copies, so the fp32 count is a guide there.
    """
    if mode not in MODE_PHASES:
        raise ValueError(f"mode must be one of {', '.join(MODE_PHASES)}, got {mode!r}")
    n = count_parameters(cfg)["total"]
    weights = FP32 * n
    grads = FP32 * n if mode != "forward" else 0
    adamw = 2 * FP32 * n if mode == "train" else 0
    activations = transformer_activation_bytes(cfg, batch, context) if mode != "forward" else 0
    end_of_forward = weights + adamw + activations
    end_of_backward = weights + grads + adamw
    bound = max(end_of_forward, end_of_backward)
    out = {"params": n, "weights_gib": weights / GIB, "grads_gib": grads / GIB, "adamw_gib": adamw / GIB,
           "activations_gib": activations / GIB, "end_of_forward_gib": end_of_forward / GIB,
           "end_of_backward_gib": end_of_backward / GIB, "lower_bound_gib": bound / GIB}
    if capacity_bytes is not None:
        out["capacity_gib"] = capacity_bytes / GIB
        out["over_capacity_gib"] = (bound - capacity_bytes) / GIB
    return out
# --8<-- [end:step_memory]
