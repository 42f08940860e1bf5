"""Kernel breakdown sweep (problem nsys_profile, answered with torch.profiler): `just bench kernels`.

Every size x context {128, 256, 512, 1024}: a full train step (forward, backward, optimizer),
2 warm-up steps, one step timed phase by phase with the Python timer, one profiled step.
Writes one summary row per cell to results/profiling/kernel_cells/ (OOM cells as OOM) and the
per-phase kernel table to results/profiling/kernels/. Both carry the cell's `cell_run` id, so a
reader can take the kernel rows of the newest run of a cell only. `--redo-stale` measures only the
cells whose newest row was counted by an older attribution (kernel_attribution.ATTRIBUTION).

`--longest-fit small,2.7B` answers the 2026 edition's version (two sizes, three power-of-two
contexts above 128, the largest the longest that fits): for each size it first probes the longest
power-of-two context at which the step fits, from --probe-start (256) doubling until the first
out-of-memory (context_probe.py; rows in results/profiling/context_probe/, the OOM one included),
then profiles that context and the two powers of two below it, into results/profiling/
longest_fit_cells/ and longest_fit_kernels/ (the 2025 grid's files keep their 4 x 5 cells). One
model per size, built at --probe-limit, serves the probe and the profiles, so both see the same
resident memory.
"""

from __future__ import annotations

import argparse
import sys
import uuid

from cs336_systems.bench.cli import Parser, at_least, csv_of, given
from cs336_systems.model import get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

from .budget import ModelCache, add_common, check_device, check_fit, open_store, run_budgeted
from .context_probe import BENCH as PROBE_BENCH
from .context_probe import KEY as PROBE_KEY
from .context_probe import probe_longest_context, step_at
from .kernel_attribution import ATTRIBUTION, RANGE_TOLERANCE
from .nvtx import ATTENTION_REGIONS, PHASES
from .steps import DTYPES, MODES
from .torch_profile import profile_step

CELL_KEY = ["size", "context", "mode", "dtype"]
SIZES = [*PRESETS, *PRESETS_EXTRA]
KERNEL_KEY = [*CELL_KEY, "phase", "region", "kernel"]
SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
CPU_ATTRIBUTION = "cpu-self-time"  # CPU runs: each op's self CPU time stands in for kernels
# --longest-fit's profiles (the 2026 nsys_profile cells), beside the 2025 grid's files
LONGEST_CELLS, LONGEST_KERNELS = "profiling/longest_fit_cells", "profiling/longest_fit_kernels"


def summarize(rows: list[dict], totals: dict[str, dict]) -> dict:
    """Flat columns for the cell row: per phase kernel/range/python ms and matmul share, the
    forward's attention regions, and the top kernel of each phase with its call count."""
    out: dict = {}
    for phase in PHASES:
        t, s = totals.get(phase, {}), SHORT[phase]
        out[f"{s}_kernel_ms"] = t.get("kernel_ms")
        out[f"{s}_range_ms"] = t.get("wall_ms")
        out[f"{s}_python_ms"] = t.get("python_ms")
        out[f"{s}_launches"] = t.get("kernels")
        out[f"{s}_appended_ms"] = t.get("appended_ms")  # GPU: what summing torch's per-op lists gives
        out[f"{s}_matmul_share"] = (t["matmul_ms"] / t["kernel_ms"]) if t.get("kernel_ms") else None
        ranked = sorted((r for r in rows if r["phase"] == phase and r["kernel"] != "(other kernels)"),
                        key=lambda r: -r["total_ms"])
        merged: dict[str, list] = {}
        for r in ranked:  # the same kernel can appear in several regions: add them up
            m = merged.setdefault(r["kernel"], [0, 0.0])
            m[0] += r["calls"]
            m[1] += r["total_ms"]
        if merged:
            top = max(merged.items(), key=lambda kv: kv[1][1])
            out[f"{s}_top_kernel"], out[f"{s}_top_calls"], out[f"{s}_top_ms"] = top[0], top[1][0], top[1][1]
    for region in ATTENTION_REGIONS:
        out[f"{region}_ms"] = sum(r["total_ms"] for r in rows if r["phase"] == "forward" and r["region"] == region)
    out["device_events_ms"] = totals.get("(all device events)", {}).get("kernel_ms")
    out["outside_phases_ms"] = totals.get("(outside phases)", {}).get("kernel_ms")
    check = totals.get("(check)")
    out["attribution"] = CPU_ATTRIBUTION
    if check is not None:  # GPU: the self-check of the attribution (CPU runs have no kernels)
        out.update(check)
        out["attribution"] = ATTRIBUTION
        out["check_ok"] = bool(check["repeated_device_events"] == 0 and check["stream_overlap_ms"] < 1e-3
                               and all(out[f"{s}_kernel_ms"] is None or out[f"{s}_range_ms"] is None
                                       or out[f"{s}_kernel_ms"] <= out[f"{s}_range_ms"] * (1 + RANGE_TOLERANCE)
                                       for s in SHORT.values()))
    return out


