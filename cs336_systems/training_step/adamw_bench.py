"""One AdamW step over a model's parameters: our fused Triton kernel vs torch's fused and foreach AdamW.

    just bench fused-adamw                        # 8B, bf16, one rank's half (--shard 2)
    just bench fused-adamw --shard 1 --dtype fp32 # the whole model in fp32 (130 GB of p, g, m, v: OOM)

The parameter tensors are built from the preset's shapes (`parameter_shapes`: the same list the
TransformerLM registers, no model built), each first dimension divided by --shard and rounded up:
one rank's share when the optimizer state is sharded over that many ranks. Gradients are random and
preset; `triton.testing.do_bench` times `opt.step()` (median, CUDA events, L2 flushed between
calls). The effective bandwidth counts what a step must move: per element, p, g, m, v read and p,
m, v written, 7 elements of --dtype (14 bytes in bf16), divided by the step's time. The host time
is how long `opt.step()` takes to return (GPU not synchronised): when it is under the GPU time the
launches are not what limits the step.
"""

from __future__ import annotations

import statistics
import sys
import timeit
from collections.abc import Mapping
from typing import Any

import torch

from cs336_systems.bench.cli import Parser, at_least, check_cuda, csv_of, open_store
from cs336_systems.bench.sweep import exit_code, run_sweep
from cs336_systems.bench.timing import gpu_bench, synchronize
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA, ModelConfig, get_config

from .fused_adamw import FusedAdamW

BENCH = "training_step/fused_adamw"
KEY = ("impl", "size", "dtype", "shard")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
IMPLS = ("ours", "torch-fused", "torch-foreach")
# p, g, m, v read; p, m, v written: elements moved per parameter element and step
ELEMENTS_MOVED = 7
HOST_CALLS = 10


def parameter_shapes(cfg: ModelConfig) -> list[tuple[int, ...]]:
    """The TransformerLM's parameter shapes in registration order: embedding (V, d); per layer
    ln1 (d,), q/k/v/output projections (d, d), ln2 (d,), SwiGLU w1 (f, d), w2 (d, f), w3 (f, d);
    the final norm (d,) and the LM head (V, d)."""
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    layer = [(d,), (d, d), (d, d), (d, d), (d, d), (d,), (f, d), (d, f), (f, d)]
    return [(V, d), *layer * cfg.num_layers, (d,), (V, d)]


def sharded(shape: tuple[int, ...], shard: int) -> tuple[int, ...]:
    """One rank's share of a tensor: its first dimension divided by `shard`, rounded up."""
    return (-(-shape[0] // shard), *shape[1:])


def make_params(size: str, dtype: torch.dtype, shard: int, device: torch.device) -> list[torch.Tensor]:
    """Parameters of one rank's share, random, each with a random gradient preset."""
    gen = torch.Generator(device=device).manual_seed(0)
    params = []
    for shape in parameter_shapes(get_config(size)):
        p = torch.randn(sharded(shape, shard), device=device, dtype=dtype, generator=gen)
        p.grad = torch.randn(p.shape, device=device, dtype=dtype, generator=gen)
        params.append(p)
    return params


def make_optimizer(impl: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    if impl == "ours":
        return FusedAdamW(params)
    return torch.optim.AdamW(params, fused=impl == "torch-fused", foreach=impl == "torch-foreach")


def measure(cell: Mapping[str, Any], params: list[torch.Tensor], device: torch.device) -> dict[str, Any]:
    opt = make_optimizer(cell["impl"], params)
    opt.step()  # creates the state (and compiles our kernel): not part of a step's time
    synchronize(device)
    host = []
    for _ in range(HOST_CALLS):
        start = timeit.default_timer()
        opt.step()
        host.append(timeit.default_timer() - start)
        synchronize(device)
    ms = gpu_bench(opt.step, warmup_ms=100, rep_ms=1000)
    numel = sum(p.numel() for p in params)
    moved = ELEMENTS_MOVED * numel * params[0].element_size()
    return {"ms": ms, "gb_per_s": moved / (ms * 1e-3) / 1e9, "bytes_moved": moved, "numel": numel,
            "tensors": len(params), "host_ms": statistics.median(host) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="bench fused-adamw", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=[*PRESETS, *PRESETS_EXTRA], default="8B",
                        help="model preset whose parameter shapes are timed")
    parser.add_argument("--shard", type=at_least(1), default=2,
                        help="divide each tensor's first dimension by N (rounded up): one rank's share")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                        help="parameters, gradients and optimizer state")
    parser.add_argument("--impls", type=csv_of(str, choices=IMPLS), default=list(IMPLS),
                        help=f"comma-separated, from {', '.join(IMPLS)}")
    parser.add_argument("--device", default="cuda", help="a CUDA device (the kernels are timed on a GPU)")
    parser.add_argument("--results-dir", default=None, help="results root (default: the repo's results/)")
    args = parser.parse_args(argv)
    check_cuda(parser, args.device)
    if torch.device(args.device).type != "cuda":
        parser.error(f"--device {args.device}: the step is timed on a CUDA GPU (on a CPU the kernel "
                     "runs only under the Triton interpreter, which times nothing useful)")
    device = torch.device(args.device)
    if device.index is not None:
        torch.cuda.set_device(device)
    store = open_store(parser, BENCH, KEY, root=args.results_dir)
    cells = [{"impl": i, "size": args.size, "dtype": args.dtype, "shard": args.shard} for i in args.impls]
    params: list[torch.Tensor] = []

    def measure_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
        if not params:  # built once, at the first cell that needs measuring, shared by the others
            params.extend(make_params(args.size, DTYPES[args.dtype], args.shard, device))
        return measure(cell, params, device)

    rows = run_sweep(store, cells, measure_cell, desc="fused-adamw")
    for row in rows:
        print(f"{row['impl']:14} {row['size']} {row['dtype']} shard {row['shard']}: {row['status']}"
              + (f", {row['ms']:.3f} ms, {row['gb_per_s']:.0f} GB/s, host {row['host_ms']:.2f} ms"
                 if row["status"] == "ok" else ""), file=sys.stderr)
    return exit_code(rows, BENCH)


if __name__ == "__main__":
    raise SystemExit(main())
