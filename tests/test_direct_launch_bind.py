"""A bound launch (`DirectKernel.bind`): its first call launches as `launch` does, later calls hand
their arguments straight to the compiled kernel's launcher without computing the launch key, and
every way back to Triton's dispatch still holds (a stand-in kernel on any machine: CPU-only)."""
# ruff: noqa: F811  (each test takes the `standin` fixture, imported from test_direct_launch.py)

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention.fast import direct_launch
from tests.triton_mode import NO_TRITON

pytest.importorskip("triton", reason=NO_TRITON)

from tests.test_direct_launch import standin  # noqa: E402, F401  (the stand-in kernel: device 0, stream 77)


def test_a_bound_launch_calls_the_launcher_with_the_new_arguments(standin):
    kernel = direct_launch.DirectKernel(standin)
    x, y = torch.zeros(32), torch.zeros(32)
    bound = kernel.bind((4, 2), (x, 32), dict(BLOCK=16))  # compiles: through Triton
    bound((y, 32))
    bound((x, 32))
    assert len(standin.dispatched) == 1
    assert standin.direct == [(4, 2, 1, 77, "fn", "meta", None, None, None, t, 32, 16, False) for t in (y, x)]


def test_a_bound_launch_takes_triton_s_dispatch_while_asked_or_hooked(standin, monkeypatch):
    from triton import knobs

    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(16)
    bound = kernel.bind((1,), (x, 16), dict(BLOCK=16))
    with direct_launch.dispatch_only():
        bound((x, 16))
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    bound((x, 16))
    assert len(standin.dispatched) == 3 and not standin.direct


def test_a_bound_launch_on_another_device_asks_for_its_key(standin, monkeypatch):
    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(16)
    bound = kernel.bind((1,), (x, 16), dict(BLOCK=16))
    monkeypatch.setattr(direct_launch, "_device_and_stream", lambda: (1, 78))  # torch.cuda.set_device(1)
    bound((x, 16))
    bound((x, 16))
    # device 1's first launch compiles there; the second finds device 1's key
    assert len(standin.dispatched) == 2 and standin.direct[-1][3] == 78


def test_a_first_launch_under_dispatch_only_binds_nothing_and_the_next_binds(standin):
    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(16)
    with direct_launch.dispatch_only():
        assert kernel.bind((1,), (x, 16), dict(BLOCK=16)) is None  # through Triton: nothing bound
    bound = kernel.bind((1,), (x, 16), dict(BLOCK=16))  # compiles; the caller binds again
    bound((x, 16))
    assert len(standin.dispatched) == 2 and len(standin.direct) == 1


def test_a_kernel_without_a_direct_path_binds_nothing_and_launches_through_dispatch(standin):
    import warnings

    del standin.compiled.packed_metadata  # another Triton's compiled form
    kernel = direct_launch.DirectKernel(standin)
    with pytest.warns(UserWarning, match="unavailable"):
        assert kernel.bind((1,), (torch.zeros(16), 16), dict(BLOCK=16)) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, at the first launch
        assert kernel.bind((1,), (torch.zeros(16), 16), dict(BLOCK=16)) is None
    assert len(standin.dispatched) == 2 and not standin.direct
