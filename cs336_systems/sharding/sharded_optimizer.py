"""Optimizer-state sharding as the course specifies it (problem optimizer_state_sharding).

Each parameter is owned by exactly one rank. A rank builds the wrapped optimizer over the
parameters it owns only, so it holds ~1/N of the optimizer state; after every step each owner
broadcasts the parameters it updated, and all ranks agree again. Parameters and gradients stay
full-size on every rank (gradients are averaged beforehand, by a DDP wrapper or by hand): this is
ZeRO stage 1's memory saving at a higher communication price (see `zero1.py` for the true ZeRO-1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist


# --8<-- [start:assign]
def assign_to_ranks(sizes: Sequence[int], world_size: int,
                    loads: list[int] | None = None) -> list[int]:
    """Owner rank of each item: greedy, largest first, each to the least-loaded rank.

    The longest-processing-time rule: the spread between the most and least loaded rank never
    exceeds the largest item. Ties go to the lower index (item) and the lower rank, so every rank
    computes the same answer from the same sizes. `loads` (per-rank totals of earlier calls) is
    updated in place, which makes the policy incremental: a group added later (unfreezing) is
    balanced against what each rank already owns.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if loads is None:
        loads = [0] * world_size
    if len(loads) != world_size:
        raise ValueError(f"loads must have world_size={world_size} entries, got {len(loads)}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be non-negative, got {list(sizes)}")
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += sizes[i]
    return owners
# --8<-- [end:assign]


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) in `group`; (0, 1) when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def unique_params(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors in order, each once (a tied weight listed twice is one parameter)."""
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


# --8<-- [start:class]
class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls`; this rank steps (and holds state for) the parameters it owns."""

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
        # The init-order trap: Optimizer.__init__ calls self.add_param_group() for every group it
        # is given, i.e. *our* override runs inside super().__init__(). Everything it touches must
        # exist before that call.
        self.optimizer_cls = optimizer_cls
        self.inner_kwargs = kwargs
        self.rank, self.world_size = _world(None)
        self.owner: dict[torch.Tensor, int] = {}      # parameter -> owning rank
        self.rank_loads = [0] * self.world_size      # elements owned per rank so far
        self.inner: torch.optim.Optimizer | None = None  # built lazily by add_param_group
        super().__init__(params, defaults=kwargs)    # consumes `params` (maybe a generator) once
    # --8<-- [end:class]

    # --8<-- [start:add_param_group]
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Register a group on every rank; hand its parameters to owners; give the inner
        optimizer this rank's share. Works during construction and later (unfreezing)."""
        super().add_param_group(param_group)  # validates, fills defaults, appends to param_groups
        group = self.param_groups[-1]
        group["params"] = unique_params(group["params"])  # a tied weight is owned (and sent) once
        owners = assign_to_ranks([p.numel() for p in group["params"]], self.world_size,
                                 self.rank_loads)
        self.owner.update(zip(group["params"], owners))
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p, r in zip(group["params"], owners) if r == self.rank]
        # One inner group per outer group (possibly empty), so index i maps to index i.
        if self.inner is None:
            self.inner = self.optimizer_cls([local], **self.inner_kwargs)
        else:
            self.inner.add_param_group(local)
    # --8<-- [end:add_param_group]

    # --8<-- [start:step]
    def step(self, closure=None, **kwargs: Any):
        """Step the owned shard (the closure goes to the inner optimizer), then broadcast every
        parameter from its owner so all ranks hold the same updated weights."""
        self._sync_hyperparameters()
        loss = self.inner.step(closure=closure, **kwargs)
        self._broadcast_from_owners()
        return loss

    def _broadcast_from_owners(self) -> None:
        if self.world_size == 1:
            return
        handles = [dist.broadcast(p.data, src=self.owner[p], async_op=True)
                   for group in self.param_groups for p in group["params"]]
        for h in handles:  # same order on every rank: param_groups are identical everywhere
            h.wait()
    # --8<-- [end:step]

    def _sync_hyperparameters(self) -> None:
        """Copy group options (lr set by a scheduler, ...) from the visible groups to the inner."""
        for outer, inner in zip(self.param_groups, self.inner.param_groups):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value

    def owned_parameters(self) -> list[torch.Tensor]:
        """The parameters this rank updates (and holds optimizer state for)."""
        return [p for p, r in self.owner.items() if r == self.rank]
