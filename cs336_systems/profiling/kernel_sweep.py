"""Kernel breakdown sweep (problem nsys_profile, answered with torch.profiler): `just bench kernels`.

Every size x context {128, 256, 512, 1024}: a full train step (forward, backward, optimizer),
2 warm-up steps, one step timed phase by phase with the Python timer, one profiled step.
Writes one summary row per cell to results/profiling/kernel_cells/ (OOM cells as OOM) and the
per-phase kernel table to results/profiling/kernels/.
"""

from __future__ import annotations

import argparse
import sys

import torch

from cs336_systems.model import get_config
from cs336_systems.model.config import PRESETS

from .budget import ModelCache, add_common, check_device, csv_list, open_store, run_budgeted
from .nvtx import ATTENTION_REGIONS, PHASES
from .torch_profile import profile_step

CELL_KEY = ["size", "context", "mode", "dtype"]
KERNEL_KEY = [*CELL_KEY, "phase", "region", "kernel"]
SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


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
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kernels", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=csv_list(), default=list(PRESETS))
    p.add_argument("--contexts", type=csv_list(int), default=[128, 256, 512, 1024])
    p.add_argument("--mode", default="train")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--warmup", type=int, default=2)
    add_common(p)
    args = p.parse_args(argv)
    check_device(p, args)
    for s in args.sizes:
        try:
            get_config(s)
        except ValueError as exc:
            p.error(str(exc))
    cells_store = open_store(p, "profiling/kernel_cells", CELL_KEY, args)
    kernel_store = open_store(p, "profiling/kernels", KERNEL_KEY, args)
    cells = [{"size": s, "context": c, "mode": args.mode, "dtype": args.dtype, "batch": 4}
             for s in args.sizes for c in args.contexts]
    models = ModelCache(args.device)
    max_ctx = max(args.contexts)

    def run(cell):
        model = models.get(cell["size"], max_ctx)  # one model per size; shorter batches use its prefix
        rows, totals = profile_step(model, get_config(cell["size"], max_ctx), mode=cell["mode"],
                                    dtype=cell["dtype"], batch=cell["batch"], context=cell["context"],
                                    device=args.device, warmup=args.warmup)
        key = {k: cell[k] for k in CELL_KEY}
        for r in rows:  # rows of a killed cell may be written twice; readers keep the last per key
            kernel_store.append({**key, **r})
        model.zero_grad(set_to_none=True)
        return summarize(rows, totals)

    done = run_budgeted(cells_store, cells, run, budget_s=args.budget_s, desc="kernel tables")
    return 0 if done else 3


if __name__ == "__main__":
    sys.exit(main())
