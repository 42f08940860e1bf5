"""The communication-accounting chapter's numbers (docs/communication-accounting.md): nothing here is
measured. The formulas of cs336_systems/sharding/communication_accounting.py give every number (their
tests check them against hand-worked values); the claims check the sentences' comparisons."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from cs336_systems.sharding import communication_accounting as ca
from report.registry import register
from report.results import markdown_table

GB = 1e9
CFG, MESH = ca.XXLConfig(), ca.Mesh()  # the problem's model and mesh
summary = lambda overlap=True: ca.compute_bound_summary(CFG, ca.TPU_V5P, MESH, overlap)
# tokens whose unsharded half of the activations alone fills a v5p, whatever N
tokens_until_overflow = lambda: ca.TPU_V5P.memory_bytes / (ca.activation_bytes_per_token(CFG) / 2)
h100s = lambda: ca.devices_to_hold(ca.state_bytes(CFG), ca.H100_80GB)
tp_limit = lambda: CFG.d_ff * MESH.M_Y / summary()["alpha"]  # the largest Y whose communication hides


def xxl_memory_table() -> str:
    P, state = ca.n_params(CFG), ca.state_bytes(CFG)
    rows = [("parameters", f"{P:,}"), ("master weights, fp32 (GB)", f"{P * CFG.master_weight_bytes / GB:,.1f}"),
            ("accumulated gradients, fp32 (GB)", f"{P * CFG.grad_bytes / GB:,.1f}"),
            ("Adam m and v, fp32 (GB)", f"{P * CFG.optimizer_bytes / GB:,.1f}"), ("sum (GB)", f"{state / GB:,.1f}"),
            ("activations saved for backward, bf16 (MB per token)", f"{ca.activation_bytes_per_token(CFG) / 1e6:,.2f}"),
            ("H100s of 80 GB to hold the sum", f"{h100s()} ({state / ca.H100_80GB.memory_bytes:.2f} rounded up)")]
    return markdown_table(pd.DataFrame(rows, columns=["quantity", "value"]))


def n_fsdp_table(tokens=(0, 1024, 2048, 4096, 8192)) -> str:
    rows = []
    for t in tokens:
        n = ca.n_fsdp_required(CFG, ca.TPU_V5P, t)
        rows.append({"tokens whose activations are held": f"{t:,}", "N_FSDP": n,
                     "GB per device at N_FSDP": ca.fsdp_bytes_per_device(CFG, n, t) / GB,
                     "GB per device at N_FSDP - 1": ca.fsdp_bytes_per_device(CFG, n - 1, t) / GB if n > 1
                     else math.nan})
    return markdown_table(pd.DataFrame(rows), floatfmt=".1f")


def compute_bound_table() -> str:
    s = pd.DataFrame([summary(True), summary(False)])
    return markdown_table(pd.DataFrame({
        "assumption": ["comms overlap (the book)", "comms add up"], "B/N threshold": s["per_device_exact"],
        "per-device batch (tokens)": s["per_device_tokens"], "global batch B (tokens)": s["global_batch_tokens"],
        "T_math (ms)": s["t_math_s"] * 1e3, "T_FSDP (ms)": s["t_fsdp_s"] * 1e3, "T_TP (ms)": s["t_tp_s"] * 1e3,
    }), floatfmt=".4g")


def batch_reduction_table() -> str:
    """Part (d): how the compute-bound global batch moves with the levers that change the formula."""
    fp8, tp8 = dataclasses.replace(CFG, comm_bytes=1), ca.Mesh(X=8, Y=8)
    options = {"the setting of part (c)": (CFG, MESH), "fp8 weight all-gathers (b = 1 byte)": (fp8, MESH),
               "more tensor parallelism: X = 8, Y = 8": (CFG, tp8), "fp8 gathers and X = 8, Y = 8": (fp8, tp8)}
    s = pd.DataFrame([ca.compute_bound_summary(cfg, ca.TPU_V5P, mesh) for cfg, mesh in options.values()])
    return markdown_table(pd.DataFrame({"lever": list(options), "per-device batch (tokens)": s["per_device_tokens"],
                                        "global batch B (tokens)": s["global_batch_tokens"]}))


register("comm_accounting", facts={
    "params": lambda: f"{ca.n_params(CFG):,}",
    "state_tb": lambda: f"{ca.state_bytes(CFG) / 1e12:.2f}",
    "h100s": lambda: f"{h100s()}",
    "act_mb_per_token": lambda: f"{ca.activation_bytes_per_token(CFG) / 1e6:.1f}",
    "v5p_gb": lambda: f"{ca.TPU_V5P.memory_bytes / GB:.0f}",
    "n_fsdp_state": lambda: f"{ca.n_fsdp_required(CFG, ca.TPU_V5P)}",
    "tokens_until_overflow": lambda: f"{tokens_until_overflow():,.0f}",
    "c_flops": lambda: f"{ca.TPU_V5P.flops:.2g}".replace("e+", " \\cdot 10^{") + "}",
    "w_ici": lambda: f"{ca.TPU_V5P.ici_bandwidth:.2g}".replace("e+", " \\cdot 10^{") + "}",
    "alpha": lambda: f"{summary()['alpha']:.0f}",
    "per_device_exact": lambda: f"{summary()['per_device_exact']:.1f}",
    "per_device_tokens": lambda: f"{summary()['per_device_tokens']}",
    "global_batch": lambda: f"{summary()['global_batch_tokens']:,}",
    "tokens_per_tp_group": lambda: f"{summary()['tokens_per_fsdp_shard']:,}",
    "n_chips": lambda: f"{MESH.N}",
    "y": lambda: f"{MESH.Y}",
    "tp_limit": lambda: f"{tp_limit():.1f}",
}, tables={"memory": xxl_memory_table, "n_fsdp": n_fsdp_table, "compute_bound": compute_bound_table,
           "batch_reduction": batch_reduction_table}, claims={
    "state_is_several_dozen_h100s": lambda: 24 <= h100s() <= 100,  # several dozen: 24 to 100
    # one device fewer does not fit
    "n_fsdp_is_tight": lambda: ca.fsdp_bytes_per_device(CFG, ca.n_fsdp_required(CFG, ca.TPU_V5P)) <= 95e9
    < ca.fsdp_bytes_per_device(CFG, ca.n_fsdp_required(CFG, ca.TPU_V5P) - 1),
    "tensor_parallelism_hides_at_any_batch": lambda: MESH.Y < tp_limit(),
})
