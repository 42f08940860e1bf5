"""True ZeRO stage 1 (Rajbhandari et al. 2020): reduce-scatter the gradients, step the owned
shard, all-gather the parameters.

Layout. Each parameter group becomes one flat fp32 buffer (padded to a multiple of the world
size N); every parameter of the group is re-pointed to a view of that buffer, so the buffer *is*
the model's weights (no copy). Rank r owns the contiguous slice [r*S, (r+1)*S), S = padded/N.
A parameter may straddle two ranks' slices; the piece of it inside a rank's slice is a separate
1-D tensor (a view) for the inner optimizer, so optimizer state is exactly 1/N of the unsharded
(up to padding) and each piece keeps its own per-parameter state (AdamW's step count, and "no
gradient, no update"). The inner optimizer must therefore be elementwise (SGD, Adam, AdamW, ...),
as ZeRO's partitioned optimizers are.

Communication per step: one reduce-scatter of the gradients ((N-1)/N of the bytes) and one
all-gather of the parameters ((N-1)/N), the same bytes as the single all-reduce of plain DDP.

Composition with the DDP wrappers: by default this class *replaces* DDP's gradient all-reduce. Use
it on the bare module (it broadcasts the group from rank 0 when the group is added, as a DDP
constructor would) and it averages the local, unsynchronized gradients itself. With
`reduce_gradients=False` it trusts that a DDP wrapper already averaged them and only takes its
slice (that costs DDP's all-reduce plus the all-gather: more bytes, but it composes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .sharded_optimizer import _world, unique_params

# torch 2.13 renamed the tensor collectives; the GPU machine runs 2.11 (old names only).
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Piece:
    """The part [start, stop) of the flat buffer that is parameter `index` and lies in a rank's shard."""

    rank: int
    index: int   # position of the parameter in its group
    start: int   # offsets into the flat buffer
    stop: int


def shard_layout(numels: list[int], world_size: int) -> tuple[list[int], int, list[Piece]]:
    """Offsets of each parameter in the flat buffer, the shard size S, and every rank's pieces.

    Pure: identical on every rank for the same sizes. The pieces tile [0, sum(numels)) exactly.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    offsets, total = [], 0
    for n in numels:
        offsets.append(total)
        total += n
    shard = -(-total // world_size)  # ceil; the last shard is padded
    pieces = []
    for rank in range(world_size):
        lo, hi = rank * shard, (rank + 1) * shard
        for i, (off, n) in enumerate(zip(offsets, numels)):
            start, stop = max(lo, off), min(hi, off + n)
            if start < stop:
                pieces.append(Piece(rank, i, start, stop))
    return offsets, shard, pieces


@dataclass
class _FlatGroup:
    params: list[torch.Tensor]
    offsets: list[int]
    shard: int
    flat: torch.Tensor                 # (N * shard,) the group's weights; params are views of it
    pieces: list[Piece]                # this rank's pieces
    piece_tensors: list[torch.Tensor] = field(default_factory=list)  # views handed to the inner


# --8<-- [start:class]
class ZeRO1Optimizer(torch.optim.Optimizer):
    """Shards optimizer state by flat slices; gradients reduce-scattered, parameters all-gathered."""

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], *,
                 reduce_gradients: bool = True, **kwargs: Any):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
        # Set before super().__init__, which calls our add_param_group (the init-order trap).
        self.optimizer_cls = optimizer_cls
        self.inner_kwargs = kwargs
        self.reduce_gradients = reduce_gradients
        self.rank, self.world_size = _world(None)
        self.flat_groups: list[_FlatGroup] = []
        self.inner: torch.optim.Optimizer | None = None
        super().__init__(params, defaults=kwargs)
    # --8<-- [end:class]

    # --8<-- [start:add_param_group]
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        params = group["params"] = unique_params(group["params"])
        if params and (len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1):
            raise ValueError("param_group: all parameters of a group must share dtype and device "
                             "(they live in one flat buffer)")
        offsets, shard, pieces = shard_layout([p.numel() for p in params], self.world_size)
        like = params[0] if params else torch.empty(0)
        flat = torch.zeros(shard * self.world_size, dtype=like.dtype, device=like.device)
        for p, off in zip(params, offsets):
            flat[off:off + p.numel()].copy_(p.detach().reshape(-1))
        if self.world_size > 1 and flat.numel():
            dist.broadcast(flat, src=0)  # start from rank 0's weights, as a DDP constructor would
        for p, off in zip(params, offsets):  # the flat buffer becomes the model's storage
            p.data = flat[off:off + p.numel()].view_as(p)
        mine = [pc for pc in pieces if pc.rank == self.rank]
        fg = _FlatGroup(params, offsets, shard, flat, mine,
                        [flat[pc.start:pc.stop] for pc in mine])  # 1-D views, leaves
        self.flat_groups.append(fg)
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = fg.piece_tensors
        if self.inner is None:
            self.inner = self.optimizer_cls([local], **self.inner_kwargs)
        else:
            self.inner.add_param_group(local)
    # --8<-- [end:add_param_group]

    # --8<-- [start:step]
    @torch.no_grad()
    def step(self, closure=None, **kwargs: Any):
        """closure (forward + backward) -> reduce-scatter grads -> inner step on the shard ->
        all-gather weights. The closure runs here, once, before the gradients are reduced: the
        inner optimizer would call it after, too late."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner in zip(self.param_groups, self.inner.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        buffers = [self._reduce_scatter_grads(fg) for fg in self.flat_groups]  # keep alive
        self.inner.step(**kwargs)
        for fg in self.flat_groups:
            for t in fg.piece_tensors:
                t.grad = None
            if self.world_size > 1 and fg.shard:
                lo = self.rank * fg.shard
                _all_gather(fg.flat, fg.flat[lo:lo + fg.shard])  # in place: our slice is the input
        del buffers
        return loss

    def _reduce_scatter_grads(self, fg: _FlatGroup) -> torch.Tensor:
        """Average the gradients into this rank's shard; point each piece's .grad at its part.

        A parameter without a gradient on every rank gets no .grad (so no update, no weight decay),
        as the unsharded optimizer would do."""
        N = self.world_size
        has_grad = torch.tensor([p.grad is not None for p in fg.params], dtype=torch.int32,
                                device=fg.flat.device)
        flat_grad = torch.zeros_like(fg.flat)  # (N * S,) transient: freed after the step
        for p, off in zip(fg.params, fg.offsets):
            if p.grad is not None:
                flat_grad[off:off + p.numel()].copy_(p.grad.reshape(-1))
        lo = self.rank * fg.shard
        if N > 1 and self.reduce_gradients and fg.shard:
            dist.all_reduce(has_grad, op=dist.ReduceOp.MAX)  # tiny: one int per parameter
            shard_grad = torch.empty(fg.shard, dtype=flat_grad.dtype, device=flat_grad.device)
            _reduce_scatter(shard_grad, flat_grad, op=dist.ReduceOp.SUM)
            shard_grad.div_(N)
        else:
            shard_grad = flat_grad[lo:lo + fg.shard]
        flags = has_grad.tolist()
        for pc, t in zip(fg.pieces, fg.piece_tensors):
            t.grad = shard_grad[pc.start - lo:pc.stop - lo] if flags[pc.index] else None
        return shard_grad
    # --8<-- [end:step]

    def owned_ranges(self) -> list[list[tuple[int, int, int]]]:
        """Per group, this rank's pieces as (parameter index, start, stop) within the flat buffer."""
        return [[(pc.index, pc.start, pc.stop) for pc in fg.pieces] for fg in self.flat_groups]
