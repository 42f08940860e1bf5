"""Launching compiled kernels directly (`fast.direct_launch`): the launch key on any machine, the
caching logic with a stand-in kernel, and on a GPU the same outputs as Triton's own dispatch."""

from __future__ import annotations

import types

import pytest
import torch

from cs336_systems.attention.fast import direct_launch
from tests.tolerances import assert_within, sum_bound
from tests.triton_mode import NO_TRITON, ON_GPU, needs_gpu, pytestmark  # noqa: F401

triton = pytest.importorskip("triton", reason=NO_TRITON)


def test_spec_tells_apart_what_triton_compiles_differently():
    buf = torch.zeros(64)
    spec = direct_launch._spec
    assert spec(buf[:8]) == spec(buf[4:12])  # both 16-byte aligned fp32 pointers
    assert spec(buf[:8]) != spec(buf[1:9])  # 4 bytes off: Triton compiles unaligned loads
    assert spec(buf) != spec(buf.double())
    assert spec(16) != spec(17) and spec(1) != spec(2)  # integers specialise on value (== 1, % 16)
    assert spec(True) != spec(1)  # a bool is typed i1, the integer 1 i32
    assert spec(1.0) != spec(1) and spec(None) != spec(0)  # fp32 and i32; no value and zero


class StandIn:
    """A kernel as DirectKernel sees it: `[grid](*args, **kw)` compiles once and returns an object
    whose `run` launches; records which way each launch went."""

    arg_names = ["X", "n", "BLOCK", "FLAG"]
    params = [types.SimpleNamespace(name=n, default=d) for n, d in
              (("X", None), ("n", None), ("BLOCK", None), ("FLAG", False))]

    def __init__(self):
        self.dispatched, self.direct = [], []
        self.compiled = types.SimpleNamespace(function="fn", packed_metadata="meta", run=self._run)

    def __getitem__(self, grid):
        def dispatch(*args, **kw):
            self.dispatched.append((grid, args, kw))
            return self.compiled
        return dispatch

    def _run(self, *launch):
        self.direct.append(launch)


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setattr(direct_launch, "interpreting", lambda: False)
    monkeypatch.setattr(direct_launch, "_device_and_stream", lambda: (0, 77))
    return StandIn()


def test_first_launch_per_key_goes_through_triton_then_directly(standin):
    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(32)
    for _ in range(3):
        kernel.launch((4, 2), (x, 32), dict(BLOCK=16, num_warps=4))
    assert len(standin.dispatched) == 1 and len(standin.direct) == 2
    # grid padded to 3-D, the stream, the compiled function, no launch metadata or hooks, then every
    # parameter in order: the runtime arguments and the constexprs, defaults filled in
    assert standin.direct[0] == (4, 2, 1, 77, "fn", "meta", None, None, None, x, 32, 16, False)


def test_a_new_shape_or_constexpr_or_alignment_goes_through_triton_again(standin):
    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(64)
    kernel.launch((1,), (x, 32), dict(BLOCK=16))
    kernel.launch((1,), (x, 33), dict(BLOCK=16))
    kernel.launch((1,), (x, 32), dict(BLOCK=32))
    kernel.launch((1,), (x[1:], 32), dict(BLOCK=16))
    kernel.launch((1,), (x, 32), dict(BLOCK=16, num_warps=8))
    assert len(standin.dispatched) == 5 and not standin.direct


def test_a_launch_hook_sends_every_launch_through_triton(standin, monkeypatch):
    from triton import knobs

    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(16)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    for _ in range(2):
        kernel.launch((1,), (x, 16), dict(BLOCK=16))
    assert len(standin.dispatched) == 2 and not standin.direct


def _gluon_launchers(d: int):
    """(forward settings, the backward's launcher, its kernel) of the Gluon kernels at head dim d:
    d = 64's one-pass backward (dQ by atomics), d = 128's (dQ by TMA reduce-adds)."""
    if d == 64:
        from cs336_systems.attention.fast.gluon.flash_bwd_ws_kernel import bwd_onepass_ws_kernel
        from cs336_systems.attention.fast.gluon.onepass_ws import launch_bwd_onepass_ws
        return (), launch_bwd_onepass_ws, bwd_onepass_ws_kernel
    from cs336_systems.attention.fast.gluon.bwd128_ws import launch_bwd128_ws
    from cs336_systems.attention.fast.gluon.flash_bwd128_ws_kernel import bwd128_ws_kernel
    return (128, 3, 2), launch_bwd128_ws, bwd128_ws_kernel


