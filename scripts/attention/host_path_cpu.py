"""Time the Python around our kernel launches, on the CPU: one eager `FlashAttentionFast` call with
every launch replaced by allocating its outputs.

    python scripts/attention/host_path_cpu.py [--batch 1] [--heads 16] [--seq 1024] [--d 64] [--full]

What it times: the autograd Function's forward (input checks, the table lookup, saving state) and,
for forward+backward, autograd's backward and our backward's lookup, on CPU tensors of the shape
given. What it leaves out: everything a launch does (Triton's and Gluon's launchers, TMA
descriptors, the preprocess kernel, GPU allocations), and the CUDA-only input check (`need_cuda`),
which this patch turns off so that CPU tensors pass. So it is a lower bound on the host's share of
an eager call, on this machine's CPU, not the GPU host's; nothing here is committed or quoted on
the site. Run without TRITON_INTERPRET (under the interpreter the table is not read).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit

import torch

from cs336_systems.attention import flash_triton
from cs336_systems.attention.fast import function


def stub_launches() -> None:
    """Launches allocate their outputs and return; the CUDA-only input check is turned off."""
    check = flash_triton.check_attention_inputs
    flash_triton.check_attention_inputs = lambda *a, **kw: check(*a, **{**kw, "need_cuda": False})
    function.launch_fwd = lambda q, k, v, causal, plan: (  # O (Z, H, n_q, d), L (Z, H, n_q) fp32
        torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32))
    function.launch_bwd = lambda q, k, v, o, L, do, causal, plan: (
        torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))


def per_call_us(fn, number: int, repeat: int) -> tuple[float, float]:
    """(median, min) microseconds per call over `repeat` timings of `number` calls."""
    fn()  # first call: imports, table reads
    runs = [t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=repeat)]
    return statistics.median(runs), min(runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="host_path_cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d", type=int, default=64, choices=(16, 32, 64, 128))
    ap.add_argument("--full", action="store_true", help="non-causal (default: causal)")
    ap.add_argument("--number", type=int, default=2000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=7, help="timings; the median and the minimum are printed")
    args = ap.parse_args(argv)
    for flag in ("batch", "heads", "seq", "number", "repeat"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("TRITON_INTERPRET=1 is set: under the interpreter the tuned table is not read; unset it")
    stub_launches()
    shape = (args.batch, args.heads, args.seq, args.d)
    q, k, v = (torch.zeros(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.zeros(shape, dtype=torch.bfloat16)
    causal = not args.full

    def fwd():
        return function.FlashAttentionFast.apply(q, k, v, causal)

    def fwd_bwd():
        # No gradient accumulation: adding into .grad would be CPU arithmetic here, a kernel on a GPU.
        q.grad = k.grad = v.grad = None
        fwd().backward(do)

    print(f"host_path_cpu: {'x'.join(map(str, shape))} {'non-causal' if args.full else 'causal'}, bf16, "
          f"launches stubbed, CPU: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}")
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        med, low = per_call_us(fn, args.number, args.repeat)
        print(f"  {name:17s} {med:8.1f} us per call (median of {args.repeat}; min {low:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
