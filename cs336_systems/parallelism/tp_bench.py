"""The tensor-parallel SwiGLU timed against the unsharded one, with its parts timed alone, so the
TP formula's compute/communication split (costs.py) can be held against a measurement.

    python -m cs336_systems.bench tp-ffn --backend nccl              # 2 GPUs, the 8B model's FFN
    python -m cs336_systems.bench tp-ffn --d-model 16 --d-ff 32 --tokens 8     # CPU, gloo

Per (tokens, mode) four rows, results/parallelism/tp_ffn/<device>.jsonl:
    unsharded    the whole FFN on rank 0 alone (the others wait)
    tp           TensorParallelSwiGLU on every rank: compute + one all-reduce per pass
    tp_compute   the same per-rank matmuls with no collective (the formula's compute term)
    all_reduce   the (tokens, d_model) all-reduces alone, one per pass (its communication term)
mode forward runs under no_grad; forward-backward also computes dx and the weight gradients.
Each timed iteration starts after a barrier and ends after a device synchronize; an iteration
lasts as long as its slowest rank; rows carry the median, mean, std and min over iterations.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.bench import fit
from cs336_systems.bench.cli import (
    Parser,
    add_resume,
    at_least,
    check_cuda,
    csv_of,
    open_store,
    results_root,
    timeout_s,
)
from cs336_systems.bench.sweep import exit_code
from cs336_systems.bench.timing import synchronize
from cs336_systems.distributed.launch import RankFailed, Worker, spawn
from cs336_systems.model.config import get_config
from cs336_systems.model.layers import SwiGLU

from .tp_ffn import TensorParallelSwiGLU, shard_swiglu, swiglu_partial

BENCH = "parallelism/tp_ffn"
KEY = ["variant", "mode", "tokens", "d_model", "d_ff", "dtype", "world_size", "backend"]
VARIANTS = ("unsharded", "tp", "tp_compute", "all_reduce")
MODES = ("forward", "forward-backward")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _time(worker: Worker, fn, warmup: int, iters: int) -> dict[str, float]:
    """Milliseconds of fn per iteration, the slowest rank's, over `iters` iterations."""
    for _ in range(warmup):
        fn()
    synchronize(worker.device)
    times = []
    for _ in range(iters):
        dist.barrier()  # start together: an iteration's time is its slowest rank's
        start = time.perf_counter()
        fn()
        synchronize(worker.device)
        times.append(time.perf_counter() - start)
    per_rank: list[Any] = [None] * worker.world_size
    dist.all_gather_object(per_rank, times)
    slowest = [1e3 * max(r[i] for r in per_rank) for i in range(iters)]
    return {"median_ms": statistics.median(slowest), "mean_ms": statistics.fmean(slowest),
            "std_ms": statistics.stdev(slowest) if iters > 1 else 0.0, "min_ms": min(slowest),
            "iters": iters, "warmup": warmup}


def _step(forward, params, x: torch.Tensor, dy: torch.Tensor, mode: str):
    """One timed call: forward (no graph), or forward + backward (dx and weight gradients)."""
    def run():
        if mode == "forward":
            with torch.no_grad():
                forward(x)
            return
        for p in params:
            p.grad = None
        x.grad = None
        forward(x).backward(dy)
    return run


def _measure_tokens(worker: Worker, tokens: int, args: dict) -> list[tuple[dict, dict]]:
    """Every variant and mode at one token count; returns (cell, metrics) pairs (rank 0's)."""
    d, f, N, dtype = args["d_model"], args["d_ff"], worker.world_size, DTYPES[args["dtype"]]
    torch.manual_seed(0)  # the same full FFN and input on every rank
    ffn = SwiGLU(d, f, device=worker.device, dtype=dtype)
    x = torch.randn(tokens, d, device=worker.device, dtype=dtype, requires_grad=True)
    dy = torch.randn(tokens, d, device=worker.device, dtype=dtype)
    tp = TensorParallelSwiGLU(ffn)
    shards = {k: v.requires_grad_() for k, v in shard_swiglu(ffn, worker.rank, N).items()}
    f_r = shards["w1"].shape[0]
    buffer = torch.empty(tokens, d, device=worker.device, dtype=dtype)

    with torch.no_grad():  # TP against the unsharded output, in the benchmark's dtype
        y_tp, y_full = tp(x), ffn(x)
        rel_err = float((y_tp - y_full).abs().max() / y_full.abs().max())
    forwards = {"unsharded": (ffn, list(ffn.parameters())),
                "tp": (tp, list(tp.parameters())),
                "tp_compute": (lambda x: swiglu_partial(x, shards["w1"], shards["w3"], shards["w2"]),
                               list(shards.values()))}
    out = []
    for mode in args["modes"]:
        passes = 1 if mode == "forward" else 2
        flops = (6 if mode == "forward" else 18) * tokens * d  # x f_r (per rank) or x d_ff (whole)

        def all_reduces(passes=passes):
            for _ in range(passes):
                dist.all_reduce(buffer)

        for variant in args["variants"]:
            if variant == "all_reduce":
                run = all_reduces
            elif variant == "unsharded" and worker.rank != 0:
                run = lambda: None  # noqa: E731 - the other ranks only join the barriers
            else:
                run = _step(*forwards[variant], x, dy, mode)
            metrics = _time(worker, run, args["warmup"], args["iters"])
            if variant != "all_reduce":
                metrics["flops_per_rank"] = flops * (f if variant == "unsharded" else f_r)
                metrics["tflops_per_rank"] = metrics["flops_per_rank"] / metrics["median_ms"] / 1e9
            if variant in ("tp", "all_reduce"):
                metrics["all_reduce_bytes"] = buffer.numel() * buffer.element_size()
                metrics["all_reduces"] = passes
            if variant == "tp":
                metrics["max_rel_err_vs_unsharded"] = rel_err
            out.append(({"variant": variant, "mode": mode, "tokens": tokens}, metrics))
    return out


