"""The shipped table's plan for an input (`tuned_configs.TUNED`, looked up by `table.lookup`),
built once per key: an eager call then builds no plan objects on the host."""

from __future__ import annotations

import functools

import torch

from ..triton_loader import interpreting
from .table import lookup, size_class
from .tuned_configs import TUNED


# `interpreter` is part of the key: the interpreter picks its own tiles.
@functools.cache
def tuned_plan(kind: str, dtype: torch.dtype, d: int, is_causal: bool, size: str, interpreter: bool):
    return lookup(TUNED, kind, dtype, d, is_causal, size)


def plan_for(kind: str, q: torch.Tensor, k: torch.Tensor, is_causal: bool):
    """The table's "fwd" or "bwd" plan for 4-D (Z, H, N, d) q and k."""
    Z, H, n_q, d = q.shape
    return tuned_plan(kind, q.dtype, d, is_causal, size_class(Z * H, n_q, k.shape[2]), interpreting())
