"""The "Choosing a parallelism" chapter's numbers: cs336_systems/parallelism's formulas for the 2026 leaderboard
FFN on H200s, with a measured C and W as a third device. The claims recompute by hand from the page's symbols."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.model import get_config
from cs336_systems.parallelism import answers, costs
from cs336_systems.parallelism.hardware import H200_INFINIBAND, H200_NVLINK, Device
from report import collectives, reproducing
from report.figures import new_figure
from report.registry import register
from report.results import markdown_table
from report.units import near

N_NODE = 8          # GPUs in one NVLink-switched HGX H200 node: the N the per-problem tables use
S_EXAMPLE = 1e9     # bytes of the all-reduce the alternate ring is timed on
DATASHEET, MEASURED, INFINIBAND = "H200 NVLink, datasheet", "H200 NVLink, measured", "H200 InfiniBand, datasheet"
B, D, F = 2 * 32_768, 4_096, 11_008  # "batch 2 at context 32,768 ... D = 4,096 and D_FF = 11,008"
C, W = 989e12, 450e9                 # the H200 datasheet: dense bf16, NVLink one direction


def reachable_device() -> Device:
    """An H200 at what we measured. Bus bandwidth is the ring's bytes per rank over time: the handout's W."""
    busbw = collectives.cell(collectives.GPU, "nccl+cuda", 2, collectives.GB_MB)["busbw_gbps"]
    return Device("H200, measured", flops=reproducing.matmul_ceiling_tflops("bf16") * 1e12,
                  egress_bandwidth=float(busbw) * 1e9, memory_bytes=H200_NVLINK.memory_bytes,
                  source="results/ceilings (bf16, n = 8192); results/collectives (NCCL, 2 ranks, 1 GB)")


SETTING = answers.leaderboard_setting()  # datasheet NVLink: the setting every answer quotes


# -- one table per problem: its parts' values at N = N_NODE ------------------------------------

_ms = lambda seconds: f"{seconds * 1e3:.3f} ms"
_alt = lambda N, key: answers.alternate_ring_all_reduce(S_EXAMPLE, N, SETTING.W)[key]["value"]


def setting_table() -> str:
    s = SETTING
    rows = [("B (tokens: batch 2 x context 32,768)", f"{s.B:,.0f}"), ("D (d_model)", f"{s.D:,.0f}"),
            ("D_FF (d_ff)", f"{s.F:,.0f}"), ("C (dense bf16)", f"{s.C / 1e12:,.0f} TFLOP/s"),
            ("W (NVLink, one direction)", f"{s.W / 1e9:,.0f} GB/s"),
            ("C / W", f"{s.C / s.W:,.0f} FLOP/byte")]
    return markdown_table(pd.DataFrame(rows, columns=["symbol", "value"]))


def alternate_table(Ns=(2, 4, 8, 16)) -> str:
    rows = [{"N": N, "alternate ring": _ms(_alt(N, "time")), "ring all-reduce": _ms(_alt(N, "ring_all_reduce")),
             "ratio (N / 2)": _alt(N, "slowdown")} for N in Ns]
    return markdown_table(pd.DataFrame(rows))


def _compute_and_comm(strategy: str, pass_: str, N: int = N_NODE) -> tuple[float, float]:
    s = SETTING
    comm = {"DP": costs.dp_comm_time(s.D, s.F, N, s.W) if pass_ == "backward" else 0.0,
            "FSDP": costs.fsdp_comm_time(s.D, s.F, N, s.W, pass_), "TP": costs.tp_comm_time(s.B, s.D, N, s.W)}
    return costs.ffn_flops(s.B, s.D, s.F, N, pass_) / s.C, comm[strategy]


def per_pass_table(strategy: str) -> str:
    """FLOPs, compute and communication time per device, each pass, at N_NODE devices."""
    rows = []
    for pass_ in ("forward", "backward"):
        compute, comm = _compute_and_comm(strategy, pass_)
        rows.append({"pass": pass_, "FLOPs per device": f"{compute * SETTING.C / 1e12:.2f} TFLOP",
                     "compute": _ms(compute), "communication": _ms(comm),
                     "communication-bound": comm > compute})
    return markdown_table(pd.DataFrame(rows))


# (N_FSDP, N_TP), real-valued, with the most devices whose forward stays compute-bound
real_split = lambda overlap: costs.fsdp_tp_split(SETTING.B, SETTING.F, SETTING.C, SETTING.W, overlap)


def integer_split(overlap: bool) -> tuple[int, int]:
    """real_split in whole devices (ties go to less TP)."""
    s = SETTING

    def fits(f: int, t: int) -> bool:
        t_f, t_t = costs.fsdp_tp_comm_times(s.B, s.D, s.F, f, t, s.W)
        return (max(t_f, t_t) if overlap else t_f + t_t) <= costs.ffn_flops(s.B, s.D, s.F, f * t) / s.C

    n = math.floor(2 * max(real_split(overlap))) + 1
    return max(((f, t) for t in range(1, n) for f in range(1, n) if fits(f, t)), key=lambda ft: (ft[0] * ft[1], -ft[1]))


def fsdp_tp_table(splits=((8, 1), (4, 2), (2, 4), (1, 8))) -> str:
    """The forward at N = 8 split every way: each axis's collective time against the compute."""
    s, rows = SETTING, []
    for f, t in splits:
        t_f, t_t = costs.fsdp_tp_comm_times(s.B, s.D, s.F, f, t, s.W)
        rows.append({"N_FSDP x N_TP": f"{f} x {t}", "compute": _ms(costs.ffn_flops(s.B, s.D, s.F, f * t) / s.C),
                     "FSDP axis": _ms(t_f), "TP axis": _ms(t_t), "overlapped (max)": _ms(max(t_f, t_t)),
                     "not overlapped (sum)": _ms(t_f + t_t)})
    return markdown_table(pd.DataFrame(rows))


