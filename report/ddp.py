"""Tables and derived numbers of the collectives and DDP chapters, computed from results at build time.

    ```python exec="on"
    from cs336_systems.distributed import summary
    print(summary.ddp_table("cpu"))
    ```
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.distributed import figures
from cs336_systems.distributed.bucket_model import BucketModel, fit_latency_bandwidth
from cs336_systems.distributed.collectives_bench import BENCH as COLLECTIVES
from cs336_systems.distributed.collectives_bench import KEY as COLLECTIVES_KEY
from cs336_systems.distributed.ddp_bench import BENCH as STEPS
from cs336_systems.distributed.ddp_bench import KEY as STEPS_KEY
from cs336_systems.distributed.ddp_bench import TRACE_BENCH
from report.results import load_results, markdown_table, provenance_line

RUN_KEY = ["size", "backend", "device_type", "world_size", "batch_size", "context_length"]


def _latest(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """The newest row of each configuration (a re-measured cell replaces the old one)."""
    if df.empty:
        return df
    df = df.copy()
    df["bucket_size_mb"] = df.get("bucket_size_mb")
    return df.sort_values("time_utc").drop_duplicates(
        [k for k in key if k in df], keep="last").reset_index(drop=True)


def collectives(device: str = "cpu") -> pd.DataFrame:
    return _latest(load_results(COLLECTIVES, device), COLLECTIVES_KEY)


def human_size(size_mb: float) -> str:
    """4 KB, 1 MB, 1 GB (binary units, as the benchmark sizes them)."""
    if size_mb >= 1024:
        return f"{size_mb / 1024:g} GB"
    if size_mb >= 1:
        return f"{size_mb:g} MB"
    return f"{size_mb * 1024:g} KB"


def collectives_table(device: str = "cpu") -> str:
    df = collectives(device)
    df = df.assign(size_bytes=df["size_mb"] * 2**20).sort_values(
        ["backend", "device_type", "world_size", "size_bytes"])  # a GPU host has gloo on both
    shown = pd.DataFrame({
        "backend": df["backend"] + "+" + df["device_type"].str.upper(),
        "ranks": df["world_size"], "size": df["size_mb"].map(human_size),
        "time (ms)": [r["time_ms"] if r["status"] == "ok" else r["status"].upper()
                      for r in df.to_dict("records")],
        "± std": df.get("time_ms_std"), "algbw (GB/s)": df.get("algbw_gbps"),
        "busbw (GB/s)": df.get("busbw_gbps"), "ranks per core": df.get("ranks_per_core"),
        "load avg": df.get("loadavg_1m"),
    })
    return markdown_table(shown, floatfmt=".3g", formats={"time (ms)": ".4g"}) + "\n\n" + provenance_line(df, _source(COLLECTIVES, device))


def collectives_svg(device: str = "cpu") -> str:
    return figures.svg(figures.collectives(collectives(device)))


def ddp_runs(device: str = "cpu") -> pd.DataFrame:
    """Every ok step row, with `run` (1, 2, ...) and `overhead_ms`: step time minus the
    compute-only step of the same run and run configuration (what data parallelism costs).

    A run is one pass of the benchmark over its grid: in time order, a new run starts at the first
    row whose configuration the current run already has. (A run cut by the time limit and resumed
    adds only the missing configurations, so it stays one run.)"""
    df = load_results(STEPS, device).sort_values("time_utc", kind="stable").reset_index(drop=True)
    df["bucket_size_mb"] = df.get("bucket_size_mb")
    runs, run, seen = [], 1, set()
    for r in df.to_dict("records"):
        key = tuple("nan" if pd.isna(r.get(k)) else r.get(k) for k in STEPS_KEY)
        if key in seen:
            run, seen = run + 1, set()
        seen.add(key)
        runs.append(run)
    df["run"] = runs
    df = df[df["status"] == "ok"].copy()
    base = df[df["stage"] == "compute-only"].set_index(RUN_KEY + ["run"])["step_ms"]
    df["overhead_ms"] = [r["step_ms"] - base.get(tuple(r[k] for k in RUN_KEY + ["run"]), float("nan"))
                         for r in df.to_dict("records")]
    df["label"] = [figures.stage_label(r) for r in df.to_dict("records")]
    return df.reset_index(drop=True)


MEDIAN_OVER_RUNS = ["step_ms", "step_ms_mean", "sync_ms", "comm_alone_ms", "overhead_ms"]


def ddp_steps(device: str = "cpu") -> pd.DataFrame:
    """One row per configuration over all its runs (`ddp_runs`): the median over runs of each run's
    `step_ms`, `sync_ms`, `comm_alone_ms` and `overhead_ms`; `runs`; the runs' extremes
    `step_ms_lo`/`step_ms_hi` and `overhead_ms_lo`/`overhead_ms_hi`; `step_ms_runs` each run's step_ms; `step_ms_std` the largest
    within-run standard deviation. Other columns come from the latest run. With one run per
    configuration this is that run's rows unchanged."""
    df = ddp_runs(device)
    if df.empty:
        return df
    key = [k for k in STEPS_KEY if k in df]
    g = df.assign(_k=[tuple("nan" if pd.isna(v) else v for v in t)
                      for t in df[key].itertuples(index=False)]).groupby("_k", sort=False)
    out = g.tail(1).set_index("_k")  # latest run's row (df is in time order)
    for col in MEDIAN_OVER_RUNS:
        if col in df:
            out[col] = g[col].median()
    out["runs"] = g["run"].nunique()
    out["step_ms_lo"], out["step_ms_hi"] = g["step_ms"].min(), g["step_ms"].max()
    out["overhead_ms_lo"], out["overhead_ms_hi"] = g["overhead_ms"].min(), g["overhead_ms"].max()
    out["step_ms_runs"] = g["step_ms"].agg(tuple)  # each run's step_ms, in run order
    out["step_ms_std"] = g["step_ms_std"].max()
    return out.reset_index(drop=True)


