"""An optimizer of plain tensors run on the local shards of FSDP2's DTensor parameters.

FSDP2 turns every parameter into a DTensor (this rank's shard plus how it is placed), and expects
the optimizer to update the shards in place. torch's AdamW handles DTensors; a Triton optimizer
(FusedAdamW) takes raw tensors. So each DTensor parameter is handed to it as an alias of its local
shard (the same storage: updates land in the DTensor), and before each step each alias gets the
local shard of the DTensor's gradient.

    opt = LocalShardOptimizer(model.parameters(), FusedAdamW, lr=1e-3)
    opt.zero_grad(); loss.backward(); opt.step()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class LocalShardOptimizer:
    """`make(local tensors, **kwargs)` stepped on the local shards of `params` (see module docstring)."""

    def __init__(self, params: Iterable[torch.Tensor], make: Callable[..., torch.optim.Optimizer], **kwargs: Any):
        self.params = list(params)
        pairs = [(p, _local(p).detach()) for p in self.params]  # detach: a leaf alias of the same storage
        self.pairs = [(p, a) for p, a in pairs if a.numel()]  # a rank may hold no rows of a small one
        self.inner = make([a for _, a in self.pairs], **kwargs)

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        for _, alias in self.pairs:
            alias.grad = None

    def step(self) -> None:
        for p, alias in self.pairs:
            alias.grad = None if p.grad is None else _local(p.grad)
        self.inner.step()
