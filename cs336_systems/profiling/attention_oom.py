"""The allocator checks of the d = 64, seq 32,768 attention OOM: `just bench attention-oom`.

docs/attention.md counts the backward peak of naive attention at seq 32,768 (batch 8, d = 64, fp32)
below the H200's memory, yet the sweep ran out of memory there. Its hypothesis: in the first forward
the output O is carved out of the just-freed block of the scaled scores, pins that block until the
backward, and the backward then needs a fifth score-sized block. Two checks settle it:

1. seq 16,384, default allocator: the reserved peak comes out near five score matrices while the
   allocated peak is four;
2. seq 32,768 with PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:1024 (blocks over 1 GiB are never split
   for smaller requests) runs.

The grid also runs the two other combinations: seq 32,768 with the default allocator (the OOM again,
now with the allocator's message) and seq 16,384 with max_split (reserved should fall to about four).
Each cell runs in a fresh process, because the allocator reads its setting at CUDA start-up and the
hypothesis is about the very first iteration. The process does what the sweep's warm-up did: forward
and backward of the model's naive attention on the same inputs, `--iterations` times.
Results: results/attention/oom_checks/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from cs336_systems.bench import fit
from cs336_systems.bench.cli import Parser, add_resume, at_least, csv_of, positive, results_root, timeout_s
from cs336_systems.bench.oom import MIB, parse_oom_message
from cs336_systems.bench.sweep import EXIT_INCOMPLETE, exit_code
from cs336_systems.bench.timing import synchronize

from .budget import check_device, open_store

KEY = ["batch", "d", "seq", "alloc_conf"]
DEFAULT = "default"  # PYTORCH_CUDA_ALLOC_CONF unset
def _memory(cuda: bool) -> dict[str, float | None]:
    if not cuda:
        return {"allocated_mib": None, "reserved_mib": None, "peak_allocated_mib": None, "peak_reserved_mib": None}
    return {"allocated_mib": torch.cuda.memory_allocated() / MIB, "reserved_mib": torch.cuda.memory_reserved() / MIB,
            "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
            "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB}


# --8<-- [start:probe]
def probe(batch: int, seq: int, d: int, iterations: int, device: str) -> dict:
    """Forward + backward of naive attention `iterations` times in this (fresh) process, as the
    sweep's warm-up did; memory after each iteration, peaks since the process started (never reset).
    On OOM: the iteration it happened in, memory at that moment, and the allocator's message."""
    from cs336_systems.model import naive_attention

    cuda = torch.device(device).type == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)  # the sweep's inputs
    q, k, v = (torch.randn(batch, seq, d, device=device, generator=gen, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(batch, seq, d, device=device, generator=gen)
    per_iteration = []
    try:
        for _ in range(iterations):
            naive_attention(q, k, v).backward(grad_out)
            synchronize(device)
            per_iteration.append(_memory(cuda))
    except torch.cuda.OutOfMemoryError as exc:
        message = str(exc)
        return {"ran": False, "oom_iteration": len(per_iteration), "iterations": per_iteration,
                "at_oom": _memory(cuda), "oom_message": message, **parse_oom_message(message),
                "num_alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries")}
    return {"ran": True, "iterations": per_iteration, **per_iteration[-1],
            "num_alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries") if cuda else None}
# --8<-- [end:probe]


def run_child(cell: dict, iterations: int, device: str, timeout_s: float) -> tuple[str, dict]:
    """(status, metrics) of one cell, measured in a fresh Python process with its allocator setting."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if cell["alloc_conf"] != DEFAULT:
        env["PYTORCH_CUDA_ALLOC_CONF"] = cell["alloc_conf"]
    args = {"batch": cell["batch"], "seq": cell["seq"], "d": cell["d"], "iterations": iterations, "device": device}
    cmd = [sys.executable, "-m", "cs336_systems.profiling.attention_oom", "--child", json.dumps(args)]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return "error", {"error_tail": tail[-400:]}
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    metrics["child_s"] = time.monotonic() - start
    return ("ok" if metrics["ran"] else "oom"), metrics


def check_fit(p, args) -> None:
    """Refuse a seq whose hand-counted backward peak (attention.benchmarks.pytorch_sweep) exceeds
    the device, unless --allow-oom. On the H200 the default seqs fit by that count (the OOM they
    probe comes from the allocator); on a CPU they would take more than its RAM."""
    from cs336_systems.attention.benchmarks.pytorch_sweep import attention_memory

    have, where = fit.capacity_bytes(args.device)
    for seq in args.seqs:
        peak = attention_memory(args.batch, seq, args.d)["backward_peak"]
        need = fit.StepMemory(peak, {"inputs, outputs, gradients and four (batch, seq, seq) scores": peak})
        fit.refuse_unless_fits(p, args, need, have, where, f"--seqs {seq} --batch {args.batch} --d {args.d}")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="attention-oom", description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=csv_of(at_least(1)), default=[16384, 32768])
    p.add_argument("--alloc-confs", type=csv_of(), default=[DEFAULT, "max_split_size_mb:1024"],
                   help=f"PYTORCH_CUDA_ALLOC_CONF values, {DEFAULT!r} for unset (comma-separated)")
    p.add_argument("--d", type=at_least(1), default=64)
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--iterations", type=at_least(1), default=3,
                   help="forward+backward passes (the sweep's warm-up: 3)")
    p.add_argument("--device", default="cuda",
                   help="cuda (a GPU benchmark), or cpu for its CPU smoke run with --results-dir")
    p.add_argument("--results-dir", type=results_root, default=None)
    p.add_argument("--budget-s", type=positive(float), default=None,
                   help="start no new cell after this many seconds")
    p.add_argument("--child-timeout-s", type=timeout_s, default=180.0)
    add_resume(p)
    fit.add_allow_oom(p)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(probe(**json.loads(args.child))))
        return 0
    check_device(p, args)
    check_fit(p, args)
    store = open_store(p, "attention/oom_checks", KEY, args)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    cells = [{"batch": args.batch, "d": args.d, "seq": s, "alloc_conf": c} for s in args.seqs for c in args.alloc_confs]
    written = []
    for cell in cells:
        if store.has(cell):
            continue
        if deadline is not None and time.monotonic() > deadline:
            print(f"[attention-oom] time budget spent; the same command with --resume {store.invocation} "
                  "measures the rest", file=sys.stderr)
            return exit_code(written, "attention-oom") or EXIT_INCOMPLETE
        status, metrics = run_child(cell, args.iterations, args.device, args.child_timeout_s)
        written.append(store.append(cell, {**metrics, "iterations_asked": args.iterations},
                                    status=status, error=metrics.get("error_tail")))
        print(f"[attention-oom] seq {cell['seq']}, {cell['alloc_conf']}: {status}", file=sys.stderr)
    return exit_code(written, "attention-oom")


if __name__ == "__main__":
    sys.exit(main())
