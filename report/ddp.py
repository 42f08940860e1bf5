"""The DDP chapter's numbers (docs/ddp.md, docs/ddp/runs.md). A *run* is one pass of the benchmark
over its grid; tables give the median over runs, `runs_table` each run. `gpu_*` facts read the 2025 xl
on 2 H200s, `cpu_*` the toy model on the 2-core CPU, `xl*` the model itself (computed)."""

from __future__ import annotations

import difflib

import numpy as np
import pandas as pd

from cs336_systems.bench.store import REPO_ROOT
from cs336_systems.distributed.bucket_model import BucketModel
from cs336_systems.distributed.ddp_bench import BENCH as STEPS
from cs336_systems.distributed.ddp_bench import KEY as STEPS_KEY
from cs336_systems.distributed.ddp_bench import TRACE_BENCH
from cs336_systems.model import get_config
from cs336_systems.sharding import preset_accounting as pa
from report import collectives, sharding
from report.figures import plt
from report.registry import register
from report.results import CPU, GPU, load_results, markdown_table, newest, with_source
from report.units import listed, span

RUN_KEY = ["size", "backend", "device_type", "world_size", "batch_size", "context_length"]
STAGE_ORDER = ["compute-only", "naive", "flat", "overlap", "bucketed", "torch-ddp"]
COMPUTE, COMM = "#4c72b0", "#dd8452"
PHASE_COLORS = {"forward": "#a6cee3", "backward": "#1f78b4", "sync": "#fb9a99", "optimizer": "#b2df8a"}
_BOTH = (("gpu", GPU), ("cpu", CPU))  # the facts and claims registered for either device


def stage_label(row: pd.Series | dict) -> str:
    return f"bucketed {row['bucket_size_mb']:g} MB" if row["stage"] == "bucketed" else str(row["stage"])


# a row's values under `key`, NaN spelled "nan" so that equal configurations compare equal
_key = lambda row, key: tuple("nan" if pd.isna(row.get(k)) else row.get(k) for k in key)


def _in_stage_order(df: pd.DataFrame, first: list[str]) -> pd.DataFrame:
    """Rows sorted by the columns `first`, then stage as the chapter builds them, then bucket cap."""
    return (df.assign(_o=df["stage"].map(STAGE_ORDER.index)).sort_values([*first, "_o", "bucket_size_mb"])
            .drop(columns="_o").reset_index(drop=True))


def runs(device: str = CPU) -> pd.DataFrame:
    """Every ok step row, with `run`, `label`, `overhead_ms` (the step minus the same run's compute-only
    step) and `outside_ms` (that minus the time in finish). A run ends where a configuration repeats."""
    df = load_results(STEPS, device).sort_values("time_utc", kind="stable").reset_index(drop=True)
    numbers, run, seen = [], 1, set()
    for key in (_key(r, STEPS_KEY) for r in df.to_dict("records")):
        if key in seen:
            run, seen = run + 1, set()
        seen.add(key)
        numbers.append(run)
    df = df.assign(run=numbers).query("status == 'ok'").copy()
    base = df[df["stage"] == "compute-only"].set_index(RUN_KEY + ["run"])["step_ms"]
    df["overhead_ms"] = [r["step_ms"] - base.get(tuple(r[k] for k in RUN_KEY + ["run"]), float("nan"))
                         for r in df.to_dict("records")]
    df["outside_ms"] = df["overhead_ms"] - df["sync_ms"]
    df["label"] = [stage_label(r) for r in df.to_dict("records")]
    return df.reset_index(drop=True)


MEDIAN_OVER_RUNS = ["step_ms", "step_ms_mean", "sync_ms", "comm_alone_ms", "overhead_ms", "outside_ms"]


