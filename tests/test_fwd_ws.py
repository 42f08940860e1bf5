"""The warp-specialised forward (Gluon): input rules on any machine, a compile check for sm_90 where
the installed Triton is the GPU's (3.6), and O and L against the float64 reference on a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention.fast.gluon import fwd_ws
from cs336_systems.attention.reference import attention_reference
from tests.triton_mode import NO_TRITON, ON_GPU, pytestmark  # noqa: F401

triton = pytest.importorskip("triton", reason=NO_TRITON)  # the version checks and compiles below need it


def test_unsupported_inputs_say_why():
    x = torch.zeros(1, 1, 64, 64)
    assert "Hopper" in fwd_ws.fwd_ws_supported(x, x, x)
    with pytest.raises(ValueError, match="warpgroups must be 2 or 3"):
        fwd_ws.launch_fwd_ws(x, x, x, True, warpgroups=4)
    with pytest.raises(ValueError, match="block_n must be 64 or 128"):
        fwd_ws.launch_fwd_ws(x, x, x, True, block_n=32)
    with pytest.raises(ValueError, match="Hopper"):
        fwd_ws.launch_fwd_ws(x, x, x, True)


def test_register_split_fits_the_register_file():
    for warpgroups in (2, 3):
        maxnreg, consumers = fwd_ws.register_split(warpgroups)
        warps = 4 * warpgroups + 4  # the loader warp is padded to a warpgroup
        assert maxnreg * warps * 32 <= 65536
        assert (consumers * 4 * warpgroups + 24 * 4) * 32 <= 65536 and consumers % 8 == 0


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason=f"Gluon's API changes between releases; the kernel is written for the GPU's Triton 3.6 "
                           f"(installed: {triton.__version__})")
@pytest.mark.parametrize("block_n,stages,warpgroups", [(64, 4, 3), (64, 6, 3), (128, 3, 2)])
def test_compiles_for_sm90_without_spills(block_n, stages, warpgroups):
    # in a fresh process: under TRITON_INTERPRET (these tests' CPU mode) the reductions' combine
    # functions are interpreter objects that the Gluon compiler refuses
    import json
    import os
    import subprocess
    import sys

    script = f"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from cs336_systems.attention.fast.gluon import fwd_ws
from cs336_systems.attention.fast.gluon.flash_fwd_ws_kernel import fwd_ws_kernel
from cs336_systems.attention.fast.tuning.compile_report import machine_code
lay = "NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)"
sig = {{"q_desc": f"tensordesc<bf16[64, 64],{{lay}}>", "k_desc": f"tensordesc<bf16[{block_n}, 64],{{lay}}>",
       "v_desc": f"tensordesc<bf16[{block_n}, 64],{{lay}}>", "O": "*bf16", "L": "*fp32", "n_q": "i32", "n_k": "i32",
       "qk_scale": "fp32", "GROUP": "i32"}}
maxnreg, math_regs = fwd_ws.register_split({warpgroups})  # as the launcher sets them
const = dict(D=64, BN={block_n}, STAGES={stages}, CAUSAL=True, MATH_REGS=math_regs, NW={warpgroups})
src = gluon._runtime.GluonASTSource(fwd_ws_kernel, sig | {{k: "constexpr" for k in const}}, constexprs=const)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={{"num_warps": 4, "maxnreg": maxnreg}})
print(json.dumps(dict(ptx=k.asm["ptx"], shared=k.metadata.shared, maxnreg=maxnreg, code=machine_code(k.asm["cubin"]))))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ptx"].count("wgmma.mma_async") > 0 and "setmaxnreg" in r["ptx"]  # tensor cores, specialised warps
    assert "cp.async.bulk.tensor" in r["ptx"]  # TMA loads
    assert r["shared"] <= 227 * 1024
    if not r["code"]:
        pytest.skip("this Triton build has no bundled nvdisasm/cuobjdump to read the SASS")
    assert r["code"]["sass_spill_ops"] == 0 and r["code"]["regs"] <= r["maxnreg"]


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (the kernel uses sm_90 warpgroup MMA, TMA and setmaxnreg)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 256, 256), (1, 2, 200, 384), (2, 1, 1000, 1024), (16, 1, 1024, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block_n,stages,warpgroups", [(64, 4, 3), (64, 3, 3), (128, 3, 2)])
def test_gpu_output_and_logsumexp_match_the_reference(shape, is_causal, dtype, block_n, stages, warpgroups):
    Z, H, n_q, n_k = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(Z, H, n_q, 64, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(Z, H, n_k, 64, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    o, L = fwd_ws.launch_fwd_ws(q, k, v, is_causal, block_n, stages, warpgroups)
    want_o, want_L = attention_reference(q.double(), k.double(), v.double(), is_causal)
    err = float((o.double() - want_o).norm() / want_o.norm())
    assert err < 1e-2, f"O: relative error {err:.3g}"
    assert float((L.double() - want_L).abs().max()) < 2e-2, "L"


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (the kernel uses sm_90 warpgroup MMA, TMA and setmaxnreg)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 256, 256), (1, 2, 200, 384), (2, 1, 1000, 1024), (1, 4, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block_n,stages,warpgroups", [(128, 3, 2), (128, 2, 2), (64, 4, 2), (64, 3, 3)])
def test_gpu_head_dim_128_matches_the_reference(shape, is_causal, dtype, block_n, stages, warpgroups):
    Z, H, n_q, n_k = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(Z, H, n_q, 128, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(Z, H, n_k, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    o, L = fwd_ws.launch_fwd_ws(q, k, v, is_causal, block_n, stages, warpgroups)
    want_o, want_L = attention_reference(q.double(), k.double(), v.double(), is_causal)
    # bf16 operands and output: the output's own rounding is ~2^-8 relative; 1e-2 leaves room for P's
    err = float((o.double() - want_o).norm() / want_o.norm())
    assert err < 1e-2, f"O: relative error {err:.3g}"
    assert float((L.double() - want_L).abs().max()) < 2e-2, "L"


def test_heads_per_group_runs_one_head_without_the_mask_and_a_budget_of_heads_with_it():
    mib = 1 << 20
    # without the mask one head at a time, at every length (K and V of 4,096 tokens: 2 MiB a head)
    assert fwd_ws.heads_per_group(16, 2 * mib, 128, False) == 1
    assert fwd_ws.heads_per_group(32, 16 * mib, 128, False) == 1
    # causal: as many heads as fit 16 MiB of K and V, a power of two dividing the heads
    assert fwd_ws.heads_per_group(16, 2 * mib, 128, True) == 8  # 4,096 tokens
    assert fwd_ws.heads_per_group(16, 4 * mib, 128, True) == 4  # 8,192
    assert fwd_ws.heads_per_group(32, 16 * mib, 128, True) == 1  # the 8B step's cell
    assert fwd_ws.heads_per_group(12, 2 * mib, 128, True) == 4  # eight fit, four divide 12
    assert fwd_ws.heads_per_group(7, 1 * mib, 128, True) == 1
    # d = 64: all heads, both masks
    assert fwd_ws.heads_per_group(32, 16 * mib, 64, True) == 32
    assert fwd_ws.heads_per_group(32, 16 * mib, 64, False) == 32
