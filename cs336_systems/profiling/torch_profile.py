"""torch.profiler in place of Nsight Systems: one profiled step -> per-phase kernel table + Chrome trace.

Every kernel is attributed to the phase (forward / backward / optimizer) and, inside the forward's
attention, to the region (attn_scores / attn_softmax / attn_output) whose record_function range
contains the CPU-side launch of the op that issued it. Attributing by launch time, not by the
profiler's parent links, also catches the backward ops, which autograd runs on its own thread
while the main thread waits inside the `backward` range.
"""

from __future__ import annotations

import re
import timeit
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

from cs336_systems.bench.timing import synchronize
from cs336_systems.model import use_attention
from cs336_systems.model.config import ModelConfig

from .nvtx import ATTENTION_REGIONS, PHASES, annotated_attention
from .steps import make_optimizer, make_step, phase_ranges, random_batch

MATMUL = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|wgmma|cublas|matmul|aten::(mm|bmm|addmm|baddbmm)$|_mm_|triton_tem", re.I)
TOP_KERNELS = 30  # per (phase, region); the rest are summed into one "(other kernels)" row
OTHER = "(other kernels)"


def is_matmul(kernel: str) -> bool:
    return bool(MATMUL.search(kernel))


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


def _ranges(events: Iterable[Any], names: Iterable[str]) -> list[tuple[str, float, float]]:
    wanted = set(names)
    return sorted((e.name, e.time_range.start, e.time_range.end) for e in events
                  if e.name in wanted and e.device_type == DeviceType.CPU)


def _containing(ranges: list[tuple[str, float, float]], t: float) -> str:
    """Name of the innermost (latest-starting) range containing time t, or ''."""
    best = ""
    for name, start, end in ranges:
        if start <= t <= end:
            best = name
    return best


# --8<-- [start:attribute]
def attribute_kernels(events: Iterable[Any]) -> tuple[list[dict], dict[str, dict]]:
    """(kernel rows, per-phase totals) from a profiler's events.

    GPU: each op's launched kernels (FunctionEvent.kernels, durations in us of GPU time).
    CPU-only runs have no kernels; there each op's self CPU time stands in, so the same table
    (and the tests) work without a GPU.
    """
    events = list(events)
    phases, regions = _ranges(events, PHASES), _ranges(events, ATTENTION_REGIONS)
    named = set(PHASES) | set(ATTENTION_REGIONS) | {"measured", "ProfilerStep"}
    gpu = any(e.device_type == DeviceType.CUDA for e in events)
    work: list[tuple[float, str, float]] = []  # (cpu start us, kernel, duration us)
    for e in events:
        if e.device_type != DeviceType.CPU or e.name in named:
            continue
        if gpu:
            work.extend((e.time_range.start, k.name, k.duration) for k in e.kernels)
        elif e.self_cpu_time_total > 0:
            work.append((e.time_range.start, e.name, e.self_cpu_time_total))
    agg: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for start, kernel, dur in work:
        phase = _containing(phases, start) or "(outside phases)"
        region = _containing(regions, start) if phase == "forward" else ""
        cell = agg[(phase, region, kernel)]
        cell[0] += 1
        cell[1] += dur
    totals: dict[str, dict] = {}
    for (phase, _, kernel), (calls, us) in agg.items():
        t = totals.setdefault(phase, {"kernel_ms": 0.0, "matmul_ms": 0.0, "kernels": 0})
        t["kernel_ms"] += us / 1e3
        t["matmul_ms"] += us / 1e3 if is_matmul(kernel) else 0.0
        t["kernels"] += calls
    for name, start, end in phases:
        totals.setdefault(name, {"kernel_ms": 0.0, "matmul_ms": 0.0, "kernels": 0})["wall_ms"] = (end - start) / 1e3
    if gpu:  # every device event, attributed or not: a check that attribution lost nothing
        # GPU-side copies of record_function ranges (ours, and e.g. "Optimizer.step#AdamW.step")
        # are device events too, spanning idle gaps: leave out any device event named like a CPU one.
        cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
        device_us = sum(e.time_range.end - e.time_range.start for e in events
                        if e.device_type == DeviceType.CUDA and e.name not in cpu_names)
        totals["(all device events)"] = {"kernel_ms": device_us / 1e3}
    rows = [{"phase": p, "region": r, "kernel": k[:200], "matmul": is_matmul(k), "calls": c,
             "total_ms": us / 1e3, "share": us / 1e3 / totals[p]["kernel_ms"] if totals[p]["kernel_ms"] else None}
            for (p, r, k), (c, us) in agg.items()]
    return _top(rows), totals
# --8<-- [end:attribute]


def _top(rows: list[dict]) -> list[dict]:
    """Keep the TOP_KERNELS longest kernels per (phase, region); sum the rest into one row."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["phase"], r["region"])].append(r)
    out = []
    for (phase, region), rs in groups.items():
        rs.sort(key=lambda r: -r["total_ms"])
        out.extend(rs[:TOP_KERNELS])
        rest = rs[TOP_KERNELS:]
        if rest:
            share = [r["share"] for r in rest if r["share"] is not None]
            out.append({"phase": phase, "region": region, "kernel": OTHER, "matmul": False,
                        "calls": sum(r["calls"] for r in rest), "total_ms": sum(r["total_ms"] for r in rest),
                        "share": sum(share) if share else None})
    return out


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
        def factory(rng):
            return make_step(target, x, y, mode=mode, dtype=dtype, optimizer=optimizer, phase=rng)

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
    rows, totals = attribute_kernels(prof.events())
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
    return "\n".join(lines)
