"""The eager lane (`fast/eager_lane.py`): which inputs get one, that each kind of input builds its
lane once (its checks, plans and verdicts asked then), and on a Hopper GPU that the lane launches
exactly what the general path launches."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from tests.triton_mode import NO_TRITON, ON_GPU, needs_gpu

triton = pytest.importorskip("triton", reason=NO_TRITON)

from cs336_systems.attention.fast import eager_lane  # noqa: E402


@pytest.fixture
def builds(monkeypatch):
    """A fresh memory of lanes, on a machine where the lane's rules are asked (no interpreter); the
    lanes built are recorded, as stand-ins, with the plans they were given."""
    from cs336_systems.attention.fast.plans import BwdPlan, FwdPlan, GluonBwdConfig, GluonFwdConfig
    from cs336_systems.attention.tiles import BwdConfig, FwdConfig

    monkeypatch.setattr(eager_lane, "_LANES", {})
    monkeypatch.setattr(eager_lane, "interpreting", lambda: False)
    monkeypatch.setattr(eager_lane, "check_triton_inputs", lambda *a: None)  # CPU tensors pass, here
    monkeypatch.setattr(eager_lane, "_verdict", lambda rule, options, tensors: None)
    plans = {"fwd": FwdPlan(FwdConfig(128, 64), GluonFwdConfig(128, 3, 2)),
             "bwd": BwdPlan(BwdConfig(64, 64, 64, 64), gluon=GluonBwdConfig(2, 1, 80))}
    monkeypatch.setattr(eager_lane, "plan_for", lambda kind, q, k, is_causal: plans[kind])
    built = types.SimpleNamespace(lanes=[], plans=plans)
    monkeypatch.setattr(eager_lane, "GluonLane",
                        lambda q, k, causal, fwd, bwd: built.lanes.append((fwd, bwd)) or object())
    return built


def _qkv(shape=(1, 2, 256, 128)):
    return [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(3)]


def test_each_kind_of_input_builds_one_lane(builds):
    q, k, v = _qkv()
    lane = eager_lane.lane_for(q, k, v, True)
    assert eager_lane.lane_for(*_qkv(), True) is lane  # other tensors of the same kind
    assert eager_lane.lane_for(q, k, v, False) is not lane  # the other mask
    t = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16).transpose(1, 2)  # other strides
    eager_lane.lane_for(t, k, v, True)
    assert len(builds.lanes) == 3 and builds.lanes[0] == (builds.plans["fwd"].gluon, builds.plans["bwd"].gluon)


def test_three_d_inputs_are_one_head_judged_in_the_callers_memory(builds, monkeypatch):
    asked = []
    monkeypatch.setattr(eager_lane, "_verdict", lambda rule, options, tensors: asked.append(tensors))
    strided = torch.zeros(2, 256, 256, dtype=torch.bfloat16)[..., ::2]  # the general path would copy it
    assert eager_lane.lane_for(strided, strided, strided, True) is not None  # (the fake rules take it)
    # the rules saw (Z, 1, N, d) views of the caller's tensor, not a contiguous copy: the lane runs
    # what it is handed, so a rule must judge exactly that
    q = asked[0][0]
    assert q.shape == (2, 1, 256, 128) and q.data_ptr() == strided.data_ptr() and q.stride()[-1] == 2


def test_rows_off_alignment_take_the_general_path(builds):
    q, k, v = _qkv()
    lane = eager_lane.lane_for(q, k, v, True)
    buf = torch.zeros(q.numel() + 1, dtype=torch.bfloat16)
    odd = buf[1:].view(q.shape)  # the same facts, 2 bytes off a 16-byte boundary: no tensor map
    assert lane is not None and eager_lane.lane_for(odd, k, v, True) is None
    assert len(builds.lanes) == 1


def test_what_the_lane_does_not_know_gets_none(builds, monkeypatch):
    q, k, v = _qkv()
    assert eager_lane.lane_for(q, k, v, 1) is None  # an int mask: the general path checks it
    assert eager_lane.lane_for(torch.nn.Parameter(q), k, v, True) is None  # a tensor subclass
    assert eager_lane.lane_for(*_qkv((1, 2, 256, 64)), True) is None  # d = 64: the general path
    plans = builds.plans
    triton_bwd = dataclasses.replace(plans["bwd"], gluon=None)
    monkeypatch.setattr(eager_lane, "plan_for", lambda kind, *a: triton_bwd if kind == "bwd" else plans[kind])
    assert eager_lane.lane_for(*_qkv((1, 4, 256, 128)), True) is None  # a Triton backward
    monkeypatch.setattr(eager_lane, "_verdict", lambda rule, options, tensors: "needs a Hopper GPU (sm_90)")
    assert eager_lane.lane_for(*_qkv((1, 8, 256, 128)), True) is None
    assert not builds.lanes


def test_a_bad_input_raises_at_every_call_naming_the_argument(monkeypatch):
    monkeypatch.setattr(eager_lane, "_LANES", {})
    monkeypatch.setattr(eager_lane, "interpreting", lambda: False)
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    for _ in range(2):  # never remembered as a lane
        with pytest.raises(ValueError, match="^k must have q's head dim"):
            eager_lane.lane_for(q, k, k, True)


@needs_gpu
@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability()[0] != 9, reason="the Gluon kernels need sm_90")
@pytest.mark.skipif(not triton.__version__.startswith("3.6"), reason="the Gluon kernels are written for Triton 3.6")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 20, 1024, 128), (40, 1024, 128)], ids=["4-D", "3-D"])
def test_gpu_the_lane_launches_what_the_general_path_launches(is_causal, shape, monkeypatch):
    """At a shape whose plans are Gluon both ways: O, L, dK, dV the same bits through the lane as
    through the general path (the same kernels); dQ (fp32 adds in any order, rounded to bf16)
    within one bf16 step. Three calls: the lane's first (it binds), a bound one, and one at new
    addresses with a non-contiguous dO (the lane copies it)."""
    from cs336_systems.attention.fast import function
    from cs336_systems.attention.fast.function import FlashAttentionFast

    g = torch.Generator(device="cuda").manual_seed(0)
    # 40 x 1,024 rows: the "large" table keys, Gluon both ways; (batch, seq, d) runs as one head
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    assert eager_lane.lane_for(q, k, v, is_causal) is not None

    def step(q, k, v, do):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = FlashAttentionFast.apply(q, k, v, is_causal)
        L = o.grad_fn.saved_tensors[4]  # the contract's L (freed by the backward)
        o.backward(do)
        return o, L, q.grad, k.grad, v.grad

    with monkeypatch.context() as m:
        m.setattr(function, "lane_for", lambda *a: None)
        want = step(q, k, v, do)
    strided = do.transpose(-1, -2).contiguous().transpose(-1, -2)  # the same values, not contiguous
    for inputs in ((q, k, v, do), (q, k, v, do), (q.clone(), k.clone(), v.clone(), strided)):
        got = step(*inputs)
        for name, a, b in zip(("O", "L", "dK", "dV"), got[:2] + got[3:], want[:2] + want[3:]):
            assert torch.equal(a, b), name
        torch.testing.assert_close(got[2].float(), want[2].float(), rtol=2**-7,
                                   atol=2**-7 * want[2].float().abs().max().item())
