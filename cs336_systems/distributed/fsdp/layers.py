"""Which parameters FSDP shards, and the bookkeeping of one sharded weight.

The rule (it recognises a layer by what it holds, not by its class): a module that owns, directly,
a 2-D Parameter named `weight` is a sharded layer. That is every Linear (d_out, d_in) and every
Embedding (vocab, d) -- torch's, ours, the course's `cs336_basics` ones, or anyone's that keeps its
matrix in `self.weight` -- and no norm (1-D weight), no convolution (3-D or more). Every other
parameter (norm gains, biases) stays whole on every rank ("replicated"), its gradient all-reduced.

What the rule needs from a layer: it reads its weight inside its own forward, as `self.weight`.
FSDP swaps the gathered matrix in for exactly that call. A module that reads another module's
weight (torch's nn.MultiheadAttention reads `out_proj.weight` itself) would see the 1-D shard.

Tied weights: one Parameter owned by several layers (an embedding tied to the output projection)
is one sharded weight. Each layer that uses it gathers it for its own call; the gradients of all
uses in one forward are summed locally, as autograd sums them into a tied weight, and then
reduce-scattered once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .shard_layout import FlatShardLayout, take_piece


# --8<-- [start:rule]
def is_sharded_layer(module: nn.Module) -> bool:
    """A Linear- or Embedding-like layer: it owns a 2-D Parameter called `weight`."""
    weight = module._parameters.get("weight")  # its own, not a child's
    return isinstance(weight, nn.Parameter) and weight.dim() == 2
# --8<-- [end:rule]


@dataclass(eq=False)
class ShardedWeight:
    """One weight matrix, sharded: this rank's flat piece is the Parameter the module now holds."""

    name: str                      # its key in named_parameters()
    shape: torch.Size              # the whole matrix's shape, e.g. (d_out, d_in)
    layout: FlatShardLayout
    shard: nn.Parameter            # (piece_len,) this rank's elements, master dtype
    pending_uses: int = 0          # forward uses whose gradient has not come back yet
    grad_sum: torch.Tensor | None = None   # local full gradient of the uses seen so far

    @classmethod
    def from_parameter(cls, name: str, weight: nn.Parameter, rank: int,
                       world_size: int) -> ShardedWeight:
        layout = FlatShardLayout(weight.numel(), world_size)
        piece = take_piece(weight.detach().reshape(-1), layout, rank)  # (piece_len,)
        return cls(name, weight.shape, layout, nn.Parameter(piece, requires_grad=weight.requires_grad))

    def add_grad(self, grad: torch.Tensor) -> None:
        """Add one use's full gradient to the local sum (in the order backward delivers them)."""
        self.grad_sum = grad if self.grad_sum is None else self.grad_sum + grad

    def set_grad(self, piece: torch.Tensor) -> None:
        """Give the shard its averaged gradient, upcast to the master dtype; accumulate like
        autograd if a gradient is already there (no zero_grad since the last step)."""
        piece = piece.to(self.shard.dtype)
        if self.shard.grad is None:
            self.shard.grad = piece
        else:
            self.shard.grad.add_(piece)


@dataclass(eq=False)
class ShardedLayer:
    """A module whose `weight` is sharded; `others` are its other own parameters (e.g. bias)."""

    index: int
    name: str
    module: nn.Module
    weight: ShardedWeight
    others: list[str]


def find_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every sharded layer, in registration order."""
    return [(name, m) for name, m in module.named_modules() if is_sharded_layer(m)]


def check_weights_only_in_layers(module: nn.Module) -> None:
    """A sharded weight registered anywhere else than as a layer's `weight` (another name, or a
    module with another role) would be trained whole there and silently diverge: refuse it."""
    layer_weights = {id(m._parameters["weight"]) for _, m in find_layers(module)}
    for module_name, m in module.named_modules():
        for name, p in m._parameters.items():
            if p is not None and id(p) in layer_weights and not (
                    name == "weight" and is_sharded_layer(m)):
                where = f"{module_name}.{name}" if module_name else name
                raise ValueError(f"module: parameter {where!r} is a sharded layer's weight "
                                 "registered under another name; FSDP cannot shard it consistently")
