"""The head-dim-128 Gluon backward: input rules on any machine, a compile check for sm_90 where the
installed Triton is the GPU's (3.6), and the gradients against float64 on a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention.fast.gluon import bwd128_ws
from cs336_systems.attention.reference import attention_reference
from tests.triton_mode import NO_TRITON, ON_GPU, pytestmark  # noqa: F401

triton = pytest.importorskip("triton", reason=NO_TRITON)  # the version checks and compiles below need it


def test_unsupported_inputs_say_why():
    x = torch.zeros(1, 1, 128, 128)
    assert "Hopper" in bwd128_ws.bwd128_supported(x, x, x, x, True)
    with pytest.raises(ValueError, match="stages must be at least 2"):
        bwd128_ws.launch_bwd128_ws(x, x, x, x, None, None, True, stages=1)
    with pytest.raises(ValueError, match="Hopper"):
        bwd128_ws.launch_bwd128_ws(x, x, x, x, None, None, True)


def test_the_dispatch_picks_the_kernel_by_head_dim(monkeypatch):
    # on a stand-in for a Hopper tensor with the GPU's Triton: d = 128 asks this kernel's rules
    import types

    from cs336_systems.attention.fast import launch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(triton, "__version__", "3.6.0")

    def fake(d, n=1024):
        return types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.bfloat16, shape=(1, 16, n, d),
                                     is_contiguous=lambda: True)

    assert launch.gluon_bwd_supported(fake(128), fake(128), fake(128), fake(128), True) is None
    assert launch.gluon_bwd_supported(fake(64), fake(64), fake(64), fake(64), True) is None
    t = fake(128, 1000)
    assert "multiple of" in launch.gluon_bwd_supported(t, t, t, t, True)
    assert launch.gluon_bwd_supported(fake(80), fake(80), fake(80), fake(80), True) == "written for head dim 64"


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason=f"Gluon's API changes between releases; the kernel is written for the GPU's Triton 3.6 "
                           f"(installed: {triton.__version__})")
@pytest.mark.parametrize("is_causal", [False, True])
def test_compiles_for_sm90(is_causal):
    # in a fresh process: under TRITON_INTERPRET (these tests' CPU mode) the Gluon compiler refuses
    # the interpreter's objects
    import json
    import os
    import subprocess
    import sys

    script = f"""
import json
from cs336_systems.attention.fast.tuning.gluon_report import bwd128_report
print(json.dumps(bwd128_report({is_causal}, 2, 2)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["fits"] and r["wgmma"] > 0  # the program's shared memory fits an SM; tensor cores


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (the kernel uses sm_90 warpgroup MMA, TMA and setmaxnreg)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 256, 256), (1, 2, 128, 384), (1, 4, 2048, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("stages,slots", [(2, 1), (2, 2)])
def test_gpu_gradients_match_the_reference(shape, is_causal, dtype, stages, slots):
    from cs336_systems.attention.flash_launch import launch_fwd, launch_preprocess

    Z, H, n_q, n_k = shape
    if is_causal and n_q != n_k:
        pytest.skip("causal needs n_q == n_k in this kernel")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(Z, H, n_q, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(Z, H, n_k, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    o, L = launch_fwd(q, k, v, is_causal)
    dq, dk, dv = bwd128_ws.launch_bwd128_ws(q, k, v, do, L, launch_preprocess(o, do), is_causal, stages, slots)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = attention_reference(q64, k64, v64, is_causal)
    out.backward(do.double())
    # P and dS are rounded to 16 bits before their matmuls (2^-8 relative each in bf16), and the
    # gradients once more on output: a few times 2^-8, far under 2e-2; a wrong tile or mask is O(1)
    for name, got, want in (("dQ", dq, q64.grad), ("dK", dk, k64.grad), ("dV", dv, v64.grad)):
        err = float((got.double() - want).norm() / want.norm())
        assert err < 2e-2, f"{name}: relative error {err:.3g}"


def test_heads_per_group_divides_the_heads_and_keeps_their_tensors_within_l2():
    from cs336_systems.attention.fast.gluon.fwd_ws import L2_BUDGET

    mib = 1 << 20
    # Q, dO (bf16) and dQ (fp32) of one head: 8 bytes a value, n_q x 128 values
    assert bwd128_ws.heads_per_group(32, 32 * mib) == 1  # the 8B step's cell: 32,768 positions
    assert bwd128_ws.heads_per_group(16, 8 * mib) == 2  # 8,192: three would fit, but 3 does not divide 16
    assert bwd128_ws.heads_per_group(32, 4 * mib) == 4  # 4,096: six fit, four divide
    assert bwd128_ws.heads_per_group(12, 2 * mib) == 4
    assert bwd128_ws.heads_per_group(7, 1 * mib) == 1
    for n_bh in range(1, 70):
        for per_head in (mib // 2, 3 * mib, 8 * mib, 64 * mib):
            g = bwd128_ws.heads_per_group(n_bh, per_head)
            assert n_bh % g == 0 and g & (g - 1) == 0, (n_bh, per_head, g)
            assert g == 1 or g * per_head <= L2_BUDGET, (n_bh, per_head, g)
