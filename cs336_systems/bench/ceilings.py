"""The machine's two ceilings, measured: dense matmul rate and memory copy bandwidth.

Every "% of peak" on the site is against these, measured on the same kind of GPU by this module,
not against a datasheet (datasheet rates are leads: an H200's bf16 dense figure is 989 TFLOP/s,
its HBM3e 4.8 TB/s, and a real kernel on real data reaches less than either).

    just bench ceilings                  # on a GPU node: results/ceilings/<device>.jsonl
    just bench ceilings --size small     # a quick run (CPU works too, for the code path)

Matmul: C = A @ B with square n x n operands of random normal data (zeros run faster than real
data, so never time on zeros), 2 n^3 FLOPs per call, median of `triton.testing.do_bench` on a
GPU. Copy: dst.copy_(src) of a buffer several times the L2, counting bytes read plus bytes written
(2 x size), again the median. fp32 matmuls are timed twice: in IEEE fp32 (PyTorch's default) and
with TF32 allowed, so the page can state what each precision costs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from .cli import Parser, add_resume, open_store, require_gpu, results_root
from .sweep import run_sweep
from .timing import gpu_bench, time_steps

BENCH = "ceilings"
KEY = ("op", "dtype", "n")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
# size presets: matmul n, copy bytes (GPU: 8192^3 fills the H200; 4 GiB is ~80x its 50 MB L2)
SIZES = {"full": (8192, 4 << 30), "small": (256, 1 << 20)}


def _time_ms(fn, device: torch.device) -> float:
    if device.type == "cuda":
        return gpu_bench(fn, warmup_ms=100, rep_ms=1000)
    return time_steps(fn, warmup=1, steps=3, device=device).median * 1e3


def measure_matmul(n: int, dtype: str, device: torch.device) -> dict[str, Any]:
    """TFLOP/s of an n x n x n product in `dtype` ('tf32' = fp32 operands, TF32 allowed)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=DTYPES[dtype], generator=gen)
    b = torch.randn(n, n, device=device, dtype=DTYPES[dtype], generator=gen)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        ms = _time_ms(lambda: a @ b, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return {"ms": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12}


def measure_copy(nbytes: int, device: torch.device) -> dict[str, Any]:
    """TB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), device)
    return {"ms": ms, "bytes_moved": 2 * nbytes, "tb_per_s": 2 * nbytes / (ms * 1e-3) / 1e12}


def cells(size: str) -> list[dict[str, Any]]:
    n, nbytes = SIZES[size]
    return ([{"op": "matmul", "dtype": d, "n": n} for d in ("bf16", "fp16", "tf32", "fp32")]
            + [{"op": "copy", "dtype": "fp32", "n": nbytes}])


def measure(cell: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    if cell["op"] == "matmul":
        return measure_matmul(cell["n"], cell["dtype"], device)
    return measure_copy(cell["n"], device)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="bench ceilings", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full",
                        help="full: 8192^3 matmuls and a 4 GiB copy (GPU); small: a quick check")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (a GPU benchmark), or cpu with --size small --results-dir: its CPU smoke run")
    parser.add_argument("--results-dir", type=results_root, default=None,
                        help="results root (default: the repo's results/)")
    add_resume(parser)
    args = parser.parse_args(argv)
    require_gpu(parser, args.device, args.results_dir)
    if args.device == "cpu" and args.size == "full":
        parser.error("--size full is the GPU measurement; on a CPU use --size small")
    device = torch.device(args.device)
    store = open_store(parser, BENCH, KEY, root=args.results_dir)
    rows = run_sweep(store, cells(args.size), lambda c: measure(c, device), desc="ceilings")
    for row in rows:
        rate = row.get("tflops") or row.get("tb_per_s")
        unit = "TFLOP/s" if "tflops" in row else "TB/s"
        print(f"{row['op']:6} {row['dtype']:5} n={row['n']}: {row['status']}"
              + (f", {rate:.3g} {unit}" if rate else ""), file=sys.stderr)
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
