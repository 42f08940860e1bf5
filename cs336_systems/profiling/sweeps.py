"""End-to-end sweeps (problems benchmarking_script (b)-(c), benchmarking_mixed_precision (c),
torch_compile (b)): `just bench end-to-end [--part timings|warmup|compile]`.

- timings: every size x forward / forward-backward / train x fp32 / bf16 at one context,
  5 warm-up + 10 measured steps -> results/end-to-end/timings/
- warmup: a fresh process per (size, mode) times every step from the very first, so tables can
  show what 0, 1 or 2 warm-up steps leave in the measured mean -> results/end-to-end/warmup/
- compile: the whole model eager vs torch.compile, forward and train -> results/end-to-end/compile/
- phases: the 2026 edition's sizes (small, medium, large, xl = our 2.7B, 10B) x forward-backward /
  train x fp32 / bf16, every phase (forward, backward, optimizer step) timed on its own, 5 warm-up +
  10 measured steps, mean and std per phase (phase_timing.py) -> results/end-to-end/phases/. Each
  row carries the cell's memory arithmetic; a cell that runs out of memory (the 10B training step:
  fp32 weights, gradients and AdamW moments alone exceed an H200) is an OOM row with the
  allocator's numbers, the phase it failed in, and the arithmetic beside them.

`--record-clocks` (timings) samples the GPU's SM clock, power and temperature with nvidia-smi while
each cell runs and stores them in its row, and measures only the cells whose newest row has no
such record, so the suspect bf16 rows can be re-measured with the clocks beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import timeit

import torch

from cs336_systems.bench.cli import Parser, at_least, csv_of, given
from cs336_systems.bench.sweep import worst
from cs336_systems.bench.timing import synchronize, time_steps
from cs336_systems.model import get_config
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA, edition_presets

from .benchmark import measure
from .budget import ModelCache, add_common, check_device, check_fit, open_store, run_budgeted
from .clocks import ClockSampler
from .phase_timing import measure_phases, step_memory
from .steps import DTYPES, MODES, build_model, make_optimizer, make_step, random_batch

SIZES = list(PRESETS)
SIZES_2026 = edition_presets("2026")  # small, medium, large, 2.7B (the 2026 "xl"), 10B
ALL_SIZES = [*PRESETS, *PRESETS_EXTRA]
PARTS = ("timings", "warmup", "compile", "phases")


def timing_cells(args) -> list[dict]:
    return [{"size": s, "context": args.context, "batch": 4, "mode": m, "dtype": d,
             "warmup": args.warmup, "steps": args.steps, "compile": False}
            for s in args.sizes for d in args.dtypes for m in args.modes]


def warmup_cells(args) -> list[dict]:
    return [{"size": s, "context": args.context, "mode": m, "dtype": "fp32", "trace_steps": args.steps + 2,
             "batch": 4} for m in ("forward-backward", "forward") for s in args.sizes]


def compile_cells(args) -> list[dict]:
    return [{"size": s, "context": args.context, "batch": 4, "mode": m, "dtype": d, "compile": c,
             "warmup": args.warmup, "steps": args.steps}
            for s in args.compile_sizes for d in args.compile_dtypes for m in ("forward", "train")
            for c in (False, True)]


def timings(p, args) -> int:
    store = open_store(p, "end-to-end/timings", ["size", "context", "mode", "dtype", "warmup", "steps"], args)
    cells = timing_cells(args)
    if args.record_clocks:  # only the cells whose newest row has no clock record
        cells = [c for c in cells if "clock_samples" not in (store.newest(c) or {})]
    models = ModelCache(args.device)

    def run(cell):
        model = models.get(cell["size"], cell["context"])
        sampler = ClockSampler() if args.record_clocks else None
        with sampler or contextlib.nullcontext():
            out = measure(model, get_config(cell["size"], cell["context"]), mode=cell["mode"],
                          dtype=cell["dtype"], batch=cell["batch"], context=cell["context"],
                          warmup=cell["warmup"], steps=cell["steps"], device=args.device)
        return {**out, **(sampler.record() if sampler else {})}

    return run_budgeted(store, cells, run, budget_s=args.budget_s, desc="end-to-end timings")


# --8<-- [start:warmup_child]
def warmup_trace(size: str, mode: str, context: int, dtype: str, steps: int, device: str) -> dict:
    """In a fresh process: time CUDA start-up, model build, then every step from the first."""
    timer = timeit.default_timer
    t0 = timer()
    if torch.device(device).type == "cuda":
        torch.zeros(1, device=device)  # creates the CUDA context
        synchronize(device)
    t1 = timer()
    cfg = get_config(size, context)
    model = build_model(cfg, device)
    synchronize(device)
    t2 = timer()
    x, y = random_batch(cfg, 4, context, device)
    step = make_step(model, x, y, mode=mode, dtype=dtype, optimizer=make_optimizer(model, mode))
    times = time_steps(step, warmup=0, steps=steps, device=device).times
    return {"context_init_ms": (t1 - t0) * 1e3, "build_ms": (t2 - t1) * 1e3,
            "step_ms": [t * 1e3 for t in times]}
# --8<-- [end:warmup_child]


# --8<-- [start:warmup_stats]
def warmup_stats(step_ms: list[float], warmup: int, steps: int = 10) -> dict[str, float]:
    """Mean/std of `steps` measured steps after `warmup` warm-ups, read off one per-step trace.

    A run with w warm-ups measures steps w+1 .. w+n of the process, so one trace of n+2 steps
    answers w = 0, 1 and 2 without three more cold starts.
    """
    window = step_ms[warmup:warmup + steps]
    if len(window) < steps:
        raise ValueError(f"trace of {len(step_ms)} steps is too short for warmup={warmup}, steps={steps}")
    return {"mean_ms": statistics.fmean(window), "std_ms": statistics.stdev(window) if steps > 1 else 0.0}
# --8<-- [end:warmup_stats]


def warmup(p, args) -> int:
    store = open_store(p, "end-to-end/warmup", ["size", "context", "mode", "dtype"], args)
    n = args.steps + 2
    cells = [{k: v for k, v in c.items() if k != "batch"} for c in warmup_cells(args)]

    def run(cell):
        cmd = [sys.executable, "-m", "cs336_systems.profiling.sweeps", "--child",
               json.dumps({**{k: cell[k] for k in ("size", "mode", "context", "dtype")},
                           "steps": n, "device": args.device})]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"child failed: {tail}")
        trace = json.loads(out.stdout.strip().splitlines()[-1])
        for w in (0, 1, 2):
            trace.update({f"w{w}_{k}": v for k, v in warmup_stats(trace["step_ms"], w, args.steps).items()})
        return trace

    return run_budgeted(store, cells, run, budget_s=args.budget_s, desc="warm-up study")


def compile_part(p, args) -> int:
    store = open_store(p, "end-to-end/compile", ["size", "context", "mode", "dtype", "compile"], args)
    cells = compile_cells(args)
    models = ModelCache(args.device)

    def run(cell):
        model = models.get(cell["size"], cell["context"])
        compiled = None
        if cell["compile"]:
            torch._dynamo.reset()  # each compiled cell pays its own compile: comparable first steps
            compiled = torch.compile(model)
        out = measure(model, get_config(cell["size"], cell["context"]), mode=cell["mode"],
                      dtype=cell["dtype"], batch=cell["batch"], context=cell["context"],
                      warmup=cell["warmup"], steps=cell["steps"], device=args.device, compiled=compiled)
        out["first_step_includes_compile"] = bool(cell["compile"])
        return out

    return run_budgeted(store, cells, run, budget_s=args.budget_s, desc="compile vs eager")


def capacity_bytes(device: str) -> float | None:
    dev = torch.device(device)
    return torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else None


def host_memory_bytes() -> float:
    """This machine's physical memory (Linux); infinity where it cannot be read."""
    import os

    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def check_phase_sizes_fit_the_host(p, args) -> None:
    """On the CPU an out-of-memory is the kernel killing the process (a shared machine's, perhaps),
    not an exception to store: refuse, before anything runs, a size whose fp32 state (16 bytes per
    parameter with AdamW) exceeds the host's memory. On a GPU every size is attempted."""
    if torch.device(args.device).type == "cuda":
        return
    ram = host_memory_bytes()
    for size in args.phase_sizes:
        need = step_memory(get_config(size), mode="train", batch=4, context=args.context)["end_of_backward_gib"]
        if need * 2**30 > ram:
            p.error(f"--phase-sizes: {size} needs {need:.0f} GiB of fp32 weights, gradients and AdamW state, "
                    f"more than this machine's {ram / 2**30:.0f} GiB; on the CPU pass --phase-sizes tiny "
                    f"(or a --part other than phases)")


