"""What one row of results/training-step holds, and the plan every rank runs (decided before any
rank starts): the key, the metrics gathered from the ranks, the configuration and the extras."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from cs336_systems.bench.device import peak_flops
from cs336_systems.bench.provenance import device_name
from cs336_systems.bench.store import read_rows, results_path
from cs336_systems.model import ModelConfig

from . import arithmetic
from .checkpoint_plan import CheckpointPlan
from .memory_budget import budget
from .plan_search import plan_recompute_flops
from .train_step import StepOptions
from .variants import Recipe

BENCH = "training-step"
KEY = ("variant", "size", "dtype", "batch", "context", "world_size", "flags")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# do_bench's own defaults (triton.testing.do_bench(fn, warmup=25, rep=100)); each is at least one call
WARMUP_MS, REP_MS = 25.0, 100.0
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


@dataclass(frozen=True)
class Plan:
    """Everything the ranks need, decided in main() before any of them starts (picklable)."""

    size: str
    cfg: ModelConfig            # context_length = the run's context
    dtype_name: str
    batch: int                  # global
    recipes: tuple[Recipe, ...]
    options: StepOptions
    warmup_ms: float
    rep_ms: float
    cold_cache: bool
    results_dir: str | None
    device_slug: str
    started: float              # time.time() at main()'s start
    run_id: str
    profile: bool = False       # one profiled step per recipe instead of do_bench (step_profile.py)
    trace_dir: str | None = None  # --profile: where each profiled step's Chrome trace goes
    sweep: bool = False         # the recipes' plans were chosen by --sweep (plan_search.py)



def _ceiling_tflops(slug: str, dtype_name: str) -> float | None:
    """The measured dense-matmul ceiling of this GPU (results/ceilings), if measured."""
    from cs336_systems.bench.ceilings import BENCH as CEILINGS

    rows = [r for r in read_rows(results_path(CEILINGS, slug)) if r.get("status") == "ok"
            and r.get("op") == "matmul" and r.get("dtype") == dtype_name]
    return rows[-1]["tflops"] if rows else None


def row_metrics(plan: Plan, recipe: Recipe, world: int, per_rank: list[dict[str, Any]],
                device: torch.device) -> dict[str, Any]:
    """One row's metrics from every rank's numbers (all ranks succeeded)."""
    cfg, context = plan.cfg, plan.cfg.context_length
    first = per_rank[0]  # timing: every rank holds the slowest rank's times
    flops = arithmetic.step_flops(cfg, plan.batch, context)
    step_s = first["step_ms"] / 1e3
    peak = peak_flops(device_name(device), plan.dtype_name) if device.type == "cuda" else None
    measured = _ceiling_tflops(plan.device_slug, plan.dtype_name) if device.type == "cuda" else None
    peaks = [r["peak_allocated_gib"] for r in per_rank]
    return {
        **{k: first[k] for k in ("step_ms", "step_ms_mean", "step_ms_min", "step_ms_max", "n_timed",
                                 "n_warmup", "timer")},
        "warmup_ms": plan.warmup_ms, "rep_ms": plan.rep_ms,
        "tokens": plan.batch * context, "model_flops": flops,
        "mfu": arithmetic.mfu(flops, step_s, world, peak) if peak else None,
        "peak_tflops_datasheet": peak / 1e12 if peak else None,
        "mfu_measured_ceiling": arithmetic.mfu(flops, step_s, world, measured * 1e12) if measured else None,
        "ceiling_tflops_measured": measured,
        "peak_allocated_gib": max(peaks) if peaks[0] is not None else None,
        "peak_allocated_gib_per_rank": peaks if peaks[0] is not None else None,
        "peak_reserved_gib": max(r["peak_reserved_gib"] for r in per_rank) if peaks[0] is not None else None,
        "after_build_gib": max(r["after_build_gib"] for r in per_rank) if peaks[0] is not None else None,
        "first_step_peak_gib": max(r["first_step_peak_gib"] for r in per_rank) if peaks[0] is not None else None,
        # each rank's loss is the mean over its equal share of the batch: their mean is the batch's
        "loss_first_step": sum(r["loss_first_step"] for r in per_rank) / world,
        "loss_last": sum(r["loss_last"] for r in per_rank) / world,
        "steps_taken": first["steps_taken"],  # do_bench's count: loss_last is the loss at the last one
        "sdpa_backend": first.get("sdpa_backend"),  # the kernel SDPA chose (stock); None without SDPA
        **{k: max(r[k] for r in per_rank) for k in ("first_step_s", "wall_to_first_step_s",
                                                    "since_start_to_first_step_s", "wall_total_s",
                                                    "since_start_s")},
    }


def config_of(plan: Plan, recipe: Recipe, world: int) -> dict[str, Any]:
    return {"variant": recipe.variant, "size": plan.size, "dtype": plan.dtype_name, "batch": plan.batch,
            "context": plan.cfg.context_length, "world_size": world, "flags": recipe.flags()}


def row_extras(plan: Plan, recipe: Recipe, world: int) -> dict[str, Any]:
    """What every row carries besides its measurements."""
    layout = recipe.layout(DTYPES[plan.dtype_name])
    context = plan.cfg.context_length
    estimate = budget(plan.cfg, layout, world, plan.batch // world, context)
    recompute = plan_recompute_flops(plan.cfg, CheckpointPlan(layout.modes(plan.cfg.num_layers)),
                                     plan.batch // world * context, context, layout.compiled)
    return {"run_id": plan.run_id, "cold_cache": plan.cold_cache, "seed": plan.options.seed,
            "n_params": arithmetic.params(plan.cfg), "memory_estimate_gib": estimate.as_gib(),
            "recompute_flops_per_rank": recompute, "sweep": plan.sweep,
            "cpu_cores": os.cpu_count(), "threads_per_rank": torch.get_num_threads(),
            "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
