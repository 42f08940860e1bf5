"""FlashAttention on the whole grid a model meets, against cuDNN, SDPA-flash and flex in one run.

    just bench flash-grid [--impls cudnn,ours,flash,flex] [--seqs 1024,...,32768] [--ds 64,128]

Cells: bf16; head dim d in {64, 128}; causal and not; sequence 1,024 to 32,768; batch x heads of
16 and 32, given as (batch, heads) = (1, 16) and (1, 32), as a model calls attention (4-D inputs,
nothing folded). Ours is `FlashAttentionFast.apply` called eagerly (no torch.compile), so the
Python launch path is part of the time, as it is for a model. Per cell, before anything is timed,
our output and gradients are checked against SDPA's cuDNN backend (a fast wrong kernel is an error
row, not a result); then each implementation's forward and forward+backward
(`o = f(q, k, v); o.backward(do)`) are timed with `triton.testing.do_bench` (median). cuDNN is
timed first in each cell so every row can carry its speed relative to cuDNN in the same run.
Rows go to results/attention/flash_grid/<device>.jsonl; every run measures every cell (readers take
each cell's newest row), and `--resume RUN` goes on with an interrupted run by (cell, impl, mode).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

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
from cs336_systems.bench.sweep import exit_code, free_memory, is_oom
from cs336_systems.bench.timing import gpu_bench

from ..flops import attention_flops, tflops

BENCH = "attention/flash_grid"
KEY = ("batch", "heads", "seq", "d", "causal", "impl", "mode")
IMPLS = ("cudnn", "ours", "flash", "flex")  # cuDNN first: the ratios refer to it
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
SHAPES = ((1, 16), (1, 32))  # (batch, heads): batch x heads of 16 and of 32


def make_attention(impl: str, causal: bool) -> Callable:
    """f(q, k, v) -> o for (batch, heads, seq, d) inputs."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "ours":
        from ..fast.function import FlashAttentionFast

        return lambda q, k, v: FlashAttentionFast.apply(q, k, v, causal)
    if impl in ("cudnn", "flash"):
        backend = SDPBackend.CUDNN_ATTENTION if impl == "cudnn" else SDPBackend.FLASH_ATTENTION

        def sdpa(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return sdpa
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention)
        masks: dict = {}

        def flex_step(q, k, v):
            n = q.shape[-2]
            if causal and n not in masks:
                masks[n] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
            return flex(q, k, v, block_mask=masks.get(n))
        return flex_step
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def check_against_cudnn(q, k, v, do, causal: bool) -> dict[str, float]:
    """Relative errors of our O, dQ, dK, dV against cuDNN's on the same inputs."""
    outs = {}
    for impl in ("ours", "cudnn"):
        qi, ki, vi = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = make_attention(impl, causal)(qi, ki, vi)
        o.backward(do)
        outs[impl] = (o.detach(), qi.grad, ki.grad, vi.grad)
    return {f"rel_err_{n}": _rel(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), outs["ours"], outs["cudnn"])}


