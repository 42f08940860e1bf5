"""The sharding chapter's numbers (docs/sharding.md, docs/sharding/runs.md): measured memory, time
and collectives of the sharded optimizers, and the computed memory and communication tables (from
cs336_systems.sharding.accounting).

`gpu_*` facts read the 2025 xl on 2 H200s, `cpu_*` the small model on the 2-core CPU. Memory is in
GiB per rank (2**30 bytes), times in ms; `rel_*` are signed changes against DDP + AdamW's step.
"""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.sharding import accounting as acc
from cs336_systems.sharding import preset_accounting as pa
from cs336_systems.sharding.sharding_bench import (
    COMM_BENCH,
    MEMORY_BENCH,
    METHODS,
    TIME_BENCH,
)
from report.registry import register
from report.results import CPU, GPU, load_results, markdown_table, newest, provenance_line, source
from report.units import GB, GiB, MiB

POINTS = ["after_init", "before_step", "after_step"]
METHOD_NAMES = {"ddp": "DDP + AdamW", "sharded": "DDP + ShardedOptimizer (course)",
                "zero1": "ZeRO1Optimizer (ours)", "zero_redundancy": "DDP + ZeroRedundancyOptimizer"}
STAGE_NAMES = {"ddp": "DDP", "sharded": "course ShardedOptimizer", "zero1": "ZeRO-1",
               "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def _order(df: pd.DataFrame, column: str, order: list[str]) -> pd.DataFrame:
    """Rows in the given order of `column`, stable (an earlier ordering survives within ties)."""
    rank = df[column].map({v: i for i, v in enumerate(order)})
    return df.assign(_o=rank).sort_values("_o", kind="stable").drop(columns="_o")


def measured_memory_table(device: str = "cpu") -> str:
    """Per-rank MiB by kind at the three points, one row per (method, point)."""
    df = _order(_order(memory(device).reset_index(), "point", POINTS), "method", METHODS)
    cols = {"params_bytes": "params", "grads_bytes": "grads", "state_bytes": "optimizer state",
            "activations_bytes": "activations", "tensor_bytes": "sum"}
    if "peak_bytes" in df:
        cols.update({"allocated_bytes": "allocated", "peak_bytes": "peak since previous point"})
    out = pd.DataFrame({"method": df["method"].map(METHOD_NAMES), "point": df["point"]})
    for c, name in cols.items():
        out[f"{name} (MiB)"] = (df[c] / MiB).round(2).to_numpy()
    return markdown_table(out, floatfmt=".2f") + "\n\n" + provenance_line(df, source(MEMORY_BENCH, device))


def measured_time_table(device: str = "cpu") -> str:
    df = _order(times(device).reset_index(), "method", METHODS)
    base = float(df.loc[df["method"] == "ddp", "step_ms"].iloc[0]) if (df["method"] == "ddp").any() else math.nan
    out = pd.DataFrame({
        "method": df["method"].map(METHOD_NAMES).to_numpy(),
        "step (ms, median)": df["step_ms"].to_numpy(),
        "step (ms, min)": df["step_ms_min"].to_numpy(),
        "optimizer step (ms, median)": df["optimizer_step_ms"].to_numpy(),
        "optimizer step (ms, min)": df["optimizer_step_ms_min"].to_numpy(),
        "vs DDP + AdamW": (df["step_ms"] / base).to_numpy(),
        "host load (1 min)": df["loadavg_1m"].to_numpy()})
    return markdown_table(out, floatfmt=".3g") + "\n\n" + provenance_line(df, source(TIME_BENCH, device))


def measured_collectives_table(device: str = "cpu") -> str:
    """Each method's communication alone, on the model's fp32 sizes."""
    order = ["all_reduce", "broadcast_per_parameter", "reduce_scatter", "all_gather"]
    df = _order(newest(load_results(COMM_BENCH, device, status="ok"), ["op"]), "op", order)
    who = {"all_reduce": "DDP (all methods but ZeRO-1)", "broadcast_per_parameter": "course, after the step",
           "reduce_scatter": "ZeRO-1, before the step", "all_gather": "ZeRO-1, after the step"}
    out = pd.DataFrame({"collective": df["op"].to_numpy(), "used by": df["op"].map(who).to_numpy(),
                        "MiB": (df["bytes"] / MiB).to_numpy(), "calls": df["tensors"].to_numpy(),
                        "ms (median)": df["ms"].to_numpy(), "GB/s (bytes / time)": (df["bytes"] / df["ms"] / 1e6).to_numpy()})
    return markdown_table(out, floatfmt=".3g") + "\n\n" + provenance_line(df, source(COMM_BENCH, device))


def memory(device: str = "cpu") -> pd.DataFrame:
    """The newest memory row of each (method, point), indexed by them."""
    return newest(load_results(MEMORY_BENCH, device, status="ok"), ["method", "point"]).set_index(["method", "point"])


def times(device: str = "cpu") -> pd.DataFrame:
    """The newest step-time row of each method, indexed by method."""
    return newest(load_results(TIME_BENCH, device, status="ok"), ["method"]).set_index("method")


def measured_step_ms(method: str, device: str = "cpu") -> float:
    return float(times(device).loc[method, "step_ms"])


def predicted_memory(device: str = "cpu", stage: str = "ddp") -> acc.MemoryBreakdown:
    """The accounting formulas at the measured run's configuration (model, batch, ranks)."""
    r = memory(device).loc[("ddp", "after_step")]
    return acc.transformer_memory(get_config(str(r["size"]), int(r["context"])), int(r["batch"]),
                                  int(r["world_size"]), stage, context=int(r["context"]))


def measured_collective_ms(op: str, device: str = "cpu") -> float:
    df = newest(load_results(COMM_BENCH, device, status="ok"), ["op"])
    return float(df.loc[df["op"] == op, "ms"].iloc[-1])


def computed_memory_table(size: str = "xl", world_size: int = 2, batch_per_rank: int = 2,
                          context: int = 512, stages=("ddp", "sharded", "zero2", "zero3")) -> str:
    """GiB per rank by kind for a preset, fp32 AdamW, from the formulas."""
    cfg = get_config(size, context)
    rows = []
    for stage in stages:
        m = acc.transformer_memory(cfg, batch_per_rank, world_size, stage, context=context)
        name = "course ShardedOptimizer, ZeRO-1" if stage == "sharded" else STAGE_NAMES[stage]  # same bytes
        rows.append({"stage": name, **{k: v / GiB for k, v in m.as_dict().items()}})
    df = pd.DataFrame(rows).rename(columns={"params": "params (GiB)", "grads": "grads (GiB)",
                                            "optimizer_state": "optimizer state (GiB)",
                                            "activations": "activations (GiB)", "total": "total (GiB)"})
    return markdown_table(df, floatfmt=".2f")


POINT_WORDS = {"after_init": "after initialisation", "before_step": "before the optimizer step",
               "after_step": "after the optimizer step"}


def points_2026() -> dict[str, dict[str, dict[str, float]]]:
    """optimizer_state_sharding_accounting (a) for the 2026 xl (our 2.7B), the course's setting:
    bytes per rank by kind at the three points, DDP + AdamW and the course's sharded optimizer."""
    return {stage: pa.memory_at_points(pa.XL_2026, stage) for stage in ("ddp", "sharded")}


def points_2026_table() -> str:
    rows = []
    for stage, name in (("ddp", "DDP + AdamW"), ("sharded", "course ShardedOptimizer")):
        for point, kinds in points_2026()[stage].items():
            rows.append({"method": name, "point": POINT_WORDS[point], "params (GiB)": kinds["params"] / GiB,
                         "grads (GiB)": kinds["grads"] / GiB, "optimizer state (GiB)": kinds["optimizer_state"] / GiB,
                         "activations (GiB)": kinds["activations"] / GiB, "sum (GiB)": kinds["total"] / GiB})
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


def _points_2026_as_for_the_2025_xl() -> bool:
    """The 2026 xl's points follow the same shape: the sharded state half of DDP's after the step,
    everything else the same, and the saving larger than the 2025 xl's (more parameters); and
    preset_accounting agrees with this chapter's formula for the 2025 xl."""
    p = points_2026()
    ddp, sharded = p["ddp"], p["sharded"]
    same = all(ddp[pt][k] == sharded[pt][k] for pt in ddp for k in ("params", "grads", "activations"))
    saved = ddp["after_step"]["optimizer_state"] - sharded["after_step"]["optimizer_state"]
    old = pa.memory_at_points(pa.XL_2025, "ddp")["after_step"]
    ref = acc.transformer_memory(get_config("xl", 512), 2, 2, "ddp", context=512)
    return (same and sharded["after_step"]["optimizer_state"] * 2 == ddp["after_step"]["optimizer_state"]
            and saved > old["optimizer_state"] / 2 and old["optimizer_state"] == ref.optimizer_state
            and p["ddp"]["before_step"]["activations"] == pa.fsdp_saving(pa.XL_2026)["activations"])


def zero_bytes_table(world_sizes=(1, 2, 8, 64)) -> str:
    """Bytes per parameter per rank with mixed-precision AdamW (the ZeRO paper's Figure 1)."""
    rows = [{"stage": STAGE_NAMES[s], **{f"N = {n}": acc.bytes_per_parameter(s, n) for n in world_sizes}}
            for s in ("ddp", "zero1", "zero2", "zero3")]
    return markdown_table(pd.DataFrame(rows), floatfmt=".3g")


def communication_table(size: str = "xl", world_sizes=(2, 8)) -> str:
    """GB each rank receives per step, fp32 gradients and parameters, and the ratio to DDP."""
    n = count_parameters(get_config(size))["total"]
    rows = []
    for s in ("ddp", "sharded", "zero1", "zero3"):
        row = {"stage": STAGE_NAMES[s]}
        for N in world_sizes:
            row[f"GB, N = {N}"] = acc.communication_bytes_per_rank(s, n, N) / GB
        row["x DDP"] = acc.communication_bytes_per_rank(s, n, 2) / acc.communication_bytes_per_rank("ddp", n, 2)
        rows.append(row)
    return markdown_table(pd.DataFrame(rows), floatfmt=".3g")


# -- the quantities the chapter's sentences quote -----------------------------------------------

SHARDED = ("sharded", "zero1", "zero_redundancy")


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def _mem(device: str, method: str, point: str, column: str) -> float:
    return float(memory(device).loc[(method, point), column])


def _time(device: str, method: str, column: str = "step_ms") -> float:
    return float(times(device).loc[method, column])


def state_ratio(device: str, method: str) -> float:
    """Optimizer-state bytes after the step, `method` over DDP + AdamW."""
    return _mem(device, method, "after_step", "state_bytes") / _mem(device, "ddp", "after_step", "state_bytes")


def peak_saved(device: str, method: str) -> float:
    """How much lower `method`'s allocator peak of the optimizer step is than DDP + AdamW's (bytes)."""
    return _mem(device, "ddp", "after_step", "peak_bytes") - _mem(device, method, "after_step", "peak_bytes")


def predicted_within(device: str = GPU) -> float:
    """The largest gap (bytes) between the computed and the measured state and activations."""
    pred = predicted_memory(device, "ddp")
    return max(abs(_mem(device, "ddp", "after_step", "state_bytes") - pred.optimizer_state),
               abs(_mem(device, "ddp", "before_step", "activations_bytes") - pred.activations))


def rel_step(device: str, method: str) -> float:
    return _time(device, method) / _time(device, "ddp") - 1


def forward_backward_ms(device: str, method: str) -> float:
    """The step minus the optimizer step."""
    return _time(device, method) - _time(device, method, "optimizer_step_ms")


def rs_ag_over_ar(device: str) -> float:
    """Reduce-scatter plus all-gather, over one all-reduce of the same buffer."""
    return ((measured_collective_ms("reduce_scatter", device) + measured_collective_ms("all_gather", device))
            / measured_collective_ms("all_reduce", device))


def ddp_run_move() -> float:
    """How far PyTorch's DDP step (xl, 2 H200s) moved between the DDP chapter's runs, relative."""
    from report import ddp  # ddp reads this chapter's collectives: imported late, no cycle

    step = ddp.per_run(GPU, "step_ms")["torch-ddp"]
    return (step.max() - step.min()) / step.median()


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



register("sharding", facts={
    "gpu_params_gib": lambda: _gib(_mem(GPU, "ddp", "after_init", "params_bytes")),
    "gpu_grads_gib": lambda: _gib(_mem(GPU, "ddp", "before_step", "grads_bytes")),
    "gpu_acts_gib": lambda: _gib(_mem(GPU, "ddp", "before_step", "activations_bytes")),
    "gpu_state_ddp_gib": lambda: _gib(_mem(GPU, "ddp", "after_step", "state_bytes")),
    "gpu_state_sharded_gib": lambda: _gib(_mem(GPU, "sharded", "after_step", "state_bytes")),
    "gpu_state_computed_gib": lambda: _gib(predicted_memory(GPU, "ddp").optimizer_state),
    "gpu_acts_computed_gib": lambda: _gib(predicted_memory(GPU, "ddp").activations),
    "gpu_predicted_within_kib": lambda: f"{predicted_within(GPU) / 1024:.0f}",
    "gpu_half_state_gib": lambda: f"{_mem(GPU, 'ddp', 'after_step', 'state_bytes') / 2 / GiB:.1f}",
    "gpu_init_ddp_gib": lambda: f"{_mem(GPU, 'ddp', 'after_init', 'allocated_bytes') / GiB:.1f}",
    "gpu_init_zero1_gib": lambda: f"{_mem(GPU, 'zero1', 'after_init', 'allocated_bytes') / GiB:.1f}",
    "gpu_zero1_lead_gib": lambda: f"{(peak_saved(GPU, 'zero1') - peak_saved(GPU, 'sharded')) / GiB:.1f}",
    "gpu_n_params": lambda: f"{int(_time(GPU, 'ddp', 'n_params')):,}",
    "cpu_n_params": lambda: f"{int(_time(CPU, 'ddp', 'n_params')):,}",
    **{f"gpu_peak_{m}_gib": (lambda m=m: f"{_mem(GPU, m, 'after_step', 'peak_bytes') / GiB:.1f}") for m in ("ddp", "sharded", "zero1")},
    **{f"{d}_state_ratio_{m}": (lambda dev=dev, m=m: f"{state_ratio(dev, m):.3f}") for d, dev in (("gpu", GPU), ("cpu", CPU)) for m in SHARDED},
    **{f"gpu_peak_saved_{m}_gib": (lambda m=m: f"{peak_saved(GPU, m) / GiB:.1f}") for m in SHARDED},
    **{f"gpu_step_{m}_ms": (lambda m=m: f"{_time(GPU, m):.0f}") for m in ("ddp",) + SHARDED},
    **{f"gpu_rel_{m}": (lambda m=m: f"{rel_step(GPU, m):+.1%}") for m in SHARDED},
    "gpu_warmup": lambda: int(_time(GPU, "ddp", "warmup")),
    "gpu_steps": lambda: int(_time(GPU, "ddp", "steps")),
    "gpu_std_range_ms": lambda: f"{times(GPU)['step_ms_std'].min():.0f} to {times(GPU)['step_ms_std'].max():.0f}",
    "ddp_run_move": lambda: f"{ddp_run_move():.1%}",
    "gpu_opt_ddp_ms": lambda: f"{_time(GPU, 'ddp', 'optimizer_step_ms'):.0f}",
    "gpu_opt_zero1_ms": lambda: f"{_time(GPU, 'zero1', 'optimizer_step_ms'):.0f}",
    "gpu_opt_sharded_extra_ms": lambda: f"{_time(GPU, 'sharded', 'optimizer_step_ms') - _time(GPU, 'ddp', 'optimizer_step_ms'):.0f}",
    "gpu_fb_saved_zero1_ms": lambda: f"{forward_backward_ms(GPU, 'ddp') - forward_backward_ms(GPU, 'zero1'):.0f}",
    "gpu_rs_ag_over_ar": lambda: f"{rs_ag_over_ar(GPU):.2f}",
    "gpu_broadcast_ms": lambda: f"{measured_collective_ms('broadcast_per_parameter', GPU):.0f}",
    "gpu_all_gather_ms": lambda: f"{measured_collective_ms('all_gather', GPU):.0f}",
    "cpu_rs_ag_over_ar": lambda: f"{rs_ag_over_ar(CPU):.1f}",
    "cpu_opt_zero1_ms": lambda: f"{_time(CPU, 'zero1', 'optimizer_step_ms'):.0f}",
    "cpu_opt_ddp_ms": lambda: f"{_time(CPU, 'ddp', 'optimizer_step_ms'):.0f}",
    "xl2026_params_gib": lambda: _gib(points_2026()["ddp"]["after_init"]["params"]),
    "xl2026_acts_gib": lambda: _gib(points_2026()["ddp"]["before_step"]["activations"]),
    "xl2026_state_ddp_gib": lambda: _gib(points_2026()["ddp"]["after_step"]["optimizer_state"]),
    "xl2026_state_sharded_gib": lambda: _gib(points_2026()["sharded"]["after_step"]["optimizer_state"]),
    "xl2026_after_ddp_gib": lambda: _gib(points_2026()["ddp"]["after_step"]["total"]),
    "xl2026_after_sharded_gib": lambda: _gib(points_2026()["sharded"]["after_step"]["total"]),
    "xl_d_model": lambda: f"{get_config('xl').d_model:,}",
    "xl_params_b": lambda: f"{count_parameters(get_config('xl'))['total'] / 1e9:.2f}",
}, tables={
    "gpu_memory": lambda: measured_memory_table(GPU), "cpu_memory": lambda: measured_memory_table(CPU),
    "gpu_time": lambda: measured_time_table(GPU), "cpu_time": lambda: measured_time_table(CPU),
    "gpu_collectives": lambda: measured_collectives_table(GPU), "cpu_collectives": lambda: measured_collectives_table(CPU),
    "zero_bytes": zero_bytes_table, "communication": lambda: communication_table("xl", world_sizes=(2, 8)),
    "computed_memory": lambda: computed_memory_table("xl", world_size=2, batch_per_rank=2, context=512),
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
    "saving_nearly_free_in_time": lambda: rel_step(GPU, "sharded") < 0.05
    and _time(GPU, "sharded", "optimizer_step_ms") > _time(GPU, "ddp", "optimizer_step_ms"),
    "forward_backward_alike_but_zero1": _forward_backward_alike_but_zero1,
    # close: within 25%
    "reduce_scatter_all_gather_like_one_all_reduce": lambda: abs(rs_ag_over_ar(GPU) - 1) < 0.25,
    "broadcasts_cost_more_than_all_gather": lambda: measured_collective_ms("broadcast_per_parameter", GPU) > measured_collective_ms("all_gather", GPU),
    "gloo_reduce_scatter_all_gather_slow": lambda: rs_ag_over_ar(CPU) > 2
    and _time(CPU, "zero1", "optimizer_step_ms") > _time(CPU, "ddp", "optimizer_step_ms"),
})
