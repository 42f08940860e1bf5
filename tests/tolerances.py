"""Rounding-error bounds that the tests use as tolerances: derived, not tuned to one machine.

The model (Higham, *Accuracy and Stability of Numerical Algorithms*, chapters 2-3): every
floating-point operation returns the exact result of its rounded operands times (1 + delta),
|delta| <= u, the unit roundoff (2^-24 for float32, 2^-53 for float64, 2^-8 for bfloat16). A
product of n such factors (1 + delta_i)^(+-1) lies in [1 - gamma_n, 1 + gamma_n], with

    gamma_n = n u / (1 - n u).

Sums. A sum of n terms, added in ANY order (any tree of n - 1 additions: a sequential loop, a
vectorised loop with 8 or 16 lanes, a blocked BLAS kernel, an all-reduce), gives each term at most
n - 1 such factors, so

    |fl(sum x_i) - sum x_i| <= gamma_{n-1} sum |x_i|          (a dot product of n terms: gamma_n).

The bound is in terms of the magnitude sum |x_i|, not of the sum: where the terms nearly cancel,
the relative error of the result is unbounded, and two CPUs (or two ATen kernel sets, AVX-512 vs
AVX2 vs scalar) that add the same terms in different orders can disagree in the last few bits of
|x_i|, i.e. by much more than the last bit of the result. A tolerance must therefore be a multiple of
the magnitude, never a fixed fraction of the result that happened to hold on one machine.

Chains. A computation built from sums and products (a ReLU MLP's forward, loss gradient and
backward) is, expanded, a sum of products of inputs; each product picks up at most N rounding
factors, N the number of roundings along the longest path, so the same bound holds with sum |x_i|
replaced by the computation run on absolute values: every weight, input and bias made
non-negative, every subtraction an addition, each ReLU replaced by the 0/1 mask it applied (a
product by an exact constant), tanh dropped (|tanh z| <= |z|, slope <= 1, its own rounding counted
in N). `mlp_gradient_magnitude` runs that network. Two evaluations of the same gradient, one in
float32 and one in float64, each lie within their own gamma_N of the exact value, so they differ by
at most (gamma_N(float32) + gamma_N(float64)) times that magnitude. (The one assumption: no ReLU
input lies within rounding of 0, where the two evaluations could take different branches; the
tests' seeded data do not put one there, and a failure would name the element.) On the toy models
the bound is under 1% of the largest gradient element: loose against rounding (the worst case adds
every error with the same sign), tight against any bug (a gradient not averaged is off by 50%).

Underflow. The relative model holds for results in the normal range. A result below the smallest
normal number (float16: 2^-14 ~ 6.1e-5) is stored as a subnormal, on a fixed grid of spacing
2^-24 for float16, so its rounding error is absolute: fl(x) = x (1 + delta) + eta, |eta| <= half
that spacing (Higham, section 2.1). A product of two N(0, 1) values falls there about four times in
10,000; bfloat16 and float32 share float32's exponent range, where it takes values below 1e-38.

Where a test compares two computations that perform the *same* operations on the *same* values,
the bound is 0: IEEE arithmetic is deterministic, each operation is correctly rounded, and a + b ==
b + a exactly; multiplying or dividing by a power of two is exact (barring under/overflow).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: half the gap between 1 and the next representable number (2^-24 for float32)."""
    return torch.finfo(dtype).eps / 2


def underflow_error(dtype: torch.dtype) -> float:
    """eta: the largest absolute error of rounding a result into `dtype`'s subnormal range, half the
    smallest subnormal: 2^-25 for float16, 2^-134 (~4.6e-41) for bfloat16, 2^-150 (~7.0e-46) for float32."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps / 2


def gamma(n: int, dtype: torch.dtype) -> float:
    """gamma_n = n u / (1 - n u): the relative error of n compounded roundings in `dtype`."""
    nu = n * unit_roundoff(dtype)
    if n < 0 or nu >= 1:
        raise ValueError(f"n must be in [0, 1/u) for {dtype}, got {n}")
    return nu / (1 - nu)


def sum_bound(n_terms: int, dtype: torch.dtype, magnitude):
    """Worst error of a sum (or dot product) of `n_terms` terms in `dtype`, in any order:
    gamma_n times `magnitude` = sum |terms| (a float, or a tensor of per-element magnitudes)."""
    return gamma(n_terms, dtype) * magnitude


# -- gradients of the toy MLPs: a bound per element ------------------------------------------------

class _ReplayReluMasks(nn.Module):
    """Stands in for a ReLU module in the magnitude network: multiplies by the masks (input > 0) the
    real network's ReLU produced, call by call (one ReLU module may serve several layers)."""

    def __init__(self, masks: list[torch.Tensor]):
        super().__init__()
        self.masks, self.calls = masks, 0

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        mask = self.masks[self.calls]
        self.calls += 1
        return z * mask


