"""The profiling chapter's account of the kernel double count, computed from results/ at build time.

Three cells of the first H200 run attributed more kernel time to a phase than the phase lasted;
kernel_attribution.py now counts each device kernel once. This note says which cells are still rows
of the first attribution (marked †), what the data shows about the duplicates, and, for cells profiled
again, what the self-check columns found, which of the duplication patterns the traces held, and how
the cells once marked compare with their re-run. It reads whatever rows exist, so the page is right
before, during and after the re-run.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import TransformerLM, get_config

from .kernel_attribution import RANGE_TOLERANCE
from .tables import _latest, _ok, counted_once, kernel_cells, kernel_rows, overcounted

NAMES = {"fwd": "forward", "bwd": "backward", "opt": "optimizer"}


def _indent(text: str) -> str:
    return "    " + text


def parameter_tensors(size: str) -> int:
    return len(list(TransformerLM.from_config(get_config(size), device="meta").parameters()))


def optimizer_excess(cells: pd.DataFrame) -> list[tuple[str, int, int, int]]:
    """(size, context, launches, tensors) of cells whose optimizer lists more launches of AdamW's
    addcdiv kernel than the model has parameter tensors (AdamW launches it once per tensor)."""
    k = kernel_rows()
    out = []
    for _, r in cells.iterrows():
        kk = k[(k["size"] == r["size"]) & (k["context"] == r.context) & (k["phase"] == "optimizer")
               & k["kernel"].str.contains("addcdiv")]
        calls, tensors = int(kk["calls"].sum()), parameter_tensors(r["size"])
        if calls > tensors:
            out.append((r["size"], int(r.context), calls, tensors))
    return out


def first_run_silu_surplus() -> list[tuple[str, int, int, int]]:
    """(size, context, launches, layers) where a first-attribution row lists more forward SiLU
    launches than the model has layers (SwiGLU applies SiLU once per layer in the forward)."""
    k = _ok("profiling/kernels")
    if "cell_run" in k:
        k = k[k["cell_run"].isna()]
    k = _latest(k, ["size", "context", "phase", "region", "kernel"])
    k = k[(k["phase"] == "forward") & k["kernel"].str.contains("silu_kernel")]
    out = []
    for (size, ctx), g in k.groupby(["size", "context"]):
        layers = get_config(size).num_layers
        if g["calls"].sum() > layers:
            out.append((size, int(ctx), int(g["calls"].sum()), layers))
    return sorted(out, key=lambda t: (t[0], t[1]))


def first_run_cells() -> pd.DataFrame:
    """The newest row per cell among the rows of the first attribution (no `attribution` field)."""
    c = _ok("profiling/kernel_cells")
    if "attribution" in c:
        c = c[c["attribution"].isna()]
    return _latest(c, ["size", "context"])


def count_checks(cells: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Cells (as 'size at ctx') whose kernel rows list a different number of forward SiLU launches than
    the model has layers, and of optimizer addcdiv launches than it has parameter tensors: launches
    each of them makes exactly once per layer / per tensor, so a kernel counted twice shows here even
    when it fits into idle time."""
    k = kernel_rows()
    silu, addcdiv = [], []
    for _, r in cells.iterrows():
        kk = k[(k["size"] == r["size"]) & (k["context"] == r.context)]
        name = f"{r['size']} at {r.context}"
        fwd = kk[(kk["phase"] == "forward") & kk["kernel"].str.contains("silu_kernel")]["calls"].sum()
        opt = kk[(kk["phase"] == "optimizer") & kk["kernel"].str.contains("addcdiv")]["calls"].sum()
        if fwd != get_config(r["size"]).num_layers:
            silu.append(name)
        if opt != parameter_tensors(r["size"]):
            addcdiv.append(name)
    return silu, addcdiv


