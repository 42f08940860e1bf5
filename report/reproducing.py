"""Tables of the "How every number was measured" page: benchmarks, peaks, ceilings, committed files."""

from __future__ import annotations

import pandas as pd

from cs336_systems.bench.ceilings import BENCH as CEILINGS
from cs336_systems.bench.device import PEAK_FLOPS
from cs336_systems.bench.provenance import PROVENANCE_FIELDS
from cs336_systems.bench.registry import BENCHMARKS
from cs336_systems.bench.store import REPO_ROOT

from .facts import fact
from .results import load_results, markdown_table, provenance_line


def benchmarks_table() -> str:
    """Every registered benchmark: `just bench NAME`, its module, whether bench-all runs it."""
    df = pd.DataFrame([{"name": f"`{n}`", "module": f"`{b.module}`", "in `just bench-all`": b.gpu,
                        "what it measures": b.about} for n, b in BENCHMARKS.items()])
    return markdown_table(df)


def peak_table() -> str:
    """Datasheet dense peaks (TFLOP/s) per device and dtype: the MFU denominators."""
    df = pd.DataFrame(PEAK_FLOPS).T.div(1e12).reset_index(names="device")
    return markdown_table(df.rename(columns={d: f"{d} (TFLOP/s)" for d in df.columns if d != "device"}),
                          floatfmt="g")


def ceilings(device: str = "nvidia-h200") -> pd.DataFrame:
    """The measured ceilings: newest row per (op, dtype, n)."""
    df = load_results(CEILINGS, device, status="ok")
    return df.sort_values("time_utc").drop_duplicates(["op", "dtype", "n"], keep="last")


def ceilings_table(device: str = "nvidia-h200") -> str:
    df = ceilings(device)
    df = df.assign(rate=[r.tflops if r.op == "matmul" else r.tb_per_s for r in df.itertuples()],
                   unit=["TFLOP/s" if op == "matmul" else "TB/s" for op in df.op])
    shown = df[["op", "dtype", "n", "ms", "rate", "unit"]]
    return markdown_table(shown, formats={"ms": ".3f", "rate": ".4g"}) + "\n\n" + provenance_line(
        df, f"results/{CEILINGS}/{device}.jsonl")


def matmul_ceiling_tflops(dtype: str = "bf16", device: str = "nvidia-h200") -> float:
    df = ceilings(device)
    return float(df[(df.op == "matmul") & (df.dtype == dtype)].tflops.iloc[0])


def copy_ceiling_tbps(device: str = "nvidia-h200") -> float:
    df = ceilings(device)
    return float(df[df.op == "copy"].tb_per_s.iloc[0])


@fact("ceilings.bf16_tflops")
def _bf16() -> str:
    return f"{matmul_ceiling_tflops('bf16'):.0f}"


@fact("ceilings.copy_tbps")
def _copy() -> str:
    return f"{copy_ceiling_tbps():.2f}"


@fact("ceilings.tf32_over_fp32")
def _tf32() -> str:
    return f"{matmul_ceiling_tflops('tf32') / matmul_ceiling_tflops('fp32'):.1f}"


@fact("reproducing.provenance_fields")
def _fields() -> str:
    return ", ".join(f"`{f}`" for f in PROVENANCE_FIELDS)


def committed_files_table() -> str:
    """Every committed results file: rows, rows not ok, and where and with what it was measured."""
    rows = []
    for path in sorted((REPO_ROOT / "results").rglob("*.jsonl")):
        if "_local" in path.parts:
            continue
        bench = path.parent.relative_to(REPO_ROOT / "results").as_posix()
        df = load_results(bench, path.stem)
        rows.append({"results file": f"`{path.relative_to(REPO_ROOT).as_posix()}`", "rows": len(df),
                     "not ok": int((df["status"] != "ok").sum()) if "status" in df else 0,
                     "measured with": provenance_line(df).strip("*").rstrip(".")})
    return markdown_table(pd.DataFrame(rows))
