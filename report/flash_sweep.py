"""Tables and numbers of the flash_benchmarking sweep (docs/flash-attention.md), from the committed
results at build time: per-cell tables, the facts the chapter's prose quotes, and phrases built
from them. The leaderboard and tuning tables are in `flash_tables`.
"""

from __future__ import annotations

import pandas as pd

from report.results import load_results, markdown_table, provenance_line

SWEEP_BENCH = "attention/flash_sweep"
SWEEP_NAMES = {"triton": "ours Triton", "pytorch": "ours PyTorch", "naive": "plain PyTorch", "sdpa": "SDPA cuDNN"}

SWEEP_CELL = ["impl", "dtype", "d", "seq", "mode"]


def sweep_rows() -> pd.DataFrame:
    """One row per cell: the newest (a cell re-measured with `--remeasure` keeps its old rows)."""
    return load_results(SWEEP_BENCH).drop_duplicates(SWEEP_CELL, keep="last").reset_index(drop=True)


def sweep_table(dtype: str, mode: str, value: str = "ms") -> str:
    """Rows (d, seq); one column per implementation; OOM/skips shown as such."""
    df = sweep_rows()
    df = df[(df.dtype == dtype) & (df["mode"] == mode)]
    cells = {}
    for r in df.to_dict("records"):
        v = r.get(value)
        if r["status"] == "ok":
            text = f"{v:.3g}" if value == "ms" else f"{v:.0f}"
        elif r["status"] == "unsupported":
            text = "skip" if str(r.get("error", "")).startswith("skipped") else "n/a"
        else:
            text = r["status"].upper()
        cells[(r["d"], r["seq"], r["impl"])] = text
    impls = [i for i in SWEEP_NAMES if i in set(df.impl)]
    rows = [{"d": d, "seq": n, **{SWEEP_NAMES[i]: cells.get((d, n, i), "not run") for i in impls}}
            for d in sorted(set(df.d)) for n in sorted(set(df.seq))]
    return markdown_table(pd.DataFrame(rows), formats={"d": "d", "seq": ","}) + "\n\n" + \
        provenance_line(df, f"results/{SWEEP_BENCH}/nvidia-h200.jsonl")


def sweep_facts() -> dict[str, float]:
    df = sweep_rows()
    ok = df[df.status == "ok"]
    get = lambda impl, dt, d, n, mode: ok[(ok.impl == impl) & (ok.dtype == dt) & (ok.d == d) & (ok.seq == n)  # noqa: E731
                                         & (ok["mode"] == mode)]
    out = {}
    for d in (16, 32, 64, 128):
        for mode in ("fwd", "bwd", "fwd_bwd"):
            t, s = get("triton", "bf16", d, 65536, mode), get("sdpa", "bf16", d, 65536, mode)
            if len(t) and len(s):
                out[f"speed_vs_cudnn_d{d}_{mode}_64k"] = float(s.ms.iloc[0] / t.ms.iloc[0])
                out[f"triton_tflops_d{d}_{mode}_64k"] = float(t.tflops.iloc[0])
                out[f"sdpa_tflops_d{d}_{mode}_64k"] = float(s.tflops.iloc[0])
    for dt in ("bf16", "fp32"):
        t, n = get("triton", dt, 64, 16384, "fwd_bwd"), get("naive", dt, 64, 16384, "fwd_bwd")
        out[f"speedup_vs_naive_{dt}_d64_16k"] = float(n.ms.iloc[0] / t.ms.iloc[0])
        tm, nm = get("triton", dt, 64, 65536, "fwd_bwd"), get("naive", dt, 64, 65536, "fwd_bwd")
        out[f"speedup_vs_naive_{dt}_d64_64k"] = float(nm.ms.iloc[0] / tm.ms.iloc[0])
        out[f"mem_triton_{dt}_d64_64k_gb"] = float(tm.peak_mem_gb.iloc[0])
        out[f"mem_naive_{dt}_d64_64k_gb"] = float(nm.peak_mem_gb.iloc[0])
    out["oom_cells"] = int((df.status == "oom").sum())
    out["pytorch_measured"] = int(((df.impl == "pytorch") & (df.status == "ok")).sum())
    return out


def sweep_fastest(dtype: str = "bf16", impls: tuple[str, ...] = ("triton", "naive", "sdpa")) -> pd.Series:
    """(d, seq, mode) -> the fastest of `impls` in that cell (cells where all of them ran)."""
    df = sweep_rows()
    df = df[(df.status == "ok") & (df.dtype == dtype) & df.impl.isin(impls)]
    t = df.pivot_table(index=["d", "seq", "mode"], columns="impl", values="ms").dropna()
    return t.idxmin(axis=1)


def dims_phrase(dims) -> str:
    """[16, 32, 64] -> 'd = 16, 32 and 64'."""
    dims = [str(d) for d in sorted(dims)]
    if not dims:
        raise ValueError("dims: expected at least one head dim")
    return "d = " + (dims[0] if len(dims) == 1 else ", ".join(dims[:-1]) + " and " + dims[-1])


MODE_WORDS = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}


def wins_phrase(fastest: pd.Series, impl: str, min_seq: int = 0) -> str:
    """Where `impl` is the fastest, by size then mode: 'at 32,768 the forward (d = 16 and 32); ...'.
    `fastest` is `sweep_fastest`'s (d, seq, mode) -> impl; '' where it never is."""
    won = fastest[fastest == impl]
    won = won[won.index.get_level_values("seq") >= min_seq]
    parts = []
    for n in sorted(set(won.index.get_level_values("seq"))):
        at = won[won.index.get_level_values("seq") == n]
        modes = [f"the {MODE_WORDS[m]} ({dims_phrase(at[at.index.get_level_values('mode') == m].index.get_level_values('d'))})"
                 for m in MODE_WORDS if m in set(at.index.get_level_values("mode"))]
        parts.append(f"at {n:,} " + (modes[0] if len(modes) == 1 else ", ".join(modes[:-1]) + " and " + modes[-1]))
    return "; ".join(parts)


def sweep_code() -> dict:
    """The code behind the sweep's newest rows: git of our Triton cells (with how many cells each),
    git of the other cells, and the git of Triton rows that were re-measured (kept in the file, no
    longer shown)."""
    df, every = sweep_rows(), load_results(SWEEP_BENCH)
    triton = df[df.impl == "triton"].git.value_counts()
    old = sorted(set(every[every.impl == "triton"].git) - set(triton.index))
    return {"triton": {g: int(n) for g, n in triton.items()}, "other": sorted(set(df[df.impl != "triton"].git)),
            "triton_replaced": old}