def measure_cell(store, cell: dict, impls: list[str], args, written: list) -> None:
    """Check ours, then time every implementation's forward and forward+backward in this cell."""
    B, H, N, d, causal = cell["batch"], cell["heads"], cell["seq"], cell["d"], cell["causal"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
               for _ in range(3))
    do = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g)
    todo = [i for i in impls if not all(store.has({**cell, "impl": i, "mode": m}) for m in ("fwd", "fwd_bwd"))]
    checks: dict[str, float] = {}
    if "ours" in todo:
        checks = check_against_cudnn(q, k, v, do, causal)
        if not all(e < args.tolerance for e in checks.values()):
            for mode in ("fwd", "fwd_bwd"):
                written.append(store.append({**cell, "impl": "ours", "mode": mode}, checks, status="error",
                                            error=f"differs from cuDNN beyond {args.tolerance}: {checks}"))
            todo.remove("ours")
    cudnn_ms = {m: r["median_ms"] for m in ("fwd", "fwd_bwd")  # cuDNN runs first: its newest row is this run's
                if (r := store.newest({**cell, "impl": "cudnn", "mode": m})) and r.get("median_ms")}
    for impl in todo:
        mode = "fwd"
        try:
            if impl == "flex":
                # a fresh compile cache per cell: past torch.compile's recompile limit flex_attention
                # silently falls back to its unfused path, which would be timed as if it were flex
                torch._dynamo.reset()
            f = make_attention(impl, causal)
            steps = {"fwd": lambda: f(q, k, v), "fwd_bwd": lambda: f(q, k, v).backward(do)}
            for mode, step in steps.items():
                ms = gpu_bench(step, warmup_ms=args.warmup, rep_ms=args.rep)
                if impl == "cudnn":
                    cudnn_ms[mode] = ms
                flops = attention_flops(B * H, N, N, d, causal, mode)
                row = store.append({**cell, "impl": impl, "mode": mode},
                                   {"median_ms": ms, "tflops": tflops(flops, ms),
                                    "speed_vs_cudnn": cudnn_ms[mode] / ms if mode in cudnn_ms else None,
                                    **(checks if impl == "ours" else {})})
                written.append(row)
                print(f"[flash-grid] {B}x{H}x{N}x{d} {'causal' if causal else 'full':6s} {impl:5s} {mode:7s} "
                      f"{ms:8.3f} ms  vs cuDNN {row['speed_vs_cudnn'] or float('nan'):.2f}x", file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing implementation must not sink the cell
            status = "oom" if is_oom(exc) else "error"
            written.append(store.append({**cell, "impl": impl, "mode": mode}, status=status,
                                        error=f"{type(exc).__name__}: {exc}"))
        finally:
            q.grad = k.grad = v.grad = None
            free_memory()


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="flash-grid", description=__doc__.splitlines()[0])
    ap.add_argument("--impls", type=csv_of(choices=IMPLS), default=list(IMPLS))
    ap.add_argument("--seqs", type=csv_of(at_least(16)), default=list(SEQS))
    ap.add_argument("--ds", type=csv_of(int, choices=(64, 128)), default=[64, 128])
    ap.add_argument("--causal", type=csv_of(choices=("causal", "full")), default=["causal", "full"])
    ap.add_argument("--shapes", type=csv_of(choices=[f"{b}x{h}" for b, h in SHAPES]),
                    default=[f"{b}x{h}" for b, h in SHAPES], help="batch x heads")
    ap.add_argument("--rep", type=positive(float), default=400, help="do_bench rep (ms)")
    ap.add_argument("--warmup", type=positive(float), default=100, help="do_bench warmup (ms)")
    ap.add_argument("--tolerance", type=positive(float), default=2e-2, help="max relative error vs cuDNN")
    ap.add_argument("--budget-s", type=positive(float), default=None, help="stop starting cells after this")
    ap.add_argument("--remeasure", action="store_true",
                    help="(the default now: every run measures every cell; kept so old commands run)")
    ap.add_argument("--results-dir", type=results_root, default=None)
    add_resume(ap)
    args = ap.parse_args(argv)
    require_gpu(ap, flag=None, cpu_smoke=False)
    store = open_store(ap, BENCH, KEY, root=args.results_dir)
    impls = [i for i in IMPLS if i in args.impls]  # cuDNN first whatever the order given
    cells = [{"batch": b, "heads": h, "seq": n, "d": d, "causal": c == "causal", "dtype": "bf16"}
             for b, h in (map(int, s.split("x")) for s in args.shapes) for d in args.ds for c in args.causal
             for n in args.seqs]
    start, written = time.monotonic(), []
    for i, cell in enumerate(cells):
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            print(f"[flash-grid] budget spent: {len(cells) - i} cells left (the same command with --resume "
                  f"{store.invocation} measures them)", file=sys.stderr)
            return 3
        measure_cell(store, cell, impls, args, written)
    return exit_code(written, BENCH)


if __name__ == "__main__":
    sys.exit(main())
