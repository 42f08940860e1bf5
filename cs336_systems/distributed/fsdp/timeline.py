"""One profiled FSDP step, reduced to what the timeline figure asks: did each layer's all-gather
finish before the layer needed it?

Our FSDP labels its work for torch.profiler (comm.label): `fsdp:all_gather:<layer>` around
starting a gather, `fsdp:layer:<layer>` around the layer's forward call,
`fsdp:reduce_scatter:<layer>` around starting a gradient's reduce-scatter. On a GPU the profiler
also draws each range on the GPU timeline, spanning the kernels launched inside it, so an
all-gather's GPU range ends when its NCCL kernel ends and a layer's begins with its first kernel.

For each forward use p (in the order the layers ran): the gather was *in time* if it ended before
the previous layer's compute ended; otherwise the compute stream could only go on once the gather
ended, and `waited_ms` bounds that stall (from the previous layer's end to the gather's end, or to
this layer's start if earlier). On CPU (gloo) the ranges are host times of issuing, which say
nothing about the transfer: only the lists are kept there, no verdicts.
"""

from __future__ import annotations

from collections import defaultdict

import torch

PREFIX = "fsdp:"


def _ranges(prof: torch.profiler.profile, t0_ms: float) -> tuple[list[tuple[str, float, float]], bool]:
    """(name, start ms, end ms) of every fsdp:* range, GPU projections if there are any."""
    events = [e for e in prof.events() if e.name.startswith(PREFIX)]
    on_gpu = any(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
    want = torch.autograd.DeviceType.CUDA if on_gpu else torch.autograd.DeviceType.CPU
    ranges = sorted((e.name, e.time_range.start / 1e3 - t0_ms, e.time_range.end / 1e3 - t0_ms)
                    for e in events if e.device_type == want)
    return sorted(ranges, key=lambda r: r[1]), on_gpu


def layer_timeline(prof: torch.profiler.profile, t0_ms: float = 0.0) -> dict:
    """Per forward use: its all-gather's and its compute's [start, end] (ms from t0_ms), whether
    the gather was late, and an upper bound on the stall; plus backward gathers and reduce-scatters."""
    ranges, on_gpu = _ranges(prof, t0_ms)
    by_kind: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for name, start, end in ranges:
        kind, _, layer = name.removeprefix(PREFIX).partition(":")
        by_kind[kind].append((layer, round(start, 3), round(end, 3)))
    gathers = by_kind["all_gather"]
    # --8<-- [start:verdict]
    uses, previous_end = [], None
    for layer, start, end in by_kind["layer"]:
        gather = max((g for g in gathers if g[0] == layer and g[1] <= start),
                     key=lambda g: g[1], default=None)
        use = {"layer": layer, "compute": [start, end],
               "all_gather": None if gather is None else [gather[1], gather[2]]}
        if on_gpu and gather is not None and previous_end is not None:
            use["late"] = gather[2] > previous_end
            use["waited_ms"] = round(max(0.0, min(gather[2], start) - previous_end), 3)
        uses.append(use)
        previous_end = end
    # --8<-- [end:verdict]
    forward_end = uses[-1]["compute"][1] if uses else float("-inf")
    return {
        "on_gpu": on_gpu,
        "uses": uses,
        "late_count": sum(bool(u.get("late")) for u in uses) if on_gpu else None,
        "waited_ms_total": round(sum(u.get("waited_ms", 0.0) for u in uses), 3) if on_gpu else None,
        "backward_all_gathers": [list(g) for g in gathers if g[1] > forward_end],
        "reduce_scatters": [list(r) for r in by_kind["reduce_scatter"]],
    }
