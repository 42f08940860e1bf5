"""The fused LM head + cross-entropy against stock PyTorch: forward+backward time and peak memory.

    just bench fused-ce                                  # the 8B step's shape (below), bf16
    just bench fused-ce --positions 8192 --impls fused   # a smaller run, ours alone

One loss, three ways: the mean cross-entropy of the logits h @ W.T (h (N, d), W (V, d), both
requiring grad) against N targets. Defaults: the 8B model's LM head on a batch of 2 x 32,768
positions (N 65,536, V 151,936, d 4,096, bf16), whose full logits would be 20 GB.

    fused          ours: fused_linear_cross_entropy, chunks of --chunk-size positions, gradients
                   computed in the forward (cs336_systems/training_step/fused_ce.py)
    torch          F.cross_entropy(h @ W.T, t): the full (N, V) logits, where they fit (else an
                   "oom" row, which is a result)
    torch-chunked  stock PyTorch: chunks of --chunk-size positions, each chunk's logits and
                   F.cross_entropy (in fp32, reduction sum) under torch.utils.checkpoint, so the
                   backward recomputes them; the sum divided by the number of positions

Per implementation: the median of triton.testing.do_bench (CUDA events, L2 flushed) over calls of
forward + backward (gradients set to None before each), the TFLOP/s of the 6 N V d FLOPs the
three GEMMs of a forward+backward need (the recomputing version does 8, counted as 6), the peak of
torch.cuda.max_memory_allocated over one more call above what the inputs hold, and the loss (the
three agree to bf16 rounding). Random normal data (never zeros: they run faster), seeded. Rows:
results/training_step/fused_ce/<device>.jsonl; progress and a summary on stderr.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cs336_systems.bench.cli import Parser, at_least, check_cuda, csv_of, open_store, positive
from cs336_systems.bench.sweep import exit_code, run_sweep
from cs336_systems.bench.timing import gpu_bench

from .fused_ce import fused_linear_cross_entropy

BENCH = "training_step/fused_ce"
KEY = ("impl", "positions", "vocab", "d_model", "dtype", "chunk_size")
IMPLS = ("fused", "torch", "torch-chunked")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GIB = 2**30


def torch_full(h: Tensor, w: Tensor, t: Tensor, chunk_size: int) -> Tensor:
    """Plain PyTorch: the (N, V) logits in h's dtype, then F.cross_entropy."""
    return F.cross_entropy(h @ w.T, t)


def _chunk_loss_sum(h_c: Tensor, w: Tensor, t_c: Tensor) -> Tensor:
    return F.cross_entropy((h_c @ w.T).float(), t_c, reduction="sum")  # (chunk, V) fp32 logits


def torch_chunked(h: Tensor, w: Tensor, t: Tensor, chunk_size: int) -> Tensor:
    """Stock PyTorch, chunked: each chunk's logits live only inside its checkpoint (the forward
    keeps h_c, W, t_c; the backward recomputes the chunk's logits and loss)."""
    from torch.utils.checkpoint import checkpoint

    total = sum(checkpoint(_chunk_loss_sum, h[s:s + chunk_size], w, t[s:s + chunk_size], use_reentrant=False)
                for s in range(0, h.shape[0], chunk_size))
    return total / t.numel()


def fused(h: Tensor, w: Tensor, t: Tensor, chunk_size: int) -> Tensor:
    return fused_linear_cross_entropy(h, w, t, chunk_size=chunk_size)


LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor, int], Tensor]] = {
    "fused": fused, "torch": torch_full, "torch-chunked": torch_chunked}