@needs_gpu
@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="the Gluon kernels need sm_90")
@pytest.mark.skipif(not triton.__version__.startswith("3.6"), reason="the Gluon kernels are written for Triton 3.6")
@pytest.mark.parametrize("d, is_causal", [(64, True), (128, False), (128, True)],
                         ids=["d64-causal", "d128-full", "d128-causal"])
def test_gpu_direct_launches_match_triton_dispatch(d, is_causal):
    """The Gluon forward and backward launched both ways, then directly at new addresses: the same
    bits for O, L, dK, dV (deterministic); dQ (fp32 adds in any order, rounded to bf16) within one
    bf16 step."""
    from cs336_systems.attention.fast.gluon.flash_fwd_ws_kernel import fwd_ws_kernel
    from cs336_systems.attention.fast.gluon.fwd_ws import launch_fwd_ws
    from cs336_systems.attention.flash_launch import launch_preprocess

    settings, launch_bwd, bwd_kernel = _gluon_launchers(d)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 2, 512, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    o_ref, L_ref = launch_fwd_ws(q, k, v, is_causal, *settings, kernel=fwd_ws_kernel)
    delta = launch_preprocess(o_ref, do)
    dq_ref, dk_ref, dv_ref = launch_bwd(q, k, v, do, L_ref, delta, is_causal, kernel=bwd_kernel)
    # the first call compiles through Triton, the second launches directly; the third's inputs live
    # at other addresses, so the direct call must make their tensor maps, not reuse the first ones
    for inputs in ((q, k, v, do), (q, k, v, do), tuple(t.clone() for t in (q, k, v, do))):
        o, L = launch_fwd_ws(*inputs[:3], is_causal, *settings)
        dq, dk, dv = launch_bwd(*inputs, L, delta.clone(), is_causal)
        assert torch.equal(o, o_ref) and torch.equal(L, L_ref)
        assert torch.equal(dk, dk_ref) and torch.equal(dv, dv_ref)
        # dQ: an fp32 sum in another order, rounded to bf16: at most one bf16 step (2^-7 relative) apart
        torch.testing.assert_close(dq.float(), dq_ref.float(), rtol=2**-7,
                                   atol=2**-7 * dq_ref.float().abs().max().item())


@needs_gpu
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_gpu_one_pass_triton_backward_direct_matches_triton_dispatch(tma):
    """The one-pass Triton backward (the fp32 table's plans run it) launched both ways: dK and dV the
    same bits; dQ summed with atomics in any order, at most one fp32 step per add apart."""
    from cs336_systems.attention.fast.launch import BWD_ONEPASS, launch_bwd_onepass
    from cs336_systems.attention.flash_launch import launch_fwd, launch_preprocess
    from cs336_systems.attention.tiles import BwdConfig, FwdConfig
    from cs336_systems.attention.triton_loader import kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 384, 64, device="cuda", generator=g) for _ in range(4))
    o, L = launch_fwd(q, k, v, True, FwdConfig(64, 32, 4, 2))
    delta = launch_preprocess(o, do)
    c = BwdConfig(32, 32, 32, 32, 4, 2, 4, 2, tma1=tma)
    dq_ref, dk_ref, dv_ref = launch_bwd_onepass(q, k, v, do, L, delta, True, c,
                                                kernel=kernels(BWD_ONEPASS).bwd_onepass_kernel)
    for _ in range(2):  # the first call compiles through Triton, the second launches directly
        dq, dk, dv = launch_bwd_onepass(q, k, v, do, L, delta, True, c)
    assert torch.equal(dk, dk_ref) and torch.equal(dv, dv_ref)
    # dQ_i = scale * sum_j dS_ij K_j, added into fp32 by 384 / 32 = 12 key-tile programs in whatever
    # order they finish: two orders differ by at most twice the bound of a 12-term fp32 sum, scaled
    # by sum_j |dS_ij| |K_j| (float64 here: P = softmax, dS = P * (dO V^T - rowsum(dO * O)))
    qd, kd, vd, dod = (t.double() for t in (q, k, v, do))
    scale = 64 ** -0.5
    s = qd @ kd.transpose(-1, -2) * scale
    s = s.masked_fill(torch.ones(384, 384, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    p = s.softmax(-1)
    ds = p * (dod @ vd.transpose(-1, -2) - (dod * (p @ vd)).sum(-1, keepdim=True))
    magnitude = scale * ds.abs() @ kd.abs()
    assert_within(dq, dq_ref, 2 * sum_bound(12, torch.float32, magnitude), "dQ, direct vs Triton's dispatch")
