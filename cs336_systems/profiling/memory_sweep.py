"""Memory of the 2.7B model (problem memory_profiling): `just bench memory`.

Context {128, 256, 512, 2048} x forward-only (inference) / full train step x fp32 / bf16 autocast.
Each cell runs one untimed step first (so a train cell's measured step starts from the steady
state: weights, Adam moments and last step's gradients resident), then one measured step.
Rows: results/memory/peaks/ (MiB = bytes / 1024^2). For the snapshot cells (default, fp32: contexts
128 and 512 forward and train, context 2,048 forward: the 2026 edition asks the xl model, our 2.7B,
at 128 and 2,048, where its training step does not fit) also the active-memory timeline
(results/memory/timeline/, which the site draws), the largest allocations with their source lines
(results/memory/largest/) and the residual-stream check (results/memory/residual/). A snapshot cell
whose peak row is stored but whose timeline is not (a snapshot cell added since) is measured again.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from cs336_systems.bench.cli import Parser, at_least, csv_of, given
from cs336_systems.model import get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA

from .budget import ModelCache, add_common, check_device, check_fit, open_store, run_budgeted
from .memory import (
    MIB,
    allocations_of_size,
    largest_allocations,
    load_snapshot,
    phase_marker,
    record_snapshot,
    residual_stream_bytes,
    timeline_series,
)
from .steps import DTYPES, MODES, make_optimizer, make_step, phase_ranges, random_batch

KEY = ["size", "context", "mode", "dtype"]
# The cells that also record a snapshot: the 2025 edition's 512 and the 2026 edition's 128 and 2,048
# (its training step runs out of memory at 2,048, so only the forward there).
SNAPSHOT_CELLS = ("128/forward/fp32", "128/train/fp32", "512/forward/fp32", "512/train/fp32", "2048/forward/fp32")


def snapshot_tag(cell: dict) -> str:
    return f"{cell['context']}/{cell['mode']}/{cell['dtype']}"


def missing_timelines(cells, snap_cells, peaks, timelines) -> list[dict]:
    """The snapshot cells measured without their snapshot (a peak row "ok", no timeline row): the
    peak alone does not make them done. A cell that ran out of memory has no timeline to take."""
    out = []
    for c in cells:
        row = peaks.newest(c) if snapshot_tag(c) in snap_cells else None
        if row is not None and row.get("status") == "ok" and timelines.newest({k: c[k] for k in KEY}) is None:
            out.append(c)
    return out


def measure_cell(model, cell, device, snapshot_path: Path | None) -> dict:
    dev = torch.device(device)
    cfg = get_config(cell["size"], cell["context"])
    x, y = random_batch(cfg, cell["batch"], cell["context"], dev)
    optimizer = make_optimizer(model, cell["mode"])
    step = make_step(model, x, y, mode=cell["mode"], dtype=cell["dtype"], optimizer=optimizer,
                     phase=phase_ranges(marker=phase_marker if snapshot_path else None))
    cuda = dev.type == "cuda"
    try:
        step()  # steady state: optimizer moments and gradients exist from here on
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        if snapshot_path is not None:
            with record_snapshot(snapshot_path):
                step()
        else:
            step()
        if cuda:
            torch.cuda.synchronize()
        out = {"before_mib": before / MIB,
               "peak_mib": torch.cuda.max_memory_allocated() / MIB if cuda else None,
               "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB if cuda else None,
               "after_mib": torch.cuda.memory_allocated() / MIB if cuda else None,
               "snapshot": snapshot_path is not None}
    finally:
        model.zero_grad(set_to_none=True)
        del optimizer
    return out


def analyse_snapshot(cell, snapshot_path: Path, timeline_store, largest_store, residual_store) -> dict:
    """Store the timeline series and the largest-allocations and residual-stream rows."""
    snap = load_snapshot(snapshot_path)
    key = {k: cell[k] for k in KEY}
    series = timeline_series(snap)
    timeline_store.append(key, series)
    for rank, row in enumerate(largest_allocations(snap, top=15)):
        largest_store.append({**key, "rank": rank, **row})
    cfg = get_config(cell["size"], cell["context"])
    elem = 4 if cell["dtype"] == "fp32" else 2
    expected = residual_stream_bytes(cell["batch"], cell["context"], cfg.d_model, 4)
    found = allocations_of_size(snap, expected)
    sites: dict[str, int] = {}
    for f in found:
        sites[f["site"]] = sites.get(f["site"], 0) + 1
    residual_store.append({**key, "expected_bytes": expected, "expected_mib": expected / MIB,
                           "allocations_of_that_size": len(found),
                           "half_precision_bytes": residual_stream_bytes(cell["batch"], cell["context"], cfg.d_model, 2),
                           "activation_elem_bytes": elem,
                           "sites": sorted(sites.items(), key=lambda kv: -kv[1])[:12]})
    return {f"timeline_{k}": series[k] for k in ("peak_gib", "start_gib", "end_gib", "events")}


def snapshot_cell(text: str) -> str:
    """argparse type: CONTEXT/MODE/DTYPE, e.g. 512/train/fp32."""
    context, mode, dtype = (text.split("/") + ["", "", ""])[:3]
    if not (context.isdigit() and int(context) >= 1 and mode in MODES and dtype in DTYPES
            and text.count("/") == 2):
        raise argparse.ArgumentTypeError(f"expected CONTEXT/MODE/DTYPE like 512/train/fp32 (modes "
                                         f"{', '.join(MODES)}; dtypes {', '.join(DTYPES)}), got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="memory", description=__doc__.splitlines()[0])
    p.add_argument("--size", default="2.7B", choices=[*PRESETS, *PRESETS_EXTRA])
    # 128-512: the 2025 edition's; 2,048: the 2026 edition's (where the training step does not fit)
    p.add_argument("--contexts", type=csv_of(at_least(1)), default=[128, 256, 512, 2048])
    p.add_argument("--modes", type=csv_of(choices=MODES), default=["forward", "train"])
    p.add_argument("--dtypes", type=csv_of(choices=list(DTYPES)), default=["fp32", "bf16"])
    p.add_argument("--snapshot-cells", type=csv_of(snapshot_cell, allow_empty=True),
                   default=list(SNAPSHOT_CELLS),
                   help="context/mode/dtype cells that also record a snapshot")
    p.add_argument("--snapshot-dir", type=Path, default=None,
                   help="where the snapshot pickles go while they are analysed (default: a private "
                        "temporary directory, removed at the end)")
    p.add_argument("--remeasure", action="store_true",
                   help="(the default now: every run measures every selected cell; kept so old commands run)")
    add_common(p)
    args = p.parse_args(argv)
    check_device(p, args)
    cuda = torch.device(args.device).type == "cuda"
    if args.remeasure and not args.resume:
        print("[memory] --remeasure: every run measures every cell now; the flag is no longer needed",
              file=sys.stderr)
    for dest in ("snapshot_cells", "snapshot_dir"):
        if not cuda and given(p, dest) and getattr(args, dest):
            p.error(f"{p.flag(dest)}: snapshots record the CUDA allocator; --device cpu takes none")
    unknown = [t for t in args.snapshot_cells if not any(
        t == f"{c}/{m}/{d}" for c in args.contexts for m in args.modes for d in args.dtypes)]
    if given(p, "snapshot_cells") and unknown:
        p.error(f"--snapshot-cells {','.join(unknown)}: not among the cells --contexts x --modes x --dtypes select")
    cells = [{"size": args.size, "context": c, "mode": m, "dtype": d, "batch": 4}
             for c in args.contexts for d in args.dtypes for m in args.modes]
    check_fit(p, args, cells, lambda c: f"--size {c['size']} --contexts {c['context']} --modes {c['mode']} "
                                        f"--dtypes {c['dtype']}")
    peaks = open_store(p, "memory/peaks", KEY, args)
    timelines = open_store(p, "memory/timeline", KEY, args)
    largest = open_store(p, "memory/largest", [*KEY, "rank"], args)
    residual = open_store(p, "memory/residual", KEY, args)
    snap_cells = set(args.snapshot_cells)
    again = cells if args.remeasure else missing_timelines(cells, snap_cells, peaks, timelines) if cuda else []
    for cell in again:
        peaks.forget(cell)
    models = ModelCache(args.device)
    # A private directory (mode 0700, a fresh name) rather than a fixed shared path: no other user
    # can plant or read the pickles we load.
    with tempfile.TemporaryDirectory(prefix="cs336-snapshots-") as private:
        snapshot_dir = args.snapshot_dir or Path(private)

        def run(cell):
            return measure_with_snapshot(cell, args, models, snapshot_dir, timelines, largest, residual,
                                         snap=cuda and snapshot_tag(cell) in snap_cells)

        return run_budgeted(peaks, cells, run, budget_s=args.budget_s, desc="2.7B memory")


def measure_with_snapshot(cell, args, models: ModelCache, snapshot_dir: Path, timelines, largest, residual, *,
                          snap: bool) -> dict:
    """One cell's peaks; for a snapshot cell also its timeline and tables (the pickle is removed)."""
    model = models.get(cell["size"], max(args.contexts))
    path = snapshot_dir / f"{cell['context']}-{cell['mode']}-{cell['dtype']}.pickle" if snap else None
    out = measure_cell(model, cell, args.device, path)
    if path is not None:
        try:
            out |= analyse_snapshot(cell, path, timelines, largest, residual)
        except Exception as exc:  # noqa: BLE001 - keep the peak even if the analysis breaks
            traceback.print_exc()
            out["snapshot_error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            path.unlink(missing_ok=True)  # pickles are large; the timeline and tables are what we keep
    return out


if __name__ == "__main__":
    sys.exit(main())
