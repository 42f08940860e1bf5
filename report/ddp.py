"""The DDP chapter: step times of every stage over runs, traces, the bucket model, the stages' diffs.

    ```python exec="on"
    import report.ddp
    print(report.ddp.steps_table("nvidia-h200"))
    ```

A *run* is one pass of the benchmark over its grid. The GPU file holds two runs, and a difference
between configurations counts only where every run shows it, so the tables give the median over
runs (with two runs, their mean) and `runs_table` each run. The chapter's numbers are facts in
`report/ddp_facts.py`; this module holds the tables, figures and the quantities they share.
"""

from __future__ import annotations

import collections
import difflib

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT
from cs336_systems.distributed.bucket_model import BucketModel
from cs336_systems.distributed.ddp_bench import BENCH as STEPS
from cs336_systems.distributed.ddp_bench import KEY as STEPS_KEY
from cs336_systems.distributed.ddp_bench import TRACE_BENCH
from cs336_systems.model import TransformerLM, get_config
from report import collectives, distributed_figures, figures  # noqa: F401 - figures: the pages' svg()
from report.distributed_figures import stage_label
from report.results import load_results, markdown_table, provenance_line

GPU, CPU = "nvidia-h200", "cpu"
RUN_KEY = ["size", "backend", "device_type", "world_size", "batch_size", "context_length"]
STAGE_ORDER = ["compute-only", "naive", "flat", "overlap", "bucketed", "torch-ddp"]
HOOKED = ["overlap", "bucketed", "torch-ddp"]  # stages that communicate during backward
STAGE_FILES = {s: f"cs336_systems/distributed/ddp/{s}.py" for s in ("naive", "flat", "overlap", "bucketed")}


def source(bench: str, device: str) -> str:
    return f"results/{bench}/{device}.jsonl"


def _key(row: dict, key: list[str]) -> tuple:
    return tuple("nan" if pd.isna(row.get(k)) else row.get(k) for k in key)


def runs(device: str = CPU) -> pd.DataFrame:
    """Every ok step row, with `run` (1, 2, ...), `label`, `overhead_ms` (the step minus the
    compute-only step of the same run: what data parallelism costs) and `outside_ms` (that overhead
    minus the time in finish_gradient_synchronization: what it added to forward, backward and the
    optimizer step).

    In time order, a new run starts at the first row whose configuration the current run already
    has (a run cut by the time limit and resumed adds only the missing configurations: one run)."""
    df = load_results(STEPS, device).sort_values("time_utc", kind="stable").reset_index(drop=True)
    df["bucket_size_mb"] = df.get("bucket_size_mb")
    numbers, run, seen = [], 1, set()
    for r in df.to_dict("records"):
        key = _key(r, STEPS_KEY)
        if key in seen:
            run, seen = run + 1, set()
        seen.add(key)
        numbers.append(run)
    df["run"] = numbers
    df = df[df["status"] == "ok"].copy()
    base = df[df["stage"] == "compute-only"].set_index(RUN_KEY + ["run"])["step_ms"]
    df["overhead_ms"] = [r["step_ms"] - base.get(tuple(r[k] for k in RUN_KEY + ["run"]), float("nan"))
                         for r in df.to_dict("records")]
    df["outside_ms"] = df["overhead_ms"] - df["sync_ms"]
    df["label"] = [stage_label(r) for r in df.to_dict("records")]
    return df.reset_index(drop=True)


MEDIAN_OVER_RUNS = ["step_ms", "step_ms_mean", "sync_ms", "comm_alone_ms", "overhead_ms", "outside_ms"]


