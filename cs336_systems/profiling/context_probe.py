"""The longest power-of-two context whose step fits on this GPU, found by trying (problem
nsys_profile, 2026: "the largest [context] should be the longest context length you can fit").

Doubling from `start`, each context runs the step twice (the second from the steady state: the
optimizer's moments and the gradients exist from the first step on) and stores a row with its
allocator peak, until a context runs out of memory; that context's row is an OOM row with the
allocator's numbers (bench.oom), so the claim "the longest that fits" rests on a measured failure
one size up. Rows: results/profiling/context_probe/. A probe that is run again reads its stored
rows instead of measuring them again.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cs336_systems.bench.oom import MIB, oom_details
from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import free_memory, is_oom
from cs336_systems.bench.timing import synchronize

from .steps import make_optimizer, make_step, random_batch

BENCH = "profiling/context_probe"
KEY = ["size", "context", "mode", "dtype", "batch"]
PROBE_STEPS = 2


@dataclass
class Probe:
    """What a probe found: the longest context that fit (None: not even the first), the context that
    did not (None: every context up to the limit fit), and the rows read or written on the way."""

    longest: int | None
    first_oom: int | None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def profile_contexts(self, start: int, count: int = 3) -> list[int]:
        """The `count` largest powers of two from `start` up to the longest that fit, ascending."""
        if self.longest is None:
            return []
        out, ctx = [], self.longest
        while ctx >= start and len(out) < count:
            out.append(ctx)
            ctx //= 2
        return out[::-1]


def step_at(model: torch.nn.Module, *, context: int, mode: str, dtype: str, batch: int,
            device: str | torch.device, steps: int = PROBE_STEPS) -> dict[str, Any]:
    """Run `steps` steps of `model` at `context`; the allocator's peak (CUDA) and each step's time."""
    dev = torch.device(device)
    cfg = model.config.with_context(context)
    x, y = random_batch(cfg, batch, context, dev)
    optimizer = make_optimizer(model, mode)
    step = make_step(model, x, y, mode=mode, dtype=dtype, optimizer=optimizer)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    try:
        for _ in range(steps):
            start = timeit.default_timer()
            step()
            synchronize(dev)
            times.append((timeit.default_timer() - start) * 1e3)
    finally:
        model.zero_grad(set_to_none=True)
        del optimizer
    cuda = dev.type == "cuda"
    return {"step_ms": times,
            "peak_mib": torch.cuda.max_memory_allocated(dev) / MIB if cuda else None,
            "capacity_mib": torch.cuda.get_device_properties(dev).total_memory / MIB if cuda else None}


# --8<-- [start:probe]
def probe_longest_context(store: ResultStore, cell: dict[str, Any], run_at: Callable[[int], dict], *,
                          start: int, limit: int) -> Probe:
    """Try `cell` (size, mode, dtype, batch) at start, 2 start, 4 start, ... up to `limit`, each
    context stored as it finishes, until one runs out of memory (its OOM row is stored too)."""
    if start < 1 or limit < start:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    probe = Probe(longest=None, first_oom=None)
    ctx = start
    while ctx <= limit:
        key = {**cell, "context": ctx}
        row = store.newest(key)
        if row is not None and row.get("invocation") != store.invocation:
            row = None  # another run's row: this one measures again (--resume reuses its own)
        if row is None:
            try:
                row = store.append(key, run_at(ctx))
            except Exception as exc:  # noqa: BLE001 - an OOM is the answer; anything else is not
                if not is_oom(exc):
                    raise
                row = store.append(key, oom_details(exc), status="oom", error="CUDA out of memory")
            finally:
                free_memory()
        probe.rows.append(row)
        if row.get("status") != "ok":
            probe.first_oom = ctx
            break
        probe.longest = ctx
        ctx *= 2
    return probe
# --8<-- [end:probe]
