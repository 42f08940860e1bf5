"""Time the Python around our kernel launches, on the CPU: one eager `FlashAttentionFast` call with
every launch replaced by allocating its outputs (`--stub launches`), or with only the kernels'
compiled launchers stubbed (`--stub kernels`).

    python scripts/attention/host_path_cpu.py [--batch 1] [--heads 16] [--seq 1024] [--d 64] [--full]
                                              [--stub launches|kernels]

What it times: the autograd Function's forward (input checks, the table lookup, saving state) and,
for forward+backward, autograd's backward and our backward's lookup, on CPU tensors of the shape
given. What it leaves out: everything a launch does (Triton's and Gluon's launchers, TMA
descriptors, the preprocess kernel, GPU allocations), and the CUDA-only input check (`need_cuda`),
which this patch turns off so that CPU tensors pass. So it is a lower bound on the host's share of
an eager call, on this machine's CPU, not the GPU host's; nothing here is committed or quoted on
the site. Run without TRITON_INTERPRET (under the interpreter the table is not read).

`--stub kernels` runs the launchers too: the CPU tensors pass for a Hopper GPU's (`is_cuda`, sm_90,
so TMA descriptors are built where the plan asks), tiles, descriptors and outputs are made, and the
direct launcher builds its launch key, up to the compiled kernel's C launcher, which does nothing
(nor does Triton's dispatch, where a launch takes it: `kernel[grid]` costs nothing here). The
Gluon kernels refuse this machine's Triton, so their plans run the Triton kernels, as on a GPU
with another Triton than 3.6.
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


def stub_kernels() -> None:
    """Everything up to the compiled kernels' launchers runs; they, and Triton's dispatch, do nothing."""
    import types
    import warnings

    from cs336_systems.attention import flash_launch
    from cs336_systems.attention.fast import direct_launch

    check = flash_triton.check_attention_inputs
    flash_triton.check_attention_inputs = lambda *a, **kw: check(*a, **{**kw, "need_cuda": False})
    torch.Tensor.is_cuda = property(lambda self: True)  # a Hopper GPU's tensors, as far as the checks ask
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    warnings.filterwarnings("ignore", message="FlashAttentionFast: the tuned plan's Gluon")
    compiled = types.SimpleNamespace(run=lambda *a: None, function=None, packed_metadata=None)

    class NoDispatch:  # a kernel whose `[grid](...)` returns the stub compiled form at once
        def __init__(self, kernel):
            self.arg_names, self.params = kernel.arg_names, kernel.params

        def __getitem__(self, grid):
            return lambda *args, **kw: compiled

    stand_ins: dict = {}

    class Kernels:  # kernel modules whose every kernel dispatches to nothing
        def __getattr__(self, name):
            real = getattr(real_kernels(KERNEL_MODULE[0]), name)
            if real not in stand_ins:  # one stand-in per kernel, as Triton keeps one JITFunction
                stand_ins[real] = NoDispatch(real)
            return stand_ins[real]

    real_kernels, KERNEL_MODULE = flash_launch.kernels, [None]

    def kernels(module):
        if not module.startswith("cs336_systems"):
            return real_kernels(module)  # triton's own modules (the TensorDescriptor class)
        KERNEL_MODULE[0] = module
        return Kernels()

    flash_launch.kernels = kernels  # where the teaching launchers find their kernels
    if hasattr(direct_launch, "DirectKernel"):  # the direct launcher builds its key, then launches nothing
        real_init = direct_launch.DirectKernel.__init__
        direct_launch.DirectKernel.__init__ = lambda self, kernel: real_init(
            self, kernel if isinstance(kernel, NoDispatch) else NoDispatch(kernel))
        direct_launch._device_and_stream = lambda: (0, 0)
        direct_launch._hooked = lambda: False


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
    ap.add_argument("--stub", choices=("launches", "kernels"), default="launches",
                    help="what is replaced: whole launches, or only the kernels' launchers (see above)")
    args = ap.parse_args(argv)
    for flag in ("batch", "heads", "seq", "number", "repeat"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("TRITON_INTERPRET=1 is set: under the interpreter the tuned table is not read; unset it")
    stub_launches() if args.stub == "launches" else stub_kernels()
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
          f"{args.stub} stubbed, CPU: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}")
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        med, low = per_call_us(fn, args.number, args.repeat)
        print(f"  {name:17s} {med:8.1f} us per call (median of {args.repeat}; min {low:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
