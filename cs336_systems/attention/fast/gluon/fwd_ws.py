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
CAUSAL_FWD_BUDGET = 16 << 20  # the causal forward's K and V of one group (`heads_per_group`)


def dividing_group(n_bh: int, fits: int) -> int:
    """The largest power of two that divides n_bh and is at most `fits`, at least one. A group that
    does not divide the heads leaves a last, smaller group whose longest programs start last and
    run on an emptying GPU (measured in the backward: at 1 x 16 x 8,192 causal, groups of 3 of the
    16 heads over 10% slower than of 2 or 4; `flash-ab-bwd128 --groups`)."""
    group = 1
    while group * 2 <= fits and n_bh % (group * 2) == 0:
        group *= 2
    return group


def heads_per_group(n_bh: int, bytes_per_head: int, d: int, is_causal: bool) -> int:
    """How many heads' programs the d = 128 forward runs together (`bwd128_ws` has the backward's
    rule); `bytes_per_head`: the K and V every program of a head reads. Without the mask, one head
    at a time: the programs running at once then share the K and V of a few heads, which stay
    in L2. Under the causal mask a head's programs differ in length (longest first within a group),
    and a few heads together, up to CAUSAL_FWD_BUDGET of K and V, balance the SMs better. Measured
    at 16 and 32 heads, 4,096 to 32,768 positions, groups of 1 to 32 heads (notes/fwd_probe/settings.py,
    the kernel alone): without the mask one head was the fastest or about 1% from it at every
    shape, where the previous rule (every head of a launch of at most four waves, else as many as
    fit 24 MiB) lost 6% at 1 x 16 x 4,096; causal, four or eight heads at 4,096 and four at 8,192
    were the fastest (within 2%), one or two at 16,384 and up. At d = 64 all heads (the order its
    table was tuned in)."""
    if d != 128:
        return n_bh
    if not is_causal:
        return 1
    return dividing_group(n_bh, CAUSAL_FWD_BUDGET // max(1, bytes_per_head))


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
        self.group = heads_per_group(n_bh, 2 * n_k * d * dtype.itemsize, d, is_causal)  # the default
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
