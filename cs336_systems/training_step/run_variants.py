"""Running the training-step bench's variants on a rank: build each, run its first step, time it
(or profile one step), and write its row; one rank in this process (`run_here`) or a spawned group
(`run_variants` on each). `bench.py` decides what runs (the CLI); this module runs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import free_memory, is_oom
from cs336_systems.bench.timing import synchronize
from cs336_systems.distributed.launch import Worker

from . import step_profile
from .memory_budget import GIB
from .rows import BENCH, CACHE_VARIABLES, DTYPES, KEY, Plan, config_of, row_extras, row_metrics
from .variants import Recipe


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


def _label(recipe: Recipe) -> str:
    if recipe.variant == "plain":
        return "plain"
    attention = " with sdpa" if recipe.variant == "ours" and recipe.attention == "sdpa" else ""
    return f"{recipe.variant}{attention} [{recipe.checkpoint}]"


def measure(worker: Worker, plan: Plan, recipe: Recipe) -> dict[str, Any]:
    """Build the variant, run its first step, time it (or, --profile, profile one step): this
    rank's numbers."""
    from .timing import time_train_step
    from .variants import build, sdpa_backend

    dev, started = worker.device, time.time()
    if dev.type == "cuda" and recipe.expandable_segments:  # every recipe of a run has the same setting
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    _say(worker, f"{_label(recipe)}: building ({plan.size}, {plan.dtype_name}, batch {plan.batch}, "
                 f"context {plan.cfg.context_length}, {worker.world_size} rank(s))")
    step = build(recipe, plan.options, plan.cfg, worker, plan.batch)
    sdpa = (sdpa_backend(plan.cfg, plan.batch // worker.world_size, DTYPES[plan.dtype_name], dev)
            if recipe.attention == "sdpa" else None)  # before the peak reset: its empty q is no step's
    synchronize(dev)
    after_build = _gib(dev, "memory_allocated")
    if dev.type == "cuda":  # the fp32 initialisation's transient is not the step's
        torch.cuda.reset_peak_memory_stats(dev)
    _say(worker, f"{_label(recipe)}: first step" + (" (compiling)" if recipe.compile else ""))
    t = time.perf_counter()
    step()
    synchronize(dev)
    first_step_s = time.perf_counter() - t
    loss_first = float(step.last_loss)
    wall_to_first, since_start_first = time.time() - started, time.time() - plan.started
    first_peak = _gib(dev, "max_memory_allocated")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if plan.profile:
        _say(worker, f"{_label(recipe)}: first step {first_step_s:.2f} s; profiling one step")
        trace = (os.path.join(plan.trace_dir, f"{recipe.variant}-{recipe.checkpoint}-rank{worker.rank}.json")
                 if plan.trace_dir else None)
        return {"breakdown": step_profile.profile_breakdown(step, dev, trace), "sdpa_backend": sdpa,
                "first_step_s": first_step_s, "loss_first_step": loss_first,
                "peak_allocated_gib": _gib(dev, "max_memory_allocated"), "first_step_peak_gib": first_peak}
    _say(worker, f"{_label(recipe)}: first step {first_step_s:.2f} s; timing (warmup {plan.warmup_ms:g} ms, "
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


def _write_profile(store: ResultStore, worker: Worker, plan: Plan, recipe: Recipe, got: list[dict]) -> None:
    """One row per category of rank 0's profiled step (every rank ran one; rank 0's is recorded)."""
    config, extras = config_of(plan, recipe, worker.world_size), row_extras(plan, recipe, worker.world_size)
    mine = got[0]["metrics"]
    shared = {k: mine[k] for k in ("sdpa_backend", "first_step_s", "loss_first_step", "peak_allocated_gib",
                                   "first_step_peak_gib")}
    for row in mine["breakdown"]:
        store.append({**config, "category": row["category"]}, {**row, **shared, **extras, "profiled_rank": 0})
    total = {r["category"]: r for r in mine["breakdown"]}
    wall = next(iter(total.values()))["step_wall_ms"]
    parts = ", ".join(f"{c} {r['ms']:.0f}" for c, r in total.items() if r["ms"] >= 0.05 * wall or c == "idle")
    _say(worker, f"{_label(recipe)}: profiled step {wall:.1f} ms: {parts} (ms)")


def run_variants(worker: Worker, plan: Plan) -> list[str]:
    """Every variant in turn on this rank; rank 0 writes each row as it finishes. Returns the statuses."""
    bench, key = (step_profile.BENCH, step_profile.KEY) if plan.profile else (BENCH, KEY)
    store = ResultStore(bench, key, device=plan.device_slug, root=plan.results_dir) if worker.rank == 0 else None
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
            if plan.profile:
                config = {**config, "category": None}
            store.append(config, extras, status=status, error=f"rank {rank}: {g['error']}")
            _say(worker, f"{_label(recipe)}: {status}: rank {rank}: {g['error']}")
            continue
        if plan.profile:
            _write_profile(store, worker, plan, recipe, got)
            continue
        metrics = row_metrics(plan, recipe, worker.world_size, [g["metrics"] for g in got], worker.device)
        r = store.append(config, {**metrics, **extras})
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] else ""
        peak = f", peak {r['peak_allocated_gib']:.1f} GiB/GPU" if r["peak_allocated_gib"] else ""
        _say(worker, f"{_label(recipe)}: {r['step_ms']:.1f} ms/step (median of {r['n_timed']}){mfu}{peak}; "
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
    bench, key = (step_profile.BENCH, step_profile.KEY) if plan.profile else (BENCH, KEY)
    store = ResultStore(bench, key, device=plan.device_slug, root=plan.results_dir)
    done = {(r["variant"], r["flags"].get("checkpoint"), r["flags"].get("attention"))
            for r in store.rows() if r.get("run_id") == plan.run_id}
    for recipe in plan.recipes:
        if (recipe.variant, recipe.checkpoint, recipe.attention) not in done:
            config = config_of(plan, recipe, world)
            if plan.profile:
                config = {**config, "category": None}
            store.append(config, row_extras(plan, recipe, world), status="error", error=why)
