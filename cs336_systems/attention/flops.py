"""FLOP counts of attention, with FlashAttention's convention (so TFLOP/s compare with the papers).

forward = 4 * batch * heads * n_q * n_k * d (two matmuls of 2*n_q*n_k*d), halved under a causal
mask; backward = 2.5 x forward (five matmuls, the forward's two recomputed for P is not counted);
forward+backward = 3.5 x forward.
"""

from __future__ import annotations

MODES = ("fwd", "bwd", "fwd_bwd")
_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def attention_flops(batch_heads: int, n_queries: int, n_keys: int, head_dim: int, causal: bool,
                    mode: str = "fwd") -> float:
    if mode not in _FACTOR:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    forward = 4.0 * batch_heads * n_queries * n_keys * head_dim * (0.5 if causal else 1.0)
    return forward * _FACTOR[mode]


def tflops(flops: float, ms: float | None) -> float | None:
    return None if not ms else flops / (ms * 1e-3) / 1e12
