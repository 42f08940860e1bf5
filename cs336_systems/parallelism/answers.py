"""The numbers each part of the handout's parallelism problems asks for, from costs.py, for a
chapter to print: alternate_ring_all_reduce, data_parallel_calcs, fsdp_calcs, tp_calcs,
fsdp_tp_calcs. Each returns {part: {"formula": text, "value": number(s)}}.

The default setting is the 2026 leaderboard model's FFN (D = 4,096, F = 11,008) at its batch,
2 x 32,768 = 65,536 tokens, on H200-class numbers (hardware.py). `communication_bound_devices`
gives, per strategy and pass, the largest device count before communication outlasts compute;
`time_curves` the two times against N (a report layer draws the plot).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cs336_systems.model.config import get_config

from . import costs
from .hardware import H200_NVLINK, Device


@dataclass(frozen=True)
class Setting:
    """B tokens, D = d_model, F = d_ff, on a device with C FLOP/s and W egress bytes/s."""

    B: float
    D: float
    F: float
    device: Device

    @property
    def C(self) -> float:
        return self.device.flops

    @property
    def W(self) -> float:
        return self.device.egress_bandwidth


def leaderboard_setting(device: Device = H200_NVLINK, batch: int = 2) -> Setting:
    """The 2026 leaderboard's 8B model: batch 2 at its full context (32,768), one FFN layer."""
    cfg = get_config("8B")
    return Setting(B=batch * cfg.context_length, D=cfg.d_model, F=cfg.d_ff, device=device)


def _part(formula: str, value) -> dict:
    return {"formula": formula, "value": value}


def alternate_ring_all_reduce(S: float, N: int, W: float) -> dict:
    """(N-1) S / W: N - 1 steps of a full S-byte message each; N/2 times the ring all-reduce."""
    alt = costs.alternate_all_reduce_time(S, N, W)
    ring = costs.ring_collective_time(S, N, W, "all_reduce")
    return {"time": _part("(N - 1) S / W", alt),
            "ring_all_reduce": _part("2 (N - 1) S / (N W)", ring),
            "slowdown": _part("N / 2", alt / ring)}


def data_parallel_calcs(s: Setting, N: int) -> dict:
    return {"a": _part("12 B D D_FF / N_DP", costs.ffn_flops(s.B, s.D, s.F, N, "backward")),
            "b": _part("2 (N_DP - 1)/N_DP * 3 D D_FF * 2 / W = 12 D D_FF (N_DP - 1) / (N_DP W)",
                       costs.dp_comm_time(s.D, s.F, N, s.W)),
            "c": _part("N_DP <= 1 + B W / C", costs.dp_max_devices(s.B, s.C, s.W))}


def fsdp_calcs(s: Setting, N: int) -> dict:
    return {"a": _part("backward 12 B D D_FF / N_FSDP; forward 6 B D D_FF / N_FSDP",
                       {"backward": costs.ffn_flops(s.B, s.D, s.F, N, "backward"),
                        "forward": costs.ffn_flops(s.B, s.D, s.F, N, "forward")}),
            "b": _part("backward 12 D D_FF (N_FSDP - 1)/(N_FSDP W); forward 6 D D_FF (N_FSDP - 1)/(N_FSDP W)",
                       {"backward": costs.fsdp_comm_time(s.D, s.F, N, s.W, "backward"),
                        "forward": costs.fsdp_comm_time(s.D, s.F, N, s.W, "forward")}),
            "c": _part("both passes: N_FSDP <= 1 + B W / C", costs.dp_max_devices(s.B, s.C, s.W))}


# --8<-- [start:tp_backward]
# tp_calcs (a), in the handout's names (our w1 = W1, w3 = W2, w2 = W3); device i of N_TP:
TP_BACKWARD = (
    "dz(i) = dy W3(i)^T",                                  # (B, D_FF/N): dy is whole on every device
    "dx2(i) = dz(i) * f(x1(i))",
    "dx1(i) = dz(i) * f'(x1(i)) * x2(i)",
    "dW3(i) = z(i)^T dy",                                  # (D_FF/N, D): the row-parallel shard's gradient
    "dW2(i) = x^T dx2(i)",                                 # (D, D_FF/N)
    "dW1(i) = x^T dx1(i)",
    "dx = all-reduce_i(dx1(i) W1(i)^T + dx2(i) W2(i)^T)",  # (B, D): each device holds a partial sum
)
# --8<-- [end:tp_backward]


def tp_calcs(s: Setting, N: int) -> dict:
    return {"a": _part("; ".join(TP_BACKWARD), TP_BACKWARD),
            "b": _part("forward 6 B D D_FF / N_TP; backward 12 B D D_FF / N_TP",
                       {"forward": costs.ffn_flops(s.B, s.D, s.F, N, "forward"),
                        "backward": costs.ffn_flops(s.B, s.D, s.F, N, "backward")}),
            "c": _part("each pass one all-reduce of (B, D): 4 B D (N_TP - 1) / (N_TP W)",
                       costs.tp_comm_time(s.B, s.D, N, s.W)),
            "d": _part("backward N_TP <= 1 + 3 D_FF W / C; forward N_TP <= 1 + 3 D_FF W / (2 C)",
                       {"backward": costs.tp_max_devices(s.F, s.C, s.W, "backward"),
                        "forward": costs.tp_max_devices(s.F, s.C, s.W, "forward")})}


