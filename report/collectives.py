"""The collectives chapter's numbers (docs/collectives.md): the all-reduce rows and their latency-bandwidth
fits. A "kind" is backend and tensor device together (`nccl+cuda`, `gloo+cuda`, `gloo+cpu`): a GPU host's
file holds gloo on CPU tensors and on CUDA tensors, so the backend alone does not pick a row."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.distributed.bucket_model import fit_latency_bandwidth
from cs336_systems.distributed.collectives_bench import BENCH, KEY
from report.figures import plt
from report.registry import register
from report.results import CPU, GPU, load_results, markdown_table, newest, source, where, with_source

PROBE_MB, GB_MB = 4 / 1024, 1024  # the 4 KB latency probe and the 1 GB cell, in MiB
# an H200 SXM's NVLink: 900 GB/s both directions together (NVIDIA H200 datasheet), so 450 GB/s each way
NVLINK_GBPS_PER_DIRECTION = 450.0


def all_reduce_rows(device: str = CPU) -> pd.DataFrame:
    """The newest row of each cell (a re-measured cell replaces the old one), with `kind`."""
    df = newest(load_results(BENCH, device), KEY).reset_index(drop=True)
    return df.assign(kind=df["backend"] + "+" + df["device_type"])


ok_rows = lambda device, kind, ranks: where(all_reduce_rows(device), status="ok", kind=kind, world_size=ranks)


def cell(device: str, kind: str, ranks: int, size_mb: float) -> pd.Series:
    """One measured cell; KeyError naming it if it was not measured (or did not run)."""
    hit = where(ok_rows(device, kind, ranks), size_mb=size_mb)
    if hit.empty:
        raise KeyError(f"no ok all-reduce row for {kind}, {ranks} ranks, {size_mb} MB in {source(BENCH, device)}")
    return hit.iloc[-1]


# nccl+cuda -> nccl+CUDA (the tables' spelling); 4 KB, 1 MB, 1 GB (binary units, as the benchmark sizes them)
kind_label = lambda kind: kind.replace("cuda", "CUDA").replace("cpu", "CPU")
human_size = lambda mb: f"{mb / 1024:g} GB" if mb >= 1024 else f"{mb:g} MB" if mb >= 1 else f"{mb * 1024:g} KB"


def all_reduce_table(device: str = CPU) -> str:
    """Every cell: time, spread, both bandwidths, and how loaded the host was; then provenance."""
    df = all_reduce_rows(device).sort_values(["kind", "world_size", "size_bytes"])
    shown = pd.DataFrame({
        "backend": df["kind"].map(kind_label), "ranks": df["world_size"], "size": df["size_mb"].map(human_size),
        "time (ms)": [r["time_ms"] if r["status"] == "ok" else r["status"].upper() for r in df.to_dict("records")],
        "± std": df["time_ms_std"], "algbw (GB/s)": df["algbw_gbps"], "busbw (GB/s)": df["busbw_gbps"],
        "ranks per core": df["ranks_per_core"], "load avg": df["loadavg_1m"],
    })
    return with_source(shown, BENCH, df, device=device, formats={"time (ms)": ".4g"})


def all_reduce_figure(device: str = CPU):
    """All-reduce time and bus bandwidth against size, one line per (kind, world size)."""
    ok = all_reduce_rows(device).query("status == 'ok'").sort_values("size_bytes")
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (kind, world), g in ok.groupby(["kind", "world_size"]):
        for ax, column in ((ax_t, "time_ms"), (ax_b, "busbw_gbps")):
            ax.plot(g["size_bytes"] / 2**20, g[column], marker="o", label=f"{kind_label(kind)}, {world} ranks")
    ax_t.set(xscale="log", yscale="log", xlabel="tensor size (MB)", ylabel="all-reduce time (ms)",
             title="time (median of the slowest rank)")
    ax_b.set(xscale="log", xlabel="tensor size (MB)", ylabel="bus bandwidth (GB/s)",
             title="bus bandwidth = bytes/time x 2(n-1)/n")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
    ax_b.legend(fontsize=8)
    fig.tight_layout()
    return fig


_fit = lambda rows: fit_latency_bandwidth(rows["size_bytes"].tolist(), (rows["time_ms"] / 1e3).tolist())


def fit(device: str, kind: str, ranks: int) -> tuple[float, float]:
    """(o seconds, w bytes/s) of t = o + bytes/w, fitted to one kind's cells at one rank count."""
    rows = ok_rows(device, kind, ranks)
    if rows.empty:
        raise ValueError(f"no all-reduce rows for {kind} on {ranks} ranks in {source(BENCH, device)}: "
                         "cannot fit o and w")
    return _fit(rows)


def fits(device: str = CPU) -> pd.DataFrame:
    """o, w and the knee o·w per (kind, ranks); one that cannot be fitted keeps NaN and the reason in `note`."""
    rows = []
    for (kind, n), g in all_reduce_rows(device).query("status == 'ok'").groupby(["kind", "world_size"]):
        try:
            (o, w), note = _fit(g), ""
        except ValueError as e:
            (o, w), note = (float("nan"), float("nan")), str(e)
        rows.append({"kind": kind, "world_size": int(n), "sizes": int(g["size_bytes"].nunique()),
                     "o_s": o, "w_bytes_per_s": w, "knee_bytes": o * w, "note": note})
    return pd.DataFrame(rows)