STAGE_ORDER = ["compute-only", "naive", "flat", "overlap", "bucketed", "torch-ddp"]


def ddp_table(device: str = "cpu", size: str | None = None) -> str:
    df = ddp_steps(device)
    if size is not None:
        df = df[df["size"] == size]
    df = df.assign(order=df["stage"].map(STAGE_ORDER.index)).sort_values(
        ["size", "world_size", "order", "bucket_size_mb"])
    several = bool((df["runs"] > 1).any())
    shown = pd.DataFrame({
        "model": df["size"], "ranks": df["world_size"], "stage": df["label"],
        "all-reduce calls": df["allreduce_calls"],
        "step (ms)": df["step_ms"],
        **({"each run (ms)": [" / ".join(f"{x:.0f}" for x in t) for t in df["step_ms_runs"]]}
           if several else {}),
        ("± std, noisiest run" if several else "± std"): df["step_ms_std"],
        "over compute-only (ms)": df["overhead_ms"],
        "in finish_gradient_synchronization (ms)": df["sync_ms"],
        "communication alone (ms)": df["comm_alone_ms"],
    })
    note = (f"\n\nWith {int(df['runs'].max())} runs per configuration, every number is the median "
            "over runs of each run's value (with two runs, their mean); *over compute-only* is taken "
            "within each run, against that run's compute-only step." if several else "")
    return (markdown_table(shown, floatfmt=".3g") + note + "\n\n"
            + provenance_line(ddp_runs(device), _source(STEPS, device)))  # every run's commit


def traces(device: str = "cpu", size: str | None = None) -> pd.DataFrame:
    df = _latest(load_results(TRACE_BENCH, device), STEPS_KEY)
    if size is not None:
        df = df[df["size"] == size]
    return df.assign(order=df["stage"].map(STAGE_ORDER.index)).sort_values(
        ["order", "bucket_size_mb"]).reset_index(drop=True)


def timelines_svg(device: str = "cpu", size: str | None = None, show_compute: bool = True) -> str:
    return figures.svg(figures.timelines(traces(device, size), show_compute=show_compute))


def fitted_bucket_model(device: str = "cpu", size: str | None = None) -> BucketModel:
    """o and w fitted to the all-reduce benchmark (same backend and rank count as the DDP run),
    s = the DDP model's gradient bytes."""
    steps = ddp_steps(device)
    if size is not None:
        steps = steps[steps["size"] == size]
    run = steps[steps["stage"] == "bucketed"].iloc[0]
    o, w = fit_collectives(device, run["backend"], run["device_type"], int(run["world_size"]))
    return BucketModel(s=float(run["grad_bytes"]), w=w, o=o)


