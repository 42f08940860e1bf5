"""The numbers the DDP chapter's sentences quote: `{{ ddp.<name> }}`, each from report.ddp.

`gpu_*` facts read the xl run on 2 H200s (medians over the runs unless the name says otherwise),
`cpu_*` the toy run on the 2-core CPU, `xl_*` the xl model itself (computed, not measured).
"""

from __future__ import annotations

from functools import partial

import pandas as pd

from report import sharding
from report.ddp import (
    CPU,
    GPU,
    at,
    best_cap_vs_torch,
    bucketed,
    fitted_bucket_model,
    flat_saved_added_ms,
    hidden,
    model_vs_measured,
    naive_terms_ms,
    overlap_saved_ms,
    per_run,
    run_move_ms,
    runs,
    xl_tensor_bytes,
    xl_tensor_sizes,
)
from report.facts import fact


def _ms(x: float) -> str:
    return f"{x:.0f}"


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _range(xs, fmt=".0f") -> str:
    """'11 to 20': the smallest and the largest."""
    return f"{format(min(xs), fmt)} to {format(max(xs), fmt)}"


def _listed(xs, fmt=".0f") -> str:
    """'470, 449, 446 and 444'."""
    parts = [format(x, fmt) for x in xs]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _value(device: str, label: str, column: str) -> float:
    return float(at(device, label)[column])


# name: (device, configuration, column) -> the median over runs, in ms, no decimals
_VALUES = {
    "gpu_compute_only_ms": (GPU, "compute-only", "step_ms"),
    "gpu_naive_step_ms": (GPU, "naive", "step_ms"),
    "gpu_naive_sync_ms": (GPU, "naive", "sync_ms"),
    "gpu_naive_overhead_ms": (GPU, "naive", "overhead_ms"),
    "gpu_flat_step_ms": (GPU, "flat", "step_ms"),
    "gpu_flat_sync_ms": (GPU, "flat", "sync_ms"),
    "gpu_flat_comm_alone_ms": (GPU, "flat", "comm_alone_ms"),
    "gpu_overlap_step_ms": (GPU, "overlap", "step_ms"),
    "gpu_overlap_sync_ms": (GPU, "overlap", "sync_ms"),
    "gpu_overlap_outside_ms": (GPU, "overlap", "outside_ms"),
    "gpu_torch_ddp_step_ms": (GPU, "torch-ddp", "step_ms"),
    "cpu_naive_step_ms": (CPU, "naive", "step_ms"),
    "cpu_naive_sync_ms": (CPU, "naive", "sync_ms"),
    "cpu_naive_comm_alone_ms": (CPU, "naive", "comm_alone_ms"),
    "cpu_flat_step_ms": (CPU, "flat", "step_ms"),
    "cpu_flat_sync_ms": (CPU, "flat", "sync_ms"),
    "cpu_overlap_sync_ms": (CPU, "overlap", "sync_ms"),
    "cpu_overlap_comm_alone_ms": (CPU, "overlap", "comm_alone_ms"),
    "cpu_torch_ddp_step_ms": (CPU, "torch-ddp", "step_ms"),
}
for _name, _spec in _VALUES.items():
    fact(f"ddp.{_name}")(lambda spec=_spec: _ms(_value(*spec)))

# name: (device, configuration) -> share of its all-reduce time hidden under computation
_HIDDEN = {"gpu_hidden_naive": (GPU, "naive"), "gpu_hidden_flat": (GPU, "flat"),
           "gpu_hidden_overlap": (GPU, "overlap"), "cpu_hidden_overlap": (CPU, "overlap"),
           "cpu_hidden_1mb": (CPU, "bucketed 1 MB"), "cpu_hidden_10mb": (CPU, "bucketed 10 MB")}
for _name, (_device, _label) in _HIDDEN.items():
    fact(f"ddp.{_name}")(partial(lambda d, k: _pct(hidden(d)[k]), _device, _label))


def hooked_hidden(device: str) -> pd.Series:
    h = hidden(device)
    return h[[k for k in h.index if k not in ("naive", "flat")]]


fact("ddp.gpu_hidden_hooked_min")(lambda: _pct(hooked_hidden(GPU).min()))
fact("ddp.gpu_hidden_hooked_max")(lambda: _pct(hooked_hidden(GPU).max()))


# -- the runs ---------------------------------------------------------------------------------------