def steps(device: str = CPU) -> pd.DataFrame:
    """One row per configuration: the median over runs of MEDIAN_OVER_RUNS, `runs`, each run's step
    (`step_ms_runs`) and the noisiest run's `step_ms_std`; the rest from the latest run."""
    df = runs(device)
    df["_k"] = [_key(r, STEPS_KEY) for r in df.to_dict("records")]  # the configuration, hashable
    g = df.groupby("_k", sort=False)
    out = newest(df, ["_k"]).set_index("_k")  # the latest run's row
    out[MEDIAN_OVER_RUNS] = g[MEDIAN_OVER_RUNS].median()
    out = out.assign(runs=g["run"].nunique(), step_ms_runs=g["step_ms"].agg(tuple), step_ms_std=g["step_ms_std"].max())
    return _in_stage_order(out.reset_index(drop=True), ["size", "world_size"])


# one configuration's column of `steps` (label 'naive', 'bucketed 10 MB', ...); a column of every run
value = lambda device, label, column: float(steps(device).set_index("label").loc[label, column])
per_run = lambda device, column: runs(device).pivot(index="run", columns="label", values=column)
# the bucketed stage's rows of `steps`, smallest cap first; those from 10 MB up
bucketed = lambda device: steps(device).query("stage == 'bucketed'")  # steps() is in cap order
big_caps = lambda device: bucketed(device).query("bucket_size_mb >= 10")


def steps_table(device: str = CPU, stages: list[str] | None = None) -> str:
    """Each configuration (of `stages`), the median over runs; each run's step where one ran twice."""
    df = steps(device) if stages is None else steps(device).query("stage in @stages")
    several = (df["runs"] > 1).any()
    each = {"each run (ms)": [" / ".join(f"{x:.0f}" for x in t) for t in df["step_ms_runs"]]} if several else {}
    shown = pd.DataFrame({
        "model": df["size"], "ranks": df["world_size"], "stage": df["label"],
        "all-reduce calls": df["allreduce_calls"], "step (ms)": df["step_ms"], **each,
        ("± std, noisiest run" if several else "± std"): df["step_ms_std"],
        "over compute-only (ms)": df["overhead_ms"],
        "in finish_gradient_synchronization (ms)": df["sync_ms"],
        "communication alone (ms)": df["comm_alone_ms"],
    })
    return with_source(shown, STEPS, runs(device), device=device, formats={"step (ms)": ".0f"})  # every run's commit


def runs_table(device: str = CPU, labels: list[str] | None = None) -> str:
    """Each run of each configuration (of `labels`, in that order)."""
    df = runs(device)
    if labels is not None:  # stable: each configuration's runs stay in time order
        df = df[df["label"].isin(labels)].sort_values("label", key=lambda c: c.map(labels.index), kind="stable")
    shown = pd.DataFrame({
        "stage": df["label"], "run": df["run"], "step (ms)": df["step_ms"], "± std": df["step_ms_std"],
        "in finish (ms)": df["sync_ms"], "communication alone (ms)": df["comm_alone_ms"],
        "over compute-only (ms)": df["overhead_ms"],
        "over compute-only, outside finish (ms)": df["outside_ms"],
    })
    return with_source(shown, STEPS, df, device=device, formats={"step (ms)": ".0f"})


# -- traces ---------------------------------------------------------------------------------------

def traces(device: str = CPU) -> pd.DataFrame:
    """The newest profiled step of each configuration, in stage order."""
    df = newest(load_results(TRACE_BENCH, device), STEPS_KEY)
    return _in_stage_order(df.assign(label=[stage_label(r) for r in df.to_dict("records")]), [])


