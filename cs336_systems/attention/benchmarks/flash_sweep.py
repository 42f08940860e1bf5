"""The flash_benchmarking grid: our FlashAttention-2 against PyTorch, by sequence length and head dim.

    just bench flash-sweep [--impls triton,sdpa,naive,pytorch] [--max-minutes 4]
    just bench flash-sweep --impls triton               # re-time our kernels after a change

Batch 1, causal, seq 2^7..2^16, d 16..128, bf16 and fp32; forward, backward and forward+backward,
each timed with triton.testing.do_bench (median). Implementations: our Triton FA2; our PyTorch FA2
(tiled forward, torch.compile'd backward); plain PyTorch attention; SDPA's cuDNN backend (bf16 only:
neither cuDNN nor the flash backend runs fp32). Our PyTorch FA2 stops at seq 4096: its forward is a
Python loop over N/64 key tiles and its backward materialises the N x N matrices, so larger cells
would take minutes each and say nothing new (they are recorded as skipped). An OOM is a result.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import multiprocessing as mp
import os
import sys
import time

import torch

from cs336_systems.bench.cli import (
    Parser,
    add_resume,
    at_least,
    csv_of,
    open_store,
    positive,
    require_gpu,
    results_root,
)
from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import exit_code, run_sweep
from cs336_systems.bench.timing import gpu_bench

from ..flops import MODES, attention_flops, tflops

BENCH = "attention/flash_sweep"
KEY = ["impl", "dtype", "d", "seq", "mode"]
SEQS = tuple(2**p for p in range(7, 17))
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
IMPLS = ("triton", "sdpa", "naive", "pytorch")
PYTORCH_FA2_MAX_SEQ = 4096
DEVICE = "cuda"  # tests run the whole flow on the CPU (interpreter) by setting "cpu"


def skip_reason(impl: str, dtype: str, seq: int) -> str | None:
    """Why a cell is not measured (recorded as 'unsupported' with this reason), or None."""
    if impl == "sdpa" and dtype == "fp32":
        return "SDPA's cuDNN and flash backends have no fp32 kernels"
    if impl == "pytorch" and seq > PYTORCH_FA2_MAX_SEQ:
        return f"skipped: PyTorch FA2 beyond seq {PYTORCH_FA2_MAX_SEQ} (Python tile loop, N x N backward)"
    return None


def attention_fn(impl: str):
    """f(q, k, v) -> o, causal, for (1, seq, d) inputs."""
    if impl == "triton":  # the tuned plans: the Function the leaderboard times
        from ..fast import FlashAttentionFast

        return lambda q, k, v: FlashAttentionFast.apply(q, k, v, True)
    if impl == "pytorch":
        from ..flash_pytorch import FlashAttentionPyTorchCompiled

        return lambda q, k, v: FlashAttentionPyTorchCompiled.apply(q, k, v, True)
    if impl == "naive":
        from ..reference import naive_attention

        return lambda q, k, v: naive_attention(q, k, v, True)
    if impl == "sdpa":
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
        return sdpa
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def measure(cell: dict) -> dict:
    dtype, n, d = DTYPES[cell["dtype"]], cell["seq"], cell["d"]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, do = (torch.randn(1, n, d, device=DEVICE, dtype=dtype, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    f = attention_fn(cell["impl"])
    if cell["mode"] == "fwd":
        step = lambda: f(q, k, v)  # noqa: E731
    elif cell["mode"] == "bwd":
        o = f(q, k, v)
        step = lambda: o.backward(do, retain_graph=True)  # noqa: E731
    else:
        step = lambda: f(q, k, v).backward(do)  # noqa: E731
    ms = gpu_bench(step, warmup_ms=5, rep_ms=25, return_mode="median")
    return {"ms": ms, "tflops": tflops(attention_flops(1, n, n, d, True, cell["mode"]), ms),
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None}


def _warm_triton(job: tuple) -> str | None:
    """Compile (into Triton's disk cache) the kernels one grid point uses: forward and backward."""
    dt, d, n = job
    try:
        from ..fast import FlashAttentionFast

        q, k, v = (torch.randn(1, n, d, device="cuda", dtype=DTYPES[dt], requires_grad=True) for _ in range(3))
        FlashAttentionFast.apply(q, k, v, True).sum().backward()
        torch.cuda.synchronize()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def precompile_triton(dtypes, dims, seqs, workers: int) -> None:
    from ..fast.table import size_class

    jobs = {(dt, d, size_class(1, n, n)): (dt, d, n) for dt, d, n in itertools.product(dtypes, dims, seqs)}
    start = time.perf_counter()
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        errors = [e for e in pool.map(_warm_triton, jobs.values()) if e]
    print(f"[flash-sweep] precompiled {len(jobs)} kernel sets in {time.perf_counter() - start:.0f} s"
          + (f"; errors: {errors[:3]}" if errors else ""), file=sys.stderr, flush=True)


def cells(impls, dtypes, dims, seqs, modes) -> list[dict]:
    return [{"impl": i, "dtype": dt, "d": d, "seq": n, "mode": m, "batch": 1, "causal": True}
            for i, dt, d, n, m in itertools.product(impls, dtypes, dims, seqs, modes)]


def run(args, store: ResultStore | None = None) -> int:
    """The sweep into `store` (default: a new invocation's store of BENCH)."""
    store = store or ResultStore(BENCH, key=KEY, root=args.results_dir)
    grid = cells(args.impls, args.dtypes, args.dims, args.seqs, args.modes)
    # Pointless or impossible cells are recorded without touching the GPU, once: a later run leaves
    # a cell alone whose newest row already says why (nothing was measured, nothing changes).
    newest = {tuple(r.get(k) for k in KEY): r.get("status") for r in store.rows()}
    for cell in grid:
        reason = skip_reason(cell["impl"], cell["dtype"], cell["seq"])
        if reason and newest.get(tuple(cell[k] for k in KEY)) != "unsupported":
            store.append(cell, status="unsupported", error=reason)
    if "triton" in args.impls and args.workers > 1:
        precompile_triton(args.dtypes, args.dims, args.seqs, args.workers)
    deadline = time.monotonic() + args.max_minutes * 60
    written: list[dict] = []
    for impl in args.impls:  # in priority order: what is left at the deadline resumes next run
        for dt, d in itertools.product(args.dtypes, args.dims):
            if time.monotonic() > deadline:
                print(f"[flash-sweep] --max-minutes reached; the same command with --resume {store.invocation} "
                      "measures the rest", file=sys.stderr)
                return exit_code(written, BENCH)
            written += run_sweep(store, [c for c in grid if (c["impl"], c["dtype"], c["d"]) == (impl, dt, d)
                                         and not skip_reason(c["impl"], c["dtype"], c["seq"])],
                                 measure, desc=f"{impl} {dt} d={d}")
    return exit_code(written, BENCH)


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="flash-sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--impls", type=csv_of(choices=IMPLS), default=list(IMPLS),
                    help=f"comma-separated, in order, from {','.join(IMPLS)}")
    ap.add_argument("--dtypes", type=csv_of(choices=tuple(DTYPES)), default=["bf16", "fp32"])
    ap.add_argument("--dims", type=csv_of(head_dim), default=list(HEAD_DIMS))
    ap.add_argument("--seqs", type=csv_of(at_least(1)), default=list(SEQS))
    ap.add_argument("--modes", type=csv_of(choices=MODES), default=list(MODES))
    ap.add_argument("--max-minutes", type=positive(float), default=60.0, help="start no new group after this long")
    ap.add_argument("--workers", type=at_least(1), default=max(1, min(12, (os.cpu_count() or 2) - 2)),
                    help="processes compiling the Triton kernels ahead of timing")
    ap.add_argument("--remeasure", action="store_true",
                    help="(the default now: every run times every selected cell; kept so old commands run)")
    ap.add_argument("--results-dir", type=results_root, default=None)
    add_resume(ap)
    args = ap.parse_args(argv)
    require_gpu(ap, flag=None, cpu_smoke=False)
    store = open_store(ap, BENCH, KEY, root=args.results_dir)  # a foreign file or uncommitted code: exit 2 now
    return run(args, store)


def head_dim(text: str) -> int:
    """argparse type: a head dimension the kernels take, 16..128."""
    d = int(text) if text.strip().lstrip("-").isdigit() else None
    if d is None or not 16 <= d <= 128:
        raise argparse.ArgumentTypeError(f"expected a head dim in 16..128, got {text!r}")
    return d


if __name__ == "__main__":
    sys.exit(main())