def tp_prediction_table(tokens=(4096, 16384, 65536), N: int = 2) -> str:
    """Per rank, the tp-ffn benchmark's cells on 2 H200s: the matmuls, the all-reduces (one per pass), their sum."""
    rows = []
    for name, dev in (("datasheet", H200_NVLINK), ("measured", reachable_device())):
        for tok in tokens:
            for mode, flops, passes in (("forward", 6, 1), ("forward-backward", 18, 2)):
                compute = flops * tok * SETTING.D * SETTING.F / N / dev.flops
                comm = passes * costs.tp_comm_time(tok, SETTING.D, N, dev.egress_bandwidth)
                rows.append({"C, W": name, "tokens": f"{tok:,}", "mode": mode, "tp_compute": _ms(compute),
                             "all_reduce": _ms(comm), "tp (sum)": _ms(compute + comm)})
    return markdown_table(pd.DataFrame(rows))


# -- the bounds: table and figure ------------------------------------------------------------

def bounds() -> pd.DataFrame:
    """Largest N before communication outlasts compute, one column per device."""
    devices = {DATASHEET: H200_NVLINK, MEASURED: reachable_device(), INFINIBAND: H200_INFINIBAND}
    df = pd.concat([answers.communication_bound_devices(answers.leaderboard_setting(device)).assign(setting=name)
                    for name, device in devices.items()])
    return (df.assign(row=df["strategy"] + ", " + df["pass"])
            .pivot_table(index=["row", "formula"], columns="setting", values="max_devices", sort=False).reset_index())


def ratio_figure():
    """Communication over compute time against N on datasheet NVLink: above 1, communication-bound."""
    df = answers.time_curves(SETTING).query("N > 1")  # one device communicates nothing
    fig, ax = new_figure(7.0, 3.6)
    for (strategy, pass_), g in df.groupby(["strategy", "pass"], sort=False):
        label = {"DP": "DP, backward (the same as FSDP)", "FSDP+TP": "FSDP+TP, forward, best split"}.get(
            strategy, f"{strategy}, {pass_}")
        ax.plot(g["N"], g["comm_s"] / g["compute_s"], marker="o", label=label,
                linestyle="--" if strategy == "DP" else "-", zorder=3 if strategy == "DP" else 2)
    ax.axhline(1, color="grey", linestyle=":", linewidth=1)
    ax.text(df["N"].min(), 1.1, "communication-bound above", color="grey", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="devices N", ylabel="communication / compute time")
    ax.set_xticks(sorted(df["N"].unique()), [str(n) for n in sorted(df["N"].unique())])
    ax.legend(fontsize=8)
    return fig


# -- the quantities the page's sentences quote -------------------------------------------------

def bound(strategy: str, pass_: str, setting: str = DATASHEET) -> float:
    """The largest N before communication outlasts compute, for one strategy and pass on one device."""
    return float(bounds().set_index("row").loc[f"{strategy}, {pass_}", setting])


OVERLAP, SERIAL = "FSDP+TP, overlapped", "FSDP+TP, not overlapped"


def _curves_cross_one_at_the_bounds() -> bool:
    """DP's, FSDP's and TP's curves: communication-bound exactly where N is above its bound."""
    curves = answers.time_curves(SETTING).query("strategy != 'FSDP+TP'").groupby(["strategy", "pass"])
    return all((g["N"] > bound(strategy, p)).eq(g["comm_bound"]).all() for (strategy, p), g in curves)


_split = lambda f, t: f"{f} x {t} = {f * t}"

