"""What every DDP stage shares, so each stage's file reads as its algorithm and nothing else.

- `DataParallel`: wraps a module (exposed as `.module`, so `parameters()` are the module's own, no
  extra Parameters), broadcasts rank 0's parameters *and* buffers on construction (frozen ones
  too: they are never communicated again, so they must start equal), passes forward through, and
  offers `no_sync()` for gradient accumulation.
- `all_reduce_mean_`: the one averaging collective. `all_reduce` sums, so each rank divides by the
  world size first (gloo has no AVG op; dividing before the sum, as torch DDP does, also keeps
  low-precision gradients from overflowing).

Contract the stages rely on (it is torch DDP's default too): in one step, every rank runs the same
graph, so the same parameters receive gradients, in the same order, on every rank. Parameters that
receive no gradient (unused, or frozen) are simply not communicated and keep `.grad = None`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

# A hook firing twice in one step means a second accumulation into a gradient already handed to
# communication (a second backward, or a reentrant checkpoint's inner one): refuse, loudly.
ACCUMULATED_AGAIN = ("a gradient was accumulated again after its hook had handed it to "
                     "communication this step; call finish_gradient_synchronization() between "
                     "backward passes, or accumulate inside no_sync()")


# --8<-- [start:common]
def broadcast_from_rank0(module: nn.Module) -> None:
    """Overwrite every parameter and buffer (trainable or not) with rank 0's values, in place."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        dist.broadcast(tensor.detach(), src=0)


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that get gradients, each once (a tied weight appears once), in forward order."""
    return [p for p in module.parameters() if p.requires_grad]


def all_reduce_mean_(tensor: torch.Tensor, async_op: bool = False) -> dist.Work | None:
    """Average `tensor` over ranks, in place. With async_op, returns the handle to wait on."""
    tensor.div_(dist.get_world_size())
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=async_op)


def check_one_kind(params: list[nn.Parameter], what: str) -> None:
    """Flattening needs one dtype and one device per buffer."""
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(f"{what} flattens gradients together, so the trainable parameters must "
                         f"share one dtype and device; got {sorted(map(str, kinds))}")


class DataParallel(nn.Module):
    """Base of the four stages: construction, forward, `no_sync`, and the per-step hooks."""

    def __init__(self, module: nn.Module):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs an initialized process group "
                               "(cs336_systems.distributed.launch starts one)")
        self.module = module
        self.world_size = dist.get_world_size()
        self.require_gradient_sync = True  # False inside no_sync()
        self._hooks: list = []  # the stages that hook parameters keep the handles here
        broadcast_from_rank0(module)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes inside only accumulate locally; the first backward
        after the block (followed by finish_gradient_synchronization) averages the sum."""
        previous, self.require_gradient_sync = self.require_gradient_sync, False
        try:
            yield
        finally:
            self.require_gradient_sync = previous

    # --8<-- [end:common]

    def on_train_batch_start(self) -> None:
        """Called at the start of a step. The stages reset their state when they finish a step, so
        there is nothing to do; kept for the course's adapter."""

    def finish_gradient_synchronization(self) -> None:
        """Block until every gradient is averaged over the ranks (call after backward)."""
        raise NotImplementedError

    def remove_hooks(self) -> None:
        """Detach from the module (so it can be wrapped again, e.g. by another stage)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
