"""The profiling chapter's account of the kernel double count, computed from results/ at build time.

Three cells of the first H200 run attributed more kernel time to a phase than the phase lasted;
kernel_attribution.py now counts each device kernel once. This note says which cells are still rows
of the first attribution (marked †), what the data shows about the duplicates, and, for cells profiled
again, what the self-check columns found. It reads whatever rows exist, so the page is right before
and after the re-run.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.model import TransformerLM, get_config

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
    silu = first_run_silu_surplus()
    if silu:
        text += (" The first run's rows point at the first kind: the surplus launches are kernels of the same "
                 "ops in the same phase and region, for instance the forward's SiLU ("
                 + "; ".join(f"{s} at {ctx}: {n} launches for {L} layers" for s, ctx, n, L in silu)
                 + "), where a colliding id would have pulled in kernels of unrelated ops, such as the "
                 "backward's `silu_backward`.")
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
        out.append(_rerun(new, len(c)))
    return "\n\n".join(out)


def _rerun(new: pd.DataFrame, total: int) -> str:
    names = ", ".join(f"{r['size']} at {r.context}" for _, r in new.iterrows())
    ratio = max(r[f"{p}_kernel_ms"] / r[f"{p}_range_ms"] for _, r in new.iterrows() for p in NAMES)
    failed = [f"{r['size']} at {r.context}" for _, r in new.iterrows() if not r.get("check_ok")]
    excess = {p: max((r[f"{p}_appended_ms"] or 0) / r[f"{p}_kernel_ms"] - 1 for _, r in new.iterrows())
              for p in NAMES}
    copies, collisions = int(new["copied_host_events"].sum()), int(new["colliding_host_ids"].sum())
    repeats = int(new["repeated_device_events"].sum())
    fallback = int(new["launch_by_op"].sum() + new["placed_by_gpu_time"].sum())
    causes = [c for c, n in (("ops listed twice", copies), ("colliding ids", collisions),
                             ("device events listed twice", repeats)) if n]
    return (f"**Profiled again with the fix** ({len(new)} of {total} cells: {names}). The largest kernels / "
            f"range ratio among their phases is {ratio:.3f}; "
            + (f"the self-check failed for {', '.join(failed)}. " if failed else "every self-check passed. ")
            + "In the same runs, summing torch's per-op lists (the old way) would have reported up to "
            + ", ".join(f"{excess[p]:+.1%} in the {NAMES[p]}" for p in NAMES)
            + f". The traces held {copies} copies of CPU events, {collisions} colliding CPU ids and {repeats} "
            f"repeated device events"
            + (f", so the double count came from {' and '.join(causes)}" if causes else
               ": none of the patterns recurred in these runs, so they do not show which one it was")
            + f". {fallback} kernels had no launch record and were placed by their op or their GPU time.")
