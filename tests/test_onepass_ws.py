"""The warp-specialised one-pass backward (Gluon): input rules on any machine, a compile
check for sm_90 where the installed Triton is the GPU's (3.6), and the gradients on a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention.fast.experiments import ab_onepass_ws
from cs336_systems.attention.fast.gluon import onepass_ws
from cs336_systems.attention.reference import attention_reference
from tests.triton_mode import NO_TRITON, ON_GPU, pytestmark  # noqa: F401

triton = pytest.importorskip("triton", reason=NO_TRITON)  # the version checks and compiles below need it


def test_unsupported_inputs_say_why():
    x = torch.zeros(1, 1, 64, 64)
    assert "Hopper" in onepass_ws.ws_supported(x, x, x, x, True)
    with pytest.raises(ValueError, match="block_n must be 128"):
        onepass_ws.launch_bwd_onepass_ws(x, x, x, x, None, None, True, block_n=32)
    with pytest.raises(ValueError, match="dq_regs must be a multiple of 8"):
        onepass_ws.launch_bwd_onepass_ws(x, x, x, x, None, None, True, dq_regs=100)


def test_ablations_edit_what_they_name():
    ab = ab_onepass_ws
    src = ab.KERNEL_FILE.read_text()
    assert ab.variant_source("full", src) == src
    no_add = ab.variant_source("no_add", src)
    assert no_add.count(ab.NEVER) == 1 and ab.HANDOFF in no_add
    math_only = ab.variant_source("math_only", src)
    assert ab.NEVER + "    " + ab.HANDOFF.splitlines()[0] in math_only
    assert "range(n_iter * 0)" in math_only
    every = ab.variant_source("mask_every_tile", src)
    assert ab.DIAG not in every and "n_diag = n_iter\n" in every
    with pytest.raises(ValueError, match="copies of"):
        ab.variant_source("full", src.replace(ab.ADD_BLOCK, ""))


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason=f"Gluon's API changes between releases; the kernel is written for the GPU's Triton 3.6 "
                           f"(installed: {triton.__version__})")
@pytest.mark.parametrize("block_n,dq_regs,dq_tma", [(128, 96, False), (128, 72, True), (128, 80, True), (128, 88, True)])
def test_compiles_for_sm90(block_n, dq_regs, dq_tma):
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon

    from cs336_systems.attention.fast.gluon.flash_bwd_ws_kernel import bwd_onepass_ws_kernel
    from cs336_systems.attention.fast.tuning.compile_report import machine_code

    lay = "NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)"
    desc = f"tensordesc<bf16[64, 64],{lay}>"
    sig = {"q_desc": desc, "k_desc": desc, "v_desc": desc, "do_desc": desc, "L": "*fp32", "Delta": "*fp32",
           "DQ": "*fp32", "dq_desc": "tensordesc<fp32[64, 64],NVMMASharedLayout(swizzle_byte_width=128, "
                                      "element_bitwidth=32, rank=2)>", "DK": "*bf16", "DV": "*bf16", "n_q": "i32", "n_k": "i32", "qk_scale": "fp32",
           "sm_scale": "fp32"}
    maxnreg, math_regs = onepass_ws.register_split(block_n, dq_regs)  # as the launcher sets them
    const = dict(D=64, BM=64, BN=block_n, STAGES=2, SLOTS=2, CAUSAL=True, MATH_REGS=math_regs, DQ_REGS=dq_regs,
                 DQ_TMA=dq_tma, RED_BUFS=2)
    src = gluon._runtime.GluonASTSource(bwd_onepass_ws_kernel, sig | {k: "constexpr" for k in const}, constexprs=const)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": maxnreg})
    ptx = k.asm["ptx"]
    assert ptx.count("wgmma.mma_async") > 0 and "setmaxnreg" in ptx  # tensor cores, and specialised warps
    assert ("cp.reduce.async.bulk.tensor" in ptx) == dq_tma and ("atom.global" in ptx) != dq_tma  # the adds' path
    assert k.metadata.shared <= 227 * 1024  # the program's shared memory fits an SM
    # spills are made by ptxas, after the PTX (whose registers are virtual): count them in the SASS
    code = machine_code(k.asm["cubin"])
    if not code:
        pytest.skip("this Triton build has no bundled nvdisasm/cuobjdump to read the SASS")
    assert code["regs"] <= maxnreg  # maxnreg holds
    if dq_tma:  # the path in use spills nothing at these splits (the atomics ablation spills a few values)
        assert code["sass_spill_ops"] == 0


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (the kernel uses sm_90 warpgroup MMA, TMA and setmaxnreg)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 256, 256), (1, 2, 128, 384), (16, 1, 1024, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block_n,stages,slots,dq_tma", [(128, 2, 2, False), (128, 3, 3, False), (128, 2, 4, False),
                                                         (128, 2, 2, True), (128, 2, 3, True)])
def test_gpu_gradients_match_the_reference(shape, is_causal, dtype, block_n, stages, slots, dq_tma):
    from cs336_systems.attention.flash_launch import launch_fwd, launch_preprocess

    Z, H, n_q, n_k = shape
    if is_causal and n_q != n_k:
        pytest.skip("causal needs n_q == n_k in this kernel")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(Z, H, n_q, 64, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(Z, H, n_k, 64, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    o, L = launch_fwd(q, k, v, is_causal)
    dq, dk, dv = onepass_ws.launch_bwd_onepass_ws(q, k, v, do, L, launch_preprocess(o, do), is_causal, stages, slots,
                                                  block_n=block_n, dq_tma=dq_tma)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = attention_reference(q64, k64, v64, is_causal)
    out.backward(do.double())
    for name, got, want in (("dQ", dq, q64.grad), ("dK", dk, k64.grad), ("dV", dv, v64.grad)):
        err = float((got.double() - want).norm() / want.norm())
        assert err < 2e-2, f"{name}: relative error {err:.3g}"
