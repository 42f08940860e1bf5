"""The sharding chapter: measured memory, time and collectives of the sharded optimizers, and the
computed memory and communication tables (from cs336_systems.sharding.accounting).

    ```python exec="on"
    import report.sharding
    print(report.sharding.measured_memory_table("nvidia-h200"))
    ```

Measured tables read results/sharding/ and end with the provenance line; computed tables call the
package's accounting functions. The chapter's numbers are facts in `report/sharding_facts.py`.
"""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT, results_path
from cs336_systems.model import count_parameters, get_config
from cs336_systems.sharding import accounting as acc
from cs336_systems.sharding.sharding_bench import (
    COMM_BENCH,
    MEMORY_BENCH,
    METHODS,
    TIME_BENCH,
)
from report.results import load_results, markdown_table, provenance_line

MIB, GB = 1024 ** 2, 1e9
POINTS = ["after_init", "before_step", "after_step"]
METHOD_NAMES = {"ddp": "DDP + AdamW", "sharded": "DDP + ShardedOptimizer (course)",
                "zero1": "ZeRO1Optimizer (ours)", "zero_redundancy": "DDP + ZeroRedundancyOptimizer"}
STAGE_NAMES = {"ddp": "DDP", "sharded": "course ShardedOptimizer", "zero1": "ZeRO-1",
               "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def _source(bench: str, device: str) -> str:
    return str(results_path(bench, device, REPO_ROOT / "results").relative_to(REPO_ROOT))


def _order(df: pd.DataFrame, column: str, order: list[str]) -> pd.DataFrame:
    """Rows in the given order of `column`, stable (an earlier ordering survives within ties)."""
    rank = df[column].map({v: i for i, v in enumerate(order)})
    return df.assign(_o=rank).sort_values("_o", kind="stable").drop(columns="_o")


def measured_memory_table(device: str = "cpu") -> str:
    """Per-rank MiB by kind at the three points, one row per (method, point)."""
    df = load_results(MEMORY_BENCH, device, status="ok")
    df = df.sort_values("time_utc").drop_duplicates(["method", "point"], keep="last")
    df = _order(_order(df, "point", POINTS), "method", METHODS)
    cols = {"params_bytes": "params", "grads_bytes": "grads", "state_bytes": "optimizer state",
            "activations_bytes": "activations", "tensor_bytes": "sum"}
    if "peak_bytes" in df:
        cols.update({"allocated_bytes": "allocated", "peak_bytes": "peak since previous point"})
    out = pd.DataFrame({"method": df["method"].map(METHOD_NAMES), "point": df["point"]})
    for c, name in cols.items():
        out[f"{name} (MiB)"] = (df[c] / MIB).round(2).to_numpy()
    return markdown_table(out, floatfmt=".2f") + "\n\n" + provenance_line(df, _source(MEMORY_BENCH, device))


def measured_time_table(device: str = "cpu") -> str:
    df = load_results(TIME_BENCH, device, status="ok")
    df = _order(df.sort_values("time_utc").drop_duplicates(["method"], keep="last"), "method", METHODS)
    base = float(df.loc[df["method"] == "ddp", "step_ms"].iloc[0]) if (df["method"] == "ddp").any() else math.nan
    out = pd.DataFrame({
        "method": df["method"].map(METHOD_NAMES).to_numpy(),
        "step (ms, median)": df["step_ms"].to_numpy(),
        "step (ms, min)": df["step_ms_min"].to_numpy(),
        "optimizer step (ms, median)": df["optimizer_step_ms"].to_numpy(),
        "optimizer step (ms, min)": df["optimizer_step_ms_min"].to_numpy(),
        "vs DDP + AdamW": (df["step_ms"] / base).to_numpy(),
        "host load (1 min)": df["loadavg_1m"].to_numpy()})
    return markdown_table(out, floatfmt=".3g") + "\n\n" + provenance_line(df, _source(TIME_BENCH, device))


def measured_collectives_table(device: str = "cpu") -> str:
    """Each method's communication alone, on the model's fp32 sizes."""
    df = load_results(COMM_BENCH, device, status="ok")
    order = ["all_reduce", "broadcast_per_parameter", "reduce_scatter", "all_gather"]
    df = _order(df.sort_values("time_utc").drop_duplicates(["op"], keep="last"), "op", order)
    who = {"all_reduce": "DDP (all methods but ZeRO-1)", "broadcast_per_parameter": "course, after the step",
           "reduce_scatter": "ZeRO-1, before the step", "all_gather": "ZeRO-1, after the step"}
    out = pd.DataFrame({"collective": df["op"].to_numpy(), "used by": df["op"].map(who).to_numpy(),
                        "MiB": (df["bytes"] / MIB).to_numpy(), "calls": df["tensors"].to_numpy(),
                        "ms (median)": df["ms"].to_numpy(), "GB/s (bytes / time)": (df["bytes"] / df["ms"] / 1e6).to_numpy()})
    return markdown_table(out, floatfmt=".3g") + "\n\n" + provenance_line(df, _source(COMM_BENCH, device))


def memory(device: str = "cpu") -> pd.DataFrame:
    """The newest memory row of each (method, point), indexed by them."""
    df = load_results(MEMORY_BENCH, device, status="ok").sort_values("time_utc")
    return df.drop_duplicates(["method", "point"], keep="last").set_index(["method", "point"])


def times(device: str = "cpu") -> pd.DataFrame:
    """The newest step-time row of each method, indexed by method."""
    df = load_results(TIME_BENCH, device, status="ok").sort_values("time_utc")
    return df.drop_duplicates("method", keep="last").set_index("method")


def measured_step_ms(method: str, device: str = "cpu") -> float:
    return float(times(device).loc[method, "step_ms"])


def predicted_memory(device: str = "cpu", stage: str = "ddp") -> acc.MemoryBreakdown:
    """The accounting formulas at the measured run's configuration (model, batch, ranks)."""
    r = memory(device).loc[("ddp", "after_step")]
    return acc.transformer_memory(get_config(str(r["size"]), int(r["context"])), int(r["batch"]),
                                  int(r["world_size"]), stage, context=int(r["context"]))


def measured_collective_ms(op: str, device: str = "cpu") -> float:
    df = load_results(COMM_BENCH, device, status="ok").sort_values("time_utc")
    return float(df.loc[df["op"] == op, "ms"].iloc[-1])


def computed_memory_table(size: str = "xl", world_size: int = 2, batch_per_rank: int = 2,
                          context: int = 512, stages=("ddp", "sharded", "zero2", "zero3")) -> str:
    """GiB per rank by kind for a preset, fp32 AdamW, from the formulas."""
    cfg = get_config(size, context)
    rows = []
    for stage in stages:
        m = acc.transformer_memory(cfg, batch_per_rank, world_size, stage, context=context)
        name = "course ShardedOptimizer, ZeRO-1" if stage == "sharded" else STAGE_NAMES[stage]  # same bytes
        rows.append({"stage": name, **{k: v / 2 ** 30 for k, v in m.as_dict().items()}})
    df = pd.DataFrame(rows).rename(columns={"params": "params (GiB)", "grads": "grads (GiB)",
                                            "optimizer_state": "optimizer state (GiB)",
                                            "activations": "activations (GiB)", "total": "total (GiB)"})
    return markdown_table(df, floatfmt=".2f")


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
