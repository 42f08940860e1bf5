"""The numbers the sharding chapter's sentences quote: `{{ sharding.<name> }}`, from report.sharding.

`gpu_*` facts read the xl run on 2 H200s, `cpu_*` the small model on the 2-core CPU. Memory is in
GiB per rank (2**30 bytes), times in ms; `rel_*` are signed changes against DDP + AdamW's step.
"""

from __future__ import annotations

from functools import partial

from report import ddp
from report.facts import fact
from report.sharding import measured_collective_ms, memory, predicted_memory, times

GPU, CPU = "nvidia-h200", "cpu"
GIB = 2**30
SHARDED = ("sharded", "zero1", "zero_redundancy")


def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


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
    step = ddp.per_run(GPU, "step_ms")["torch-ddp"]
    return (step.max() - step.min()) / step.median()


# -- memory (a) -------------------------------------------------------------------------------------

fact("sharding.gpu_params_gib")(lambda: _gib(_mem(GPU, "ddp", "after_init", "params_bytes")))
fact("sharding.gpu_grads_gib")(lambda: _gib(_mem(GPU, "ddp", "before_step", "grads_bytes")))
fact("sharding.gpu_acts_gib")(lambda: _gib(_mem(GPU, "ddp", "before_step", "activations_bytes")))
fact("sharding.gpu_state_ddp_gib")(lambda: _gib(_mem(GPU, "ddp", "after_step", "state_bytes")))
fact("sharding.gpu_state_sharded_gib")(lambda: _gib(_mem(GPU, "sharded", "after_step", "state_bytes")))
fact("sharding.gpu_state_computed_gib")(lambda: _gib(predicted_memory(GPU, "ddp").optimizer_state))
fact("sharding.gpu_acts_computed_gib")(lambda: _gib(predicted_memory(GPU, "ddp").activations))
fact("sharding.gpu_predicted_within_kib")(lambda: f"{predicted_within(GPU) / 1024:.0f}")
fact("sharding.gpu_half_state_gib")(lambda: f"{_mem(GPU, 'ddp', 'after_step', 'state_bytes') / 2 / GIB:.1f}")
fact("sharding.gpu_init_ddp_gib")(lambda: f"{_mem(GPU, 'ddp', 'after_init', 'allocated_bytes') / GIB:.1f}")
fact("sharding.gpu_init_zero1_gib")(lambda: f"{_mem(GPU, 'zero1', 'after_init', 'allocated_bytes') / GIB:.1f}")
fact("sharding.gpu_zero1_lead_gib")(lambda: f"{(peak_saved(GPU, 'zero1') - peak_saved(GPU, 'sharded')) / GIB:.1f}")
fact("sharding.gpu_n_params")(lambda: f"{int(_time(GPU, 'ddp', 'n_params')):,}")
fact("sharding.cpu_n_params")(lambda: f"{int(_time(CPU, 'ddp', 'n_params')):,}")
for _method in ("ddp", "sharded", "zero1"):
    fact(f"sharding.gpu_peak_{_method}_gib")(
        partial(lambda m: f"{_mem(GPU, m, 'after_step', 'peak_bytes') / GIB:.1f}", _method))
for _method in SHARDED:
    fact(f"sharding.gpu_state_ratio_{_method}")(partial(lambda m: f"{state_ratio(GPU, m):.3f}", _method))
    fact(f"sharding.cpu_state_ratio_{_method}")(partial(lambda m: f"{state_ratio(CPU, m):.3f}", _method))
    fact(f"sharding.gpu_peak_saved_{_method}_gib")(partial(lambda m: f"{peak_saved(GPU, m) / GIB:.1f}", _method))

# -- time (b) ---------------------------------------------------------------------------------------

for _method in ("ddp",) + SHARDED:
    fact(f"sharding.gpu_step_{_method}_ms")(partial(lambda m: f"{_time(GPU, m):.0f}", _method))
for _method in SHARDED:
    fact(f"sharding.gpu_rel_{_method}")(partial(lambda m: f"{rel_step(GPU, m):+.1%}", _method))
fact("sharding.gpu_warmup")(lambda: f"{int(_time(GPU, 'ddp', 'warmup'))}")
fact("sharding.gpu_steps")(lambda: f"{int(_time(GPU, 'ddp', 'steps'))}")
fact("sharding.gpu_std_range_ms")(
    lambda: f"{times(GPU)['step_ms_std'].min():.0f} to {times(GPU)['step_ms_std'].max():.0f}")
fact("sharding.ddp_run_move")(lambda: f"{ddp_run_move():.1%}")
fact("sharding.gpu_opt_ddp_ms")(lambda: f"{_time(GPU, 'ddp', 'optimizer_step_ms'):.0f}")
fact("sharding.gpu_opt_zero1_ms")(lambda: f"{_time(GPU, 'zero1', 'optimizer_step_ms'):.0f}")
fact("sharding.gpu_opt_sharded_extra_ms")(
    lambda: f"{_time(GPU, 'sharded', 'optimizer_step_ms') - _time(GPU, 'ddp', 'optimizer_step_ms'):.0f}")
fact("sharding.gpu_fb_saved_zero1_ms")(
    lambda: f"{forward_backward_ms(GPU, 'ddp') - forward_backward_ms(GPU, 'zero1'):.0f}")
fact("sharding.gpu_rs_ag_over_ar")(lambda: f"{rs_ag_over_ar(GPU):.2f}")
fact("sharding.gpu_broadcast_ms")(lambda: f"{measured_collective_ms('broadcast_per_parameter', GPU):.0f}")
fact("sharding.gpu_all_gather_ms")(lambda: f"{measured_collective_ms('all_gather', GPU):.0f}")
fact("sharding.cpu_rs_ag_over_ar")(lambda: f"{rs_ag_over_ar(CPU):.1f}")
fact("sharding.cpu_opt_zero1_ms")(lambda: f"{_time(CPU, 'zero1', 'optimizer_step_ms'):.0f}")
fact("sharding.cpu_opt_ddp_ms")(lambda: f"{_time(CPU, 'ddp', 'optimizer_step_ms'):.0f}")
