"""Why naive attention at seq 32,768 (batch 8, d = 64) ran out of memory: the allocator checks.

Rows: results/attention/oom_checks/ (`just bench attention-oom`, each cell in a fresh process). Peaks
are shown in score matrices (one is 8 x seq^2 x 4 bytes), the unit the hand count speaks in.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.attention.benchmarks.pytorch_sweep import attention_memory
from cs336_systems.profiling.attention_oom import DEFAULT
from report.attention import capacity_gib
from report.facts import register
from report.results import load_results, newest, with_source

BENCH = "attention/oom_checks"
SPLIT = "max_split_size_mb:1024"
GiB, MiB = 2**30, 2**20


def checks() -> pd.DataFrame:
    """The newest row per check cell (batch 8, d = 64), ok or out of memory."""
    df = load_results(BENCH)
    df = df[df["status"].isin(["ok", "oom"]) & (df["batch"] == 8) & (df["d"] == 64)]
    return newest(df, ["batch", "d", "seq", "alloc_conf"]).sort_values(["seq", "alloc_conf"])


def score_mib(seq: int) -> float:
    return attention_memory(8, seq, 64)["one_score_matrix"] / MiB


def check(seq: int, conf: str):
    c = checks()
    return c[(c["seq"] == seq) & (c["alloc_conf"] == conf)].iloc[0]


def _peaks(r) -> tuple[float, float]:
    """(allocated, reserved) peaks in MiB: of the run, or up to the moment of the OOM."""
    src = r if r["status"] == "ok" else r["at_oom"]
    return src["peak_allocated_mib"], src["peak_reserved_mib"]


def checks_table() -> str:
    rows = []
    for _, r in checks().iterrows():
        alloc, reserved = _peaks(r)
        oom = r["status"] == "oom"
        rows.append({"seq": int(r.seq), "allocator": "default" if r.alloc_conf == DEFAULT else f"`{r.alloc_conf}`",
                     "result": "out of memory" if oom else "ran",
                     "peak allocated (score matrices)": alloc / score_mib(int(r.seq)),
                     "peak reserved (score matrices)": reserved / score_mib(int(r.seq)),
                     "asked for GiB": r.tried_mib / 1024 if oom else None,
                     "free on the card GiB": r.free_mib / 1024 if oom else None,
                     "reserved but unallocated GiB": r.reserved_unallocated_mib / 1024 if oom else None})
    return with_source(pd.DataFrame(rows), BENCH, floatfmt=".2f")


def stranded_block_confirmed() -> bool:
    """Both predictions of the hypothesis hold: at seq 16,384 the default allocator reserves about a
    fifth score matrix over the four allocated, and seq 32,768 runs once large blocks are not split."""
    a, b = check(16384, DEFAULT), check(32768, SPLIT)
    return (a["status"] == "ok" and _peaks(a)[1] / score_mib(16384) >= 4.5 and b["status"] == "ok")


FACTS = {
    "attention.oom_margin_gib": lambda: f"{capacity_gib() - attention_memory(8, 32768, 64)['backward_peak'] / GiB:.1f}",
    "attention.oom_output_mib": lambda: f"{attention_memory(8, 32768, 64)['inputs_qkv'] / 3 / MiB:.0f}",
    "attention.score_16384_gib": lambda: f"{score_mib(16384) / 1024:.0f}",
    "attention.reserved_16384_default": lambda: f"{_peaks(check(16384, DEFAULT))[1] / score_mib(16384):.2f}",
    "attention.allocated_16384_default": lambda: f"{_peaks(check(16384, DEFAULT))[0] / score_mib(16384):.2f}",
    "attention.reserved_16384_split": lambda: f"{_peaks(check(16384, SPLIT))[1] / score_mib(16384):.2f}",
    "attention.oom_tried_gib": lambda: f"{check(32768, DEFAULT).tried_mib / 1024:.1f}",
    "attention.oom_stranded_gib": lambda: f"{check(32768, DEFAULT).reserved_unallocated_mib / 1024:.1f}",
    "attention.split_32768_allocated_gib": lambda: f"{_peaks(check(32768, SPLIT))[0] / 1024:.1f}",
    "attention.split_32768_reserved_gib": lambda: f"{_peaks(check(32768, SPLIT))[1] / 1024:.1f}",
}
register(FACTS)
