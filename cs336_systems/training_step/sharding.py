"""How a variant spreads over the ranks: `shard(module, how, worker) -> (module to call, after_backward)`.

    none    one rank holds everything (world size 1)
    ddp     torch's DistributedDataParallel: replicated, gradients all-reduced in buckets
    fsdp2   torch's fully_shard on every block, then on the root (embedding, final norm, head):
            parameters, gradients and AdamW state all split over the ranks (parameters become
            DTensors; optimizers that take plain tensors run on the local shards, local_shards.py)
    fsdp    our container (cs336_systems/distributed/fsdp): every layer's 2-D weight sharded, the
            norms' gains replicated; it needs finish_gradient_synchronization after backward

`module` is a PlainLoss or LanguageModelLoss (lm_loss.py); all but "none" need a process group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

SHARDS = ("none", "ddp", "fsdp2", "fsdp")


class CannotShard(ValueError):
    """The sharding cannot wrap this model; the message says why."""


def shard(module: nn.Module, how: str, device: torch.device,
          world_size: int) -> tuple[nn.Module, Callable[[], None] | None]:
    """Wrap `module` (in place for fsdp2) for `how`; return what to call and what to run after backward."""
    if how == "none":
        return module, None
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids), None
    if how == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world_size,))
        for block in module.lm.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)  # the root: embedding, final norm, the loss head's weight
        return module, None
    if how == "fsdp":
        from cs336_systems.distributed.fsdp import FSDP

        try:
            wrapped = FSDP(module)
        except ValueError as exc:  # its layer rule (a module reads its own 2-D `weight`) does not hold
            raise CannotShard(f"our FSDP cannot wrap this model: {exc}") from None
        return wrapped, wrapped.finish_gradient_synchronization
    raise ValueError(f"shard must be one of {', '.join(SHARDS)}, got {how!r}")