def phases(p, args) -> int:
    store = open_store(p, "end-to-end/phases", ["size", "context", "mode", "dtype", "warmup", "steps"], args)
    cells = [{"size": s, "context": args.context, "batch": 4, "mode": m, "dtype": d,
              "warmup": args.warmup, "steps": args.steps}
             for s in args.phase_sizes for d in args.dtypes for m in args.phase_modes]
    models = ModelCache(args.device)
    capacity = capacity_bytes(args.device)

    def run(cell):
        cfg = get_config(cell["size"], cell["context"])
        arithmetic = step_memory(cfg, mode=cell["mode"], batch=cell["batch"], context=cell["context"],
                                 capacity_bytes=capacity)
        try:
            model = models.get(cell["size"], cell["context"])
            out = measure_phases(model, cfg, mode=cell["mode"], dtype=cell["dtype"], batch=cell["batch"],
                                 context=cell["context"], warmup=cell["warmup"], steps=cell["steps"],
                                 device=args.device)
        except Exception as exc:  # the OOM row keeps the arithmetic beside the allocator's numbers
            exc.oom_context = {**getattr(exc, "oom_context", {}), **{f"predicted_{k}": v for k, v in arithmetic.items()}}
            raise
        return {**out, **{f"predicted_{k}": v for k, v in arithmetic.items()}}

    return run_budgeted(store, cells, run, budget_s=args.budget_s, desc="phase timings")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="end-to-end", description=__doc__.splitlines()[0])
    p.add_argument("--part", action="append", choices=PARTS, help="which part(s); default all")
    p.add_argument("--sizes", type=csv_of(choices=ALL_SIZES), default=SIZES)
    p.add_argument("--modes", type=csv_of(choices=MODES), default=list(MODES))
    p.add_argument("--dtypes", type=csv_of(choices=list(DTYPES)), default=["fp32", "bf16"])
    p.add_argument("--phase-sizes", type=csv_of(choices=ALL_SIZES), default=SIZES_2026,
                   help="phases: the sizes (default: the 2026 table's, 10B included)")
    p.add_argument("--phase-modes", type=csv_of(choices=MODES), default=["forward-backward", "train"],
                   help="phases: the modes (train gives all three phases; forward-backward also where "
                        "the optimizer's state does not fit)")
    p.add_argument("--compile-sizes", type=csv_of(choices=ALL_SIZES), default=["small", "medium", "large"])
    p.add_argument("--compile-dtypes", type=csv_of(choices=list(DTYPES)), default=["fp32"])
    p.add_argument("--context", type=at_least(1), default=512)
    p.add_argument("--warmup", type=at_least(0), default=5)
    p.add_argument("--steps", type=at_least(2), default=10, help="measured steps (>= 2: a std needs two)")
    p.add_argument("--record-clocks", action="store_true",
                   help="timings: sample GPU clocks/power/temperature per cell (nvidia-smi); re-measure "
                        "cells stored without them")
    p.add_argument("--child", help=argparse.SUPPRESS)
    add_common(p)
    args = p.parse_args(argv)
    if args.child:  # the fresh process of the warm-up study
        print(json.dumps(warmup_trace(**json.loads(args.child))))
        return 0
    check_device(p, args)
    chosen = args.part or list(PARTS)
    if args.part and len(set(args.part)) < len(args.part):
        p.error("argument --part: a part given twice")
    for dest, used_by in (("record_clocks", {"timings"}), ("modes", {"timings"}), ("dtypes", {"timings", "phases"}),
                          ("compile_sizes", {"compile"}), ("compile_dtypes", {"compile"}),
                          ("phase_sizes", {"phases"}), ("phase_modes", {"phases"})):
        if given(p, dest) and not used_by & set(chosen):
            p.error(f"{p.flag(dest)} is for --part {' or '.join(sorted(used_by))}, which this run leaves out")
    # The fit check (bench.fit) for the parts of the course's grid; phases makes its own (on the CPU
    # only: on a GPU its 10B training step is meant to run out of memory, an OOM row with the arithmetic).
    flags = {"timings": (timing_cells, "--sizes", "--modes", "--dtypes"),
             "warmup": (warmup_cells, "--sizes", "(warm-up study) mode", "dtype"),
             "compile": (compile_cells, "--compile-sizes", "(compile) mode", "--compile-dtypes")}
    for part in (c for c in chosen if c in flags):
        build, size, mode, dtype = flags[part]
        check_fit(p, args, build(args), lambda c, size=size, mode=mode, dtype=dtype:
                  f"{size} {c['size']} --context {c['context']} {mode} {c['mode']} {dtype} {c['dtype']}")
    if "phases" in chosen:
        check_phase_sizes_fit_the_host(p, args)
    parts = {"timings": timings, "warmup": warmup, "compile": compile_part, "phases": phases}
    return worst(*(parts[part](p, args) for part in chosen))


if __name__ == "__main__":
    sys.exit(main())
