"""Which phase (and attention region) each GPU kernel of a profiled step belongs to, each kernel once.

The step's ranges (record_function: forward / backward / optimizer, and the attention regions inside
the forward) are CPU events. A kernel belongs to the range that contains its *launch*: the CUDA
runtime call (cudaLaunchKernel, cudaMemcpyAsync, ...) with the kernel's CUPTI correlation id. Launch
time rather than parent links, because autograd runs the backward's ops on a thread of its own while
the main thread waits inside `backward`.

Why not the profiler's per-op kernel lists (`FunctionEvent.kernels`), which our first version summed?
torch builds them by appending every kernel to *each* CPU event whose correlation id equals the
kernel's linked id. An event list that holds an op twice (or an unrelated event whose id happens to
equal the op's) gets the kernel appended twice, and a sum over the lists counts it twice: three H200
cells came out with more kernel time than wall time. Here the kernels are the device events
themselves, deduplicated, so each is counted exactly once; `appended_kernel_ms` keeps the old sum as a
diagnostic and `check` says what the trace holds that would have fooled it.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.autograd import DeviceType

from .nvtx import ATTENTION_REGIONS, MEASURED, PHASES

MATMUL = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|wgmma|cublas|matmul|aten::(mm|bmm|addmm|baddbmm)$|_mm_|triton_tem", re.I)
RUNTIME_CALL = re.compile(r"^cu[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, ...
TOP_KERNELS = 30  # per (phase, region); the rest are summed into one "(other kernels)" row
OTHER = "(other kernels)"
OUTSIDE = "(outside phases)"
NAMED = frozenset(PHASES) | frozenset(ATTENTION_REGIONS) | {MEASURED, "ProfilerStep"}
ATTRIBUTION = "unique-device-events"  # recorded in each row: how its kernels were counted
# kernel time may exceed the synchronised range it was launched in by no more than this (relative):
# on one stream, kernels run one after another inside the range
RANGE_TOLERANCE = 2e-3


def is_matmul(kernel: str) -> bool:
    return bool(MATMUL.search(kernel))


@dataclass(frozen=True)
class TraceEvent:
    """One profiler event, reduced to what attribution needs (times in us)."""

    name: str
    on_device: bool  # a GPU activity: kernel, memcpy, memset, or the GPU-side copy of a range
    start_us: float
    end_us: float
    corr: int = 0  # correlation id: torch's op id for ops, CUPTI's for runtime calls and kernels
    linked: int = 0  # the op a runtime call or kernel was issued from (0: none)
    stream: int = 0
    device: int = 0
    annotation: bool = False  # a record_function range, or its GPU-side copy


def from_kineto(events: Iterable[Any]) -> list[TraceEvent]:
    """TraceEvents from torch's raw profiler events (`prof.profiler.kineto_results.events()`)."""
    out = []
    for e in events:
        user = getattr(e, "is_user_annotation", None)
        out.append(TraceEvent(e.name(), e.device_type() != DeviceType.CPU, e.start_ns() / 1e3, e.end_ns() / 1e3,
                              e.correlation_id(), e.linked_correlation_id(), e.device_resource_id(),
                              e.device_index(), bool(user()) if user else False))
    return out


def _ranges(events: Iterable[tuple[str, float, float]], names: Iterable[str]) -> list[tuple[str, float, float]]:
    wanted = set(names)
    return sorted(r for r in events if r[0] in wanted)


def _containing(ranges: list[tuple[str, float, float]], t: float) -> str:
    """Name of the innermost (latest-starting) range containing time t, or ''."""
    best = ""
    for name, start, end in ranges:
        if start <= t <= end:
            best = name
    return best


def unique_kernels(events: list[TraceEvent]) -> tuple[list[TraceEvent], int]:
    """The device activities that are work (kernels, memcpys, memsets), each once, and how many
    exact repeats were dropped. GPU-side copies of ranges (ours, and e.g.
    "Optimizer.step#AdamW.step") span idle gaps and are left out."""
    range_names = {e.name for e in events if not e.on_device and e.annotation} | NAMED
    seen, out, repeats = set(), [], 0
    for e in events:
        if not e.on_device or e.annotation or e.name in range_names:
            continue
        key = (e.device, e.stream, e.corr, e.start_us, e.end_us, e.name)
        if key in seen:
            repeats += 1
            continue
        seen.add(key)
        out.append(e)
    return out, repeats


def stream_overlap_us(kernels: list[TraceEvent]) -> float:
    """Time during which two kernels of the same stream overlap: 0 for a sane trace (a stream runs
    its work in order), so anything else means the same work is listed twice under two ids."""
    by_stream: dict[tuple[int, int], list[TraceEvent]] = defaultdict(list)
    for k in kernels:
        by_stream[(k.device, k.stream)].append(k)
    overlap = 0.0
    for ks in by_stream.values():
        ks.sort(key=lambda k: k.start_us)
        reach = -math.inf
        for k in ks:
            overlap += max(0.0, min(reach, k.end_us) - k.start_us)
            reach = max(reach, k.end_us)
    return overlap


def repeated_host_ids(events: list[TraceEvent]) -> tuple[int, int]:
    """(exact copies, collisions) among the CPU events torch would append kernels to (linked id 0):
    events whose correlation id another such event already has, either as a copy of it (same name
    and times) or as an unrelated event with the same number. Either makes `FunctionEvent.kernels`
    count the linked kernels twice."""
    first: dict[int, TraceEvent] = {}
    copies = collisions = 0
    for e in events:
        if e.on_device or e.linked or not e.corr:
            continue
        seen = first.setdefault(e.corr, e)
        if seen is e:
            continue
        if (seen.name, seen.start_us, seen.end_us) == (e.name, e.start_us, e.end_us):
            copies += 1
        else:
            collisions += 1
    return copies, collisions