@fact("ddp.gpu_runs_apart_min")
def _() -> str:
    start = runs(GPU).groupby("run")["time_utc"].min().map(pd.Timestamp)
    return _ms((start.iloc[-1] - start.iloc[0]).total_seconds() / 60)


fact("ddp.gpu_run_move_median_ms")(lambda: _ms(run_move_ms(GPU).median()))
fact("ddp.gpu_run_move_max_ms")(lambda: _ms(run_move_ms(GPU).max()))
fact("ddp.gpu_std_median_ms")(lambda: _ms(runs(GPU)["step_ms_std"].median()))


# -- naive ------------------------------------------------------------------------------------------

fact("ddp.gpu_naive_sync_share")(lambda: _pct(_value(GPU, "naive", "sync_ms") / _value(GPU, "naive", "step_ms")))
fact("ddp.cpu_naive_sync_share")(lambda: _pct(_value(CPU, "naive", "sync_ms") / _value(CPU, "naive", "step_ms")))
fact("ddp.cpu_naive_calls")(lambda: f"{int(_value(CPU, 'naive', 'allreduce_calls'))}")
fact("ddp.gpu_knee_mb")(lambda: _ms(fitted_bucket_model(GPU).o * fitted_bucket_model(GPU).w / 2**20))
fact("ddp.gpu_naive_fixed_ms")(lambda: _ms(naive_terms_ms(GPU)[0]))
fact("ddp.gpu_transfer_ms")(lambda: _ms(naive_terms_ms(GPU)[1]))
fact("ddp.cpu_naive_fixed_ms")(lambda: _ms(naive_terms_ms(CPU)[0]))
fact("ddp.cpu_transfer_ms")(lambda: _ms(naive_terms_ms(CPU)[1]))
fact("ddp.cpu_grad_mb")(lambda: f"{fitted_bucket_model(CPU).s / 2**20:.1f}")
fact("ddp.gpu_grad_mb")(lambda: f"{fitted_bucket_model(GPU).s / 2**20:,.0f}")

fact("ddp.xl_tensors")(lambda: f"{len(xl_tensor_bytes())}")
fact("ddp.xl_params_b")(lambda: f"{sum(b for _, b in xl_tensor_bytes()) / 4e9:.2f}")
fact("ddp.xl_grad_gb")(lambda: f"{sum(b for _, b in xl_tensor_bytes()) / 1e9:.1f}")
fact("ddp.xl_norm_tensors")(lambda: f"{int(xl_tensor_sizes()['tensors'].iloc[0])}")
fact("ddp.xl_norm_call_share")(lambda: _pct(xl_tensor_sizes()["tensors"].iloc[0] / len(xl_tensor_bytes())))
fact("ddp.xl_avg_tensor_mb")(lambda: _ms(sum(b for _, b in xl_tensor_bytes()) / len(xl_tensor_bytes()) / 2**20))


# -- flat -------------------------------------------------------------------------------------------

def one_allreduce_ms() -> float:
    """One all-reduce of the xl model's whole gradient, timed alone by the sharding benchmark."""
    return sharding.measured_collective_ms("all_reduce", GPU)


fact("ddp.gpu_one_allreduce_ms")(lambda: _ms(one_allreduce_ms()))
fact("ddp.gpu_flat_saved_ms")(lambda: _ms(flat_saved_added_ms(GPU, one_allreduce_ms())[0]))
fact("ddp.gpu_flat_added_ms")(lambda: _ms(flat_saved_added_ms(GPU, one_allreduce_ms())[1]))
fact("ddp.gpu_naive_excess_ms")(lambda: _ms(flat_saved_added_ms(GPU, one_allreduce_ms())[0]))
fact("ddp.gpu_naive_excess_us")(lambda: _ms(flat_saved_added_ms(GPU, one_allreduce_ms())[0] * 1e3
                                            / _value(GPU, "naive", "allreduce_calls")))
fact("ddp.gpu_o_us")(lambda: _ms(fitted_bucket_model(GPU).o * 1e6))
fact("ddp.gpu_w_gbps")(lambda: _ms(fitted_bucket_model(GPU).w / 1e9))


# -- overlap ----------------------------------------------------------------------------------------

fact("ddp.gpu_overlap_outside_each_ms")(lambda: " and ".join(_ms(x) for x in per_run(GPU, "outside_ms")["overlap"]))


# -- bucketed ---------------------------------------------------------------------------------------