def _record_relu_masks(model: nn.Module, x: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """Run `model` on `x` in float64 and return, per ReLU module, the mask of every call."""
    masks: dict[str, list[torch.Tensor]] = {}
    handles = [m.register_forward_hook(lambda m, inp, out, name=name: masks.setdefault(name, []).append(
                   (inp[0] > 0).double()))
               for name, m in model.named_modules() if isinstance(m, nn.ReLU)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return masks


def _magnitude_network(model: nn.Module, masks: dict[str, list[torch.Tensor]]) -> nn.Module:
    """A float64 copy with |weights| and |buffers|, ReLU replaced by its recorded masks, tanh
    dropped; anything but Linear, ReLU and Tanh layers is refused."""
    net = copy.deepcopy(model).double()
    for name, module in list(net.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.ReLU):
                setattr(module, child_name, _ReplayReluMasks(masks.get(full, [])))
            elif isinstance(child, nn.Tanh):
                setattr(module, child_name, nn.Identity())
            elif not isinstance(child, nn.Linear) and not list(child.children()):
                raise ValueError(f"the magnitude network knows Linear, ReLU and Tanh layers; "
                                 f"{full} is a {type(child).__name__}")
    with torch.no_grad():
        for t in [*net.parameters(), *net.buffers()]:
            t.abs_()
    return net


def mlp_rounding_depth(model: nn.Module, batch: int, extra_terms: int = 0) -> int:
    """An upper bound N on the roundings along any path of an MLP's forward, MSE-loss gradient,
    backward and weight-gradient sum over the batch.

    A weight-gradient term passes the forward twice (once for the activation it multiplies, once
    for the output its loss gradient comes from: a dot of in_features terms and a bias add per
    layer), the backward once (a dot of out_features terms per layer) and the sum over the `batch`
    rows; 8 more per layer and for the loss cover the elementwise steps (input scaling, tanh to
    within 4 ulps, out - y, times 2/n). `extra_terms` adds steps the caller makes after backward
    (accumulating micro-batches, the all-reduce's addition).
    """
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    per_layer = sum(2 * (m.in_features + 1) + m.out_features + 8 for m in linears)
    return per_layer + batch + 8 + extra_terms


def mlp_gradient_magnitude(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per trainable parameter, the sum of |terms| of its MSE-loss gradient (float64): the gradient
    of the same network on absolute values (see the module docstring), run on a copy."""
    net = _magnitude_network(model, _record_relu_masks(copy.deepcopy(model).double(), x.double()))
    out = net(x.double().abs())  # (batch, out): the magnitude of every output's forward sum
    # d(mean (out - y)^2)/d out = 2 (out - y) / numel: its magnitude uses |out| + |y|
    grad_out = 2 * (out.detach() + y.double().abs()) / out.numel()
    out.backward(grad_out)
    return {n: p.grad for n, p in net.named_parameters() if p.grad is not None}


def float32_vs_float64_gradient_bound(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                                      n_roundings: int) -> dict[str, torch.Tensor]:
    """Per trainable parameter, how far a float32 and a float64 evaluation of the MSE-loss gradient
    may differ elementwise: (gamma_N(float32) + gamma_N(float64)) * magnitude."""
    factor = gamma(n_roundings, torch.float32) + gamma(n_roundings, torch.float64)
    return {n: factor * m for n, m in mlp_gradient_magnitude(model, x, y).items()}


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound, what: str) -> None:
    """|actual - expected| <= bound elementwise (bound a float or a broadcastable tensor), compared
    in float64; the message names the worst element and how far past its bound it is."""
    diff = (actual.double() - expected.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64)
    excess = diff - bound
    if excess.numel() and excess.max() > 0:
        i = int(excess.argmax())
        b = bound.expand_as(diff).flatten()[i].item()
        raise AssertionError(f"{what}: {int((excess > 0).sum())} of {diff.numel()} elements past the "
                             f"bound; worst at flat index {i}: |diff| {diff.flatten()[i].item():.3g} > "
                             f"bound {b:.3g}")


def assert_relative_error(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    """Normwise: ||actual - expected|| / ||expected|| (Frobenius, in float64) at most `tol`."""
    err = ((actual.double() - expected.double()).norm() / expected.double().norm()).item()
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


# -- the Transformer LM: roundings along the longest path ------------------------------------------

def transformer_rounding_depth(cfg, seq: int, batch: int, backward: bool = True) -> int:
    """An upper bound N on the roundings along any path from the inputs to a logit (and, with
    `backward`, on to a parameter gradient) of the Transformer LM with config `cfg`.

    One block's longest path: RMSNorm (a sum of d_model squares, then sqrt, eps, divide, scale: d + 5),
    a projection (d_model), RoPE (3), Q K^T (d_head) and its scale (1), softmax (exp, a sum of seq
    terms, divide: seq + 3), P V (seq), the output projection (d_model), the residual add (1), the
    second RMSNorm (d + 5), W1 (d_model), SiLU and the gate product (5), W2 (d_ff), the residual (1).
    Then the final RMSNorm and the LM head (2 d + 5), and the loss's logsumexp over the vocabulary.
    The backward retraces the path once more and sums each weight gradient over the batch's tokens.
    """
    d, d_head = cfg.d_model, cfg.d_model // cfg.num_heads
    block = 5 * d + d_head + 2 * seq + cfg.d_ff + 25
    forward = cfg.num_layers * block + 2 * d + 5
    if not backward:
        return forward
    return 2 * (forward + cfg.vocab_size + 6) + batch * seq


# -- one AdamW step after another, elementwise: roundings along the longest path ----------------------

def compound_gamma(counts: dict[torch.dtype, int]) -> float:
    """The relative error of a path with counts[dtype] roundings in each dtype (float32 arithmetic
    whose results are stored in bfloat16, say): the product of the factors (1 + gamma_n(dtype)), less 1."""
    out = 1.0
    for dtype, n in counts.items():
        out *= 1 + gamma(n, dtype)
    return out - 1


def adamw_rounding_depth(steps: int) -> dict[str, int]:
    """An upper bound on the roundings along any path of an AdamW run of `steps` steps, elementwise,
    in the arithmetic dtype: {"exp_avg": ..., "exp_avg_sq": ..., "param": ...}.

    Per step, with host scalars (beta1, 1 - beta1, lr / (1 - beta1^t), ...) each rounded once to the
    arithmetic dtype when they meet a tensor:
      m: at most 4 per step: a scalar, a product, a sum; or, written as the lerp m + w (g - m), the
         difference, w, the product, the sum. (The lerp form expands into the terms m, w g and -w m:
         its magnitude recursion is (1 + w) M + w |g|, not (1 - w) M + w |g|.)
      v: at most 4 per step: the new term (1 - beta2) g g has a scalar and two products, plus the sum.
         All of v's terms are >= 0: its error is relative to v itself.
      denominator sqrt(v) / sqrt(1 - beta2^t) + eps: v's path (the sqrt of a product of k factors
         (1 + d)^(+-1) is a product of k factors (1 + d)^(+-1/2), within gamma_k), then the sqrt, the
         host scalar, the division, eps, the sum: 5. Both terms >= 0: again relative.
      update step_size m / denom: step_size, the product, the division (the denominator's factors
         enter as (1 + theta)^-1): 3, plus 1 for the subtraction from p.
      p carried: p (1 - lr wd), a scalar and a product, then the subtraction: 3 per step.
    The update of step t reaches p_T through 4t (m) + 4t (v) + 5 + 3 + 1 + 3 (T - t) roundings,
    at most 8T + 9 at t = T; p_0 through 3T. The gradients are given: no feedback through p.
    A storage dtype coarser than the arithmetic one adds, per step, one rounding of each of m, v, p
    at the store: m_T and v_T see T of them, p_T at most 2T + 1 (t of m's and v's in step t's
    update, then T - t + 1 of p's).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return {"exp_avg": 4 * steps, "exp_avg_sq": 4 * steps, "param": 8 * steps + 9,
            "param_stores": 2 * steps + 1, "moment_stores": steps}