def steps(device: str = CPU) -> pd.DataFrame:
    """One row per configuration over its runs: the median over runs of each run's step_ms,
    sync_ms, comm_alone_ms, overhead_ms and outside_ms; `runs`; the extremes `step_ms_lo`/`_hi`;
    `step_ms_runs` (each run's step_ms, in run order); `step_ms_std` the noisiest run's standard
    deviation. Other columns come from the latest run. One run: that run's rows unchanged."""
    df = runs(device)
    if df.empty:
        return df
    key = [k for k in STEPS_KEY if k in df]
    g = df.assign(_k=[_key(r, key) for r in df.to_dict("records")]).groupby("_k", sort=False)
    out = g.tail(1).set_index("_k")  # the latest run's row (df is in time order)
    for col in MEDIAN_OVER_RUNS:
        out[col] = g[col].median()
    out["runs"] = g["run"].nunique()
    out["step_ms_lo"], out["step_ms_hi"] = g["step_ms"].min(), g["step_ms"].max()
    out["step_ms_runs"] = g["step_ms"].agg(tuple)
    out["step_ms_std"] = g["step_ms_std"].max()
    out = out.reset_index(drop=True)
    order = out["stage"].map(STAGE_ORDER.index)
    return out.assign(_o=order).sort_values(["size", "world_size", "_o", "bucket_size_mb"]).drop(
        columns="_o").reset_index(drop=True)


def at(device: str, label: str) -> pd.Series:
    """One configuration's row of `steps` ('naive', 'bucketed 10 MB', 'torch-ddp', ...)."""
    return steps(device).set_index("label").loc[label]


def per_run(device: str, column: str) -> pd.DataFrame:
    """`column` of every configuration in every run: index run, columns label."""
    return runs(device).pivot(index="run", columns="label", values=column)


def bucketed(device: str) -> pd.DataFrame:
    """The bucketed stage's rows of `steps`, smallest cap first."""
    df = steps(device)
    return df[df["stage"] == "bucketed"].sort_values("bucket_size_mb").reset_index(drop=True)


def steps_table(device: str = CPU, size: str | None = None) -> str:
    df = steps(device)
    if size is not None:
        df = df[df["size"] == size]
    several = bool((df["runs"] > 1).any())
    shown = pd.DataFrame({
        "model": df["size"], "ranks": df["world_size"], "stage": df["label"],
        "all-reduce calls": df["allreduce_calls"], "step (ms)": df["step_ms"],
        **({"each run (ms)": [" / ".join(f"{x:.0f}" for x in t) for t in df["step_ms_runs"]]}
           if several else {}),
        ("± std, noisiest run" if several else "± std"): df["step_ms_std"],
        "over compute-only (ms)": df["overhead_ms"],
        "in finish_gradient_synchronization (ms)": df["sync_ms"],
        "communication alone (ms)": df["comm_alone_ms"],
    })
    return (markdown_table(shown, floatfmt=".3g") + "\n\n"
            + provenance_line(runs(device), source(STEPS, device)))  # every run's commit


def runs_table(device: str = CPU, labels: list[str] | None = None) -> str:
    """Each run of each configuration: step ± std, the time in finish, communication alone, the
    overhead over that run's compute-only step, and the part of it outside finish."""
    df = runs(device)
    if labels is not None:
        df = df[df["label"].isin(labels)].assign(_o=lambda d: d["label"].map(labels.index))
        df = df.sort_values(["_o", "run"])
    shown = pd.DataFrame({
        "stage": df["label"], "run": df["run"], "step (ms)": df["step_ms"], "± std": df["step_ms_std"],
        "in finish (ms)": df["sync_ms"], "communication alone (ms)": df["comm_alone_ms"],
        "over compute-only (ms)": df["overhead_ms"],
        "over compute-only, outside finish (ms)": df["outside_ms"],
    })
    return (markdown_table(shown, floatfmt=".3g", formats={"step (ms)": ".0f"}) + "\n\n"
            + provenance_line(df, source(STEPS, device)))