def make_inputs(cell: Mapping[str, Any], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """h (N, d) ~ N(0, 1) (the final norm's output), W (V, d) ~ N(0, 1/d) (logits ~ N(0, 1)),
    targets uniform in [0, V); h and W require grad."""
    dtype = DTYPES[cell["dtype"]]
    gen = torch.Generator(device=device).manual_seed(0)
    N, V, d = cell["positions"], cell["vocab"], cell["d_model"]
    h = torch.randn(N, d, device=device, dtype=dtype, generator=gen).requires_grad_()
    w = (torch.randn(V, d, device=device, dtype=dtype, generator=gen) / math.sqrt(d)).requires_grad_()
    t = torch.randint(0, V, (N,), device=device, generator=gen)
    return h, w, t


def measure(cell: Mapping[str, Any], device: torch.device, warmup_ms: float, rep_ms: float) -> dict[str, Any]:
    h, w, t = make_inputs(cell, device)
    loss_fn = LOSSES[cell["impl"]]

    def step() -> Tensor:
        h.grad = w.grad = None  # each call allocates its gradients, as a training step does
        loss = loss_fn(h, w, t, cell["chunk_size"])
        loss.backward()
        return loss.detach()

    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)  # the inputs
    torch.cuda.reset_peak_memory_stats(device)
    loss = step()  # the first call: compiles the kernel, warms cuBLAS, and gives the peak
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    ms = gpu_bench(step, warmup_ms=warmup_ms, rep_ms=rep_ms)
    N, V, d = cell["positions"], cell["vocab"], cell["d_model"]
    return {"ms": ms, "tflops": 6 * N * V * d / (ms * 1e-3) / 1e12, "peak_gib": peak / GIB,
            "inputs_gib": base / GIB, "full_logits_gib": N * V * h.element_size() / GIB, "loss": loss.item()}


def build_parser() -> Parser:
    p = Parser(prog="bench fused-ce", description=__doc__.splitlines()[0])
    p.add_argument("--positions", type=at_least(1), default=65536, help="N = batch x context (default 2 x 32768)")
    p.add_argument("--vocab", type=at_least(1), default=151936, help="V (default 151936)")
    p.add_argument("--d-model", type=at_least(1), default=4096, help="d (default 4096)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--chunk-size", type=at_least(1), default=4096,
                   help="positions per chunk, for ours and for the chunked PyTorch (default 4096)")
    p.add_argument("--impls", type=csv_of(str, choices=IMPLS), default=list(IMPLS),
                   help=f"comma-separated, from {', '.join(IMPLS)} (default all)")
    p.add_argument("--warmup-ms", type=positive(float), default=100.0, help="do_bench warm-up (ms)")
    p.add_argument("--rep-ms", type=positive(float), default=1000.0, help="do_bench measuring time (ms)")
    p.add_argument("--device", default="cuda", help="a CUDA device (this benchmark times on a GPU)")
    p.add_argument("--results-dir", default=None, help="results root (default: the repo's results/)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_cuda(parser, args.device)  # a bad name, or a CUDA device this machine lacks
    if torch.device(args.device).type != "cuda":
        parser.error(f"--device {args.device}: this benchmark times on a CUDA GPU")
    device = torch.device(args.device)
    if device.index is None:  # "cuda": the current device, named, so memory stats and slugs agree
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    store = open_store(parser, BENCH, KEY, device=None, root=args.results_dir)
    cells = [{"impl": impl, "positions": args.positions, "vocab": args.vocab, "d_model": args.d_model,
              "dtype": args.dtype, "chunk_size": args.chunk_size} for impl in args.impls]
    rows = run_sweep(store, cells, lambda c: measure(c, device, args.warmup_ms, args.rep_ms), desc="fused-ce")
    for r in rows:
        detail = (f", {r['ms']:.1f} ms, {r['tflops']:.0f} TFLOP/s, peak {r['peak_gib']:.2f} GiB above the inputs, "
                  f"loss {r['loss']:.5f}") if r["status"] == "ok" else ""
        print(f"{r['impl']:14} N={r['positions']} V={r['vocab']} d={r['d_model']} {r['dtype']}: {r['status']}{detail}",
              file=sys.stderr)
    return exit_code(rows, BENCH)


if __name__ == "__main__":
    raise SystemExit(main())