def _marked(bad: list) -> str:
    k = kernel_rows()
    k = k[(k["phase"] == "forward") & (k["region"] != "")]
    cells = "; ".join(f"{r['size']} at context {r.context}: " + ", ".join(
        f"{NAMES[p]} {r[p + '_kernel_ms'] / r[p + '_range_ms']:.2f}" for p in ps) for r, ps in bad)
    worst = max(r[p + "_kernel_ms"] / r[p + "_range_ms"] for r, ps in bad for p in ps) - 1
    where = []
    for r, ps in bad:
        if "fwd" not in ps:
            continue
        kk = k[(k["size"] == r["size"]) & (k["context"] == r.context)]
        layers = get_config(r["size"]).num_layers
        over = kk[kk["calls"] > layers]
        where.append(f"in the forward of {r['size']} at {r.context}, " + (
            f"{len(over)} of the attention regions' kernels show up to {over.calls.max()} launches for "
            f"{layers} layers" if not over.empty else
            f"every attention kernel shows exactly {layers} launches, so the surplus sits outside attention"))
    return "\n".join([
        '!!! warning "Cells marked †: some kernels counted twice (rows of our first attribution)"',
        _indent(f"On one CUDA stream kernels run one after another, so the kernel time attributed to a "
                f"synchronised range cannot exceed the range's wall time. In these cells it does (kernels / "
                f"range: {cells}). Where the duplicates sit, as far as the attention regions show: "
                f"{'; '.join(where) or 'not in the forward'}. The affected phase totals are high by at least "
                f"{worst:.0%} (the excess over the wall time; the true excess can be larger), and the shares "
                f"and the attention regions of those cells can be off by as much, since matmul and non-matmul "
                f"kernels are duplicated alike. The ranges quoted in the prose of this chapter leave these "
                f"cells out. They have not been profiled again since the fix below.")])


def attribution_note() -> str:
    c = kernel_cells()
    rows = [r for _, r in c.iterrows()]
    bad = [(r, overcounted(r)) for r in rows if overcounted(r)]
    new = c[[counted_once(r) for r in rows]]
    old = c[[not counted_once(r) for r in rows]]
    out = [_marked(bad)] if bad else []
    hidden = optimizer_excess(old)
    text = ("**What counted them twice.** Our first attribution summed, for every CPU op, the kernels "
            "`torch.profiler` lists under it (`FunctionEvent.kernels`). torch builds those lists by appending "
            "each kernel to *every* CPU event whose correlation id equals the kernel's linked id, so an op "
            "that appears twice in the event list, or an unrelated event whose id happens to be the same "
            "number (CUDA runtime calls made outside any op carry CUPTI's ids, ops carry torch's), receives "
            "the kernel twice.")
    first = first_run_cells()
    was = [(r, overcounted(r)) for _, r in first.iterrows() if overcounted(r)]
    if was and not bad:
        text += (" In our first H200 run this put more kernel time into a phase than the phase lasted in "
                 + str(len(was)) + " cells (kernels / range: "
                 + "; ".join(f"{r['size']} at context {r.context}: " + ", ".join(
                     f"{NAMES[p]} {r[p + '_kernel_ms'] / r[p + '_range_ms']:.2f}" for p in ps) for r, ps in was)
                 + "), which the tables marked †.")
    silu = first_run_silu_surplus()
    found = _cause(new)
    if silu:
        text += (" The first run's rows " + ("seemed to point at" if found and found != ["ops listed twice"]
                                             else "point at")
                 + " the first kind: the surplus launches are kernels of the same ops in the same phase and "
                 "region, for instance the forward's SiLU ("
                 + "; ".join(f"{s} at {ctx}: {n} launches for {L} layers" for s, ctx, n, L in silu)
                 + (")." if found and found != ["ops listed twice"] else
                    "), where a colliding id would have pulled in kernels of unrelated ops, such as the "
                    "backward's `silu_backward`."))
    if hidden:
        text += (" The kernels-within-the-wall-time check cannot see duplicates that fit into idle time; "
                 "the optimizer can, "
                 "because AdamW launches its `addcdiv` kernel once per parameter tensor: "
                 + "; ".join(f"{s} at {ctx} lists {n} launches for {t} tensors" for s, ctx, n, t in hidden)
                 + ". So rows of the first attribution that pass the check can hold a few duplicates too.")
    text += (" Now the kernels are the device events themselves, each counted once (repeats of the same "
             "event dropped), and each is placed by its launch: the runtime call with the kernel's own CUPTI "
             "correlation id *and* linked op, which no colliding id can imitate. A unit test builds a trace "
             "with all three patterns (an op listed twice, a colliding id, a device event listed twice): the "
             "old sum puts more kernel time into its forward than the forward lasts, the new one counts "
             "each kernel once.")
    out.append(text)
    if new.empty:
        out.append("No cell has been profiled with the fix yet: every row above is from the first attribution "
                   "(the re-run is `just bench kernels --redo-stale`).")
    else:
        out.append(_rerun(new, len(c), was))
    return "\n\n".join(out)