def timelines_figure(device: str = CPU) -> plt.Figure:
    """One profiled step per stage: phases, compute and communication on a shared time axis."""
    rows = traces(device).to_dict("records")
    fig, ax = plt.subplots(figsize=(10, 0.75 * len(rows) + 1.2))
    labels = []
    for i, row in enumerate(reversed(rows)):  # the first stage on top
        y = i * 3.0
        for name, (a, b) in row["phases"].items():
            if name in PHASE_COLORS:
                ax.broken_barh([(a, b - a)], (y + 2.0, 0.7), color=PHASE_COLORS[name])
        ax.broken_barh([(a, b - a) for a, b in row["compute"]], (y + 1.0, 0.8), color=COMPUTE)
        ax.broken_barh([(a, b - a) for a, b in row["comm"]], (y, 0.8), color=COMM)
        frac = row["overlap_fraction"]  # NaN where the stage does not communicate
        labels.append(row["label"] + ("" if pd.isna(frac) else f"\n{frac:.0%} of comm hidden"))
    ax.set_yticks([i * 3.0 + 1.3 for i in range(len(rows))], labels, fontsize=8)
    ax.set_xlabel("ms from the start of the step (rank 0)")
    shown = {**PHASE_COLORS, "compute": COMPUTE, "all-reduce running": COMM}
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in shown.values()], list(shown), ncol=6, fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(rows)))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# per configuration that communicates: the share of its all-reduce time that ran while the device computed
hidden = lambda device: traces(device).set_index("label")["overlap_fraction"].dropna().astype(float)


# -- the bucket model -----------------------------------------------------------------------------

def fitted_bucket_model(device: str = CPU) -> BucketModel:
    """o and w fitted to the all-reduce rows of the DDP run's backend and rank count; s its gradient bytes."""
    run = bucketed(device).iloc[0]
    o, w = collectives.fit(device, f"{run['backend']}+{run['device_type']}", int(run["world_size"]))
    return BucketModel(s=float(run["grad_bytes"]), w=w, o=o)


def model_vs_measured(device: str = CPU) -> pd.DataFrame:
    """Each cap at the bucket count it made (no parameter is split): the model's and the measured overhead."""
    model, b = fitted_bucket_model(device), bucketed(device)
    model_ms = [model.overhead(max(1, int(n))) * 1e3 for n in b["allreduce_calls"]]
    return pd.DataFrame({"cap_mb": b["bucket_size_mb"], "buckets": b["allreduce_calls"].astype(int),
                         "model_ms": model_ms, "measured_ms": b["overhead_ms"], "sync_ms": b["sync_ms"]})


def model_vs_measured_table(device: str = CPU) -> str:
    df = model_vs_measured(device).eval("ratio = measured_ms / model_ms")
    return markdown_table(df.rename(columns={
        "cap_mb": "cap (MB)", "model_ms": "model: exposed (ms)", "measured_ms": "measured: over compute-only (ms)",
        "sync_ms": "measured: in finish (ms)", "ratio": "measured / model"}), floatfmt=".3g")


