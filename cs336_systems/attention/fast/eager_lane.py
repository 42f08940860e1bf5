"""The eager lane: an eager call's launches prepared once per kind of input.

Every eager forward+backward of `FlashAttentionFast` asks the same questions: are the inputs
valid, which plan does the table give, do the Gluon kernels take them, what grid, constexprs and
tensor-map geometry does each launch need, and (inside each launch) what is its launch key. Where
the GPU's kernels are short (the grid's 4k cells) the GPU waits for those answers: do_bench's time
there is about the host's time up to the backward's launch plus the backward kernel (the runs page).
All of them depend only on the inputs' shapes, strides, dtypes and devices and on the mask, so
`lane_for` answers them at the first call of each kind of input and keeps a `GluonLane`, whose
`forward` and `backward` then allocate the outputs and launch:

    forward:   O, L = the Gluon forward                            (gluon/fwd_ws.py)
    backward:  Delta = rowsum(O * dO); dQ, dK, dV = the backward   (triton_launch, gluon/bwd128_ws.py)

A lane exists for inputs whose tuned plans are Gluon kernels both ways at head dim 128 (the
Llama-style shapes; d = 64 keeps the general path), (batch, heads, seq, d) or (batch, seq, d), which
it runs as one head (the Function unsqueezes them). Anything else gets None and takes the general
path of `function.py`, which checks, copies and warns as before; the first sight of a kind of
input runs those same checks here, so a bad input raises naming the argument either way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..flash_triton import check_triton_inputs
from ..triton_loader import interpreting
from .launch import _verdict, gluon_bwd_supported
from .tuned import plan_for


class GluonLane:
    """The Gluon forward and backward of one kind of contiguous (Z, H, N, 128) input."""

    def __init__(self, q: Tensor, k: Tensor, is_causal: bool, fwd, bwd):
        from .gluon import bwd128_ws, fwd_ws
        from .triton_launch import prepare_preprocess

        Z, H, n_q, d = q.shape
        n_k = k.shape[2]
        self.fwd = fwd_ws.prepare(Z * H, n_q, n_k, d, q.dtype, is_causal, fwd.block_n, fwd.stages, fwd.warpgroups,
                                  q.device)
        self.pre = prepare_preprocess(Z, H, n_q, d)
        self.bwd = bwd128_ws.prepare(Z * H, n_q, n_k, d, q.dtype, is_causal, bwd.stages, bwd.slots)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """O (Z, H, n_q, d) and L (Z, H, n_q) fp32."""
        return self.fwd.run(q, k, v)

    def backward(self, q, k, v, o, L, do) -> tuple[Tensor, Tensor, Tensor]:
        """dQ, dK, dV; dO in any layout of O's shape and dtype (the kernels read it contiguous, and
        by TMA, which needs 16-byte aligned rows)."""
        if not do.is_contiguous() or do.data_ptr() & 15:
            do = do.clone(memory_format=torch.contiguous_format)
        return self.bwd.run(q, k, v, do, L, self.pre.run(o, do))


_LANES: dict[tuple, GluonLane | None] = {}  # the facts of a kind of input -> its lane (None: none)
MAX_LANES = 4096  # kinds of inputs remembered (a training run has a handful)
_UNSEEN = object()


def lane_for(q, k, v, is_causal) -> GluonLane | None:
    """The lane of these inputs' kind, or None where the general path runs them."""
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor or type(is_causal) is not bool:
        return None  # tensor subclasses, masks given as tensors or ints: the general path's checks
    facts = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
             k.device, v.device, is_causal)
    lane = _LANES.get(facts, _UNSEEN)
    if lane is _UNSEEN:
        if len(_LANES) >= MAX_LANES:
            _LANES.clear()
        lane = _LANES[facts] = _build(q, k, v, is_causal)
    if lane is not None and (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15:
        return None  # rows off 16-byte alignment, which the tensor maps need: the general path says so
    return lane


def _build(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> GluonLane | None:
    if interpreting():
        return None
    check_triton_inputs(q, k, v, is_causal)  # raises, naming the argument
    if q.dim() == 3:  # one head, as the Function passes it (views, never copies: the rules below
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)  # judge the caller's memory)
    if q.dim() != 4 or q.shape[-1] != 128:
        return None
    fwd, bwd = plan_for("fwd", q, k, is_causal).gluon, plan_for("bwd", q, k, is_causal).gluon
    if fwd is None or bwd is None:
        return None
    from .gluon.fwd_ws import fwd_ws_supported

    # dO is asked as a tensor of q's shape, dtype and layout: the backward makes it contiguous
    if _verdict(fwd_ws_supported, (fwd.block_n,), (q, k, v)) is not None or \
            _verdict(gluon_bwd_supported, (is_causal,), (q, k, v, q)) is not None:
        return None
    return GluonLane(q, k, is_causal, fwd, bwd)
