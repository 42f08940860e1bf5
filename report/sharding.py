"""The sharding chapter's numbers (docs/sharding.md, docs/sharding/runs.md): measured memory, time
and collectives of the sharded optimizers, and the computed memory and communication tables (from
cs336_systems.sharding.accounting).

`gpu_*` facts read the 2025 xl on 2 H200s, `cpu_*` the small model on the 2-core CPU. Memory is in
GiB per rank (2**30 bytes), times in ms; `rel_*` are signed changes against DDP + AdamW's step.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.sharding import accounting as acc
from cs336_systems.sharding import preset_accounting as pa
from cs336_systems.sharding.sharding_bench import COMM_BENCH, MEMORY_BENCH, METHODS, TIME_BENCH
from report.registry import register
from report.results import CPU, GPU, load_results, markdown_table, newest, with_source
from report.units import GB, GiB, MiB

POINTS = ["after_init", "before_step", "after_step"]
POINT_WORDS = {"after_init": "after initialisation", "before_step": "before the optimizer step",
               "after_step": "after the optimizer step"}
METHOD_NAMES = {"ddp": "DDP + AdamW", "sharded": "DDP + ShardedOptimizer (course)",
                "zero1": "ZeRO1Optimizer (ours)", "zero_redundancy": "DDP + ZeroRedundancyOptimizer"}
SHARDED = ("sharded", "zero1", "zero_redundancy")
STAGE_NAMES = {"ddp": "DDP", "sharded": "course ShardedOptimizer", "zero1": "ZeRO-1",
               "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
# the collectives benchmark's ops, in the table's order, and which method uses each
COLLECTIVE_USERS = {"all_reduce": "DDP (all methods but ZeRO-1)", "broadcast_per_parameter": "course, after the step",
                    "reduce_scatter": "ZeRO-1, before the step", "all_gather": "ZeRO-1, after the step"}
XL_PARAMS = count_parameters(get_config("xl"))["total"]


def _newest(bench: str, device: str, key: list[str]) -> pd.DataFrame:
    """The newest ok row of each `key`, indexed by it."""
    return newest(load_results(bench, device, status="ok"), key).set_index(key)


memory = lambda device=CPU: _newest(MEMORY_BENCH, device, ["method", "point"])
times = lambda device=CPU: _newest(TIME_BENCH, device, ["method"])
collectives = lambda device=CPU: _newest(COMM_BENCH, device, ["op"])
_mem = lambda device, method, point, column: float(memory(device).loc[(method, point), column])
_time = lambda device, method, column="step_ms": float(times(device).loc[method, column])
measured_step_ms = lambda method, device=CPU: _time(device, method)
measured_collective_ms = lambda op, device=CPU: float(collectives(device).loc[op, "ms"])


def _order(df: pd.DataFrame, column: str, order: list[str]) -> pd.DataFrame:
    """Rows in the given order of `column`, stable (an earlier ordering survives within ties)."""
    rank = df[column].map({v: i for i, v in enumerate(order)})
    return df.assign(_o=rank).sort_values("_o", kind="stable").drop(columns="_o")


# bytes by kind (params, grads, optimizer_state, activations, total) as a table's GiB columns
_gib_columns = lambda kinds, total: {f"{total if k == 'total' else k.replace('_', ' ')} (GiB)": v / GiB for k, v in kinds.items()}


def measured_memory_table(device: str = CPU) -> str:
    """Per-rank MiB by kind at the three points, one row per (method, point)."""
    df = _order(_order(memory(device).reset_index(), "point", POINTS), "method", METHODS)
    cols = {"params_bytes": "params", "grads_bytes": "grads", "state_bytes": "optimizer state",
            "activations_bytes": "activations", "tensor_bytes": "sum"}
    if "peak_bytes" in df:  # the CPU run has no allocator to ask
        cols.update({"allocated_bytes": "allocated", "peak_bytes": "peak since previous point"})
    out = pd.DataFrame({"method": df["method"].map(METHOD_NAMES), "point": df["point"],
                        **{f"{name} (MiB)": (df[c] / MiB).round(2) for c, name in cols.items()}})
    return with_source(out, MEMORY_BENCH, df, device=device, floatfmt=".2f")


def measured_time_table(device: str = CPU) -> str:
    df = _order(times(device).reset_index(), "method", METHODS)
    out = pd.DataFrame({
        "method": df["method"].map(METHOD_NAMES), "step (ms, median)": df["step_ms"],
        "step (ms, min)": df["step_ms_min"], "optimizer step (ms, median)": df["optimizer_step_ms"],
        "optimizer step (ms, min)": df["optimizer_step_ms_min"],
        "vs DDP + AdamW": df["step_ms"] / _time(device, "ddp"), "host load (1 min)": df["loadavg_1m"]})
    return with_source(out, TIME_BENCH, df, device=device)


def measured_collectives_table(device: str = CPU) -> str:
    """Each method's communication alone, on the model's fp32 sizes."""
    df = _order(collectives(device).reset_index(), "op", list(COLLECTIVE_USERS))
    out = pd.DataFrame({"collective": df["op"], "used by": df["op"].map(COLLECTIVE_USERS),
                        "MiB": df["bytes"] / MiB, "calls": df["tensors"], "ms (median)": df["ms"],
                        "GB/s (bytes / time)": df["bytes"] / df["ms"] / 1e6})
    return with_source(out, COMM_BENCH, df, device=device)


def predicted_memory(device: str) -> acc.MemoryBreakdown:
    """DDP's bytes by the accounting formulas, at the measured run's configuration (model, batch, ranks)."""
    r = memory(device).loc[("ddp", "after_step")]
    return acc.transformer_memory(get_config(str(r["size"]), int(r["context"])), int(r["batch"]),
                                  int(r["world_size"]), "ddp", context=int(r["context"]))


# the formulas for the 2025 xl at the GPU run's setting: 2 ranks, 2 sequences of 512 each
computed_memory = lambda stage: acc.transformer_memory(get_config("xl", 512), 2, 2, stage, context=512)


def computed_memory_table() -> str:
    """GiB per rank by kind, fp32 AdamW, from the formulas."""
    rows = [{"stage": "course ShardedOptimizer, ZeRO-1" if stage == "sharded" else STAGE_NAMES[stage],  # same bytes
             **_gib_columns(computed_memory(stage).as_dict(), "total")} for stage in ("ddp", "sharded", "zero2", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


# optimizer_state_sharding_accounting (a) for the 2026 xl (our 2.7B), the course's setting: bytes
# per rank by kind at the three points, DDP + AdamW and the course's sharded optimizer
points_2026 = lambda: {stage: pa.memory_at_points(pa.XL_2026, stage) for stage in ("ddp", "sharded")}


def points_2026_table() -> str:
    rows = [{"method": name, "point": POINT_WORDS[point], **_gib_columns(kinds, "sum")}
            for stage, name in (("ddp", "DDP + AdamW"), ("sharded", "course ShardedOptimizer"))
            for point, kinds in points_2026()[stage].items()]
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


def zero_bytes_table(world_sizes=(1, 2, 8, 64)) -> str:
    """Bytes per parameter per rank with mixed-precision AdamW (the ZeRO paper's Figure 1)."""
    rows = [{"stage": STAGE_NAMES[s], **{f"N = {n}": acc.bytes_per_parameter(s, n) for n in world_sizes}}
            for s in ("ddp", "zero1", "zero2", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".3g")


def communication_table() -> str:
    """GB each rank receives per step for the 2025 xl, fp32 gradients and parameters, and the ratio to DDP."""
    per_rank = lambda stage, n: acc.communication_bytes_per_rank(stage, XL_PARAMS, n)
    rows = [{"stage": STAGE_NAMES[s], **{f"GB, N = {n}": per_rank(s, n) / GB for n in (2, 8)},
             "x DDP": per_rank(s, 2) / per_rank("ddp", 2)} for s in ("ddp", "sharded", "zero1", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".3g")


# -- the quantities the chapter's sentences quote -----------------------------------------------

# method `m` against DDP + AdamW: its optimizer state after the step (a ratio), how much lower its
# allocator peak of the optimizer step is (bytes), its step (a signed change), how much longer its
# optimizer step is (ms); and its step less its optimizer step (ms)
state_ratio = lambda device, m: _mem(device, m, "after_step", "state_bytes") / _mem(device, "ddp", "after_step", "state_bytes")
peak_saved = lambda device, m: _mem(device, "ddp", "after_step", "peak_bytes") - _mem(device, m, "after_step", "peak_bytes")
rel_step = lambda device, m: _time(device, m) / _time(device, "ddp") - 1
optimizer_step_extra_ms = lambda device, m: _time(device, m, "optimizer_step_ms") - _time(device, "ddp", "optimizer_step_ms")
forward_backward_ms = lambda device, m: _time(device, m) - _time(device, m, "optimizer_step_ms")


def predicted_within(device: str = GPU) -> float:
    """The largest gap (bytes) between the computed and the measured state and activations."""
    pred = predicted_memory(device)
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
    """The 2026 xl's points follow the same shape: the sharded state half of DDP's after the step,
    everything else the same, and the saving larger than the 2025 xl's (more parameters); and
    preset_accounting agrees with this chapter's formula for the 2025 xl."""
    p = points_2026()
    ddp, sharded = p["ddp"], p["sharded"]
    same = all(ddp[pt][k] == sharded[pt][k] for pt in ddp for k in ("params", "grads", "activations"))
    saved = ddp["after_step"]["optimizer_state"] - sharded["after_step"]["optimizer_state"]
    old = pa.memory_at_points(pa.XL_2025, "ddp")["after_step"]
    return (same and sharded["after_step"]["optimizer_state"] * 2 == ddp["after_step"]["optimizer_state"]
            and saved > old["optimizer_state"] / 2 and old["optimizer_state"] == computed_memory("ddp").optimizer_state
            and p["ddp"]["before_step"]["activations"] == pa.fsdp_saving(pa.XL_2026)["activations"])


def _three_points_as_expected() -> bool:
    """No gradients or state after initialisation; gradients the size of the parameters and saved
    activations before the step; AdamW's moments after it."""
    return all(_mem(GPU, m, "after_init", "grads_bytes") == 0 == _mem(GPU, m, "after_init", "state_bytes")
               and _mem(GPU, m, "before_step", "grads_bytes") == _mem(GPU, m, "before_step", "params_bytes")
               and _mem(GPU, m, "before_step", "activations_bytes") > 0 and _mem(GPU, m, "after_step", "state_bytes") > 0
               for m in ("ddp",) + SHARDED)


def _reducer_holds_a_gradient_copy() -> bool:
    """DDP holds a gradient-sized copy from construction (within 2%); ZeRO-1's lead is smaller at the peak."""
    diff = _mem(GPU, "ddp", "after_init", "allocated_bytes") - _mem(GPU, "zero1", "after_init", "allocated_bytes")
    return (abs(diff / _mem(GPU, "ddp", "before_step", "grads_bytes") - 1) <= 0.02
            and peak_saved(GPU, "zero1") - peak_saved(GPU, "sharded") < diff)


def _forward_backward_alike_but_zero1() -> bool:
    """The three DDP methods within 2%; ZeRO-1's shorter, its optimizer step the longest."""
    fb = [forward_backward_ms(GPU, m) for m in ("ddp", "sharded", "zero_redundancy")]
    return (max(fb) / min(fb) < 1.02 and forward_backward_ms(GPU, "zero1") < min(fb)
            and times(GPU)["optimizer_step_ms"].idxmax() == "zero1")


_gib = lambda x: f"{x / GiB:.2f}"
# name: (method, point, column) -> GiB per rank on the GPU, two decimals
_MEMORY_GIB = {
    "gpu_params_gib": ("ddp", "after_init", "params_bytes"), "gpu_grads_gib": ("ddp", "before_step", "grads_bytes"),
    "gpu_acts_gib": ("ddp", "before_step", "activations_bytes"), "gpu_state_ddp_gib": ("ddp", "after_step", "state_bytes"),
    "gpu_state_sharded_gib": ("sharded", "after_step", "state_bytes")}
# name: (stage, point, kind) -> GiB per rank of the 2026 xl, two decimals
_POINTS_2026_GIB = {
    "xl2026_params_gib": ("ddp", "after_init", "params"), "xl2026_acts_gib": ("ddp", "before_step", "activations"),
    "xl2026_state_ddp_gib": ("ddp", "after_step", "optimizer_state"),
    "xl2026_state_sharded_gib": ("sharded", "after_step", "optimizer_state"),
    "xl2026_after_ddp_gib": ("ddp", "after_step", "total"), "xl2026_after_sharded_gib": ("sharded", "after_step", "total")}


register("sharding", facts={
    **{name: (lambda spec=spec: _gib(_mem(GPU, *spec))) for name, spec in _MEMORY_GIB.items()},
    **{name: (lambda s=s, p=p, k=k: _gib(points_2026()[s][p][k])) for name, (s, p, k) in _POINTS_2026_GIB.items()},
    "gpu_state_computed_gib": lambda: _gib(predicted_memory(GPU).optimizer_state),
    "gpu_acts_computed_gib": lambda: _gib(predicted_memory(GPU).activations),
    "gpu_predicted_within_kib": lambda: f"{predicted_within(GPU) / 1024:.0f}",
    "gpu_half_state_gib": lambda: f"{_mem(GPU, 'ddp', 'after_step', 'state_bytes') / 2 / GiB:.1f}",
    **{f"gpu_init_{m}_gib": (lambda m=m: f"{_mem(GPU, m, 'after_init', 'allocated_bytes') / GiB:.1f}") for m in ("ddp", "zero1")},
    "gpu_zero1_lead_gib": lambda: f"{(peak_saved(GPU, 'zero1') - peak_saved(GPU, 'sharded')) / GiB:.1f}",
    **{f"{d}_n_params": (lambda dev=dev: f"{int(_time(dev, 'ddp', 'n_params')):,}") for d, dev in (("gpu", GPU), ("cpu", CPU))},
    **{f"gpu_peak_{m}_gib": (lambda m=m: f"{_mem(GPU, m, 'after_step', 'peak_bytes') / GiB:.1f}") for m in ("ddp", "sharded", "zero1")},
    **{f"{d}_state_ratio_{m}": (lambda dev=dev, m=m: f"{state_ratio(dev, m):.3f}") for d, dev in (("gpu", GPU), ("cpu", CPU)) for m in SHARDED},
    **{f"gpu_peak_saved_{m}_gib": (lambda m=m: f"{peak_saved(GPU, m) / GiB:.1f}") for m in SHARDED},
    **{f"gpu_step_{m}_ms": (lambda m=m: f"{_time(GPU, m):.0f}") for m in ("ddp",) + SHARDED},
    **{f"gpu_rel_{m}": (lambda m=m: f"{rel_step(GPU, m):+.1%}") for m in SHARDED},
    "gpu_warmup": lambda: int(_time(GPU, "ddp", "warmup")),
    "gpu_steps": lambda: int(_time(GPU, "ddp", "steps")),
    "gpu_std_range_ms": lambda: f"{times(GPU)['step_ms_std'].min():.0f} to {times(GPU)['step_ms_std'].max():.0f}",
    "ddp_run_move": lambda: f"{ddp_run_move():.1%}",
    **{f"{d}_opt_{m}_ms": (lambda dev=dev, m=m: f"{_time(dev, m, 'optimizer_step_ms'):.0f}")
       for d, dev in (("gpu", GPU), ("cpu", CPU)) for m in ("ddp", "zero1")},
    "gpu_opt_sharded_extra_ms": lambda: f"{optimizer_step_extra_ms(GPU, 'sharded'):.0f}",
    "gpu_fb_saved_zero1_ms": lambda: f"{forward_backward_ms(GPU, 'ddp') - forward_backward_ms(GPU, 'zero1'):.0f}",
    "gpu_rs_ag_over_ar": lambda: f"{rs_ag_over_ar(GPU):.2f}",
    "cpu_rs_ag_over_ar": lambda: f"{rs_ag_over_ar(CPU):.1f}",
    "gpu_broadcast_ms": lambda: f"{measured_collective_ms('broadcast_per_parameter', GPU):.0f}",
    "gpu_all_gather_ms": lambda: f"{measured_collective_ms('all_gather', GPU):.0f}",
    "xl_d_model": lambda: f"{get_config('xl').d_model:,}",
    "xl_params_b": lambda: f"{XL_PARAMS / 1e9:.2f}",
}, tables={
    "gpu_memory": lambda: measured_memory_table(GPU), "cpu_memory": lambda: measured_memory_table(CPU),
    "gpu_time": lambda: measured_time_table(GPU), "cpu_time": lambda: measured_time_table(CPU),
    "gpu_collectives": lambda: measured_collectives_table(GPU), "cpu_collectives": lambda: measured_collectives_table(CPU),
    "zero_bytes": zero_bytes_table, "communication": communication_table, "computed_memory": computed_memory_table,
    "points_2026": points_2026_table,
}, claims={
    "points_2026_as_for_the_2025_xl": _points_2026_as_for_the_2025_xl,
    "three_points_as_expected": _three_points_as_expected,
    # within 1%: AdamW's per-tensor step counters and the uneven split of whole tensors
    "sharding_halves_the_state": lambda: all(abs(state_ratio(d, m) - 0.5) <= 0.01 for d in (GPU, CPU) for m in SHARDED),
    # KiB: under 1 MiB of GiBs of state and activations
    "prediction_held": lambda: predicted_within(GPU) < MiB,
    "peak_falls_more_than_half_the_state": lambda: all(peak_saved(GPU, m) > _mem(GPU, "ddp", "after_step", "state_bytes") / 2 for m in SHARDED),
    "zero1_saves_the_most": lambda: max(SHARDED, key=lambda m: peak_saved(GPU, m)) == "zero1",
    "reducer_holds_a_gradient_copy": _reducer_holds_a_gradient_copy,
    "only_course_cost_and_zero1_gain_exceed_the_noise": lambda: rel_step(GPU, "sharded") > ddp_run_move()
    and rel_step(GPU, "zero1") < -ddp_run_move() and abs(rel_step(GPU, "zero_redundancy")) <= ddp_run_move(),
    # under 5% of the step
    "saving_nearly_free_in_time": lambda: rel_step(GPU, "sharded") < 0.05 and optimizer_step_extra_ms(GPU, "sharded") > 0,
    "forward_backward_alike_but_zero1": _forward_backward_alike_but_zero1,
    # close: within 25%
    "reduce_scatter_all_gather_like_one_all_reduce": lambda: abs(rs_ag_over_ar(GPU) - 1) < 0.25,
    "broadcasts_cost_more_than_all_gather": lambda: measured_collective_ms("broadcast_per_parameter", GPU) > measured_collective_ms("all_gather", GPU),
    "gloo_reduce_scatter_all_gather_slow": lambda: rs_ag_over_ar(CPU) > 2 and optimizer_step_extra_ms(CPU, "zero1") > 0,
})