def bucket_model_figure(device: str = CPU) -> plt.Figure:
    """Predicted exposed communication over bucket size, with each cap's measured overhead."""
    b, model = bucketed(device), fitted_bucket_model(device)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    sizes = np.geomspace(model.s / 2000, max(model.s * 2, float(b["bucket_size_mb"].max()) * 2**20 * 1.5), 400)
    ax.plot(sizes / 2**20, [model.overhead_for_bucket(x) * 1e3 for x in sizes], color=COMPUTE,
            label="model: n_b·o + s/(n_b·w)")
    ax.axvline(model.optimal_bucket_bytes / 2**20, color=COMPUTE, ls="--", lw=1,
               label=f"b* = sqrt(s·w·o) = {model.optimal_bucket_bytes / 2**20:.3g} MB")
    ax.plot(b["bucket_size_mb"], b["overhead_ms"], "o", color=COMM, label="measured: step - compute-only step")
    ax.set(xscale="log", yscale="log", xlabel="bucket size (MB)", ylabel="exposed communication (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- the xl model's gradient tensors (computed from the model, not measured) ----------------------

xl = lambda: pa.ddp_numbers(pa.XL_2025)  # the 2025 xl's gradients: tensors, bytes, the norm gains among them


def xl2026() -> dict[str, float]:
    """The 2026 xl's gradients (our 2.7B) under the 2-GPU fit: t_naive's two terms in ms, and the knee o·w."""
    model = fitted_bucket_model(GPU)
    n = pa.ddp_numbers(pa.XL_2026, bus_bytes_per_s=model.w)
    return {**n, "fixed_ms": n["tensors"] * model.o * 1e3, "transfer_ms": n["allreduce_s"] * 1e3, "knee_bytes": model.o * model.w}


def xl_tensor_sizes() -> pd.DataFrame:
    """The xl's tensors grouped by fp32 size, smallest first: how many, their share of the bytes, one name."""
    df = pd.DataFrame(pa.parameter_tensors("xl"), columns=["name", "bytes"]).eval("bytes = 4 * bytes")
    g = df.groupby("bytes")
    out = pd.DataFrame({"tensors": g.size(), "example": g["name"].first()}).reset_index()
    return out.assign(share=out.eval("bytes * tensors") / df["bytes"].sum())


def xl_tensor_sizes_table() -> str:
    df = xl_tensor_sizes()
    shown = pd.DataFrame({
        "fp32 size": [f"{b / 2**10:.3g} KB" if b < 2**20 else f"{b / 2**20:.3g} MB" for b in df["bytes"]],
        "tensors": df["tensors"], "share of the bytes": [f"{x:.3%}" for x in df["share"]],
        "for example": [f"`{n}`" for n in df["example"]]})
    return markdown_table(shown)


# -- the stages' code, as diffs -------------------------------------------------------------------

def stage_diff(old: str, new: str, section: str = "ddp") -> str:
    """A fenced unified diff of the `# --8<-- [start:section]` ... `[end:section]` lines of two stages' files."""
    paths, parts = [f"cs336_systems/distributed/ddp/{s}.py" for s in (old, new)], []
    for path in paths:
        lines = (REPO_ROOT / path).read_text().splitlines()
        marks = [line.strip() for line in lines]
        parts.append(lines[marks.index(f"# --8<-- [start:{section}]") + 1:marks.index(f"# --8<-- [end:{section}]")])
    diff = difflib.unified_diff(*parts, fromfile=paths[0], tofile=paths[1], lineterm="", n=2)
    return "```diff\n" + "\n".join(diff) + "\n```"


# -- quantities the chapter's sentences quote -------------------------------------------------------

_cpu_after_backward = lambda column: min(value(CPU, s, column) for s in ("naive", "flat"))  # the smaller of the two


def naive_terms_ms(device: str) -> tuple[float, float]:
    """The two terms of t_naive = k·o + s/w, in ms: k calls' fixed costs, and the transfer."""
    model, k = fitted_bucket_model(device), int(value(device, "naive", "allreduce_calls"))
    return k * model.o * 1e3, model.s / model.w * 1e3


naive_fixed_over_transfer = lambda device: np.divide(*naive_terms_ms(device))  # = knee o·w / average call s/k
naive_sync_share = lambda device: value(device, "naive", "sync_ms") / value(device, "naive", "step_ms")
one_allreduce_ms = lambda: sharding.measured_collective_ms("all_reduce", GPU)  # the whole gradient, timed alone


def flat_saved_added_ms() -> tuple[float, float]:
    """On the GPU: what flattening saves (naive's communication alone beyond s/w) and adds (flat's copies)."""
    return (value(GPU, "naive", "comm_alone_ms") - naive_terms_ms(GPU)[1],
            value(GPU, "flat", "comm_alone_ms") - one_allreduce_ms())


# what naive's communication alone spends beyond the transfer, per all-reduce call
naive_excess_per_call_ms = lambda: flat_saved_added_ms()[0] / value(GPU, "naive", "allreduce_calls")


def clearly_faster(device: str, fast: str, slow: str) -> pd.Series:
    """Per run: did `fast` beat `slow` by more than their two standard deviations added?"""
    step, std = per_run(device, "step_ms"), per_run(device, "step_ms_std")
    return (step[slow] - step[fast]) > (std[slow] + std[fast])


def overlap_saved_ms(device: str) -> pd.Series:
    """Per run: naive's overhead minus the smallest overhead of a stage that overlaps."""
    overhead = per_run(device, "overhead_ms")
    return overhead["naive"] - overhead.drop(columns=["compute-only", "naive", "flat"]).min(axis=1)


# per run (rows): each bucket cap's step (columns); the fastest cap's over PyTorch's DDP's, minus 1
caps_step = lambda device: per_run(device, "step_ms").filter(like="bucketed")
best_cap_vs_torch = lambda device: caps_step(device).min(axis=1) / per_run(device, "step_ms")["torch-ddp"] - 1
# per configuration: how far its step moved between runs (largest minus smallest run)
run_move_ms = lambda device: per_run(device, "step_ms").agg(np.ptp)
above_model_everywhere = lambda device: model_vs_measured(device).eval("measured_ms > model_ms").all()


def _model_falls_from_10_mb() -> bool:
    """From 10 MB up the model's overhead falls over 3x (the measured one's flatness: part (a)'s claim)."""
    model = model_vs_measured(GPU).query("cap_mb >= 10")["model_ms"]
    return model.iloc[0] > 3 * model.iloc[-1]


def _cpu_caps_within_one_steps_noise() -> bool:
    """The caps' steps spread by under 1.5 steps' noise; the best cap within that noise of PyTorch's DDP."""
    step, noise = bucketed(CPU)["step_ms"], bucketed(CPU)["step_ms_std"].median()
    return np.ptp(step) < 1.5 * noise and abs(step.min() - value(CPU, "torch-ddp", "step_ms")) < noise


register("ddp", facts={
    # gpu_naive_step_ms, gpu_naive_sync_ms, ...: the GPU's median over runs
    **{f"gpu_{s}_{c}": (lambda s=s, c=c: f"{value(GPU, s, c):.0f}")
       for s in ("naive", "flat", "overlap") for c in ("step_ms", "sync_ms")},
    "gpu_compute_only_ms": lambda: f"{value(GPU, 'compute-only', 'step_ms'):.0f}",
    "gpu_torch_ddp_step_ms": lambda: f"{value(GPU, 'torch-ddp', 'step_ms'):.0f}",
    "gpu_overlap_outside_ms": lambda: f"{value(GPU, 'overlap', 'outside_ms'):.0f}",
    **{f"{d}_naive_sync_share": (lambda dev=dev: f"{naive_sync_share(dev):.0%}") for d, dev in _BOTH},
    **{f"{d}_naive_fixed_ms": (lambda dev=dev: f"{naive_terms_ms(dev)[0]:.0f}") for d, dev in _BOTH},
    **{f"{d}_transfer_ms": (lambda dev=dev: f"{naive_terms_ms(dev)[1]:.0f}") for d, dev in _BOTH},
    "gpu_hidden_overlap": lambda: f"{hidden(GPU)['overlap']:.0%}",
    "gpu_std_median_ms": lambda: f"{runs(GPU)['step_ms_std'].median():.0f}",
    "gpu_run_move_median_ms": lambda: f"{run_move_ms(GPU).median():.0f}",
    "xl_d_model": lambda: f"{get_config('xl').d_model:,}",
    "xl_params_b": lambda: f"{xl()['params'] / 1e9:.2f}",
    "xl_grad_gb": lambda: f"{xl()['grad_bytes'] / 1e9:.1f}",
    "xl_tensors": lambda: xl()["tensors"],
    "xl_avg_tensor_mb": lambda: f"{xl()['mean_tensor_bytes'] / 2**20:.0f}",
    "xl2026_tensors": lambda: xl2026()["tensors"],
    "xl2026_avg_tensor_mb": lambda: f"{xl2026()['mean_tensor_bytes'] / 2**20:.0f}",
    "xl2026_naive_fixed_ms": lambda: f"{xl2026()['fixed_ms']:.0f}",
    "xl2026_transfer_ms": lambda: f"{xl2026()['transfer_ms']:.0f}",
    "gpu_one_allreduce_ms": lambda: f"{one_allreduce_ms():.0f}",
    "gpu_flat_saved_ms": lambda: f"{flat_saved_added_ms()[0]:.0f}",
    "gpu_flat_added_ms": lambda: f"{flat_saved_added_ms()[1]:.0f}",
    "gpu_naive_excess_us": lambda: f"{naive_excess_per_call_ms() * 1e3:.0f}",
    "gpu_o_us": lambda: f"{fitted_bucket_model(GPU).o * 1e6:.0f}",
    "gpu_w_gbps": lambda: f"{fitted_bucket_model(GPU).w / 1e9:.0f}",
    "gpu_grad_mb": lambda: f"{fitted_bucket_model(GPU).s / 2**20:,.0f}",
    "gpu_optimal_buckets": lambda: f"{fitted_bucket_model(GPU).optimal_num_buckets:.0f}",
    "gpu_optimal_bucket_mb": lambda: f"{fitted_bucket_model(GPU).optimal_bucket_bytes / 2**20:.0f}",
    "gpu_min_overhead_ms": lambda: f"{fitted_bucket_model(GPU).min_overhead * 1e3:.1f}",
    "gpu_measured_over_model": lambda: span(model_vs_measured(GPU).eval("measured_ms / model_ms"), ".1f"),
    "gpu_bucketed_steps": lambda: listed(bucketed(GPU)["step_ms"], ".0f"),
    "gpu_bucket_spread_ms": lambda: f"{np.ptp(big_caps(GPU)['step_ms']):.0f}",
    "gpu_best_cap_vs_torch": lambda: f"{best_cap_vs_torch(GPU).abs().max():.1%}",
    "gpu_overlap_saved_max_ms": lambda: f"{overlap_saved_ms(GPU).max():.0f}",
    "cpu_naive_calls": lambda: int(value(CPU, "naive", "allreduce_calls")),
    "cpu_grad_mb": lambda: f"{fitted_bucket_model(CPU).s / 2**20:.1f}",
}, tables={
    "gpu_steps": lambda: steps_table(GPU), "cpu_steps": lambda: steps_table(CPU), "xl_tensors": xl_tensor_sizes_table,
    "gpu_bucketed": lambda: steps_table(GPU, ["compute-only", "bucketed", "torch-ddp"]),
    "gpu_runs": lambda: runs_table(GPU), "gpu_runs_overlap": lambda: runs_table(GPU, ["naive", "flat", "overlap"]),
    **{f"{d}_model_vs_measured": (lambda dev=dev: model_vs_measured_table(dev)) for d, dev in _BOTH},
    # diff_naive_flat, diff_flat_overlap, diff_overlap_bucketed: each stage against the one before
    **{f"diff_{a}_{b}": (lambda a=a, b=b: stage_diff(a, b)) for a, b in zip(STAGE_ORDER[1:4], STAGE_ORDER[2:5])},
}, figures={
    "gpu_timelines": lambda: timelines_figure(GPU), "cpu_timelines": lambda: timelines_figure(CPU),
    "gpu_bucket_model": lambda: bucket_model_figure(GPU), "cpu_bucket_model": lambda: bucket_model_figure(CPU),
}, claims={
    "runs_move_more_than_steps_vary": lambda: run_move_ms(GPU).median() > runs(GPU)["step_ms_std"].median(),
    "run_1_cost_more_everywhere": lambda: (per_run(GPU, "overhead_ms").idxmax().drop("compute-only") == 1).all(),
    "naive_one_call_per_tensor": lambda: value(GPU, "naive", "allreduce_calls") == xl()["tensors"],
    "best_cap_within_a_few_percent": lambda: best_cap_vs_torch(GPU).abs().max() < 0.03,  # a few: under 3%
    "step_is_mostly_computation": lambda: naive_sync_share(GPU) < 0.2,
    # at the knee, so the two terms about equal: within 0.8 to 1.25
    "average_call_at_the_knee": lambda: 0.8 < naive_fixed_over_transfer(GPU) < 1.25,
    # the smallest tensors are the norm gains, under 0.1% of the bytes
    "norm_gains_carry_almost_nothing": lambda: xl_tensor_sizes()["tensors"].iloc[0] == xl()["norm_tensors"]
    and xl()["norm_bytes"] < 0.001 * xl()["grad_bytes"],
    "cpu_share_far_larger": lambda: naive_sync_share(CPU) > 2 * naive_sync_share(GPU),  # far: at least twice
    # flat faster in one run and slower in the other, clearly in neither
    "flat_not_clearly_faster": lambda: np.prod(per_run(GPU, "step_ms")["naive"] - per_run(GPU, "step_ms")["flat"]) < 0
    and not clearly_faster(GPU, "flat", "naive").any(),
    # about equal: within 3:2 either way; and naive's calls each cost less than the fit's o
    "flat_saves_about_what_it_adds": lambda: 2 / 3 < np.divide(*flat_saved_added_ms()) < 3 / 2
    and naive_excess_per_call_ms() / 1e3 < fitted_bucket_model(GPU).o,
    "cpu_flat_and_naive_within_noise": lambda: abs(value(CPU, "flat", "step_ms") - value(CPU, "naive", "step_ms"))
    < min(value(CPU, "flat", "step_ms_std"), value(CPU, "naive", "step_ms_std")),
    "cpu_transfer_is_the_bigger_term": lambda: naive_fixed_over_transfer(CPU) < 1,
    # the 2026 xl: fewer tensors, the average above the knee, the fixed costs under half the transfer and a
    # smaller share of it than the 2025 xl's (less for flattening to save)
    "xl2026_naive_is_bandwidth_bound": lambda: (lambda x: x["tensors"] < xl()["tensors"] and x["mean_tensor_bytes"]
        > x["knee_bytes"] and x["fixed_ms"] / x["transfer_ms"] < min(0.5, naive_fixed_over_transfer(GPU)))(xl2026()),
    "hooks_hide_the_wait_yet_win_one_run": lambda: (per_run(GPU, "sync_ms")["overlap"]
                                                    < per_run(GPU, "sync_ms")[["naive", "flat"]].min(axis=1)).all()
    and clearly_faster(GPU, "overlap", "naive").sum() == 1,
    # nothing: within 3 ms, the typical standard deviation of a step; large: over 10 ms
    "time_moved_into_backward": lambda: (per_run(GPU, "outside_ms")[["naive", "flat"]].abs() < 3).all().all()
    and (per_run(GPU, "outside_ms")["overlap"] > 10).all(),
    "naive_and_flat_hide_nothing": lambda: hidden(GPU)["naive"] == 0 and hidden(GPU)["flat"] == 0,
    "hooked_stages_hide_most": lambda: hidden(GPU).drop(["naive", "flat"]).min() > 0.5,
    # far less: under half of either; shorter: by more than one step's standard deviation
    "cpu_overlap_waits_less_and_leads": lambda: value(CPU, "overlap", "sync_ms") < 0.5 * _cpu_after_backward("sync_ms")
    and _cpu_after_backward("step_ms") - value(CPU, "overlap", "step_ms") > value(CPU, "overlap", "step_ms_std"),
    # flat: the caps from 10 MB up spread less than any of them moved between runs
    "bucket_curve_flat_from_10_mb": lambda: np.ptp(big_caps(GPU)["step_ms"])
    < run_move_ms(GPU)[big_caps(GPU)["label"]].min(),
    "1_mb_cap_slowest_in_run_1_only": lambda: (caps_step(GPU).idxmax(axis=1) == "bucketed 1 MB").tolist()
    == [True, False] and value(GPU, "bucketed 1 MB", "allreduce_calls") == value(GPU, "naive", "allreduce_calls"),
    "overlap_saved_little": lambda: (overlap_saved_ms(GPU) < per_run(GPU, "overhead_ms")["naive"] / 2).all(),
    "bucketed_overhead_mostly_in_backward": lambda: (bucketed(GPU)["outside_ms"] > bucketed(GPU)["sync_ms"]).all(),
    **{f"{d}_model_underestimates_the_overhead": (lambda dev=dev: above_model_everywhere(dev)) for d, dev in _BOTH},
    "model_falls_several_fold_from_10_mb": _model_falls_from_10_mb,
    "time_in_finish_falls_with_the_cap": lambda: model_vs_measured(GPU)["sync_ms"].is_monotonic_decreasing,
    "cpu_caps_within_one_steps_noise": _cpu_caps_within_one_steps_noise,
})
