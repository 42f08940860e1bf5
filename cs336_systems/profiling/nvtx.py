"""Named ranges at three levels, for Nsight Systems (NVTX) or torch.profiler (record_function).

1. the measured region (so warm-up can be filtered out of a timeline),
2. forward / backward / optimizer inside each step,
3. inside attention: the score matmul, the softmax, the output matmul, via an annotated attention
   swapped into every layer with `model.use_attention`.

Nsight Systems cannot run on the GPU machine these results were measured on (no `nsys` there,
and the bundled one cannot write a report), so the numbers on the site come
from the torch.profiler mode; the NVTX ranges stay for anyone who has `nsys`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import ContextManager

import torch

RangeFactory = Callable[[str], ContextManager]
PHASES = ("forward", "backward", "optimizer")
ATTENTION_REGIONS = ("attn_scores", "attn_softmax", "attn_output")
MEASURED = "measured"


def _no_range(name: str) -> ContextManager:
    return contextlib.nullcontext()


@contextlib.contextmanager
def _nvtx_range(name: str):
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


def range_factory(kind: str | None) -> RangeFactory:
    """`name -> context manager` for 'nvtx', 'torch' (record_function), or None (no-op).

    NVTX needs a CUDA build; without one the ranges are no-ops (nothing could record them).
    """
    if kind is None:
        return _no_range
    if kind == "nvtx":
        return _nvtx_range if torch.cuda.is_available() else _no_range
    if kind == "torch":
        return torch.profiler.record_function
    raise ValueError(f"range kind must be 'nvtx', 'torch' or None, got {kind!r}")


# --8<-- [start:annotated_attention]
def annotated_attention(rng: RangeFactory) -> Callable[..., torch.Tensor]:
    """Naive attention with one range per step, so a profile separates matmul from softmax time.

    Same arithmetic as model.naive_attention: Q (..., n_q, d), K and V (..., n_k, d).
    """

    def attention(Q, K, V, mask=None):
        with rng("attn_scores"):
            scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., n_q, n_k)
        with rng("attn_softmax"):
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
        with rng("attn_output"):
            return probs @ V  # (..., n_q, d)

    return attention
# --8<-- [end:annotated_attention]


def attention_flops(batch: int, heads: int, n: int, d_head: int) -> dict[str, float]:
    """FLOPs of the three regions of one (unfused, non-causal-discounted) attention call.

    Matmuls: 2 FLOPs per multiply-add. Softmax: per score about 5 operations (mask, max, subtract,
    exp, sum, divide amortised) - a generous count; the point is the order of magnitude.
    """
    scores = 2.0 * batch * heads * n * n * d_head
    softmax = 5.0 * batch * heads * n * n
    return {"attn_scores": scores, "attn_softmax": softmax, "attn_output": scores}
