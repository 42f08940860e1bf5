"""The direct launcher's ways back to Triton's dispatch (`fast.direct_launch`), with a stand-in
kernel on any machine: an interpreted kernel, `dispatch_only`, and a kernel or compiled form that
lacks what the direct call needs (another Triton's internals), which warns once. Beside
test_direct_launch.py, whose GPU tests the GPU runs' logs list: these are CPU-only."""

from __future__ import annotations

import types

import pytest
import torch

from cs336_systems.attention.fast import direct_launch
from tests.test_direct_launch import StandIn
from tests.triton_mode import NO_TRITON

pytest.importorskip("triton", reason=NO_TRITON)


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setattr(direct_launch, "interpreting", lambda: False)
    monkeypatch.setattr(direct_launch, "_device_and_stream", lambda: (0, 77))
    return StandIn()


def test_an_interpreted_kernel_always_goes_through_triton(standin):
    # under TRITON_INTERPRET=1 Triton's jit makes InterpretedFunctions: nothing compiled to launch
    class InterpretedFunction(StandIn):
        pass

    interpreted = InterpretedFunction()
    kernel = direct_launch.DirectKernel(interpreted)
    for _ in range(2):
        kernel.launch((1,), (torch.zeros(16), 16), dict(BLOCK=16))
    assert len(interpreted.dispatched) == 2 and not interpreted.direct


def test_dispatch_only_sends_every_launch_through_triton(standin):
    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(16)
    kernel.launch((1,), (x, 16), dict(BLOCK=16))  # compiled once
    with direct_launch.dispatch_only():
        kernel.launch((1,), (x, 16), dict(BLOCK=16))
    kernel.launch((1,), (x, 16), dict(BLOCK=16))  # direct again afterwards
    assert len(standin.dispatched) == 2 and len(standin.direct) == 1


@pytest.mark.parametrize("lacks", ["packed_metadata", "run"])
def test_a_compiled_form_without_the_launcher_falls_back_with_one_warning(standin, lacks):
    # another Triton's CompiledKernel may name its launcher's inputs differently: then every launch
    # takes Triton's dispatch (correct, slower on the host), and a warning says so once
    import warnings

    delattr(standin.compiled, lacks)
    kernel = direct_launch.DirectKernel(standin)
    x = torch.zeros(16)
    with pytest.warns(UserWarning, match=f"direct launch .* unavailable .*compiled.{lacks}"):
        kernel.launch((1,), (x, 16), dict(BLOCK=16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (16, 32):  # the same key and a new one: both dispatched, silently
            kernel.launch((1,), (x, n), dict(BLOCK=16))
    assert len(standin.dispatched) == 3 and not standin.direct


def test_a_parameter_without_a_value_falls_back(standin):
    import inspect

    # a parameter the launch neither passes nor defaults (Triton's KernelParam.default is `empty` then)
    standin.arg_names = [*standin.arg_names, "EXTRA"]
    standin.params = [*standin.params, types.SimpleNamespace(name="EXTRA", default=inspect.Parameter.empty)]
    kernel = direct_launch.DirectKernel(standin)
    with pytest.warns(UserWarning, match="a value for parameter EXTRA"):
        kernel.launch((1,), (torch.zeros(16), 16), dict(BLOCK=16))
    kernel.launch((1,), (torch.zeros(16), 16), dict(BLOCK=16))
    assert len(standin.dispatched) == 2 and not standin.direct
