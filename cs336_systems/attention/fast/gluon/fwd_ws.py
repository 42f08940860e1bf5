"""Launch the warp-specialised forward (`flash_fwd_ws_kernel`, Gluon) and say which inputs it takes.

`fast.launch.launch_fwd` runs it where a plan names a `GluonFwdConfig` (a table entry that says
`gluon_ws`; the tuner times it as kernel "fwd_ws" beside the Triton forward and picks its settings);
other inputs run the Triton forward.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..direct_launch import Tma, for_triton

ROWS = 64  # query rows per consumer warpgroup


def fwd_ws_supported(q: Tensor, k: Tensor, v: Tensor, block_n: int = 64) -> str | None:
    """Why the Gluon forward cannot take these inputs, or None."""
    from .requirements import input_problem

    if (why := input_problem((q, k, v), (64, 128))) is not None:
        return why
    if k.shape[2] % block_n:
        return f"n_k must be a multiple of {block_n}"
    return None


L2_BUDGET = 24 << 20  # bytes of one group's re-read tensors: half the H100/H200's 50 MB L2
FEW_WAVES = 4  # launches of at most this many programs per SM run as one group


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def heads_per_group(n_bh: int, bytes_per_head: int, d: int, n_tiles: int, device: torch.device) -> int:
    """How many heads' programs the d = 128 forward runs together (`bwd128_ws` has the backward's
    rule): as many as keep the tensors every program of a head re-reads (`bytes_per_head`) within
    L2_BUDGET, at least one. A launch of few waves runs as one group (measured: at 1 x 16 x 4,096
    the longest programs of every head first balance the SMs better than L2 saves). At d = 64 all
    heads (the order its table was tuned in)."""
    if d != 128 or n_tiles * n_bh <= FEW_WAVES * _sm_count(device):
        return n_bh
    return max(1, min(n_bh, L2_BUDGET // max(1, bytes_per_head)))


def register_split(warpgroups: int) -> tuple[int, int]:
    """(maxnreg at launch, consumer warpgroups' registers): the 64K-register file over the program's
    warps (the consumer warpgroups, and the loader warp, which Gluon pads to a warpgroup); setmaxnreg
    gives the loader 24 registers and the consumers the rest."""
    warps = 4 * warpgroups + 4
    maxnreg = 65536 // (32 * warps) // 8 * 8
    return maxnreg, min(256, (warps * maxnreg - 4 * 24) // (warps - 4) // 8 * 8)


def launch_fwd_ws(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, block_n: int = 64, stages: int = 4,
                  warpgroups: int = 3, kernel=None, group: int | None = None,
                  checked: bool = False) -> tuple[Tensor, Tensor]:
    """O (Z, H, n_q, 64) in q's dtype and L (Z, H, n_q) fp32, natural-log logsumexp, as `launch_fwd`.
    A program owns 64 * warpgroups queries; block_n keys per tile, stages tiles in flight.
    `kernel`: launched through Triton's own dispatch instead of directly (to time the difference).
    `group`: heads whose programs run together (default `heads_per_group`: K and V are re-read).
    `checked`: the caller has asked `fwd_ws_supported` of these inputs (the speed path's launcher)."""
    if warpgroups not in (2, 3):
        raise ValueError(f"launch_fwd_ws: warpgroups must be 2 or 3, got {warpgroups}")
    if block_n not in (64, 128) or stages < 2:
        raise ValueError(f"launch_fwd_ws: block_n must be 64 or 128 and stages at least 2, got {block_n}, {stages}")
    if not checked and (why := fwd_ws_supported(q, k, v, block_n)) is not None:
        raise ValueError(f"launch_fwd_ws: {why}; got q {tuple(q.shape)} {q.dtype}")
    Z, H, n_q, d = q.shape
    prepared = prepare(Z * H, n_q, k.shape[2], d, q.dtype, is_causal, block_n, stages, warpgroups, q.device)
    if kernel is None and group is None:
        return prepared.run(q, k, v)
    if group is not None and not 1 <= group <= Z * H:
        raise ValueError(f"launch_fwd_ws: group must be in [1, {Z * H}], got {group}")
    o, L, args = prepared.outputs_and_args(q, k, v, group)
    if kernel is None:
        prepared.direct.launch(prepared.grid, args, prepared.constexprs)
    else:
        kernel[prepared.grid](*for_triton(args), **prepared.constexprs)
    return o, L


class FwdLaunch:
    """The forward's launch for one shape, dtype and plan, its answers found once: `run(q, k, v)`
    allocates O and L and launches (an eager call's host time is most of a short launch's)."""

    def __init__(self, n_bh: int, n_q: int, n_k: int, d: int, dtype: torch.dtype, is_causal: bool, block_n: int,
                 stages: int, warpgroups: int, device: torch.device):
        import triton

        from ...flash_launch import _scales
        from ..direct_launch import direct
        from .flash_fwd_ws_kernel import fwd_ws_kernel
        from .onepass_ws import shared_layout

        maxnreg, math_regs = register_split(warpgroups)
        self.grid = (triton.cdiv(n_q, ROWS * warpgroups), n_bh)
        self.group = heads_per_group(n_bh, 2 * n_k * d * dtype.itemsize, d, self.grid[0], device)  # the default
        self.constexprs = dict(D=d, BN=block_n, STAGES=stages, CAUSAL=is_causal, MATH_REGS=math_regs, NW=warpgroups,
                               num_warps=4, maxnreg=maxnreg)
        self.n_q, self.n_k, self.qk_scale = n_q, n_k, _scales(d)[1]
        # the tensor maps' geometry: each input as its (Z * H * N, d) rows, a box of tile rows
        self.q_geometry = ((n_bh * n_q, d), (d, 1), (ROWS, d), shared_layout(ROWS, d, dtype))
        self.kv_geometry = ((n_bh * n_k, d), (d, 1), (block_n, d), shared_layout(block_n, d, dtype))
        self.direct = direct(fwd_ws_kernel)
        self._launch = None  # the bound launch, after the first

    def outputs_and_args(self, q: Tensor, k: Tensor, v: Tensor, group: int | None = None):
        o = torch.empty_like(q)
        L = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        args = (Tma(q, *self.q_geometry), Tma(k, *self.kv_geometry), Tma(v, *self.kv_geometry), o, L, self.n_q,
                self.n_k, self.qk_scale, self.group if group is None else group)
        return o, L, args

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """O and L of contiguous (Z, H, n_q, d) inputs of this launch's shape and dtype (unchecked)."""
        o, L, args = self.outputs_and_args(q, k, v)
        if self._launch is None:
            self._launch = self.direct.bind(self.grid, args, self.constexprs)
        else:
            self._launch(args)
        return o, L


@functools.cache
def prepare(n_bh: int, n_q: int, n_k: int, d: int, dtype: torch.dtype, is_causal: bool, block_n: int, stages: int,
            warpgroups: int, device: torch.device) -> FwdLaunch:
    """The one FwdLaunch of a shape, dtype and plan."""
    return FwdLaunch(n_bh, n_q, n_k, d, dtype, is_causal, block_n, stages, warpgroups, device)