def _measure_all(worker: Worker, tokens_list: list[int], args: dict) -> list[tuple[dict, dict]]:
    rows = []
    for tokens in tokens_list:
        rows += _measure_tokens(worker, tokens, args)
        if worker.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def check_fit(p: Parser, args, device: str) -> None:
    """Refuse a token count whose SwiGLU cannot fit on a rank, unless --allow-oom: at least the
    three (d_model, d_ff) weights, the input and the two (tokens, d_ff) projections at once."""
    elem = DTYPES[args.dtype].itemsize
    have, where = fit.capacity_bytes(device, args.world_size)
    d, f = args.d_model, args.d_ff
    for tokens in args.tokens:
        weights, acts = 3 * d * f * elem, tokens * (d + 2 * f) * elem
        need = fit.StepMemory(weights + acts, {"weights": weights, "input and projections": acts})
        fit.refuse_unless_fits(p, args, need, have, where, f"--tokens {tokens} --d-model {d} --d-ff {f}")


def build_parser() -> Parser:
    eight_b = get_config("8B")
    p = Parser(prog="tp-ffn", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=csv_of(at_least(1)), default=[4096, 16384, 65536],
                   help="token counts (batch x context); the 8B leaderboard step is 65,536")
    p.add_argument("--d-model", type=at_least(1), default=eight_b.d_model)
    p.add_argument("--d-ff", type=at_least(1), default=eight_b.d_ff)
    p.add_argument("--world-size", type=at_least(2), default=2)
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                   help="default: nccl with CUDA GPUs, else gloo on CPU")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on GPUs, fp32 on CPU")
    p.add_argument("--modes", type=csv_of(str, choices=MODES), default=list(MODES))
    p.add_argument("--variants", type=csv_of(str, choices=VARIANTS), default=list(VARIANTS))
    p.add_argument("--warmup", type=at_least(0), default=5)
    p.add_argument("--iters", type=at_least(1), default=20)
    p.add_argument("--timeout-s", type=timeout_s, default=600.0)
    p.add_argument("--results-dir", type=results_root, default=None, help="results root (default: results/)")
    add_resume(p)
    fit.add_allow_oom(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.backend is None:
        args.backend = "nccl" if torch.cuda.device_count() >= args.world_size else "gloo"
    device = "cuda" if args.backend == "nccl" else "cpu"
    check_cuda(p, device, gpus=args.world_size, flag="--backend nccl")
    if args.dtype is None:
        args.dtype = "bf16" if device == "cuda" else "fp32"
    if args.d_ff < args.world_size:
        p.error(f"--d-ff {args.d_ff} is smaller than --world-size {args.world_size}: a rank would hold no slice")
    check_fit(p, args, device)
    store = open_store(p, BENCH, KEY, device="cpu" if device == "cpu" else None, root=args.results_dir)
    common = {"d_model": args.d_model, "d_ff": args.d_ff, "dtype": args.dtype,
              "world_size": args.world_size, "backend": args.backend}
    cells = [{**common, "variant": v, "mode": m, "tokens": t}
             for t in args.tokens for m in args.modes for v in args.variants]
    todo = sorted({c["tokens"] for c in cells if not store.has(c)})
    if not todo:
        print(f"[{BENCH}] run {store.invocation} already measured every cell in {store.path}", file=sys.stderr)
        return 0
    settings = {**common, "modes": args.modes, "variants": args.variants, "warmup": args.warmup,
                "iters": args.iters}
    try:
        measured = spawn(_measure_all, args.world_size, todo, settings, backend=args.backend,
                         device=device, timeout_s=args.timeout_s)[0]
    except RankFailed as exc:
        print(f"[{BENCH}] failed: {exc}", file=sys.stderr)
        return 1
    rows = [store.append({**common, **cell}, metrics) for cell, metrics in measured
            if not store.has({**common, **cell})]
    return exit_code(rows, BENCH)


if __name__ == "__main__":
    sys.exit(main())