def fits_table(device: str = CPU) -> str:
    f = fits(device)
    shown = pd.DataFrame({
        "backend": f["kind"].map(kind_label), "ranks": f["world_size"], "sizes fitted": f["sizes"],
        "o (ms per call)": f["o_s"] * 1e3, "w (GB/s, algbw)": f["w_bytes_per_s"] / 1e9,
        "knee o·w (MB)": f["knee_bytes"] / 2**20,
    })
    if f["note"].astype(bool).any():
        shown["not fitted because"] = f["note"]
    return markdown_table(shown, floatfmt=".3g")


knee_mb = lambda device, kind, ranks=2: math.prod(fit(device, kind, ranks)) / 2**20
_t = lambda device, kind, n, mb, column="time_ms": float(cell(device, kind, n, mb)[column])
# the kinds the page compares: (device, kind, ranks) of the GPU host's three kinds, and the CPU's gloo
NCCL, GLOO_CUDA, GLOO_CPU = (GPU, "nccl+cuda", 2), (GPU, "gloo+cuda", 2), (GPU, "gloo+cpu", 2)
CPU2, CPU4, CPU6 = ((CPU, "gloo+cpu", n) for n in (2, 4, 6))


register("collectives", facts={
    "nccl_1gb_ms": lambda: f"{_t(*NCCL, GB_MB):.1f}",
    "nccl_1gb_busbw": lambda: f"{_t(*NCCL, GB_MB, 'busbw_gbps'):.0f}",
    "nccl_1gb_nvlink_share": lambda: f"{_t(*NCCL, GB_MB, 'busbw_gbps') / NVLINK_GBPS_PER_DIRECTION:.0%}",
    "gloo_cuda_1gb_ms": lambda: f"{_t(*GLOO_CUDA, GB_MB):.0f}",
    "nccl_vs_gloo_1gb": lambda: f"{_t(*GLOO_CUDA, GB_MB) / _t(*NCCL, GB_MB):.0f}",
    "cpu_4kb_ms_2": lambda: f"{_t(*CPU2, PROBE_MB):.2f}",
    "cpu_4kb_ms_6": lambda: f"{_t(*CPU6, PROBE_MB):.1f}",
    "nccl_knee_mb": lambda: f"{knee_mb(GPU, 'nccl+cuda'):.0f}",
    "gloo_cuda_knee_mb": lambda: f"{knee_mb(GPU, 'gloo+cuda'):.1f}",
    "cpu_o_ms": lambda: f"{fit(*CPU2)[0] * 1e3:.2f}",
    "cpu_w_gbps": lambda: f"{fit(*CPU2)[1] / 1e9:.2f}",
}, tables={
    "gpu": lambda: all_reduce_table(GPU), "gpu_fits": lambda: fits_table(GPU),
    "cpu": lambda: all_reduce_table(CPU), "cpu_fits": lambda: fits_table(CPU),
}, figures={"gpu": lambda: all_reduce_figure(GPU), "cpu": lambda: all_reduce_figure(CPU)}, claims={
    "gloo_is_slower_through_the_host": lambda: _t(*GLOO_CUDA, GB_MB) > 10 * _t(*NCCL, GB_MB),
    # far: ten times or more
    "nccl_knee_far_right_of_gloos": lambda: knee_mb(GPU, "nccl+cuda") > 10 * knee_mb(GPU, "gloo+cuda")
    and fit(*NCCL)[0] < fit(*GLOO_CUDA)[0] and fit(*NCCL)[1] > fit(*GLOO_CUDA)[1],
    "more_ranks_hurt_small_messages": lambda: _t(*CPU2, PROBE_MB) < _t(*CPU4, PROBE_MB) < _t(*CPU6, PROBE_MB),
    "nccl_small_calls_cost_their_fixed_cost": lambda: abs(_t(*NCCL, 1) - _t(*NCCL, PROBE_MB))
    < _t(*NCCL, 1, "time_ms_std") + _t(*NCCL, PROBE_MB, "time_ms_std"),
    "nccl_bandwidth_climbs_to_100_mb": lambda: pd.Series([_t(*NCCL, mb, "busbw_gbps") for mb in (1, 10, 100, GB_MB)])
    .is_monotonic_increasing,
    # the same: within 10%
    "gloo_cuda_like_cpu_at_1_gb_not_1_mb": lambda: abs(_t(*GLOO_CUDA, GB_MB) / _t(*GLOO_CPU, GB_MB) - 1) < 0.1
    and _t(*GLOO_CUDA, 1) > _t(*GLOO_CPU, 1),
    "cpu_knee_below_1_mb": lambda: knee_mb(CPU, "gloo+cpu") < 1
    and _t(*CPU2, 1, "busbw_gbps") < _t(*CPU2, GB_MB, "busbw_gbps"),
    "cpu_more_ranks_lower_busbw_at_1_gb": lambda: _t(*CPU2, GB_MB, "busbw_gbps")
    > max(_t(*CPU4, GB_MB, "busbw_gbps"), _t(*CPU6, GB_MB, "busbw_gbps")),
    "only_two_gpus_measured": lambda: set(all_reduce_rows(GPU).query("status == 'ok'")["world_size"]) == {2},
})
