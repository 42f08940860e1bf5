"""torch.profiler in place of Nsight Systems: one profiled step -> per-phase kernel table + Chrome trace.

Every kernel is attributed to the phase (forward / backward / optimizer) and, inside the forward's
attention, to the region (attn_scores / attn_softmax / attn_output) whose record_function range
contains its launch (kernel_attribution.py: each device kernel counted once).
"""

from __future__ import annotations

import re
import timeit
from pathlib import Path

import torch

from cs336_systems.bench.timing import synchronize
from cs336_systems.model import use_attention
from cs336_systems.model.config import ModelConfig

from .kernel_attribution import (  # noqa: F401
    OTHER,
    TOP_KERNELS,
    appended_kernel_ms,
    attribute_cpu_ops,
    attribute_kernels,
    from_kineto,
    is_matmul,
)
from .nvtx import PHASES, annotated_attention
from .steps import make_optimizer, make_step, phase_ranges, random_batch


def short_name(kernel: str, width: int = 60) -> str:
    """A readable kernel name: drop `void `, template arguments and argument lists."""
    name = re.sub(r"^void\s+", "", kernel)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
            if depth == 1:
                out.append("<…>" if ch == "<" else "(…)")
            continue
        if ch in ">)":
            depth = max(depth - 1, 0)
            continue
        if depth == 0:
            out.append(ch)
    s = "".join(out).replace("(…)", "")
    return s if len(s) <= width else s[: width - 1] + "…"


def profiled_totals(prof, device: torch.device) -> tuple[list[dict], dict[str, dict]]:
    """Kernel rows and per-phase totals of a finished torch.profiler run.

    GPU: the unique device kernels by launch (attribute_kernels), with the sum of torch's per-op
    kernel lists beside each phase as `appended_ms` (what our first version reported). CPU: each
    op's self CPU time.
    """
    function_events = prof.events()
    if device.type != "cuda":
        return attribute_cpu_ops(function_events)
    rows, totals = attribute_kernels(from_kineto(prof.profiler.kineto_results.events()))
    for phase, ms in appended_kernel_ms(function_events).items():
        totals.setdefault(phase, {})["appended_ms"] = ms
    return rows, totals


def timed_phases(step_factory, device) -> dict[str, float]:
    """Python-timer milliseconds of each phase of one step (synchronize at each phase end)."""
    times: dict[str, float] = {}
    import contextlib

    @contextlib.contextmanager
    def timer(name: str):
        synchronize(device)
        start = timeit.default_timer()
        yield
        synchronize(device)
        times[name] = (timeit.default_timer() - start) * 1e3

    step_factory(timer)()
    return times


def profile_step(model: torch.nn.Module, cfg: ModelConfig, *, mode: str = "train", dtype: str = "fp32",
                 batch: int = 4, context: int = 128, device: str | torch.device = "cpu", seed: int = 0,
                 compiled: torch.nn.Module | None = None, warmup: int = 2,
                 trace_path: str | Path | None = None) -> tuple[list[dict], dict[str, dict]]:
    """Warm up, time each phase with the Python timer, then profile one step.

    Returns the kernel rows and the per-phase totals (kernel_ms, wall_ms, matmul_ms, python_ms).
    Attention is the annotated naive one (three record_function regions) for the whole call.
    """
    dev = torch.device(device)
    x, y = random_batch(cfg, batch, context, dev, seed)
    optimizer = make_optimizer(model, mode)
    target = compiled if compiled is not None else model
    with use_attention(annotated_attention(torch.profiler.record_function)):
        def factory(rng, opt=optimizer):
            return make_step(target, x, y, mode=mode, dtype=dtype, optimizer=opt, phase=rng)

        plain = factory(phase_ranges())
        for _ in range(warmup):
            plain()
        synchronize(dev)
        python_ms = timed_phases(factory, dev)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiled = factory(phase_ranges(torch.profiler.record_function, sync=dev))
        with torch.profiler.profile(activities=activities) as prof:
            profiled()
            synchronize(dev)
    if trace_path is not None:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    rows, totals = profiled_totals(prof, dev)
    for phase, ms in python_ms.items():
        totals.setdefault(phase, {})["python_ms"] = ms
    del optimizer
    return rows, totals


def format_kernel_table(rows: list[dict], totals: dict[str, dict], top: int = 8) -> str:
    """Plain-text summary for the CLI: per phase, its totals and top kernels."""
    lines = []
    for phase in [*PHASES, "(outside phases)"]:
        if phase not in totals or "kernel_ms" not in totals[phase]:
            continue
        t = totals[phase]
        share = t["matmul_ms"] / t["kernel_ms"] if t.get("kernel_ms") else 0.0
        lines.append(f"[{phase}] kernels {t['kernel_ms']:.2f} ms ({t.get('kernels', 0)} launches), "
                     f"matmul {share:.0%}, range {t.get('wall_ms', float('nan')):.2f} ms, "
                     f"python timer {t.get('python_ms', float('nan')):.2f} ms")
        ranked = sorted((r for r in rows if r["phase"] == phase), key=lambda r: -r["total_ms"])
        for r in ranked[:top]:
            where = f" [{r['region']}]" if r["region"] else ""
            lines.append(f"  {r['total_ms']:9.3f} ms {r['calls']:6d}x {r['share'] or 0:6.1%}  "
                         f"{short_name(r['kernel'])}{where}")
    if "(check)" in totals:  # GPU runs: how the kernels were counted and placed
        lines.append("[check] " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in totals["(check)"].items()))
    return "\n".join(lines)
