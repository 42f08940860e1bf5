"""The numbers of the "How every number was measured" page (docs/reproducing.md): benchmarks,
datasheet peaks, the measured ceilings (which other chapters' rooflines use) and committed files."""

from __future__ import annotations

import pandas as pd

from cs336_systems.bench.ceilings import BENCH as CEILINGS
from cs336_systems.bench.device import PEAK_FLOPS
from cs336_systems.bench.provenance import PROVENANCE_FIELDS
from cs336_systems.bench.registry import BENCHMARKS
from cs336_systems.bench.store import REPO_ROOT

from .registry import register
from .results import load_results, markdown_table, newest, provenance_line, source


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
    return newest(load_results(CEILINGS, device, status="ok"), ["op", "dtype", "n"])


def ceilings_table(device: str = "nvidia-h200") -> str:
    df = ceilings(device)
    df = df.assign(rate=[r.tflops if r.op == "matmul" else r.tb_per_s for r in df.itertuples()],
                   unit=["TFLOP/s" if op == "matmul" else "TB/s" for op in df.op])
    shown = df[["op", "dtype", "n", "ms", "rate", "unit"]]
    return markdown_table(shown, formats={"ms": ".3f", "rate": ".4g"}) + "\n\n" + provenance_line(df, source(CEILINGS, device))


def matmul_ceiling_tflops(dtype: str = "bf16", device: str = "nvidia-h200") -> float:
    df = ceilings(device)
    return float(df[(df.op == "matmul") & (df.dtype == dtype)].tflops.iloc[0])


def copy_ceiling_tbps(device: str = "nvidia-h200") -> float:
    df = ceilings(device)
    return float(df[df.op == "copy"].tb_per_s.iloc[0])


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


def _below_the_datasheet() -> bool:
    from report.flash_tuning import PEAK_TBPS, PEAK_TFLOPS  # the datasheet figures the flash chapter quotes

    return matmul_ceiling_tflops("bf16") < PEAK_TFLOPS and copy_ceiling_tbps() < PEAK_TBPS


def _bench_all_leaves_out_multi_process() -> bool:
    """The multi-process benchmarks are not in bench-all; the step's one-GPU pieces are."""
    return (not any(BENCHMARKS[n].gpu for n in ("collectives", "ddp", "sharding", "fsdp", "tp-ffn", "training-step"))
            and BENCHMARKS["fused-ce"].gpu and BENCHMARKS["fused-adamw"].gpu)


register("ceilings", facts={
    "bf16_tflops": lambda: f"{matmul_ceiling_tflops('bf16'):.0f}",
    "copy_tbps": lambda: f"{copy_ceiling_tbps():.2f}",
    "tf32_over_fp32": lambda: f"{matmul_ceiling_tflops('tf32') / matmul_ceiling_tflops('fp32'):.1f}",
}, claims={
    "below_the_datasheet": _below_the_datasheet,
    # several-fold: the fp32 precision a kernel uses changes its speed
    "tf32_several_times_fp32": lambda: matmul_ceiling_tflops("tf32") > 3 * matmul_ceiling_tflops("fp32"),
})
register("reproducing", facts={"provenance_fields": lambda: ", ".join(f"`{f}`" for f in PROVENANCE_FIELDS)},
         tables={"benchmarks": benchmarks_table, "peaks": peak_table, "ceilings": ceilings_table,
                 "committed_files": committed_files_table},
         claims={"bench_all_leaves_out_multi_process": _bench_all_leaves_out_multi_process})
