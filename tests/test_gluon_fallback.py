"""The fast path's choice between the Gluon and the Triton kernels, on fakes of Hopper tensors (the
rules run on any machine): strided inputs reach the Gluon kernels as contiguous copies; another
Triton than the GPU's 3.6 runs the Triton kernels with a one-time warning saying why."""

from __future__ import annotations

import pytest
import torch


def _fake(d=128, n=1024, contiguous=True):
    import types

    strides = (16 * n * d, n * d, d, 1) if contiguous else (16 * n * d, d, 16 * d, 1)  # (b, s, h, d) memory
    t = types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.bfloat16, shape=(1, 16, n, d),
                              is_contiguous=lambda: contiguous, stride=lambda: strides)
    t.contiguous = lambda: _fake(d, n, True)
    return t


def _gluon_plans():
    from cs336_systems.attention.fast.plans import BwdPlan, FwdPlan, GluonBwdConfig, GluonFwdConfig
    from cs336_systems.attention.tiles import BwdConfig, FwdConfig

    return (FwdPlan(FwdConfig(128, 64), GluonFwdConfig(128, 3, 2)),
            BwdPlan(BwdConfig(64, 64, 64, 64), gluon=GluonBwdConfig(2, 1, 80)))


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU with the GPU's Triton (3.6); the launchers record what they were given."""
    import triton

    from cs336_systems.attention.fast import launch
    from cs336_systems.attention.fast.gluon import bwd128_ws, fwd_ws

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(launch, "_shape", lambda q, k: None)
    monkeypatch.setattr(launch, "_WARNED", set())
    monkeypatch.setattr(launch, "_VERDICTS", {})  # verdicts are of this process's Triton, faked here
    calls = []
    monkeypatch.setattr(fwd_ws, "launch_fwd_ws", lambda q, k, v, *a, **kw: calls.append(("gluon fwd", q)) or "gluon")
    monkeypatch.setattr(bwd128_ws, "launch_bwd128_ws", lambda q, k, v, do, *a, **kw: calls.append(("gluon bwd", q)) or "g")
    monkeypatch.setattr(launch, "launch_preprocess", lambda o, do: None)
    monkeypatch.setattr(launch, "launch_triton_fwd", lambda *a: calls.append(("triton fwd", a[0])) or "triton")
    monkeypatch.setattr(launch, "launch_triton_bwd", lambda *a: calls.append(("triton bwd", a[0])) or "triton")
    return calls


def test_strided_inputs_reach_the_gluon_kernels_as_contiguous_copies(hopper):
    from cs336_systems.attention.fast import launch

    fwd, bwd = _gluon_plans()
    x = _fake(contiguous=False)  # a model's (batch, heads, seq, d) view of (batch, seq, heads, d)
    assert launch.launch_fwd(x, x, x, True, fwd) == "gluon"
    launch.launch_bwd(x, x, x, None, None, x, True, bwd)
    assert [c[0] for c in hopper] == ["gluon fwd", "gluon bwd"]
    assert all(q.is_contiguous() for _, q in hopper)


def test_another_triton_runs_the_triton_kernels_and_says_so_once(hopper, monkeypatch):
    import triton

    from cs336_systems.attention.fast import launch

    monkeypatch.setattr(triton, "__version__", "3.9.0")  # Gluon's API changed (3.9 renamed the TMA copies)
    fwd, bwd = _gluon_plans()
    x = _fake()
    with pytest.warns(UserWarning, match=r"Gluon forward does not run here \(written against Triton 3\.6"):
        assert launch.launch_fwd(x, x, x, True, fwd) == "triton"
    with pytest.warns(UserWarning, match="Gluon backward does not run here"):
        launch.launch_bwd(x, x, x, None, None, x, True, bwd)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason: the second call is silent
        launch.launch_fwd(x, x, x, True, fwd)
    assert [c[0] for c in hopper] == ["triton fwd", "triton bwd", "triton fwd"]


def test_no_hopper_gpu_runs_the_triton_kernels_without_a_warning(hopper, monkeypatch):
    import warnings

    from cs336_systems.attention.fast import launch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    fwd, _ = _gluon_plans()
    x = _fake()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert launch.launch_fwd(x, x, x, True, fwd) == "triton"