def fit_collectives(device: str, backend: str, device_type: str, world_size: int) -> tuple[float, float]:
    """(o seconds, w bytes/s) fitted to one (backend, tensor device, ranks) row of the all-reduce
    benchmark. A GPU host's file holds gloo on CPU and on CUDA tensors, so the device type is part
    of the match. ValueError naming what is missing if that row was not measured."""
    coll = collectives(device)
    coll = coll[(coll["status"] == "ok") & (coll["backend"] == backend)
                & (coll["device_type"] == device_type) & (coll["world_size"] == world_size)]
    if coll.empty:
        raise ValueError(f"no all-reduce rows for {backend}+{device_type} on {world_size} ranks in "
                         f"{_source(COLLECTIVES, device)}: cannot fit o and w")
    return fit_latency_bandwidth(coll["size_bytes"].tolist(), (coll["time_ms"] / 1e3).tolist())


def latency_bandwidth_fits(device: str = "cpu") -> pd.DataFrame:
    """o, w and the knee o·w of t = o + bytes/w, one fit per (backend, tensor device, ranks).

    A row that cannot be fitted (fewer than two sizes, or times that do not grow with size) keeps
    NaN and says why in `note` instead of failing the page."""
    coll = collectives(device)
    coll = coll[coll["status"] == "ok"]
    rows = []
    for (backend, dtype, n), g in coll.groupby(["backend", "device_type", "world_size"]):
        row = {"backend": backend, "device_type": dtype, "world_size": int(n),
               "sizes": int(g["size_bytes"].nunique()), "o_s": float("nan"),
               "w_bytes_per_s": float("nan"), "knee_bytes": float("nan"), "note": ""}
        try:
            o, w = fit_latency_bandwidth(g["size_bytes"].tolist(), (g["time_ms"] / 1e3).tolist())
            row.update(o_s=o, w_bytes_per_s=w, knee_bytes=o * w)
        except ValueError as e:
            row["note"] = str(e)
        rows.append(row)
    return pd.DataFrame(rows)


def latency_bandwidth_table(device: str = "cpu", note_single_rank_count: bool = True) -> str:
    """The fits as a table, then what the measured rank counts cannot tell (one line; leave it out
    with `note_single_rank_count=False` where the page already says so)."""
    fits = latency_bandwidth_fits(device)
    shown = pd.DataFrame({
        "backend": fits["backend"] + "+" + fits["device_type"].str.upper(),
        "ranks": fits["world_size"], "sizes fitted": fits["sizes"],
        "o (ms per call)": fits["o_s"] * 1e3, "w (GB/s, algbw)": fits["w_bytes_per_s"] / 1e9,
        "knee o·w (MB)": fits["knee_bytes"] / 2**20,
    })
    if fits["note"].astype(bool).any():
        shown["not fitted because"] = fits["note"]
    out = markdown_table(shown, floatfmt=".3g")
    single = [f"{b}+{d.upper()}" for (b, d), g in fits.groupby(["backend", "device_type"])
              if g["world_size"].nunique() < 2]
    if single and note_single_rank_count:
        out += ("\n\nOnly one rank count was measured for " + ", ".join(single) + ": how the "
                "fixed cost o grows with the number of ranks (a ring pays it in 2(n-1) steps) "
                "cannot be fitted from these rows.")
    return out


def bucket_model_svg(device: str = "cpu", size: str | None = None) -> str:
    model = fitted_bucket_model(device, size)
    steps = ddp_steps(device)
    if size is not None:
        steps = steps[steps["size"] == size]
    bucketed = steps[steps["stage"] == "bucketed"]
    measured = pd.DataFrame({"bucket_bytes": bucketed["bucket_size_mb"] * 2**20,
                             "overhead_ms": bucketed["overhead_ms"]})
    return figures.svg(figures.bucket_model(model, measured))


def _source(bench: str, device: str) -> str:
    return f"results/{bench}/{device}.jsonl"


def snippet_section(path: str, section: str) -> list[str]:
    """The lines between `# --8<-- [start:section]` and `# --8<-- [end:section]` of a repo file."""
    from cs336_systems.bench.store import REPO_ROOT

    lines = (REPO_ROOT / path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# --8<-- [start:{section}]")
    end = next(i for i, line in enumerate(lines) if line.strip() == f"# --8<-- [end:{section}]")
    return lines[start + 1:end]


def stage_diff(old: str, new: str, section: str = "ddp") -> str:
    """A fenced unified diff between the same snippet section of two stage files."""
    import difflib

    diff = difflib.unified_diff(snippet_section(old, section), snippet_section(new, section),
                                fromfile=old, tofile=new, lineterm="", n=2)
    return "```diff\n" + "\n".join(diff) + "\n```"
