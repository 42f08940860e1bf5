"""Our FlashAttention as a torch.library custom op (attention/fast/op.py): forward and gradients
against a float64 reference, the op's registrations (schema, fake, autograd) as torch checks them,
and torch.compile tracing it as one node.

On a CPU the kernels run under the Triton interpreter (fp32); on a GPU the same tests run the
compiled kernels, and bf16 is added. The op runs the same launches as FlashAttentionFast, so the
tolerances are test_flash_attention's (derived there).
"""

from __future__ import annotations

import pytest
import torch

from tests.test_flash_attention import assert_close_rel, make_qkv, reference, tolerance
from tests.triton_mode import DEVICE, ON_GPU, pytestmark  # noqa: F401

pytest.importorskip("triton")

from cs336_systems.attention.fast import op  # noqa: E402

SHAPES = [(2, 3, 20, 20, 16), (1, 2, 33, 33, 32), (2, 2, 17, 40, 16)]  # lengths no tile divides
DTYPES = [torch.float32] + ([torch.bfloat16] if ON_GPU else [])  # the interpreter has no bf16


def _check(shape, is_causal, dtype, fn):
    batch, heads, n_q, n_k, d = shape
    (q, k, v), do = make_qkv(batch, heads, n_q, n_k, d, dtype)
    o_ref, L_ref, *grads_ref = reference(q, k, v, do, is_causal)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, L = fn(q, k, v, is_causal)
    o.backward(do)
    tol = tolerance(dtype, "triton")
    assert o.dtype == dtype and o.shape == q.shape and o.is_contiguous()
    assert L.dtype == torch.float32 and L.shape == q.shape[:-1]  # fp32 L in every dtype
    assert_close_rel(o, o_ref, tol, "O")
    assert_close_rel(L, L_ref, tolerance(torch.float32, "triton") if dtype == torch.float32 else tol, "L")
    for name, t, ref in zip(("dQ", "dK", "dV"), (q, k, v), grads_ref):
        assert t.grad.dtype == dtype and t.grad.shape == t.shape
        assert_close_rel(t.grad, ref, tol, name)


CASES = [(s, c) for s in SHAPES for c in (False, True) if not c or s[2] == s[3]]  # causal: square


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,is_causal", CASES, ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_op_forward_and_gradients_match_float64(shape, is_causal, dtype):
    _check(shape, is_causal, dtype, op.flash_attention_fwd)


@pytest.mark.parametrize("is_causal", [False, True])
def test_op_under_compile_is_one_graph_with_the_same_gradients(is_causal):
    """fullgraph=True: dynamo must trace the op without a break; aot_eager runs the traced forward
    and the backward AOT autograd derived from the registered formula on the op's own kernels."""
    torch._dynamo.reset()
    compiled = torch.compile(op.flash_attention_fwd, backend="aot_eager", fullgraph=True)
    _check(SHAPES[0], is_causal, torch.float32, compiled)


def test_the_ops_registrations_pass_torchs_own_checks():
    # schema, fake (meta) implementation vs the real one, autograd registration, AOT dispatch
    (q, k, v), _ = make_qkv(1, 2, 20, 20, 16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(op.FORWARD_OP, (q, k, v, True))
    o, L = op.flash_attention_fwd(q, k, v, True)
    do = torch.randn_like(o)
    torch.library.opcheck(op.BACKWARD_OP, (q.detach(), k.detach(), v.detach(), o.detach(), L, do, True))


def test_L_is_an_output_without_a_gradient():
    (q, k, v), _ = make_qkv(1, 2, 20, 20, 16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, L = op.flash_attention_fwd(q, k, v, True)
    assert o.requires_grad and not L.requires_grad  # marked non-differentiable: dS += dL P is not computed


def test_three_d_inputs_are_one_head():
    (q, k, v), do = make_qkv(2, None, 20, 20, 16)
    o = op.flash_attention_op(q, k, v, True)
    o4, _ = op.flash_attention_fwd(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), True)
    assert o.shape == q.shape and torch.equal(o, o4.squeeze(1))  # the same launch: the same bits


@pytest.mark.parametrize("fake", [False, True], ids=["eager", "fake"])
def test_bad_inputs_raise_value_error_naming_the_argument(fake):
    (q, k, v), _ = make_qkv(1, 2, 20, 20, 16)
    if fake:  # what compile's tracing sees: the fake implementation checks too
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        q, k, v = (mode.from_tensor(t) for t in (q, k, v))
    else:
        mode = None
    with mode if mode is not None else torch.no_grad():
        with pytest.raises(ValueError, match="k must have q's head dim"):
            op.flash_attention_fwd(q, k[..., :8].contiguous(), v, True)
        with pytest.raises(ValueError, match="v must have q's dtype"):
            op.flash_attention_fwd(q, k, v.double(), True)