def parse_cells(text: str) -> list[tuple[str, int]]:
    """'xl:1024,2.7B:256' -> [('xl', 1024), ('2.7B', 256)]."""
    out = []
    for item in filter(None, text.split(",")):
        size, sep, ctx = item.partition(":")
        if not sep or not ctx.isdigit() or int(ctx) < 1:
            raise argparse.ArgumentTypeError(f"cells are SIZE:CONTEXT (CONTEXT >= 1), comma-separated; "
                                             f"got {item!r}")
        if size not in SIZES:
            raise argparse.ArgumentTypeError(f"unknown size {size!r} in {item!r}; expected one of "
                                             f"{', '.join(SIZES)}")
        out.append((size, int(ctx)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="kernels", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=csv_of(choices=SIZES), default=list(PRESETS))
    p.add_argument("--contexts", type=csv_of(at_least(1)), default=[128, 256, 512, 1024])
    p.add_argument("--mode", default="train", choices=MODES)
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--cells", type=parse_cells, default=None,
                   help="SIZE:CONTEXT,... in this order, instead of --sizes x --contexts")
    p.add_argument("--longest-fit", type=csv_of(choices=SIZES), default=None, metavar="SIZES",
                   help="probe each size's longest power-of-two context that fits, then profile it and "
                        "the two below it (instead of --sizes x --contexts)")
    p.add_argument("--probe-start", type=at_least(1), default=256,
                   help="--longest-fit: the first context tried (the handout asks contexts above 128)")
    p.add_argument("--probe-limit", type=at_least(1), default=16384,
                   help="--longest-fit: the longest context tried (the model's RoPE table and mask are "
                        "built this long)")
    p.add_argument("--redo-stale", action="store_true",
                   help="measure only the cells whose newest row predates the current attribution")
    p.add_argument("--warmup", type=at_least(0), default=2)
    add_common(p)
    args = p.parse_args(argv)
    check_device(p, args)
    if args.longest_fit is not None and args.cells is not None:
        p.error("--longest-fit chooses the cells itself; leave out --cells")
    if args.longest_fit is not None and args.probe_limit < args.probe_start:
        p.error(f"--probe-limit {args.probe_limit} is below --probe-start {args.probe_start}")
    if args.longest_fit is not None and not args.longest_fit:
        p.error("--longest-fit: expected at least one size")
    if (args.cells is not None or args.longest_fit is not None) and (given(p, "sizes") or given(p, "contexts")):
        p.error(f"{'--cells' if args.cells is not None else '--longest-fit'} replaces --sizes x --contexts; "
                "give one or the other")
    if args.longest_fit is None and (given(p, "probe_start") or given(p, "probe_limit")):
        p.error("--probe-start and --probe-limit are for --longest-fit")
    pairs = args.cells if args.cells is not None else [(s, c) for s in args.sizes for c in args.contexts]
    if not pairs:
        p.error("--cells: expected at least one SIZE:CONTEXT")
    if len(set(pairs)) < len(pairs):
        p.error("argument --cells: a cell given twice")
    longest = args.longest_fit is not None
    if not longest:  # --longest-fit finds what fits by running it (its OOM is the probe's answer)
        check_fit(p, args, [{"size": s, "context": c, "mode": args.mode, "dtype": args.dtype, "batch": 4}
                            for s, c in pairs],
                  lambda c: f"--sizes/--cells {c['size']} --contexts {c['context']} --mode {c['mode']} "
                            f"--dtype {c['dtype']}")
    cells_store = open_store(p, LONGEST_CELLS if longest else "profiling/kernel_cells", CELL_KEY, args)
    kernel_store = open_store(p, LONGEST_KERNELS if longest else "profiling/kernels", KERNEL_KEY, args)
    models = ModelCache(args.device)
    max_ctx: dict[str, int] = {}
    if args.longest_fit is not None:
        probe_store = open_store(p, PROBE_BENCH, PROBE_KEY, args)
        pairs = []
        for size in args.longest_fit:
            probe = probe_longest_context(
                probe_store, {"size": size, "mode": args.mode, "dtype": args.dtype, "batch": 4},
                lambda ctx, size=size: step_at(models.get(size, args.probe_limit), context=ctx, mode=args.mode,
                                               dtype=args.dtype, batch=4, device=args.device),
                start=args.probe_start, limit=args.probe_limit)
            contexts = probe.profile_contexts(args.probe_start)
            oom = f", {probe.first_oom} does not" if probe.first_oom else f" (every context up to the limit {args.probe_limit} fits)"
            print(f"[kernels] {size}: the longest context that fits is {probe.longest}{oom}; "
                  f"profiling {contexts}", file=sys.stderr)
            if len(contexts) < 3:
                print(f"[kernels] {size}: fewer than three contexts from {args.probe_start} fit", file=sys.stderr)
            pairs += [(size, c) for c in contexts]
            max_ctx[size] = args.probe_limit
        if not pairs:
            print("[kernels] no size fits even at --probe-start; nothing to profile", file=sys.stderr)
            return 1
    cells = [{"size": s, "context": c, "mode": args.mode, "dtype": args.dtype, "batch": 4} for s, c in pairs]
    if args.redo_stale:  # only the cells whose newest row an older attribution counted
        current = (ATTRIBUTION, CPU_ATTRIBUTION)
        cells = [c for c in cells if (row := cells_store.newest(c)) is not None and row.get("status") == "ok"
                 and row.get("attribution") not in current]
    for s, _ in pairs:  # one model per size; shorter batches use its prefix
        max_ctx.setdefault(s, max(c for s2, c in pairs if s2 == s))

    def run(cell):
        model = models.get(cell["size"], max_ctx[cell["size"]])  # one model per size; shorter batches use its prefix
        rows, totals = profile_step(model, get_config(cell["size"], max_ctx[cell["size"]]), mode=cell["mode"],
                                    dtype=cell["dtype"], batch=cell["batch"], context=cell["context"],
                                    device=args.device, warmup=args.warmup)
        key = {k: cell[k] for k in CELL_KEY}
        run_id = uuid.uuid4().hex[:12]
        for r in rows:  # rows of a killed cell stay behind; readers keep the newest cell_run's
            kernel_store.append({**key, **r, "cell_run": run_id})
        model.zero_grad(set_to_none=True)
        return {**summarize(rows, totals), "cell_run": run_id}

    return run_budgeted(cells_store, cells, run, budget_s=args.budget_s, desc="kernel tables")


if __name__ == "__main__":
    sys.exit(main())