fact("ddp.gpu_bucketed_steps")(lambda: _listed(bucketed(GPU)["step_ms"]))
fact("ddp.gpu_bucket_counts")(lambda: _listed(bucketed(GPU)["allreduce_calls"]))
fact("ddp.gpu_bucket_spread_ms")(lambda: _ms(_big_caps(GPU)["step_ms"].max() - _big_caps(GPU)["step_ms"].min()))
fact("ddp.gpu_best_cap_vs_torch")(lambda: f"{best_cap_vs_torch(GPU).abs().max():.1%}")
fact("ddp.gpu_overlap_saved_max_ms")(lambda: _ms(overlap_saved_ms(GPU).max()))
fact("ddp.gpu_bucketed_sync_range_ms")(lambda: _range(bucketed(GPU)["sync_ms"]))
fact("ddp.gpu_bucketed_outside_range_ms")(lambda: _range(bucketed(GPU)["outside_ms"]))
fact("ddp.gpu_optimal_buckets")(lambda: f"{fitted_bucket_model(GPU).optimal_num_buckets:.0f}")
fact("ddp.gpu_optimal_bucket_mb")(lambda: f"{fitted_bucket_model(GPU).optimal_bucket_bytes / 2**20:.0f}")
fact("ddp.gpu_min_overhead_ms")(lambda: f"{fitted_bucket_model(GPU).min_overhead * 1e3:.1f}")
fact("ddp.gpu_measured_over_model")(lambda: _range(_ratio(GPU), ".1f"))
fact("ddp.cpu_bucket_spread_ms")(lambda: _ms(bucketed(CPU)["step_ms"].max() - bucketed(CPU)["step_ms"].min()))
fact("ddp.cpu_step_std_ms")(lambda: _ms(bucketed(CPU)["step_ms_std"].median()))
fact("ddp.cpu_optimal_bucket_mb")(lambda: f"{fitted_bucket_model(CPU).optimal_bucket_bytes / 2**20:.1f}")


def _big_caps(device: str) -> pd.DataFrame:
    """The caps of 10 MB and more."""
    b = bucketed(device)
    return b[b["bucket_size_mb"] >= 10]


def _ratio(device: str) -> pd.Series:
    df = model_vs_measured(device)
    return df["measured_ms"] / df["model_ms"]



# -- each run (the runs page) ------------------------------------------------------------------------

def _slug(label: str) -> str:
    """'bucketed 1 MB' -> 'bucketed_1_mb', 'torch-ddp' -> 'torch_ddp'."""
    return label.lower().replace(" ", "_").replace("-", "_")


def _run_value(run: int, label: str, column: str) -> float:
    return float(per_run(GPU, column).loc[run, label])


for _label in ["naive", "flat", "overlap", "bucketed 1 MB", "bucketed 10 MB"]:  # those runs.md quotes
    for _run in (1, 2):
        fact(f"ddp.gpu_run{_run}_{_slug(_label)}_ms")(partial(lambda r, k: _ms(_run_value(r, k, "step_ms")), _run, _label))
        fact(f"ddp.gpu_run{_run}_{_slug(_label)}_std_ms")(
            partial(lambda r, k: _ms(_run_value(r, k, "step_ms_std")), _run, _label))

for _run in (1, 2):
    fact(f"ddp.gpu_run{_run}_best_cap_vs_torch")(partial(lambda r: f"{best_cap_vs_torch(GPU)[r]:+.1%}", _run))
    fact(f"ddp.gpu_run{_run}_overlap_saved_ms")(partial(lambda r: _ms(overlap_saved_ms(GPU)[r]), _run))

fact("ddp.gpu_run_move_min_ms")(lambda: _ms(run_move_ms(GPU).min()))
fact("ddp.gpu_std_min_ms")(lambda: _ms(runs(GPU)["step_ms_std"].min()))
fact("ddp.gpu_std_max_ms")(lambda: _ms(runs(GPU)["step_ms_std"].max()))


def sharding_ddp_step_ms() -> float:
    """The sharding benchmark's DDP + AdamW step: PyTorch's DDP on xl, the same configuration."""
    return float(sharding.measured_step_ms("ddp", GPU))


fact("ddp.sharding_ddp_step_ms")(lambda: _ms(sharding_ddp_step_ms()))
for _run in (1, 2):
    fact(f"ddp.sharding_vs_run{_run}")(
        partial(lambda r: f"{sharding_ddp_step_ms() / _run_value(r, 'torch-ddp', 'step_ms') - 1:+.1%}", _run))
