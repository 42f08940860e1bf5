"""ddp_bucketed_benchmarking (b): how much communication bucketed DDP leaves exposed, and the bucket
size that minimises it.

Model (the problem's assumptions): s bytes of gradients in n_b equal buckets; an all-reduce of b
bytes costs o + b/w (o: per-call overhead, w: algorithmic bandwidth, payload bytes per second);
computing a bucket's gradients takes as long as communicating it. Then every bucket but the last is
hidden behind the computation of the next one, and what is exposed is each call's fixed cost plus
the transfer of the final bucket:

    overhead(n_b) = n_b·o + s/(n_b·w)

d/dn_b = o - s/(n_b²·w) = 0 gives n_b* = sqrt(s/(w·o)), a bucket size b* = s/n_b* = sqrt(s·w·o),
and a minimum overhead of 2·sqrt(s·o/w): the bucket whose transfer time b/w equals the per-call
overhead times the number of buckets, the same latency/bandwidth balance as the all-reduce curve's
knee (o·w is the size at which a call spends as long in overhead as in transfer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


# --8<-- [start:model]
@dataclass(frozen=True)
class BucketModel:
    s: float  # bytes of gradients all-reduced per step
    w: float  # algorithmic bandwidth, bytes/s
    o: float  # fixed cost per all-reduce call, s

    def __post_init__(self) -> None:
        for name in ("s", "w", "o"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def overhead(self, n_b: float) -> float:
        """Exposed communication time (s) with n_b buckets: n_b·o + s/(n_b·w)."""
        if not n_b >= 1:
            raise ValueError(f"n_b must be >= 1, got {n_b}")
        return n_b * self.o + self.s / (n_b * self.w)

    def overhead_for_bucket(self, bucket_bytes: float) -> float:
        """The same, for a bucket cap: n_b = ceil(s / b), at least 1."""
        return self.overhead(max(1, math.ceil(self.s / bucket_bytes)))

    @property
    def optimal_num_buckets(self) -> float:
        """n_b* = sqrt(s / (w·o)), where the derivative o - s/(n_b²·w) vanishes (at least 1)."""
        return max(1.0, math.sqrt(self.s / (self.w * self.o)))

    @property
    def optimal_bucket_bytes(self) -> float:
        """b* = s / n_b* = sqrt(s·w·o) (or all of s, if one bucket is already best)."""
        return self.s / self.optimal_num_buckets

    @property
    def min_overhead(self) -> float:
        """overhead(n_b*) = 2·sqrt(s·o/w) when n_b* > 1."""
        return self.overhead(self.optimal_num_buckets)
# --8<-- [end:model]


def fit_latency_bandwidth(size_bytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Fit t = o + size/w to all-reduce timings; returns (o seconds, w bytes/s).

    Least squares on relative error (each equation divided by its t), so the 1 MB points, which
    decide o, count as much as the 1 GB points, which decide w. o is clamped at >= 1 ns.
    """
    x, t = np.asarray(size_bytes, float), np.asarray(seconds, float)
    if x.shape != t.shape or x.size < 2 or len(set(x.tolist())) < 2:
        raise ValueError("need timings at two or more distinct sizes")
    if (t <= 0).any() or (x <= 0).any():
        raise ValueError("sizes and times must be positive")
    a = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (o, inv_w), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if inv_w <= 0:
        raise ValueError("the timings do not grow with size; cannot fit a bandwidth")
    return max(float(o), 1e-9), 1.0 / float(inv_w)
