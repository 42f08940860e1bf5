"""Why a full batch and two half batches give gradients that differ in the last bit, whatever the
data-parallel code: one 20-row reduction is not two 10-row reductions added.

The course's 2026 `test_fsdp_correctness[fp32]` trains a toy model in one process on the full batch
and on two gloo ranks with half the batch each, and asserts `torch.equal` between the weights. On
a CPU it fails after the first step, by one or two units in the last place of a linear layer's
weight, for our FSDP and for the plainest data parallelism alike. A weight's gradient is
dY^T X, a sum over the batch's rows. MKL's AVX-512 kernels (this machine's default) sum them with
fused multiply-adds in row order, one accumulator per element, so the full batch rounds one
sequence of 20 partial sums while the ranks round two sequences of 10 and then their sum (its AVX2
kernels take other orders: a plain 20-row mm, two lanes of even and odd rows added; the course
Linear's einsum layout, neither; the conclusion is the same). Everything else is the same number:
each row's activation and output gradient agree bit for bit between the full and the half batch
(the mean loss scales the half batch's by exactly 2), and gloo's sum of two floats is the
correctly rounded one.

So an implementation can pass that assertion only by not splitting the reduction: each rank
gathering the rows and computing the full batch's products itself (then it is not data parallel:
it communicates activations and does all the work twice), or continuing the other rank's accumulators
with a hand-written kernel in the BLAS's own order (shape- and instruction-set-specific; MKL's
addmm adds its C after the product, so not even addmm does it). The tests below show each step on
a toy model of the course's layer classes (tests/course_standins.py), independent of our FSDP.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.distributed.launch import Worker, spawn
from tests.course_standins import Embedding, Linear, RMSNorm

ROWS, HALF = 20, 10
BATCH, SEQ = 4, 5          # 20 rows: each rank gets 2 sequences of 5
VOCAB, D, HIDDEN = 16, 8, 12
U = 2.0**-24               # fp32 unit roundoff


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound on n roundings in a row."""
    return n * U / (1 - n * U)


# -- the arithmetic alone, emulated exactly --------------------------------------------------------

# --8<-- [start:fma]
def fma_lanes(a: np.ndarray, b: np.ndarray, lanes: int = 1, start: list | None = None) -> list[np.ndarray]:
    """sum_k a[k] (x) b[k] in `lanes` fp32 accumulators per element, row k going to lane k % lanes,
    one fused multiply-add per row in row order, from `start` (zeros if None). Emulated in float64:
    the product of two floats is exact there, and the one rounding of the add to fp32 is the FMA's
    (a second rounding could only differ at an exact fp32 midpoint, which these random inputs do not
    hit: the BLAS checks below agree element for element)."""
    shape = (a.shape[1], b.shape[1])
    acc = [np.zeros(shape, np.float32) for _ in range(lanes)] if start is None else list(start)
    for k in range(a.shape[0]):
        product = np.outer(a[k].astype(np.float64), b[k].astype(np.float64))
        acc[k % lanes] = (acc[k % lanes].astype(np.float64) + product).astype(np.float32)
    return acc
# --8<-- [end:fma]


def lanes_sum(acc: list[np.ndarray]) -> np.ndarray:
    """The lanes added in order, each add rounded to fp32."""
    out = acc[0]
    for lane in acc[1:]:
        out = (out.astype(np.float64) + lane).astype(np.float32)
    return out


def product(a: np.ndarray, b: np.ndarray, lanes: int) -> np.ndarray:
    return lanes_sum(fma_lanes(a, b, lanes))


def _rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.standard_normal((ROWS, 11)).astype(np.float32), g.standard_normal((ROWS, 7)).astype(np.float32)


# --8<-- [start:arithmetic]
@pytest.mark.parametrize("lanes", [1, 2], ids=["one-chain", "two-lanes"])
def test_one_sum_of_twenty_rows_is_not_two_sums_of_ten_added(lanes):
    dy, x = _rows()
    full = product(dy, x, lanes)
    halves = (product(dy[:HALF], x[:HALF], lanes) + product(dy[HALF:], x[HALF:], lanes)).astype(np.float32)
    assert (full != halves).any(), "the two orders round differently somewhere"
    # Any order of n - 1 additions is within gamma_(n-1) sum|terms| of the exact sum (Higham, 4.2;
    # the FMA's products are exact): |full - S| <= gamma_19 M, |halves - S| <= (gamma_9 + u(1 + gamma_9)) M
    magnitude = np.abs(dy.astype(np.float64)).T @ np.abs(x.astype(np.float64))
    bound = (gamma(ROWS) + gamma(HALF) + U * (1 + gamma(HALF))) * magnitude
    assert (np.abs(full.astype(np.float64) - halves) <= bound).all()
    # The one split that reproduces the full sum: the second half continuing the first's accumulators.
    first = fma_lanes(dy[:HALF], x[:HALF], lanes)
    assert np.array_equal(lanes_sum(fma_lanes(dy[HALF:], x[HALF:], lanes, start=first)), full)