# --8<-- [start:attribute]
def launched_kernels(events: list[TraceEvent]) -> tuple[list[tuple[float, TraceEvent]], Counter, int]:
    """Each unique device kernel with the host time of its launch: the runtime call with the
    kernel's own CUPTI correlation id and linked op (both must match, so an op id that happens to
    equal some runtime call's id cannot pull a kernel elsewhere); failing that, the start of the op
    it is linked to; failing that, its own start on the GPU. Returns ((launch us, kernel) pairs, how
    many were placed each way, how many exact repeats were dropped)."""
    launches: dict[tuple[int, int], float] = {}
    op_starts: dict[int, float] = {}
    for e in events:
        if e.on_device:
            continue
        if e.linked or RUNTIME_CALL.match(e.name):
            launches.setdefault((e.corr, e.linked), e.start_us)
        elif not e.annotation:
            op_starts.setdefault(e.corr, e.start_us)
    kernels, repeats = unique_kernels(events)
    out, placed = [], Counter()
    for k in kernels:
        t = launches.get((k.corr, k.linked)) if k.corr else None
        how = "launch_by_runtime_call"
        if t is None and k.linked in op_starts:
            t, how = op_starts[k.linked], "launch_by_op"
        if t is None:
            t, how = k.start_us, "placed_by_gpu_time"
        placed[how] += 1
        out.append((t, k))
    return out, placed, repeats


def attribute_kernels(events: Iterable[TraceEvent]) -> tuple[list[dict], dict[str, dict]]:
    """(kernel rows, per-phase totals) of one profiled step, every device kernel counted once.

    Each unique kernel goes to the phase and attention region containing its launch: the runtime
    call with the kernel's own CUPTI correlation id and linked op (both must match, so an op id that
    happens to equal some runtime call's id cannot pull a kernel elsewhere); failing that, the start
    of the op it is linked to; failing that, its own start on the GPU (right for the phase, since
    each phase ends with a synchronize). totals["(check)"] says how each was placed.
    """
    events = list(events)
    spans = [(e.name, e.start_us, e.end_us) for e in events if not e.on_device and e.name in NAMED]
    phases, regions = _ranges(spans, PHASES), _ranges(spans, ATTENTION_REGIONS)
    launched, placed, repeats = launched_kernels(events)
    kernels = [k for _, k in launched]
    work = [(t, k.name, k.end_us - k.start_us) for t, k in launched]
    rows, totals = aggregate(work, phases, regions)
    unique_ms = sum(d for *_, d in work) / 1e3
    attributed_ms = sum(t["kernel_ms"] for t in totals.values())
    # every unique kernel lands in exactly one phase (or "outside"): nothing lost, nothing twice
    assert math.isclose(attributed_ms, unique_ms, rel_tol=1e-9, abs_tol=1e-9), (attributed_ms, unique_ms)
    copies, collisions = repeated_host_ids(events)
    totals["(all device events)"] = {"kernel_ms": unique_ms}
    totals["(check)"] = {"unique_kernel_ms": unique_ms, "attributed_ms": attributed_ms,
                         "repeated_device_events": repeats, "stream_overlap_ms": stream_overlap_us(kernels) / 1e3,
                         "copied_host_events": copies, "colliding_host_ids": collisions,
                         **{h: placed[h] for h in ("launch_by_runtime_call", "launch_by_op", "placed_by_gpu_time")}}
    return rows, totals
# --8<-- [end:attribute]


def aggregate(work: Iterable[tuple[float, str, float]], phases, regions) -> tuple[list[dict], dict[str, dict]]:
    """Rows per (phase, region, kernel) and totals per phase from (launch us, kernel, duration us)."""
    agg: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for start, kernel, dur in work:
        phase = _containing(phases, start) or OUTSIDE
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
    rows = [{"phase": p, "region": r, "kernel": k[:200], "matmul": is_matmul(k), "calls": c,
             "total_ms": us / 1e3, "share": us / 1e3 / totals[p]["kernel_ms"] if totals[p]["kernel_ms"] else None}
            for (p, r, k), (c, us) in agg.items()]
    return top_rows(rows), totals


def top_rows(rows: list[dict]) -> list[dict]:
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


def _function_spans(events: list[Any]) -> list[tuple[str, float, float]]:
    return [(e.name, e.time_range.start, e.time_range.end) for e in events
            if e.device_type == DeviceType.CPU and e.name in NAMED]


def attribute_cpu_ops(function_events: Iterable[Any]) -> tuple[list[dict], dict[str, dict]]:
    """The same table for a CPU-only run, which has no kernels: each op's self CPU time stands in
    (so the sweep and its tests run without a GPU). Reads torch's FunctionEvents."""
    events = list(function_events)
    spans = _function_spans(events)
    work = [(e.time_range.start, e.name, e.self_cpu_time_total) for e in events
            if e.device_type == DeviceType.CPU and e.name not in NAMED and e.self_cpu_time_total > 0]
    return aggregate(work, _ranges(spans, PHASES), _ranges(spans, ATTENTION_REGIONS))


def appended_kernel_ms(function_events: Iterable[Any]) -> dict[str, float]:
    """Per phase, the kernel ms that summing torch's per-op kernel lists gives (our first version):
    a kernel appended to two CPU events is counted twice. Kept beside the unique count as evidence."""
    events = list(function_events)
    phases = _ranges(_function_spans(events), PHASES)
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.device_type != DeviceType.CPU or e.name in NAMED:
            continue
        for k in e.kernels:
            out[_containing(phases, e.time_range.start) or OUTSIDE] += k.duration / 1e3
    return dict(out)
