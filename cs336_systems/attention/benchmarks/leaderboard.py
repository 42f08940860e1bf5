"""The leaderboard case, timed against the best attention PyTorch ships, in one process and run.

    just bench flash-leaderboard [--rep 10000] [--warmup 1000] [--impls ours,cudnn,flash,flex,naive]

q, k, v of shape (16, 16384, 64) bf16 (16 heads folded into batch), causal. Each implementation's
step is the leaderboard's: `o = f(q, k, v, True); o.sum().backward()`, timed with
`triton.testing.do_bench(step, rep=10000, warmup=1000)` (its mean, ms, and separately the median);
then the forward alone. Ours goes through `torch.compile(FlashAttentionFast.apply)` exactly as the
leaderboard calls it. Before anything is timed our output and gradients are checked against SDPA's
cuDNN backend (a fast wrong kernel is a failure, not a result). Rows go to
results/attention/flash_leaderboard/<device>.jsonl, one per (implementation, mode) and run, with
TFLOP/s, the speed relative to cuDNN measured in the same run, and the median SM clock and board
power while the mean was timed (nvidia-smi once a second: at the leaderboard's 10 s the board sits at
its power limit and the clock it settles at differs between implementations).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from cs336_systems.bench.cli import Parser, at_least, csv_of, open_store, positive, require_gpu, results_root
from cs336_systems.bench.sweep import exit_code, free_memory, is_oom
from cs336_systems.bench.timing import gpu_bench
from cs336_systems.profiling.clocks import ClockSampler

from ..flops import attention_flops, tflops

BENCH = "attention/flash_leaderboard"
IMPLS = ("cudnn", "ours", "flash", "flex", "naive")  # cuDNN first: every ratio refers to it
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_attention(impl: str, heads: int) -> Callable:
    """f(q, k, v) -> o for (batch*heads, seq, d) inputs, causal."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def as4d(t):  # (Z*H, N, d) -> (Z, H, N, d): a view, no copy
        return t.view(-1, heads, *t.shape[1:])

    if impl == "ours":
        from ..fast import FlashAttentionFast

        compiled = torch.compile(FlashAttentionFast.apply)  # the leaderboard's own call
        return lambda q, k, v: compiled(q, k, v, True)
    if impl in ("cudnn", "flash"):
        backend = SDPBackend.CUDNN_ATTENTION if impl == "cudnn" else SDPBackend.FLASH_ATTENTION

        def sdpa(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(as4d(q), as4d(k), as4d(v), is_causal=True).flatten(0, 1)
        return sdpa
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention)
        masks: dict = {}

        def flex_step(q, k, v):
            n = q.shape[1]
            if n not in masks:
                masks[n] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
            return flex(as4d(q), as4d(k), as4d(v), block_mask=masks[n]).flatten(0, 1)
        return flex_step
    if impl == "naive":
        from ..reference import naive_attention

        compiled = torch.compile(naive_attention)
        return lambda q, k, v: compiled(q, k, v, True)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def clock_summary(clocks: ClockSampler) -> dict[str, float | None]:
    """Median SM clock, its minimum and the median board power while the mean was timed (None
    without nvidia-smi)."""
    rec = clocks.record()
    return {k: rec[k] for k in ("sm_mhz_median", "sm_mhz_min", "power_w_median")}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def check_against_cudnn(q, k, v, heads: int) -> dict[str, float]:
    """Relative errors of our O, dQ, dK, dV against SDPA cuDNN, with a random upstream gradient."""
    do = torch.randn_like(q)
    results = {}
    for impl in ("ours", "cudnn"):
        qi, ki, vi = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = make_attention(impl, heads)(qi, ki, vi)
        o.backward(do)
        results[impl] = (o.detach(), qi.grad, ki.grad, vi.grad)
    return {f"rel_err_{name}": _rel(a, b) for name, a, b in zip(("o", "dq", "dk", "dv"), results["ours"], results["cudnn"])}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="flash-leaderboard", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=at_least(1), default=16,
                    help="batch*heads (the leaderboard folds 16 heads into batch)")
    ap.add_argument("--heads", type=at_least(1), default=16,
                    help="how SDPA/flex see the batch: (batch/heads, heads, seq, d)")
    ap.add_argument("--seq", type=at_least(1), default=16384)
    ap.add_argument("--d", type=at_least(1), default=64)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--rep", type=positive(float), default=10000, help="do_bench rep (ms) for the mean")
    ap.add_argument("--warmup", type=positive(float), default=1000, help="do_bench warmup (ms)")
    ap.add_argument("--median-rep", type=positive(float), default=2000, help="do_bench rep (ms) for the median")
    ap.add_argument("--impls", type=csv_of(choices=IMPLS), default=list(IMPLS),
                    help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--tolerance", type=positive(float), default=2e-2, help="max relative error vs cuDNN")
    ap.add_argument("--results-dir", type=results_root, default=None)
    args = ap.parse_args(argv)
    impls = list(args.impls)
    if args.batch % args.heads:
        ap.error(f"--heads must divide --batch, got {args.heads} and {args.batch}")
    require_gpu(ap, flag=None, cpu_smoke=False)

    store = open_store(ap, BENCH, ["impl", "mode", "run"], root=args.results_dir)
    written = []
    run = time.strftime("%Y%m%dT%H%M%S")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.seq, args.d, device="cuda", dtype=DTYPES[args.dtype], generator=g,
                           requires_grad=True) for _ in range(3))
    base = {"run": run, "batch": args.batch, "heads": args.heads, "seq": args.seq, "d": args.d,
            "dtype": args.dtype, "causal": True, "rep_ms": args.rep, "warmup_ms": args.warmup}
    checks: dict[str, float] = {}
    if "ours" in impls:
        checks = check_against_cudnn(q, k, v, args.heads)
        wrong = {k_: e for k_, e in checks.items() if not e < args.tolerance}
        print(f"[leaderboard] ours vs cuDNN: {checks}", file=sys.stderr, flush=True)
        if wrong:
            for mode in ("fwd_bwd", "fwd"):
                written.append(store.append({**base, "impl": "ours", "mode": mode}, checks, status="error",
                                            error=f"output differs from cuDNN beyond {args.tolerance}: {wrong}"))
            impls.remove("ours")
        free_memory()

    cudnn_ms: dict[str, float] = {}
    for impl in impls:
        try:
            f = make_attention(impl, args.heads)

            def fwd_bwd(f=f):
                o = f(q, k, v)
                o.sum().backward()

            def fwd(f=f):
                f(q, k, v)

            for mode, step in (("fwd_bwd", fwd_bwd), ("fwd", fwd)):
                with ClockSampler(period_s=1.0) as clocks:  # the SM clock follows the power limit
                    mean = gpu_bench(step, warmup_ms=args.warmup, rep_ms=args.rep, return_mode="mean")
                median = gpu_bench(step, warmup_ms=min(args.warmup, 200), rep_ms=args.median_rep, return_mode="median")
                if impl == "cudnn":
                    cudnn_ms[mode] = mean
                flops = attention_flops(args.batch, args.seq, args.seq, args.d, True, mode)
                metrics = {"mean_ms": mean, "median_ms": median, "tflops": tflops(flops, mean),
                           "speed_vs_cudnn": cudnn_ms[mode] / mean if mode in cudnn_ms else None,
                           **clock_summary(clocks), **(checks if impl == "ours" else {})}
                store.append({**base, "impl": impl, "mode": mode}, metrics)
                print(f"[leaderboard] {impl:6s} {mode:8s} mean {mean:.3f} ms  median {median:.3f} ms  "
                      f"{metrics['tflops']:.0f} TFLOP/s  vs cuDNN {metrics['speed_vs_cudnn'] or float('nan'):.2f}x",
                      file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing baseline must not sink the others
            status = "oom" if is_oom(exc) else "error"
            written.append(store.append({**base, "impl": impl, "mode": "fwd_bwd"}, status=status,
                                        error=f"{type(exc).__name__}: {exc}"))
            print(f"[leaderboard] {impl}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr, flush=True)
        finally:
            q.grad = k.grad = v.grad = None
            free_memory()
    return exit_code(written, BENCH)


if __name__ == "__main__":
    sys.exit(main())
