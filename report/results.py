"""Reading committed results, and rendering them as Markdown tables with their provenance line.

Every report module reads rows through here: `load_results` (a missing file raises
FileNotFoundError, so the strict build fails instead of publishing a page whose table vanished),
`newest` (the newest row per cell: a re-measured cell keeps its older rows in the file), `where`
(rows by column values) and `with_source` (a table and the provenance of the rows it shows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT, read_rows, results_path

RESULTS_ROOT = REPO_ROOT / "results"
GPU, CPU = "nvidia-h200", "cpu"  # the device classes results are stored under
# Files the current build has read: a test checks each exists and the site names its source.
READ_LOG: list[Path] = []


def load_results(bench: str, device: str = "nvidia-h200", *, root: str | Path | None = None,
                 status: str | None = None) -> pd.DataFrame:
    """All rows of one results file as a DataFrame (optionally only rows with this status)."""
    path = results_path(bench, device, root if root is not None else RESULTS_ROOT)
    if not path.exists():
        raise FileNotFoundError(
            f"results file {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path} "
            f"is missing: run `just bench ...` for {bench!r} on a {device} machine and commit it")
    READ_LOG.append(path)
    df = pd.DataFrame(read_rows(path))
    if status is not None and not df.empty:
        df = df[df["status"] == status]
    return df.reset_index(drop=True)


def rows_if_any(bench: str, device: str = GPU) -> pd.DataFrame:
    """The rows of a results file, or no rows where the file does not exist: for a claim that a run
    a page calls "not yet measured" still has no rows (the claim turns false when they arrive, so the
    sentence gets rewritten). Tables read `load_results`, which fails on a missing file."""
    path = results_path(bench, device, RESULTS_ROOT)
    return load_results(bench, device) if path.exists() else pd.DataFrame()


def ok(bench: str, device: str = GPU) -> pd.DataFrame:
    """The rows of one results file that ran (status "ok")."""
    return load_results(bench, device, status="ok")


def newest(df: pd.DataFrame, key: Sequence[str], keep: str = "last") -> pd.DataFrame:
    """The newest row of each cell (`keep="first"`: the earliest), rows in time order."""
    return df.sort_values("time_utc", kind="stable").drop_duplicates(list(key), keep=keep)


def where(df: pd.DataFrame, **equal) -> pd.DataFrame:
    """The rows of `df` whose columns hold these values, e.g. where(cells, size="small", context=128)."""
    for column, value in equal.items():
        df = df[df[column] == value]
    return df


def source(bench: str, device: str = GPU) -> str:
    """The results file of a bench, as the provenance line names it."""
    return f"results/{bench}/{device}.jsonl"


def with_source(table: pd.DataFrame, bench: str, used: pd.DataFrame | None = None, *, device: str = GPU,
                floatfmt: str = ".3g", formats: Mapping[str, str | Callable[[object], str]] | None = None,
                note: str = "") -> str:
    """The table, then the provenance of the rows it shows (`used`; default: the whole file)."""
    rows = used if used is not None else load_results(bench, device)
    return (markdown_table(table, floatfmt=floatfmt, formats=formats) + "\n\n"
            + provenance_line(rows, source(bench, device)) + (f" *{note}*" if note else ""))


def provenance_line(df: pd.DataFrame, source: str | None = None) -> str:
    """One italic line: where and with what these rows were measured."""
    if df.empty:
        return "*No rows.*"
    parts = []
    for field in ("device", "torch", "triton", "cuda", "git"):
        if field in df:
            values = sorted({str(v) for v in df[field].dropna()})
            if values:
                parts.append(f"{field} {', '.join(values)}")
    if "time_utc" in df:
        times = df["time_utc"].dropna().sort_values()
        if not times.empty:
            first, last = times.iloc[0][:10], times.iloc[-1][:10]
            parts.append(f"measured {first}" + (f" to {last}" if last != first else ""))
    src = f" Source: `{source}`." if source else ""
    return f"*{'; '.join(parts)}.{src}*"


def format_value(value: object, floatfmt: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15 and floatfmt.endswith("g"):
            return f"{int(value):,}"
        return format(value, floatfmt)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(df: pd.DataFrame, *, floatfmt: str = ".3g",
                   formats: Mapping[str, str | Callable[[object], str]] | None = None) -> str:
    """A GitHub-flavoured Markdown table of `df` (index dropped), with per-column formats."""
    formats = dict(formats or {})
    cols = list(df.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |",
             "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            fmt = formats.get(c, floatfmt)
            cells.append(fmt(row[c]) if callable(fmt) else format_value(row[c], fmt))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