# --8<-- [end:arithmetic]


def backward_lanes() -> int | None:
    """How this BLAS sums the course Linear's 20-row weight gradient: 1 (one FMA chain), 2 (two
    lanes added), None (neither: MKL's AVX2 kernels, for one, take the einsum's layout another way)."""
    dy, x = (torch.from_numpy(t) for t in _rows(1))
    layer = Linear(x.shape[1], dy.shape[1])
    layer(x).backward(dy)  # the course's Linear: y = x W^T by einsum, so dW = dY^T X
    got = layer.weight.grad.numpy()
    return next((n for n in (1, 2) if np.array_equal(got, product(dy.numpy(), x.numpy(), n))), None)


LANES = backward_lanes()
needs_known_order = pytest.mark.skipif(
    LANES is None, reason="this BLAS sums the 20-row weight gradient in neither order emulated here "
                          "(MKL's AVX-512 kernels, this machine's default, use one FMA chain)")


@needs_known_order
def test_this_blas_sums_a_weight_gradient_in_row_order_and_addmm_does_not_continue_it():
    dy, x = (torch.from_numpy(t) for t in _rows(2))
    layer = Linear(x.shape[1], dy.shape[1])
    layer(x).backward(dy)
    assert torch.equal(layer.weight.grad, torch.from_numpy(product(dy.numpy(), x.numpy(), LANES)))
    first = dy[:HALF].T @ x[:HALF]
    continued = torch.addmm(first, dy[HALF:].T, x[HALF:])  # beta * C + A B: C added after the product
    assert torch.equal(continued, first + dy[HALF:].T @ x[HALF:])
    assert not torch.equal(continued, dy.T @ x)


# -- a toy model of the course's layer classes, full batch against half batches -------------------

class Toy(nn.Module):
    """Embedding, RMSNorm, linear1, ReLU, linear2: token ids (batch, seq) -> logits (batch, seq, VOCAB)."""

    def __init__(self):
        super().__init__()
        self.embedding = Embedding(VOCAB, D)
        self.norm = RMSNorm(D)
        self.linear1 = Linear(D, HIDDEN)
        self.linear2 = Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        return self.linear2(torch.relu(self.linear1(self.norm(self.embedding(tokens)))))


def _toy() -> Toy:
    torch.manual_seed(0)
    return Toy()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
            torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))


def _gradients(model: nn.Module, x, y, capture: dict | None = None) -> dict[str, torch.Tensor]:
    """The mean cross-entropy's gradients; with `capture`, linear1's input rows and output gradient."""
    hooks = []
    if capture is not None:
        hooks = [model.linear1.register_forward_hook(
                     lambda m, inp, out: capture.__setitem__("x", inp[0].detach().reshape(-1, D))),
                 model.linear1.register_full_backward_hook(
                     lambda m, gin, gout: capture.__setitem__("dy", gout[0].detach().reshape(-1, HIDDEN)))]
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
    for h in hooks:
        h.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return before


def _full_and_halves():
    before = _one_thread()
    try:
        model, (x, y) = _toy(), _batch()
        full_rows, half_rows = {}, [{}, {}]
        full = _gradients(model, x, y, full_rows)
        halves = [_gradients(model, x[2 * r:2 * r + 2], y[2 * r:2 * r + 2], half_rows[r]) for r in (0, 1)]
    finally:
        torch.set_num_threads(before)
    mean = {n: (halves[0][n] + halves[1][n]) / 2 for n in full}
    return full, mean, full_rows, half_rows