def bucketed_table(device: str = CPU) -> str:
    """The bucket caps beside the per-parameter stage, PyTorch's DDP and compute-only."""
    df = steps(device)
    df = df[df["stage"].isin(["compute-only", "overlap", "bucketed", "torch-ddp"])]
    several = bool((df["runs"] > 1).any())
    shown = pd.DataFrame({
        "configuration": df["label"], "all-reduce calls": df["allreduce_calls"], "step (ms)": df["step_ms"],
        **({"each run (ms)": [" / ".join(f"{x:.0f}" for x in t) for t in df["step_ms_runs"]]}
           if several else {}),
        "± std": df["step_ms_std"], "over compute-only (ms)": df["overhead_ms"], "in finish (ms)": df["sync_ms"],
    })
    return (markdown_table(shown, floatfmt=".3g", formats={"step (ms)": ".0f"}) + "\n\n"
            + provenance_line(runs(device), source(STEPS, device)))


# -- traces ---------------------------------------------------------------------------------------

def traces(device: str = CPU) -> pd.DataFrame:
    """The newest profiled step of each configuration, in stage order."""
    df = load_results(TRACE_BENCH, device)
    df = df.sort_values("time_utc").drop_duplicates([k for k in STEPS_KEY if k in df], keep="last")
    df = df.assign(label=[stage_label(r) for r in df.to_dict("records")],
                   _o=df["stage"].map(STAGE_ORDER.index))
    return df.sort_values(["_o", "bucket_size_mb"]).drop(columns="_o").reset_index(drop=True)


def timelines_figure(device: str = CPU, show_compute: bool = True):
    return distributed_figures.timelines(traces(device), show_compute=show_compute)


def hidden(device: str = CPU) -> pd.Series:
    """Share of all-reduce time that ran while the device computed, per configuration label
    (configurations that do not communicate are left out)."""
    tr = traces(device).set_index("label")["overlap_fraction"]
    return tr.dropna().astype(float)


# -- the bucket model -----------------------------------------------------------------------------

def fitted_bucket_model(device: str = CPU) -> BucketModel:
    """o and w fitted to the all-reduce benchmark of the DDP run's backend and rank count,
    s the DDP model's gradient bytes."""
    run = bucketed(device).iloc[0]
    o, w = collectives.fit(device, f"{run['backend']}+{run['device_type']}", int(run["world_size"]))
    return BucketModel(s=float(run["grad_bytes"]), w=w, o=o)


def model_vs_measured(device: str = CPU) -> pd.DataFrame:
    """Each cap at the bucket count it really made (no parameter is split, so a small cap makes
    fewer buckets than s/b): the model's exposed overhead, the measured one, the time in finish."""
    model, b = fitted_bucket_model(device), bucketed(device)
    model_ms = [model.overhead(max(1, int(n))) * 1e3 for n in b["allreduce_calls"]]
    return pd.DataFrame({"cap_mb": b["bucket_size_mb"], "buckets": b["allreduce_calls"].astype(int),
                         "model_ms": model_ms, "measured_ms": b["overhead_ms"], "sync_ms": b["sync_ms"]})


def model_vs_measured_table(device: str = CPU) -> str:
    df = model_vs_measured(device)
    shown = pd.DataFrame({"cap (MB)": df["cap_mb"], "buckets": df["buckets"],
                          "model: exposed (ms)": df["model_ms"],
                          "measured: over compute-only (ms)": df["measured_ms"],
                          "measured: in finish (ms)": df["sync_ms"],
                          "measured / model": df["measured_ms"] / df["model_ms"]})
    return markdown_table(shown, floatfmt=".3g")


def bucket_model_figure(device: str = CPU):
    b = bucketed(device)
    measured = pd.DataFrame({"bucket_bytes": b["bucket_size_mb"] * 2**20, "overhead_ms": b["overhead_ms"]})
    return distributed_figures.bucket_model(fitted_bucket_model(device), measured)


# -- the xl model's gradient tensors (computed from the model, not measured) -----------------------

def xl_tensor_bytes() -> list[tuple[str, int]]:
    """(name, fp32 bytes) of every parameter of the xl model, built on the meta device."""
    model = TransformerLM.from_config(get_config("xl"), device="meta")
    return [(n, p.numel() * 4) for n, p in model.named_parameters()]