def fsdp_tp_calcs(s: Setting, N_fsdp: int, N_tp: int) -> dict:
    t_fsdp, t_tp = costs.fsdp_tp_comm_times(s.B, s.D, s.F, N_fsdp, N_tp, s.W)
    return {"a": _part("6 B D D_FF / (N_FSDP N_TP)", costs.ffn_flops(s.B, s.D, s.F, N_fsdp * N_tp)),
            "b": _part("max(6 D D_FF (N_FSDP - 1)/(N_FSDP N_TP W), 4 B D (N_TP - 1)/(N_TP N_FSDP W))",
                       {"time": max(t_fsdp, t_tp), "fsdp_axis": t_fsdp, "tp_axis": t_tp}),
            "c": _part("N <= (1 + B W / C)(1 + 3 D_FF W / (2 C)) ~ 3 B D_FF W^2 / (2 C^2)",
                       {"N": costs.fsdp_tp_max_devices(s.B, s.F, s.C, s.W, overlap=True),
                        "split": costs.fsdp_tp_split(s.B, s.F, s.C, s.W, overlap=True)}),
            "d": _part("N <= (6 B D_FF W / C + 6 D_FF + 4 B)^2 / (96 B D_FF) ~ 3 B D_FF W^2 / (8 C^2)",
                       {"N": costs.fsdp_tp_max_devices(s.B, s.F, s.C, s.W, overlap=False),
                        "split": costs.fsdp_tp_split(s.B, s.F, s.C, s.W, overlap=False)})}


# --8<-- [start:bound_table]
def communication_bound_devices(s: Setting | None = None) -> pd.DataFrame:
    """One row per (strategy, pass): the largest N before communication outlasts compute."""
    s = s or leaderboard_setting()
    rows = [("DP", "backward", costs.dp_max_devices(s.B, s.C, s.W), "1 + B W / C"),
            ("FSDP", "forward", costs.dp_max_devices(s.B, s.C, s.W), "1 + B W / C"),
            ("FSDP", "backward", costs.dp_max_devices(s.B, s.C, s.W), "1 + B W / C"),
            ("TP", "forward", costs.tp_max_devices(s.F, s.C, s.W, "forward"), "1 + 3 D_FF W / (2 C)"),
            ("TP", "backward", costs.tp_max_devices(s.F, s.C, s.W, "backward"), "1 + 3 D_FF W / C"),
            ("FSDP+TP, overlapped", "forward", costs.fsdp_tp_max_devices(s.B, s.F, s.C, s.W, True),
             "(1 + B W / C)(1 + 3 D_FF W / (2 C))"),
            ("FSDP+TP, not overlapped", "forward", costs.fsdp_tp_max_devices(s.B, s.F, s.C, s.W, False),
             "(6 B D_FF W / C + 6 D_FF + 4 B)^2 / (96 B D_FF)")]
    return pd.DataFrame([{"strategy": st, "pass": p, "max_devices": n, "formula": f,
                          "device": s.device.name, "B": s.B, "D": s.D, "D_FF": s.F}
                         for st, p, n, f in rows])
# --8<-- [end:bound_table]


def time_curves(s: Setting | None = None, Ns=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)) -> pd.DataFrame:
    """Compute and communication seconds per forward (and DP's backward) against N. 2-D uses, at
    each N, the factorisation N_FSDP x N_TP with the least (overlapped) communication."""
    s = s or leaderboard_setting()
    rows = []
    for N in Ns:
        fwd, bwd = (costs.ffn_flops(s.B, s.D, s.F, N, p) / s.C for p in ("forward", "backward"))
        comm = {("DP", "backward", bwd): costs.dp_comm_time(s.D, s.F, N, s.W),
                ("FSDP", "forward", fwd): costs.fsdp_comm_time(s.D, s.F, N, s.W, "forward"),
                ("TP", "forward", fwd): costs.tp_comm_time(s.B, s.D, N, s.W)}
        splits = [(N // t, t) for t in range(1, N + 1) if N % t == 0]
        best = min(splits, key=lambda ft: max(costs.fsdp_tp_comm_times(s.B, s.D, s.F, *ft, s.W)))
        comm[("FSDP+TP", "forward", fwd)] = max(costs.fsdp_tp_comm_times(s.B, s.D, s.F, *best, s.W))
        for (strategy, p, compute), t in comm.items():
            rows.append({"N": N, "strategy": strategy, "pass": p, "compute_s": compute, "comm_s": t,
                         "comm_bound": t > compute})
    return pd.DataFrame(rows)