register("parallelism", facts={
    "n_node": lambda: f"{N_NODE}",
    "reach_c_tflops": lambda: f"{reproducing.matmul_ceiling_tflops('bf16'):.0f}",
    "reach_w_gbps": lambda: f"{reachable_device().egress_bandwidth / 1e9:.0f}",
    "dp_bound": lambda: f"{bound('DP', 'backward'):.1f}",
    "tp_fwd_bound": lambda: f"{bound('TP', 'forward'):.1f}",
    "tp_bwd_bound": lambda: f"{bound('TP', 'backward'):.1f}",
    "fsdp_tp_overlap_bound": lambda: f"{bound(OVERLAP, 'forward'):.0f}",
    "fsdp_tp_serial_bound": lambda: f"{bound(SERIAL, 'forward'):.0f}",
    "overlap_split": lambda: "{:.1f} x {:.1f}".format(*real_split(True)),
    "serial_split": lambda: "{:.1f} x {:.1f}".format(*real_split(False)),
    "overlap_int": lambda: _split(*integer_split(True)),
    "serial_int": lambda: _split(*integer_split(False)),
    "ib_w_drop": lambda: f"{H200_NVLINK.egress_bandwidth / H200_INFINIBAND.egress_bandwidth:.0f}",
}, tables={
    "setting": setting_table, "alternate": alternate_table, "dp": lambda: per_pass_table("DP"),
    "fsdp": lambda: per_pass_table("FSDP"), "tp": lambda: per_pass_table("TP"), "fsdp_tp": fsdp_tp_table,
    "bounds": lambda: markdown_table(bounds().rename(columns={"row": "strategy, pass"}), floatfmt=".1f",
                                     formats={"formula": lambda f: f"`{f}`"}),
    "tp_prediction": tp_prediction_table,
}, figures={"ratio": ratio_figure}, claims={
    # the 8B preset: batch 2 at its full context, its d_model and d_ff; the datasheet's C and W
    "setting_is_the_leaderboard_8b": lambda: (SETTING.B, SETTING.D, SETTING.F, SETTING.C, SETTING.W) == (B, D, F, C, W)
    and (2 * get_config("8B").context_length, get_config("8B").d_model, get_config("8B").d_ff) == (B, D, F),
    # (N - 1) S / W over 2 (N - 1) S / (N W), at the two N the answer names
    "alternate_ring_n_over_2_slower": lambda: all(near(_alt(N, "time") / _alt(N, "ring_all_reduce"), N / 2, 1e-12)
                                                  for N in (2, 8)),
    # DP's backward and FSDP's forward hide their communication at N = 8: their bound 1 + B W / C is above it
    "dp_and_fsdp_compute_bound_on_one_node": lambda: near(bound("DP", "backward"), 1 + B * W / C, 1e-12)
    and all(comm < compute for compute, comm in map(_compute_and_comm, ("DP", "FSDP"), ("backward", "forward"))),
    # TP's bounds, 1 + 3 D_FF W / (2 C) and 1 + 3 D_FF W / C, below DP's 1 + B W / C; its forward's just past a node
    "tp_runs_out_first": lambda: near(bound("TP", "forward"), 1 + 3 * F * W / (2 * C), 1e-12)
    and near(bound("TP", "backward"), 1 + 3 * F * W / C, 1e-12) and N_NODE < bound("TP", "forward") < N_NODE + 1
    and bound("TP", "backward") < bound("DP", "backward") < bound(OVERLAP, "forward"),
    # overlapped: the 1-D bounds' product; serial: K^2 / (96 B D_FF), a quarter of it as W / C grows (C / 1e6)
    "2d_overlapped_limits_multiply_serial_near_a_quarter": lambda: near(
        bound(OVERLAP, "forward"), bound("DP", "backward") * bound("TP", "forward"), 1e-12)
    and near(bound(SERIAL, "forward"), (6 * B * F * W / C + 6 * F + 4 * B) ** 2 / (96 * B * F), 1e-12)
    and near(costs.fsdp_tp_max_devices(B, F, C * 1e-6, W, False) / costs.fsdp_tp_max_devices(B, F, C * 1e-6, W, True),
             0.25, 1e-3),
    # measured C and W both below the datasheet's, by similar factors: no bound moves by 5%
    "measured_h200_keeps_c_over_w": lambda: reachable_device().flops < C and reachable_device().egress_bandwidth < W
    and (bounds()[MEASURED] / bounds()[DATASHEET] - 1).abs().max() < 0.05,
    # every bound less one smaller by W's drop: TP's forward below 2
    "infiniband_tp_comm_bound_on_two": lambda: bound("TP", "forward", INFINIBAND) < 2 and all(
        near(bound(s, p, INFINIBAND) - 1, (bound(s, p) - 1) * H200_INFINIBAND.egress_bandwidth / W, 1e-12)
        for s, p in (("DP", "backward"), ("TP", "forward"))),
    "curves_cross_one_at_the_bounds": _curves_cross_one_at_the_bounds,
})
