"""One training step under torch.profiler, reduced to a small timeline we can store and plot.

The profile of a step has thousands of events; the question we ask of it is narrow: when was the
device computing, when was it communicating, and how much of the communication ran while
computation was still going on. So the trace is reduced to three lists of (start_ms, end_ms):

- `phases`: the step's phases from record_function labels (forward, backward, sync, optimizer)
  on the CPU timeline;
- `compute`: when the device computed. CPU: the autograd engine's backward functions (forward ops
  are inside the forward phase). GPU: every CUDA kernel (and memcpy/memset) that is not a NCCL
  kernel. Not the GPU *user annotations*: the profiler also projects every record_function range
  (our `ddp:*` phases, c10d's) onto the GPU timeline as a CUDA-device event spanning the kernels
  launched inside it; counting those as compute made a naive step's whole sync phase "compute"
  (overlap fraction ~1 where it is 0 by construction; seen in the first H200 traces).
- `comm`: when a collective was executing. gloo runs all-reduces on its own worker threads and the
  profiler records them as `gloo:all_reduce`; on GPU, the NCCL kernels.

`overlap_fraction` = |comm ∩ compute| / |comm|: the share of communication time hidden under
computation (0 for a stage that communicates only after backward).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch
from torch.autograd.profiler import record_function

Interval = tuple[float, float]
PHASE_PREFIX = "ddp:"
PHASES = ("forward", "backward", "sync", "optimizer")


@contextmanager
def phase(name: str):
    """Label a phase of the step (only costs anything while a profiler is recording)."""
    with record_function(PHASE_PREFIX + name):
        yield


def merge(intervals: Iterable[Interval], gap: float = 0.0) -> list[Interval]:
    """Union of intervals, joining those closer than `gap`; sorted."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def total(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> float:
    """Total length of (union of a) ∩ (union of b)."""
    a, b = merge(a), merge(b)
    i = j = 0
    length = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        length += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return length


def _is_comm(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith("gloo:") or "nccl" in lowered


def _is_annotation(event) -> bool:
    """A GPU-timeline projection of a record_function range (torch marks it; older versions may
    not, so our own phase labels are also recognised by name)."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(PHASE_PREFIX)


def compact(intervals: list[Interval], max_count: int = 300) -> list[Interval]:
    """Merge until at most `max_count` intervals remain (doubling the joining gap), rounded to us."""
    merged, gap = merge(intervals), 1e-3
    while len(merged) > max_count:
        merged, gap = merge(merged, gap), gap * 2
    return [(round(a, 3), round(b, 3)) for a, b in merged]


def timeline(prof: torch.profiler.profile) -> dict:
    """Reduce a profiled step to phases, compute and comm intervals (ms from the step's start)."""
    events = prof.events()
    phases: dict[str, Interval] = {}
    compute: list[Interval] = []
    comm: list[Interval] = []
    on_gpu = any(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
    for e in events:
        start, end = e.time_range.start / 1e3, e.time_range.end / 1e3  # us -> ms
        is_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if is_gpu and _is_annotation(e):
            continue  # a CPU range drawn on the GPU timeline, not work the GPU did
        if e.name.startswith(PHASE_PREFIX) and not is_gpu:
            phases[e.name.removeprefix(PHASE_PREFIX)] = (start, end)
        elif _is_comm(e.name) and (is_gpu or not on_gpu):
            comm.append((start, end))  # CPU gloo events, or NCCL kernels on the GPU
        elif on_gpu and is_gpu:
            compute.append((start, end))
        elif not on_gpu and e.name.startswith("autograd::engine::evaluate_function"):
            compute.append((start, end))
    t0 = min((a for a, _ in phases.values()), default=0.0)
    shift = lambda ivs: [(a - t0, b - t0) for a, b in ivs]  # noqa: E731
    compute, comm = merge(shift(compute)), merge(shift(comm))
    comm_ms = total(comm)
    return {
        "phases": {k: [round(a - t0, 3), round(b - t0, 3)] for k, (a, b) in phases.items()},
        "compute": compact(compute),
        "comm": compact(comm),
        "comm_busy_ms": comm_ms,
        "overlap_fraction": intersection(comm, compute) / comm_ms if comm_ms > 0 else None,
    }