def test_the_full_batch_gradient_is_not_the_mean_of_the_half_batch_ones():
    """The course test's failure in one process, with no communication at all: the linear weights'
    gradients differ, by rounding only. Bound: both sides are within rounding of the exact
    sum_k dy_k x_k^T, the full batch by gamma_19 M, the halves by gamma_9 M plus the final add's u,
    M = sum_k |dy_k| |x_k|; a row's own values may also round differently in a batch of 10 (their
    products then by 2u more at most): (gamma_20 + gamma_10 + 3u) M in all."""
    full, mean, rows, _ = _full_and_halves()
    assert not torch.equal(full["linear1.weight"], mean["linear1.weight"])
    magnitude = rows["dy"].abs().double().T @ rows["x"].abs().double()
    bound = (gamma(ROWS) + gamma(HALF) + 3 * U) * magnitude
    assert ((full["linear1.weight"] - mean["linear1.weight"]).abs().double() <= bound).all()


# --8<-- [start:rows]
@needs_known_order
def test_the_rows_agree_and_only_the_sum_over_rows_differs():
    """Full batch against the mean of the two halves' gradients, in one process: the same row
    values (the half batch's output gradients exactly twice the full batch's: mean over 10 rows
    instead of 20), and linear1's gradient exactly the 20-row sum against the halves' sum."""
    full, mean, full_rows, half_rows = _full_and_halves()
    for r in (0, 1):
        rows = slice(HALF * r, HALF * (r + 1))
        assert torch.equal(half_rows[r]["x"], full_rows["x"][rows])
        assert torch.equal(half_rows[r]["dy"], 2 * full_rows["dy"][rows])  # doubling is exact
    dy, xs = full_rows["dy"].numpy(), full_rows["x"].numpy()
    assert torch.equal(full["linear1.weight"], torch.from_numpy(product(dy, xs, LANES)))
    split = product(dy[:HALF], xs[:HALF], LANES) + product(dy[HALF:], xs[HALF:], LANES)
    assert torch.equal(mean["linear1.weight"], torch.from_numpy(split.astype(np.float32)))
# --8<-- [end:rows]


def test_the_full_batch_reference_is_deterministic():
    """Three SGD steps on the full batch, twice: bit for bit the same. The reference side of the
    course's assertion is not where the difference comes from."""
    def train() -> dict[str, torch.Tensor]:
        model, (x, y) = _toy(), _batch()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            _gradients(model, x, y)
            opt.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    before = _one_thread()
    try:
        first, second = train(), train()
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(first[n], second[n]) for n in first)


# -- two gloo ranks: the plainest data parallelism, and the one scheme that matches -----------------

def _ranks(worker: Worker) -> dict:
    """Each rank's half-batch gradients all-reduced and halved (data parallelism: what any DDP or
    FSDP reduces), and the full batch's gradients computed from the gathered token rows."""
    model, (x, y) = _toy(), _batch()
    mine = _gradients(model, x[2 * worker.rank:2 * worker.rank + 2], y[2 * worker.rank:2 * worker.rank + 2])
    reduced = {}
    for name, g in mine.items():
        dist.all_reduce(g)
        reduced[name] = g / worker.world_size
    parts_x = [torch.empty_like(x[:2]) for _ in range(worker.world_size)]
    parts_y = [torch.empty_like(y[:2]) for _ in range(worker.world_size)]
    dist.all_gather(parts_x, x[2 * worker.rank:2 * worker.rank + 2].contiguous())
    dist.all_gather(parts_y, y[2 * worker.rank:2 * worker.rank + 2].contiguous())
    gathered = _gradients(model, torch.cat(parts_x), torch.cat(parts_y))
    return {"reduced": reduced, "gathered": gathered}


@pytest.mark.distributed
def test_two_gloo_ranks_reduce_to_the_halves_sum_and_only_gathering_the_rows_matches():
    ranks = spawn(_ranks, 2, timeout_s=120, threads_per_rank=1)
    before = _one_thread()
    try:
        model, (x, y) = _toy(), _batch()
        full = _gradients(model, x, y)
        halves = [_gradients(model, x[2 * r:2 * r + 2], y[2 * r:2 * r + 2]) for r in (0, 1)]
    finally:
        torch.set_num_threads(before)
    for rank in ranks:
        for name in full:
            # gloo's sum of two floats is the correctly rounded one, as in this process
            assert torch.equal(rank["reduced"][name], (halves[0][name] + halves[1][name]) / 2), name
            # every rank computing the whole batch's sums itself: the full batch, bit for bit
            assert torch.equal(rank["gathered"][name], full[name]), name
        assert not torch.equal(rank["reduced"]["linear1.weight"], full["linear1.weight"])
