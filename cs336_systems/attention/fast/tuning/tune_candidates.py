"""The tuner's search space: per kernel, the candidate settings timed for a table key, and the
launch plans built from them (`tune` times them; `tune.choose` picks).
"""

from __future__ import annotations

import itertools

import torch

from ...tiles import BwdConfig, FwdConfig, heuristic_bwd, heuristic_fwd
from ..plans import BwdPlan, FwdPlan, GluonBwdConfig, GluonFwdConfig


# --8<-- [start:candidates]
def fwd_candidates(dtype: torch.dtype, d: int, wide: bool) -> list[FwdConfig]:
    if wide:
        return [FwdConfig(m, n, w, s) for m, n, w, s in itertools.product(
            (64, 128), (32, 64, 128), (4, 8), (2, 3, 4))]
    if dtype == torch.float32:
        return [FwdConfig(*c) for c in ((64, 32, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2), (64, 32, 8, 2),
                                        (32, 16, 4, 2), (128, 32, 8, 2))]
    return [FwdConfig(*c) for c in ((128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                    (64, 32, 4, 2), (128, 32, 4, 3))]


def dkdv_candidates(dtype: torch.dtype, d: int, wide: bool) -> list[tuple[int, int, int, int]]:
    """(block_m1, block_n1, warps, stages) of the dK/dV pass."""
    if wide:
        return list(itertools.product((16, 32, 64), (64, 128), (4, 8), (2, 3, 4, 5)))
    if dtype == torch.float32:
        return [(16, 64, 4, 2), (32, 64, 4, 2), (16, 32, 4, 2), (32, 32, 4, 2), (16, 128, 8, 2), (32, 64, 8, 1)]
    return [(32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (16, 64, 4, 3), (64, 64, 4, 2)]


def dq_candidates(dtype: torch.dtype, d: int, wide: bool) -> list[tuple[int, int, int, int]]:
    """(block_m2, block_n2, warps, stages) of the dQ pass."""
    if wide:
        return list(itertools.product((64, 128), (16, 32, 64), (4, 8), (2, 3, 4, 5)))
    if dtype == torch.float32:
        return [(64, 16, 4, 2), (64, 32, 4, 2), (32, 16, 4, 2), (32, 32, 4, 2), (128, 16, 8, 2), (64, 32, 8, 1)]
    return [(128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 2), (64, 16, 4, 3)]


def onepass_candidates(dtype: torch.dtype, d: int, wide: bool) -> list[tuple[int, int, int, int]]:
    """(block_m1, block_n1, warps, stages) of the one-pass backward: its program is the dK/dV pass
    plus one matmul and the dQ atomics. Wide search: 16-query steps are left out (the dQ matmul
    would have 16 rows, below a warpgroup MMA's 64), 128-query steps added."""
    if wide:
        return list(itertools.product((32, 64, 128), (64, 128), (4, 8), (2, 3, 4, 5)))
    return dkdv_candidates(dtype, d, wide)


def fwd_ws_candidates(dtype: torch.dtype, d: int, wide: bool) -> list[tuple[int, int, int]]:
    """(keys per tile, stages, consumer warpgroups) of the Gluon forward, written for 16-bit inputs
    with d = 64 or 128 (`gluon.fwd_ws.fwd_ws_supported`); none elsewhere. Three warpgroups with
    128-key tiles spill; at d = 128 three 128-key stages take 224 KB of shared memory, the most
    that fits, and three warpgroups get 160 registers each (the accumulator alone takes 64)."""
    if dtype == torch.float32 or d not in (64, 128):
        return []
    if d == 128:
        return [(128, 3, 2), (128, 2, 2), (64, 4, 2), (64, 3, 3)]
    return [(64, 3, 3), (64, 4, 3), (64, 5, 3), (64, 6, 3), (128, 2, 2), (128, 3, 2)]


def ws_candidates(dtype: torch.dtype, d: int, wide: bool) -> list[tuple[int, int, int]]:
    """(stages, slots, dQ registers) of the Gluon one-pass backward, written for 16-bit inputs with
    d = 64 (`gluon.onepass_ws.ws_supported`) or 128 (`gluon.bwd128_ws.bwd128_supported`); none elsewhere. The dQ warpgroup's registers trade against
    the math warpgroups' (at 96 and more the math spills a few values; at 64 the dQ warpgroup does)."""
    if dtype == torch.float32 or d not in (64, 128):
        return []
    if d == 128:  # its own kernel (no dQ warpgroup: the dQ registers are unused); P^T stays in
        # registers, so three Q/dO stages fit beside K, V and two dS^T slots (230 KB)
        return list(itertools.product((2, 3), (1, 2), (80,)))
    return list(itertools.product((2, 3), (2, 3), (72, 80, 88, 96)))
# --8<-- [end:candidates]


def bwd_from(dkdv: tuple, dq: tuple, fused: bool = False, tma1: bool = False, tma2: bool = False) -> BwdPlan:
    m1, n1, w1, s1 = dkdv
    m2, n2, w2, s2 = dq
    return BwdPlan(BwdConfig(m1, n1, m2, n2, w1, s1, w2, s2, fused, tma1=tma1, tma2=tma2))


def fwd_ws_from(c: tuple, dtype: torch.dtype, d: int) -> FwdPlan:
    """A Gluon forward candidate; its Triton tiles (the heuristic's) are unused, as in `ws_from`."""
    return FwdPlan(heuristic_fwd(dtype, d), GluonFwdConfig(*c))


def ws_from(c: tuple, dtype: torch.dtype, d: int) -> BwdPlan:
    """A Gluon candidate; its Triton tiles (the heuristic's) are unused: the table keeps the best
    Triton backward's for the inputs the Gluon kernel does not take."""
    return BwdPlan(heuristic_bwd(dtype, d), gluon=GluonBwdConfig(*c))


def onepass_from(c: tuple, tma: bool = False) -> BwdPlan:
    """The *2 tiles are unused by the one-pass kernel; they repeat the *1 tiles."""
    m, n, w, s = c
    return BwdPlan(BwdConfig(m, n, m, n, w, s, w, s, tma1=tma), one_pass=True)
