"""The sharding chapter's numbers: the sharded optimizers' measured memory, time and collectives (`gpu_*`: the
2025 xl on 2 H200s, `cpu_*`: a small model on the 2-core CPU), and the accounting's computed tables."""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.sharding import accounting as acc
from cs336_systems.sharding import preset_accounting as pa
from cs336_systems.sharding.sharding_bench import COMM_BENCH, MEMORY_BENCH, METHODS, TIME_BENCH
from report.registry import register
from report.results import CPU, GPU, load_results, markdown_table, newest, with_source
from report.units import GB, GiB, MiB, near

POINTS = ["after_init", "before_step", "after_step"]
METHOD_NAMES = {"ddp": "DDP + AdamW", "sharded": "DDP + ShardedOptimizer (course)",
                "zero1": "ZeRO1Optimizer (ours)", "zero_redundancy": "DDP + ZeroRedundancyOptimizer"}
SHARDED = ("sharded", "zero1", "zero_redundancy")
STAGE_NAMES = {"ddp": "DDP", "sharded": "course ShardedOptimizer", "zero1": "ZeRO-1",
               "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
# the collectives benchmark's ops, in the table's order, and which method uses each
COLLECTIVE_USERS = {"all_reduce": "DDP (all methods but ZeRO-1)", "broadcast_per_parameter": "course, after the step",
                    "reduce_scatter": "ZeRO-1, before the step", "all_gather": "ZeRO-1, after the step"}
XL_PARAMS = count_parameters(get_config("xl"))["total"]


def _newest(bench: str, device: str, **orders: list[str]) -> pd.DataFrame:
    """The newest ok row of each key (the columns named), sorted by their listed orders, indexed by the key."""
    df = newest(load_results(bench, device, status="ok"), list(orders))
    rank = {column: {v: i for i, v in enumerate(values)} for column, values in orders.items()}
    return df.sort_values(list(orders), key=lambda col: col.map(rank[col.name])).set_index(list(orders))


memory = lambda device=CPU: _newest(MEMORY_BENCH, device, method=METHODS, point=POINTS)
times = lambda device=CPU: _newest(TIME_BENCH, device, method=METHODS)
collectives = lambda device=CPU: _newest(COMM_BENCH, device, op=list(COLLECTIVE_USERS))
_mem = lambda device, method, point, column: float(memory(device).loc[(method, point), column])
_time = lambda device, method, column="step_ms": float(times(device).loc[method, column])
measured_collective_ms = lambda op, device=CPU: float(collectives(device).loc[op, "ms"])


# bytes by kind (params, grads, optimizer_state, activations, total) as a table's GiB columns
gib_columns = lambda kinds, total: {f"{total if k == 'total' else k.replace('_', ' ')} (GiB)": v / GiB
                                    for k, v in kinds.items()}


def measured_memory_table(device: str = CPU) -> str:
    """Per-rank MiB by kind at the three points, one row per (method, point)."""
    df = memory(device).reset_index()
    cols = {"params_bytes": "params", "grads_bytes": "grads", "state_bytes": "optimizer state",
            "activations_bytes": "activations", "tensor_bytes": "sum"}
    if "peak_bytes" in df:  # the CPU run has no allocator to ask
        cols.update({"allocated_bytes": "allocated", "peak_bytes": "peak since previous point"})
    out = pd.DataFrame({"method": df["method"].map(METHOD_NAMES), "point": df["point"],
                        **{f"{name} (MiB)": df[c] / MiB for c, name in cols.items()}})
    return with_source(out, MEMORY_BENCH, df, device=device, floatfmt=".2f")


def measured_time_table(device: str = CPU) -> str:
    df = times(device).reset_index()
    out = pd.DataFrame({
        "method": df["method"].map(METHOD_NAMES), "step (ms, median)": df["step_ms"],
        "step (ms, min)": df["step_ms_min"], "optimizer step (ms, median)": df["optimizer_step_ms"],
        "optimizer step (ms, min)": df["optimizer_step_ms_min"],
        "vs DDP + AdamW": df["step_ms"] / _time(device, "ddp"), "host load (1 min)": df["loadavg_1m"]})
    return with_source(out, TIME_BENCH, df, device=device)


def measured_collectives_table(device: str = CPU) -> str:
    """Each method's communication alone, on the model's fp32 sizes."""
    df = collectives(device).reset_index()
    out = pd.DataFrame({"collective": df["op"], "used by": df["op"].map(COLLECTIVE_USERS),
                        "MiB": df["bytes"] / MiB, "calls": df["tensors"], "ms (median)": df["ms"],
                        "GB/s (bytes / time)": df["bytes"] / df["ms"] / 1e6})
    return with_source(out, COMM_BENCH, df, device=device)


# the formulas at the GPU run's setting, 2 ranks of 2 sequences of 512 (size 2.7B: the 2026 xl at that setting)
computed_memory = lambda stage, size="xl": acc.transformer_memory(get_config(size, 512), 2, 2, stage, context=512)


def computed_memory_table() -> str:
    """GiB per rank by kind, fp32 AdamW, from the formulas (the course's optimizer and ZeRO-1 keep the same bytes)."""
    names = {**STAGE_NAMES, "sharded": "course ShardedOptimizer, ZeRO-1"}
    rows = [{"stage": names[s], **gib_columns(computed_memory(s).as_dict(), "total")}
            for s in ("ddp", "sharded", "zero2", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


# optimizer_state_sharding_accounting (a) for the 2026 xl (our 2.7B): bytes per rank by kind at the three points
points_2026 = lambda: {stage: pa.memory_at_points(pa.XL_2026, stage) for stage in ("ddp", "sharded")}


def points_2026_table() -> str:
    rows = [{"method": name, "point": point, **gib_columns(kinds, "sum")}
            for stage, name in (("ddp", "DDP + AdamW"), ("sharded", "course ShardedOptimizer"))
            for point, kinds in points_2026()[stage].items()]
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


def zero_bytes_table(world_sizes=(1, 2, 8, 64)) -> str:
    """Bytes per parameter per rank with mixed-precision AdamW (the ZeRO paper's Figure 1)."""
    rows = [{"stage": STAGE_NAMES[s], **{f"N = {n}": acc.bytes_per_parameter(s, n) for n in world_sizes}}
            for s in ("ddp", "zero1", "zero2", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".3g")


# GB each of `world` ranks receives per step, the 2025 xl's gradients and parameters of `b` bytes each
received_gb = lambda stage, world, b=4: acc.communication_bytes_per_rank(stage, XL_PARAMS, world, b, b) / GB


def communication_table() -> str:
    """GB each rank receives per step for the 2025 xl, fp32 gradients and parameters, and the ratio to DDP."""
    rows = [{"stage": STAGE_NAMES[s], **{f"GB, N = {n}": received_gb(s, n) for n in (2, 8)},
             "x DDP": received_gb(s, 2) / received_gb("ddp", 2)} for s in ("ddp", "sharded", "zero1", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".3g")


# -- the quantities the chapter's sentences quote -----------------------------------------------

# method `m` against DDP + AdamW (a ratio, bytes saved, a signed change, ms more); its step less its optimizer step
_after = lambda device, m, column: _mem(device, m, "after_step", column)
state_ratio = lambda device, m: _after(device, m, "state_bytes") / _after(device, "ddp", "state_bytes")
peak_saved = lambda device, m: _after(device, "ddp", "peak_bytes") - _after(device, m, "peak_bytes")
rel_step = lambda device, m: _time(device, m) / _time(device, "ddp") - 1
optimizer_step_extra_ms = lambda device, m: (_time(device, m, "optimizer_step_ms")
                                             - _time(device, "ddp", "optimizer_step_ms"))
forward_backward_ms = lambda device, m: _time(device, m) - _time(device, m, "optimizer_step_ms")


def predicted_within(device: str = GPU) -> float:
    """The largest gap (bytes) between the computed (the GPU run's setting) and the measured state and activations."""
    pred = computed_memory("ddp")
    return max(abs(_mem(device, "ddp", "after_step", "state_bytes") - pred.optimizer_state),
               abs(_mem(device, "ddp", "before_step", "activations_bytes") - pred.activations))


def rs_ag_over_ar(device: str) -> float:
    """Reduce-scatter plus all-gather, over one all-reduce of the same buffer."""
    ms = collectives(device)["ms"]
    return (ms["reduce_scatter"] + ms["all_gather"]) / ms["all_reduce"]


def ddp_run_move() -> float:
    """How far PyTorch's DDP step (xl, 2 H200s) moved between the DDP chapter's runs, relative."""
    from report import ddp  # ddp reads this chapter's collectives: imported late, no cycle

    step = ddp.per_run(GPU, "step_ms")["torch-ddp"]
    return (step.max() - step.min()) / step.median()


def _points_2026_as_for_the_2025_xl() -> bool:
    """The sharded optimizer's state after the step is half of DDP's; every other kind is the same."""
    ddp, sharded = points_2026()["ddp"], points_2026()["sharded"]
    same = all(ddp[pt][k] == sharded[pt][k] for pt in ddp for k in ("params", "grads", "activations"))
    return same and sharded["after_step"]["optimizer_state"] * 2 == ddp["after_step"]["optimizer_state"]


def _three_points_as_expected() -> bool:
    """After init no gradients or state; before the step gradients and activations; after it AdamW's moments."""
    return all(_mem(GPU, m, "after_init", "grads_bytes") == 0 == _mem(GPU, m, "after_init", "state_bytes")
               and _mem(GPU, m, "before_step", "grads_bytes") == _mem(GPU, m, "before_step", "params_bytes")
               and _mem(GPU, m, "before_step", "activations_bytes") > 0 and _after(GPU, m, "state_bytes") > 0
               for m in ("ddp",) + SHARDED)


# DDP's allocation after construction less ZeRO-1's: the reducer's copy of the gradients
init_lead = lambda: (_mem(GPU, "ddp", "after_init", "allocated_bytes")
                     - _mem(GPU, "zero1", "after_init", "allocated_bytes"))
# forward and backward under the three methods that wrap the model in DDP
_ddp_fb = lambda: [forward_backward_ms(GPU, m) for m in ("ddp", "sharded", "zero_redundancy")]
_gib = lambda x, fmt=".2f": f"{x / GiB:{fmt}}"


register("sharding", facts={
    "gpu_params_gib": lambda: _gib(_mem(GPU, "ddp", "after_init", "params_bytes")),
    "gpu_acts_gib": lambda: _gib(_mem(GPU, "ddp", "before_step", "activations_bytes")),
    "gpu_state_ddp_gib": lambda: _gib(_after(GPU, "ddp", "state_bytes")),
    "gpu_state_sharded_gib": lambda: _gib(_after(GPU, "sharded", "state_bytes")),
    # the allocator's, to a tenth
    **{f"gpu_peak_{m}_gib": (lambda m=m: _gib(_after(GPU, m, "peak_bytes"), ".1f"))
       for m in ("ddp", "sharded", "zero1")},
    "gpu_predicted_within_kib": lambda: f"{predicted_within(GPU) / 1024:.0f}",
    **{f"{d}_n_params": (lambda dev=dev: f"{int(_time(dev, 'ddp', 'n_params')):,}")
       for d, dev in (("gpu", GPU), ("cpu", CPU))},
    "gpu_step_ddp_ms": lambda: f"{_time(GPU, 'ddp'):.0f}",
    **{f"gpu_rel_{m}": (lambda m=m: f"{rel_step(GPU, m):+.1%}") for m in SHARDED},
    "gpu_opt_sharded_extra_ms": lambda: f"{optimizer_step_extra_ms(GPU, 'sharded'):.0f}",
    "gpu_warmup": lambda: int(_time(GPU, "ddp", "warmup")),
    "gpu_steps": lambda: int(_time(GPU, "ddp", "steps")),
    "ddp_run_move": lambda: f"{ddp_run_move():.1%}",
    "gpu_rs_ag_over_ar": lambda: f"{rs_ag_over_ar(GPU):.2f}",
    "cpu_rs_ag_over_ar": lambda: f"{rs_ag_over_ar(CPU):.1f}",
}, tables={
    **{f"{d}_{kind}": (lambda dev=dev, t=t: t(dev)) for d, dev in (("gpu", GPU), ("cpu", CPU))
       for kind, t in (("memory", measured_memory_table), ("time", measured_time_table),
                       ("collectives", measured_collectives_table))},
    "zero_bytes": zero_bytes_table, "communication": communication_table, "computed_memory": computed_memory_table,
    "points_2026": points_2026_table,
}, claims={
    "points_2026_as_for_the_2025_xl": _points_2026_as_for_the_2025_xl,
    "three_points_as_expected": _three_points_as_expected,
    # within 1%: AdamW's per-tensor step counters and the uneven split of whole tensors
    "sharding_halves_the_state": lambda: all(abs(state_ratio(d, m) - 0.5) <= 0.01 for d in (GPU, CPU) for m in SHARDED),
    # KiB: under 1 MiB of GiBs of state and activations
    "prediction_held": lambda: predicted_within(GPU) < MiB,
    "peak_falls_more_than_half_the_state": lambda: all(
        peak_saved(GPU, m) > _mem(GPU, "ddp", "after_step", "state_bytes") / 2 for m in SHARDED),
    # ZeRO-1 saves the most; DDP's lead after init within 2% of the gradients' bytes, more than ZeRO-1's at the peak
    "zero1_saves_the_most_without_a_reducer": lambda: max(SHARDED, key=lambda m: peak_saved(GPU, m)) == "zero1"
    and near(init_lead(), _mem(GPU, "ddp", "before_step", "grads_bytes"), 0.02)
    and peak_saved(GPU, "zero1") - peak_saved(GPU, "sharded") < init_lead(),
    # beyond the DDP chapter's run-to-run move; nearly free: under 5% of the step
    "only_course_cost_and_zero1_gain_exceed_the_noise": lambda: ddp_run_move() < rel_step(GPU, "sharded") < 0.05
    and rel_step(GPU, "zero1") < -ddp_run_move() and abs(rel_step(GPU, "zero_redundancy")) <= ddp_run_move()
    and optimizer_step_extra_ms(GPU, "sharded") > 0,
    # the three DDP methods' forward and backward within 2%; ZeRO-1's shorter, its optimizer step the longest
    "forward_backward_alike_but_zero1": lambda: max(_ddp_fb()) / min(_ddp_fb()) < 1.02
    and forward_backward_ms(GPU, "zero1") < min(_ddp_fb()) and times(GPU)["optimizer_step_ms"].idxmax() == "zero1",
    # close: within 25%; the broadcasts over twice the all-gather
    "nccl_rs_ag_like_one_all_reduce_broadcasts_slow": lambda: abs(rs_ag_over_ar(GPU) - 1) < 0.25
    and measured_collective_ms("broadcast_per_parameter", GPU) > 2 * measured_collective_ms("all_gather", GPU),
    # gloo: over twice one all-reduce, and ZeRO-1's optimizer step longer than plain AdamW's
    "gloo_reduce_scatter_all_gather_slow": lambda: rs_ag_over_ar(CPU) > 2 and optimizer_step_extra_ms(CPU, "zero1") > 0,
})
