"""Compile a Gluon kernel for Hopper (sm_90) on a machine without a GPU, and report its resources.

The Gluon kernels are written against Triton 3.6 (the GPU's version), so this needs that Triton
importable (for instance `pip install --target DIR triton==3.6.0`, then `PYTHONPATH=DIR`). The
launch's runtime arguments are built on the CPU (tensors and TMA descriptors on CPU storage: only
their types reach the compiler) and typed as a real launch would type them; ptxas then reports
what a launch would get: registers per thread, spills, shared memory. The command line:

    PYTHONPATH=DIR python -m cs336_systems.attention.fast.tuning.gluon_report fwd --d 128 --causal
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .compile_report import SMEM_LIMIT, machine_code


def compile_gluon(kernel, args: tuple, constexprs: dict) -> dict:
    """Compile `kernel` (a @gluon.jit function) for sm_90 as `kernel[grid](*args, **constexprs)`
    would; constexprs hold the launch options num_warps and maxnreg too."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    options = {k: constexprs[k] for k in ("num_warps", "maxnreg", "num_stages") if k in constexprs}
    const = {k: v for k, v in constexprs.items() if k not in options}
    names = kernel.arg_names
    signature, consts, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if i < len(args):
            signature[name] = mangle_type(args[i])
            if isinstance(args[i], torch.Tensor) or (isinstance(args[i], int) and args[i] % 16 == 0):
                attrs[(i,)] = [["tt.divisibility", 16]]  # aligned pointers, sizes divisible by 16
        else:
            default = next(p.default for p in kernel.params if p.name == name)
            signature[name] = "constexpr"
            consts[(i,)] = const.get(name, default)
    start = time.perf_counter()
    k = triton.compile(GluonASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 128),
                       options=options)
    return {"smem": k.metadata.shared, "fits": k.metadata.shared <= SMEM_LIMIT, **machine_code(k.asm["cubin"]),
            "wgmma": k.asm["ptx"].count("wgmma.mma_async"), "compile_s": round(time.perf_counter() - start, 1)}


def _descriptor(t: torch.Tensor, rows: int, cols: int):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[t.dtype]
    return TensorDescriptor.from_tensor(t, [rows, cols], gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype))


def fwd_report(d: int, causal: bool, block_n: int, stages: int, warpgroups: int) -> dict:
    from ..gluon.flash_fwd_ws_kernel import fwd_ws_kernel
    from ..gluon.fwd_ws import ROWS, register_split

    n = 4096
    x = torch.empty(n, d, dtype=torch.bfloat16)
    maxnreg, math_regs = register_split(warpgroups)
    args = (_descriptor(x, ROWS, d), _descriptor(x, block_n, d), _descriptor(x, block_n, d),
            torch.empty(n, d, dtype=torch.bfloat16), torch.empty(n), n, n, 0.1, 1)
    return compile_gluon(fwd_ws_kernel, args, dict(D=d, BN=block_n, STAGES=stages, CAUSAL=causal,
                                                   MATH_REGS=math_regs, NW=warpgroups, num_warps=4,
                                                   maxnreg=maxnreg))


def bwd128_report(causal: bool, stages: int, slots: int, version: str = "full") -> dict:
    """The d = 128 backward, or one of its A/B versions (experiments/bwd128_versions.py)."""
    import tempfile
    from pathlib import Path

    from ..experiments import ab_bwd128
    from ..experiments import bwd128_versions as versions
    from ..experiments.harness import load_variant
    from ..gluon.bwd128_ws import bwd128_args_for_report

    if version in versions.OWN_KERNELS:  # solo: its own kernel file and launch
        from ..direct_launch import for_triton

        x = torch.empty(1, 1, 4096, 128, dtype=torch.bfloat16)
        vec = torch.empty(1, 1, 4096)
        _, args, constexprs, *_ = ab_bwd128.solo_args(x, x, x, x, vec, vec, causal, stages)
        kernel = load_variant("bwd128_solo", versions.SOLO_FILE, versions.VARIANT_PACKAGE).bwd128_solo_kernel
        return compile_gluon(kernel, for_triton(args), constexprs)
    kernel, args, constexprs = bwd128_args_for_report(causal, stages, slots)
    if versions.pointer_dq(version):  # the version's dq_desc is dQ's fp32 tensor
        args = args[:6] + (torch.empty(4096, 128),) + args[7:]
    if version != "full":
        name = "bwd128_" + version.replace("+", "_")
        with tempfile.TemporaryDirectory() as workdir:
            path = Path(workdir) / f"{name}.py"
            path.write_text(versions.variant_source(version, versions.KERNEL_FILE.read_text()))
            kernel = load_variant(name, path, versions.VARIANT_PACKAGE).bwd128_ws_kernel
            return compile_gluon(kernel, args, constexprs)
    return compile_gluon(kernel, args, constexprs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gluon_report", description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=["fwd", "bwd128"])
    ap.add_argument("--d", type=int, default=128, choices=[64, 128])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--settings", nargs="+", default=None, metavar="A,B,C",
                    help="fwd: WARPGROUPS,BLOCK_N,STAGES; bwd128: STAGES,SLOTS")
    ap.add_argument("--version", default="full", help="bwd128: an A/B version (experiments/bwd128_versions.py; default full)")
    args = ap.parse_args(argv)
    import triton

    if not triton.__version__.startswith("3.6"):
        ap.error(f"the Gluon kernels are written against Triton 3.6; this Triton is {triton.__version__}")
    if args.kernel == "fwd":
        for s in args.settings or ["2,128,3", "2,128,2", "2,64,4"]:
            nw, bn, st = (int(x) for x in s.split(","))
            print(f"fwd d={args.d} causal={args.causal} nw={nw} bn={bn} st={st}:",
                  fwd_report(args.d, args.causal, bn, st, nw), flush=True)
    else:
        for s in args.settings or ["2,2"]:
            st, sl = (int(x) for x in s.split(","))
            print(f"bwd128 {args.version} causal={args.causal} stages={st} slots={sl}:",
                  bwd128_report(args.causal, st, sl, args.version), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