def xl_tensor_sizes() -> pd.DataFrame:
    named = xl_tensor_bytes()
    total = sum(b for _, b in named)
    groups: dict[int, list[str]] = collections.defaultdict(list)
    for name, b in named:
        groups[b].append(name)
    return pd.DataFrame([{"bytes": b, "tensors": len(names), "share": len(names) * b / total,
                          "example": names[0]} for b, names in sorted(groups.items())])


def xl_tensor_sizes_table() -> str:
    df = xl_tensor_sizes()
    shown = pd.DataFrame({
        "fp32 size": [f"{b / 2**10:.3g} KB" if b < 2**20 else f"{b / 2**20:.3g} MB" for b in df["bytes"]],
        "tensors": df["tensors"], "share of the bytes": [f"{x:.3%}" for x in df["share"]],
        "for example": [f"`{n}`" for n in df["example"]]})
    return markdown_table(shown)


# -- the stages' code, as diffs -------------------------------------------------------------------

def snippet_section(path: str, section: str) -> list[str]:
    """The lines between `# --8<-- [start:section]` and `# --8<-- [end:section]` of a repo file."""
    lines = (REPO_ROOT / path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# --8<-- [start:{section}]")
    end = next(i for i, line in enumerate(lines) if line.strip() == f"# --8<-- [end:{section}]")
    return lines[start + 1:end]


def stage_diff(old: str, new: str, section: str = "ddp") -> str:
    """A fenced unified diff between the same snippet section of two stages ('naive', 'flat', ...)."""
    a, b = STAGE_FILES[old], STAGE_FILES[new]
    diff = difflib.unified_diff(snippet_section(a, section), snippet_section(b, section),
                                fromfile=a, tofile=b, lineterm="", n=2)
    return "```diff\n" + "\n".join(diff) + "\n```"


# -- quantities the chapter's sentences quote (facts) and its claims tests assert -----------------

def naive_terms_ms(device: str) -> tuple[float, float]:
    """The two terms of t_naive = k·o + s/w, in ms: k calls' fixed costs, and the transfer."""
    model, k = fitted_bucket_model(device), int(at(device, "naive")["allreduce_calls"])
    return k * model.o * 1e3, model.s / model.w * 1e3


def flat_saved_added_ms(device: str, one_allreduce_ms: float) -> tuple[float, float]:
    """What flattening saves, naive's communication alone beyond the transfer time s/w, and what
    it adds, flat's communication alone beyond one all-reduce of the whole gradient (timed alone
    by the sharding benchmark): the copies into and out of the flat buffer."""
    _, transfer = naive_terms_ms(device)
    return (float(at(device, "naive")["comm_alone_ms"]) - transfer,
            float(at(device, "flat")["comm_alone_ms"]) - one_allreduce_ms)


def clearly_faster(device: str, fast: str, slow: str) -> pd.Series:
    """Per run: did `fast` beat `slow` by more than their two standard deviations added?"""
    step, std = per_run(device, "step_ms"), per_run(device, "step_ms_std")
    return (step[slow] - step[fast]) > (std[slow] + std[fast])


def overlap_saved_ms(device: str) -> pd.Series:
    """Per run: naive's overhead minus the smallest overhead of a stage that overlaps."""
    df = runs(device)
    hooked = df[df["stage"].isin(HOOKED)].groupby("run")["overhead_ms"].min()
    return df[df["stage"] == "naive"].set_index("run")["overhead_ms"] - hooked


def best_cap_vs_torch(device: str) -> pd.Series:
    """Per run: the fastest bucket cap's step over PyTorch's DDP step, minus 1."""
    step = per_run(device, "step_ms")
    caps = [c for c in step.columns if c.startswith("bucketed")]
    return step[caps].min(axis=1) / step["torch-ddp"] - 1


def run_move_ms(device: str) -> pd.Series:
    """Per configuration: how far its step moved between runs (largest minus smallest run)."""
    df = steps(device).set_index("label")
    return df["step_ms_hi"] - df["step_ms_lo"]