def _cause(new: pd.DataFrame) -> list[str]:
    """Which duplication patterns the re-profiled cells' traces held."""
    if new.empty:
        return []
    counts = (("ops listed twice", "copied_host_events"), ("colliding ids", "colliding_host_ids"),
              ("device events listed twice", "repeated_device_events"))
    return [name for name, col in counts if int(new[col].sum())]


def _rerun(new: pd.DataFrame, total: int, was: list) -> str:
    names = (f"all {total} cells" if len(new) == total else
             f"{len(new)} of {total} cells: " + ", ".join(f"{r['size']} at {r.context}" for _, r in new.iterrows()))
    ratio = max(r[f"{p}_kernel_ms"] / r[f"{p}_range_ms"] for _, r in new.iterrows() for p in NAMES)
    failed = [f"{r['size']} at {r.context}" for _, r in new.iterrows() if not r.get("check_ok")]
    excess = {p: max((r[f"{p}_appended_ms"] or 0) / r[f"{p}_kernel_ms"] - 1 for _, r in new.iterrows())
              for p in NAMES}
    copies, collisions = int(new["copied_host_events"].sum()), int(new["colliding_host_ids"].sum())
    repeats = int(new["repeated_device_events"].sum())
    fallback = int(new["launch_by_op"].sum() + new["placed_by_gpu_time"].sum())
    causes = _cause(new)
    over = new[[max((r[f"{p}_appended_ms"] or 0) / r[f"{p}_kernel_ms"] for p in NAMES) > 1 + RANGE_TOLERANCE
                for _, r in new.iterrows()]]
    out = (f"**Profiled again with the fix** ({names}). The largest kernels / "
           f"range ratio among their phases is {ratio:.3f}; "
           + (f"the self-check failed for {', '.join(failed)}. " if failed else
              "every self-check passed" + (" (kernels within each phase's wall time, no device event listed "
                                           "twice, no overlapping kernels on a stream), so no cell is marked † "
                                           "and none is left out of the ranges quoted in this chapter. "
                                           if len(new) == total else ". "))
           + "In the same runs, summing torch's per-op lists (the old way) would have reported up to "
           + ", ".join(f"{excess[p]:+.1%} in the {NAMES[p]}" for p in NAMES)
           + f". The traces held {copies} copies of CPU events, {collisions} colliding CPU ids and {repeats} "
           f"repeated device events"
           + (f", so in these runs the double count came from {' and '.join(causes)}" if causes else
              ": none of the patterns recurred in these runs, so they do not show which one it was")
           + f". {fallback} kernels had no launch record and were placed by their op or their GPU time.")
    if causes == ["colliding ids"] and not over.empty:
        quiet = new.drop(over.index)
        out += (f" The old sum exceeds the unique count in {len(over)} cells ("
                + ", ".join(f"{r['size']} at {r.context}" for _, r in over.iterrows())
                + f"), whose traces hold {int(over['colliding_host_ids'].min())} to "
                f"{int(over['colliding_host_ids'].max())} colliding ids"
                + (f"; the other cells hold {int(quiet['colliding_host_ids'].min())} to "
                   f"{int(quiet['colliding_host_ids'].max())} (a collision duplicates nothing when no kernel "
                   f"is linked to the shared id)" if not quiet.empty else "")
                + ". So the first run's same-op surplus did not tell the two kinds apart: a colliding id "
                "duplicates the kernel of the op whose id it shares, so the duplicate keeps that op's "
                "kernel name.")
    silu, addcdiv = count_checks(new)
    out += (" A count that needs no wall time: "
            + ("every re-profiled cell" if not silu else
               "every re-profiled cell but " + ", ".join(silu)) + " lists exactly one forward SiLU launch "
            "per layer, and " + ("every one" if not addcdiv else "all but " + ", ".join(addcdiv))
            + " exactly one optimizer `addcdiv` launch per parameter tensor.")
    again = []
    for r, ps in was:
        hit = new[(new["size"] == r["size"]) & (new["context"] == r.context)]
        if not hit.empty:
            n = hit.iloc[-1]
            again.append(f"{r['size']} at {r.context}, " + ", ".join(
                f"{NAMES[p]} {r[p + '_kernel_ms']:.1f} -> {n[p + '_kernel_ms']:.1f} ms of kernels in a "
                f"{n[p + '_range_ms']:.1f} ms range" for p in ps))
    if again:
        out += " The cells once marked †, first run -> re-run: " + "; ".join(again) + "."
    return out
