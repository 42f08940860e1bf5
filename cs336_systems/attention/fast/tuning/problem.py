"""The problem the tuner and the A/B experiments time: random inputs at one shape, the forward's O
and L, and Delta; and how far one result is from another.

    DEVICE = "cuda"   # a dry run of a whole flow on the CPU interpreter sets "cpu" (tests do)
"""

from __future__ import annotations

import torch

from ...flash_launch import launch_fwd, launch_preprocess

DEVICE = "cuda"


def inputs(Z: int, N: int, d: int, dtype: torch.dtype, seed: int = 0):
    """q, k, v, dO of shape (Z, 1, N, d) on DEVICE."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return tuple(torch.randn(Z, 1, N, d, device=DEVICE, dtype=dtype, generator=g) for _ in range(4))


def prepare(Z: int, N: int, d: int, dtype: torch.dtype, causal: bool = True):
    """(q, k, v, dO, O, L, Delta): what every backward kernel reads, from the default forward."""
    q, k, v, do = inputs(Z, N, d, dtype)
    o, L = launch_fwd(q, k, v, causal)
    return q, k, v, do, o, L, launch_preprocess(o, do)


def rel_err(a, b) -> float:
    """Frobenius error of a against b, relative to b; tensors, or tuples of them compared as one."""
    a, b = (t.float() if isinstance(t, torch.Tensor) else torch.cat([x.float().flatten() for x in t]) for t in (a, b))
    return float((a - b).norm() / b.norm().clamp_min(1e-12))
