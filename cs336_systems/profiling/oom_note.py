"""The attention chapter's seq-32,768 OOM question and its two checks, computed from results/ at build time.

Before `just bench attention-oom` has run on the H200 the note states the hypothesis and says the
checks are not measured yet; once results/attention/oom_checks/nvidia-h200.jsonl exists it reports
what each check found, in score matrices and GiB, and `oom_status` says what that means for the
hypothesis (the page titles its block by it). Either way nothing is typed.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.attention.pytorch_sweep import attention_memory
from cs336_systems.bench.store import results_path
from report import results as report

from .attention_oom import DEFAULT

BENCH = "attention/oom_checks"
SPLIT = "max_split_size_mb:1024"
GiB, MiB = 2**30, 2**20
NEAR_FIVE = 4.5  # reserved peak at or above this many score matrices: "about five", the stranded block


def oom_check_rows(device: str = "nvidia-h200") -> pd.DataFrame | None:
    """The newest row per check cell, or None while the checks have not run on this device."""
    if not results_path(BENCH, device, report.RESULTS_ROOT).exists():
        return None
    df = report.load_results(BENCH, device)
    df = df[df["status"].isin(["ok", "oom"])]
    return df.sort_values("time_utc").drop_duplicates(["batch", "d", "seq", "alloc_conf"], keep="last")


def _cell(df: pd.DataFrame, seq: int, conf: str):
    hit = df[(df["seq"] == seq) & (df["alloc_conf"] == conf) & (df["d"] == 64) & (df["batch"] == 8)]
    return None if hit.empty else hit.iloc[-1]


def _in_matrices(mib: float | None, seq: int) -> float | None:
    if mib is None or pd.isna(mib):
        return None
    return mib * MiB / attention_memory(8, seq, 64)["one_score_matrix"]


def _peaks(r, seq: int) -> tuple[float | None, float | None]:
    """(allocated, reserved) peaks of a cell in score matrices (at the OOM, for an OOM row)."""
    src = r if r["status"] == "ok" else (r.get("at_oom") or {})
    return _in_matrices(src.get("peak_allocated_mib"), seq), _in_matrices(src.get("peak_reserved_mib"), seq)


def _describe(r, seq: int, conf: str) -> str:
    alloc, reserved = _peaks(r, seq)
    setting = "the default allocator" if conf == DEFAULT else f"`PYTORCH_CUDA_ALLOC_CONF={conf}`"
    if r["status"] == "ok":
        return (f"seq {seq:,} with {setting}: **ran**; peak allocated {alloc:.2f} score matrices, peak "
                f"reserved {reserved:.2f}")
    msg = ""
    if r.get("tried_mib") is not None and not pd.isna(r.get("tried_mib")):
        msg = (f"; the allocator tried to allocate {r['tried_mib'] / 1024:.1f} GiB with "
               f"{r['free_mib'] / 1024:.1f} GiB free on the card, and PyTorch held "
               f"{r['reserved_unallocated_mib'] / 1024:.1f} GiB reserved but unallocated")
    at = (f" (peaks up to that moment: {alloc:.2f} score matrices allocated, {reserved:.2f} reserved)"
          if alloc is not None and reserved is not None else "")
    return f"seq {seq:,} with {setting}: **out of memory** in iteration {int(r['oom_iteration']) + 1}{at}{msg}"


def oom_status(df: pd.DataFrame | None) -> str:
    """'untested' (no rows), 'confirmed', 'refuted' or 'unsettled': what the checks say about the
    stranded-block hypothesis. Confirmed needs both: a fifth score matrix reserved at seq 16,384 with
    the default allocator, and seq 32,768 running once large blocks may not be split."""
    if df is None or df.empty:
        return "untested"
    a, b = _cell(df, 16384, DEFAULT), _cell(df, 32768, SPLIT)
    if b is not None and b["status"] == "oom":
        return "refuted"
    if (a is not None and a["status"] == "ok" and _peaks(a, 16384)[1] >= NEAR_FIVE
            and b is not None and b["status"] == "ok"):
        return "confirmed"
    return "unsettled"


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def oom_check_verdict(df: pd.DataFrame) -> str:
    """One paragraph: what the checks that ran say about the stranded-block hypothesis, in GiB."""
    a, a2 = _cell(df, 16384, DEFAULT), _cell(df, 16384, SPLIT)
    o, b = _cell(df, 32768, DEFAULT), _cell(df, 32768, SPLIT)
    mat16 = attention_memory(8, 16384, 64)["one_score_matrix"] / MiB
    need = attention_memory(8, 32768, 64)["backward_peak"] / MiB
    said = []
    if a is not None and a["status"] == "ok":
        alloc, reserved = _peaks(a, 16384)
        near = reserved >= NEAR_FIVE
        s = (f"at seq 16,384 the default allocator reserves {reserved:.2f} score matrices "
             f"({_gib(a['peak_reserved_mib'])}) for a peak of {alloc:.2f} allocated "
             f"({_gib(a['peak_allocated_mib'])}), {'about one block more, as' if near else 'not the fifth block'} "
             f"the hypothesis predicts{'' if near else 's'}")
        if a2 is not None and a2["status"] == "ok":
            saved = a["peak_reserved_mib"] - a2["peak_reserved_mib"]
            s += (f"; with large blocks unsplittable the reserve falls to {_peaks(a2, 16384)[1]:.2f} "
                  f"({_gib(a2['peak_reserved_mib'])}), {_gib(saved)} less, {saved / mat16:.2f} of a score matrix")
        said.append(s)
    if o is not None and o["status"] == "oom" and o.get("tried_mib") is not None and not pd.isna(o.get("tried_mib")):
        mat32 = attention_memory(8, 32768, 64)["one_score_matrix"] / MiB
        said.append(f"at seq 32,768 the default allocator fails asking for {_gib(o['tried_mib'])} while it holds "
                    f"{_gib(o['reserved_unallocated_mib'])} reserved but unallocated "
                    f"({o['reserved_unallocated_mib'] / mat32:.2f} of a score matrix: the stranded block)")
    if b is not None:
        if b["status"] == "ok":
            cap = o.get("capacity_mib") if o is not None else None
            room = (f", leaving {_gib(cap - b['peak_reserved_mib'])} of the card's {_gib(cap)}"
                    if cap is not None and not pd.isna(cap) else "")
            said.append(f"with large blocks unsplittable seq 32,768 runs: peak allocated "
                        f"{_gib(b['peak_allocated_mib'])} (the hand count: {_gib(need)}), reserved "
                        f"{_gib(b['peak_reserved_mib'])}{room}")
        else:
            said.append("seq 32,768 runs out of memory even when the allocator may not split large blocks")
    if not said:
        return "The checks that would settle it have not produced a result yet."
    status = oom_status(df)
    verdict = ("Both checks agree with the hypothesis: a score-sized block is stranded by a small allocation "
               "carved out of it, and the boundary measured with the default settings (above seq 16,384, "
               "below 32,768) is the allocator's, not the algorithm's; the hand count of four score "
               "matrices was right." if status == "confirmed" else
               "So the hypothesis does not explain the OOM: something else needs the extra memory (the "
               "allocator's message above says how much it wanted)." if status == "refuted" else
               "The two checks do not settle it between them.")
    return "Measured: " + "; ".join(said) + ". " + verdict


def oom_checks_note() -> str:
    """The admonition body's last part: the checks' results, or that they are not measured yet."""
    df = oom_check_rows()
    if df is None or df.empty:
        return ("Two checks would settle it; neither is measured yet (`just bench attention-oom` runs both, "
                "each in a fresh process): at seq 16,384, `torch.cuda.max_memory_reserved()` should come out "
                "near five score matrices while the allocated peak is four; and seq 32,768 should run with "
                f"`PYTORCH_CUDA_ALLOC_CONF={SPLIT}`, which stops the allocator from splitting blocks larger "
                "than 1 GiB for small requests. Until then the measured boundary on this card is \"above "
                "16,384, at or below 32,768\".")
    lines = [_describe(r, int(r.seq), r.alloc_conf) for _, r in df.sort_values(["seq", "alloc_conf"]).iterrows()
             if int(r.d) == 64 and int(r.batch) == 8]
    return ("The checks (`just bench attention-oom`: each cell in a fresh process, three forward+backward "
            "passes as in the sweep's warm-up; peaks since the process started):\n\n"
            + "\n".join(f"- {line}." for line in lines) + "\n\n" + oom_check_verdict(df))
