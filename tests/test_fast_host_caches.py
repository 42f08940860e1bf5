"""What the fast path's eager call remembers between calls (`fast/function.py`): the input checks'
verdict per kind of input, and the plan per table key. Both must answer as the full work would."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention.fast import function
from cs336_systems.attention.flash_triton import check_triton_inputs
from tests.triton_mode import NO_TRITON

pytest.importorskip("triton", reason=NO_TRITON)

from cs336_systems.attention.triton_loader import interpreting  # noqa: E402

# Where the fast path takes inputs: CUDA tensors on a GPU, CPU ones under the interpreter
DEV = "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEV)


@pytest.fixture
def counted(monkeypatch):
    """A fresh memory of passed inputs; counts the full checks."""
    monkeypatch.setattr(function, "_PASSED", set())
    calls = []

    def check(*args):
        calls.append(args)
        return check_triton_inputs(*args)
    monkeypatch.setattr(function, "check_triton_inputs", check)
    return calls


def _same(x, y) -> bool:
    return (x.lead == y.lead and x.is_causal == y.is_causal
            and all(a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
                    for a, b in ((x.q, y.q), (x.k, y.k), (x.v, y.v))))


@pytest.mark.parametrize("shape", [(2, 24, 16), (2, 3, 24, 16)], ids=["3-D", "4-D"])
def test_remembered_inputs_give_what_the_full_check_gives(counted, shape):
    q, k, v = (randn(*shape) for _ in range(3))
    strided = randn(*shape[:-1], 32)[..., ::2]  # last stride 2: copied to a unit last stride
    for args in ((q, k, v, True), (q, k, v, True), (strided, k, v, False), (strided, k, v, False)):
        assert _same(function.checked_inputs(*args), check_triton_inputs(*args))
    assert len(counted) == 2  # once per kind of input: (causal, contiguous) and (full, strided q)


def test_other_facts_take_the_full_check_and_its_error(counted):
    q = randn(1, 2, 24, 16)
    function.checked_inputs(q, q, q, True)
    with pytest.raises(ValueError, match="^k must have q's head dim"):
        function.checked_inputs(q, randn(1, 2, 24, 32), randn(1, 2, 24, 32), True)
    with pytest.raises(ValueError, match="^k must have q's dtype"):
        function.checked_inputs(q, q.double(), q, True)
    with pytest.raises(ValueError, match="^is_causal must be a bool"):
        function.checked_inputs(q, q, q, 2)
    assert len(counted) == 4


def test_the_interpreter_mode_is_part_of_the_verdict(counted, monkeypatch):
    # bf16 passes the checks on a GPU and is refused under the interpreter (tl.dot on bit patterns)
    q = torch.randn(1, 2, 24, 16).bfloat16()
    monkeypatch.setattr(function, "interpreting", lambda: False)
    from cs336_systems.attention import flash_triton, inputs

    monkeypatch.setattr(flash_triton, "interpreting", lambda: True)  # CPU tensors pass as the interpreter's
    monkeypatch.setattr(inputs, "interpreting", lambda: False)
    function.checked_inputs(q, q, q, True)
    monkeypatch.setattr(function, "interpreting", lambda: True)
    monkeypatch.setattr(inputs, "interpreting", lambda: True)
    with pytest.raises(ValueError, match="bfloat16 is computed wrongly by the Triton interpreter"):
        function.checked_inputs(q, q, q, True)


def test_a_tensor_subclass_is_checked_every_time(counted):
    p = torch.nn.Parameter(randn(1, 2, 24, 16))
    for _ in range(2):
        function.checked_inputs(p, p, p, True)
    assert len(counted) == 2


def test_a_plan_is_built_once_per_key():
    q = randn(1, 2, 24, 16)
    assert function._plan("fwd", q, q, True) is function._plan("fwd", q.clone(), q.clone(), True)
    assert function._plan("bwd", q, q, True) is not function._plan("bwd", q, q, False)


def test_a_gluon_rule_is_asked_once_per_kind_of_input(monkeypatch):
    # `fast.launch._verdict`: a rule reads only shapes, strides, dtypes and devices (and its options)
    from cs336_systems.attention.fast import launch

    monkeypatch.setattr(launch, "_VERDICTS", {})
    asked = []

    def rule(*args):
        asked.append(args)
        return None if args[0].is_contiguous() else launch.CONTIGUOUS

    x = torch.zeros(1, 2, 8, 4)
    strided = torch.zeros(1, 8, 2, 4).transpose(1, 2)  # a model's (batch, heads, seq, d) view
    for _ in range(3):
        assert launch._verdict(rule, (True,), (x, x)) is None
    assert len(asked) == 1
    assert launch._verdict(rule, (False,), (x, x)) is None and len(asked) == 2  # other options: asked again
    # strided inputs: refused for their strides, then their contiguous copies pass on the
    # remembered verdict of x's facts (the same shapes, strides, dtype and device)
    why, got = launch._gluon_inputs(rule, (True,), strided, strided)
    assert why is None and all(t.is_contiguous() for t in got) and len(asked) == 3
