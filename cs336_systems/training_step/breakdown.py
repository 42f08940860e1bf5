"""Where one profiled training step's GPU time goes, by category: the page's breakdown.

    rows = breakdown(events)      # events: profiling.kernel_attribution.TraceEvent, one step's trace

Each device kernel (counted once, profiling/kernel_attribution.py) goes to the first category
that claims it, by the ranges that contain its *launch* (the step's record_function ranges,
training_step/annotate.py) and then by its name:

    optimizer                     launched in the optimizer range
    loss                          launched in the loss head's forward range or in its backward
                                  (from the loss's gradient to the hidden states' gradient): the LM
                                  head's matmuls and the cross-entropy, in any variant
    attention backward            an attention backward kernel (ours, SDPA's: ATTENTION_BACKWARD)
    attention forward             an attention forward kernel launched in the forward
    recompute: attention forward  one launched in the backward: a checkpointed block recomputing
                                  it (the other recomputed ops cannot be told from the backward's
                                  own inside a compiled backward graph; they count where they fall)
    matmul                        any other GEMM (kernel_attribution.is_matmul)
    elementwise and norms         everything else in the forward and backward: norms, RoPE,
                                  SwiGLU's gate, residual adds, casts, copies, the embedding
    other                         outside those ranges (zero_grad's memsets)
    idle                          the step's wall time minus the union of every kernel's busy time
                                  (on every stream): when the GPU ran nothing at all

A row per category: milliseconds, share of the step's wall time, kernel count, the split by
phase, and the longest kernels by name. Categories' ms add up to the kernels' total (busy plus any
overlap between streams); with idle they add up to the wall time when streams do not overlap.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from cs336_systems.profiling.kernel_attribution import TraceEvent, is_matmul, launched_kernels

STEP, FORWARD, BACKWARD, OPTIMIZER = "step", "forward", "backward", "optimizer"
LOSS_FORWARD, LOSS_BACKWARD = "loss", "loss_backward"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
RANGES = (STEP, *PHASES, LOSS_FORWARD, LOSS_BACKWARD)
CATEGORIES = ("matmul", "attention forward", "attention backward", "recompute: attention forward",
              "elementwise and norms", "loss", "optimizer", "other", "idle")
TOP = 5  # kernel names kept per category

# Attention kernels by name. Ours (attention/*_kernel.py, fast/, fast/gluon/) by function name;
# SDPA's: cuDNN (..._sdpa_..._fprop / _bprop), FlashAttention-2 (flash_fwd / flash_bwd), the
# memory-efficient one (fmha_cutlassF / fmha_cutlassB). Backward is tried first: its names
# contain the forward's words in places (flash_bwd_dot_do_o, bwd_preprocess).
# On the CPU (cpu_stand_in) the ops' names: our custom ops and aten's SDPA ops.
# Ours: every backward kernel's name starts with bwd (tests/test_training_step_profile.py reads the
# names from the kernels' sources, so a new kernel that breaks the rule fails there).
ATTENTION_BACKWARD = re.compile(
    r"^bwd\w*_kernel$"
    r"|flash_bwd|sdpa.*bprop|bprop.*sdpa|fmha_cutlassB"
    r"|flash_attention_bwd|attention\w*backward", re.I)  # the last: aten's SDPA backward, autograd's nodes
ATTENTION_FORWARD = re.compile(
    r"^\w*fwd\w*_kernel$|flash_fwd|sdpa.*fprop|fprop.*sdpa|fmha_cutlassF|attention_forward"
    r"|flash_attention_fwd|scaled_dot_product", re.I)

INDUCTOR_FUSED = re.compile(r"triton_(poi|red|per)_fused")

# --8<-- [start:category]
def kernel_category(name: str, phase: str, in_loss: bool) -> str:
    """The category of one kernel (module docstring) from its phase, whether it was launched in
    the loss head, and its name."""
    if phase == OPTIMIZER:
        return "optimizer"
    if phase not in (FORWARD, BACKWARD):
        return "other"
    if in_loss:
        return "loss"
    if INDUCTOR_FUSED.match(name):  # compile's fused pointwise and reductions (RoPE, transposes),
        return "elementwise and norms"  # though their names list the attention op they fed
    if ATTENTION_BACKWARD.search(name):
        return "attention backward"
    if ATTENTION_FORWARD.search(name):
        return "attention forward" if phase == FORWARD else "recompute: attention forward"
    if is_matmul(name):
        return "matmul"
    return "elementwise and norms"
# --8<-- [end:category]


def _inside(spans: list[tuple[float, float]], t: float) -> bool:
    return any(start <= t <= end for start, end in spans)


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def breakdown(events: Iterable[TraceEvent]) -> list[dict]:
    """One row per category of the step in `events` (module docstring); times in ms."""
    events = list(events)
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if not e.on_device and e.name in RANGES:
            spans[e.name].append((e.start_us, e.end_us))
    if len(spans[STEP]) != 1:
        raise ValueError(f"the trace must hold exactly one {STEP!r} range, it holds {len(spans[STEP])}")
    step_start, step_end = spans[STEP][0]
    wall_us = step_end - step_start
    loss_spans = spans[LOSS_FORWARD] + spans[LOSS_BACKWARD]
    launched, _, _ = launched_kernels(events)
    us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    by_phase: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    names: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    busy = []
    for t, k in launched:
        if not step_start <= t <= step_end:
            continue  # launched before or after the profiled step
        phase = next((p for p in PHASES if _inside(spans[p], t)), "")
        category = kernel_category(k.name, phase, _inside(loss_spans, t))
        duration = k.end_us - k.start_us
        us[category] += duration
        count[category] += 1
        by_phase[category][phase or "outside"] += duration / 1e3
        names[category][k.name] += duration / 1e3
        busy.append((max(k.start_us, step_start), min(k.end_us, step_end)))
    busy_us = union_us((s, e) for s, e in busy if e > s)
    us["idle"] = max(0.0, wall_us - busy_us)
    rows = []
    for category in CATEGORIES:
        top = sorted(names[category].items(), key=lambda kv: -kv[1])[:TOP]
        rows.append({"category": category, "ms": us[category] / 1e3,
                     "share_of_wall": us[category] / wall_us if wall_us > 0 else None,
                     "kernels": count[category], "by_phase_ms": dict(by_phase[category]),
                     "top_kernels": [{"kernel": n[:200], "ms": ms} for n, ms in top],
                     "step_wall_ms": wall_us / 1e3, "busy_ms": busy_us / 1e3})
    return rows


def cpu_stand_in(function_events: Iterable) -> list[TraceEvent]:
    """A CPU run has no kernels: each op's self CPU time stands in for one, at the op's start (so
    the CLI and its tests run without a GPU; idle is then the host time outside any op's own
    work, not a GPU's). An op a selective checkpoint answers from its cache still shows as an op
    here (on a GPU it launches no kernel). Reads torch's FunctionEvents (`prof.events()`)."""
    from torch.autograd import DeviceType

    out = []
    for e in function_events:
        if e.device_type != DeviceType.CPU:
            continue
        start = e.time_range.start
        if e.name in RANGES:
            out.append(TraceEvent(e.name, False, start, e.time_range.end, annotation=True))
        elif e.self_cpu_time_total > 0:
            out.append(TraceEvent(e.name, True, start, start + e.self_cpu_time_total))
    return out
