"""Where each rank's piece of one sharded weight lives: the flat-shard arithmetic, nothing else.

A weight of `numel` elements is flattened and cut into N equal slots of S = ceil(numel / N)
elements; rank r owns the elements [r*S, (r+1)*S) that exist, i.e. [min(r*S, numel),
min((r+1)*S, numel)). The collectives need equal slots, so the communication buffers are N*S long
and the tail beyond `numel` (N*S - numel < N elements) is padding. The *parameter* a rank holds is
only its own elements, never padding: the last ranks' pieces are shorter (or empty), so the
optimizer, weight decay and the gathered state dict never see a padded element.

    numel = 10, N = 4  ->  S = 3, pieces [0,3) [3,6) [6,9) [9,10), padding 2 (in the buffers only)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


# --8<-- [start:layout]
@dataclass(frozen=True)
class FlatShardLayout:
    """The flat layout of one weight of `numel` elements over `world_size` ranks."""

    numel: int
    world_size: int

    def __post_init__(self) -> None:
        if self.numel < 0:
            raise ValueError(f"numel must be >= 0, got {self.numel}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @property
    def slot(self) -> int:
        """S: elements per rank in the communication buffers (the last slots hold padding)."""
        return -(-self.numel // self.world_size)

    @property
    def padded(self) -> int:
        """N*S: length of the all-gather output and of the reduce-scatter input."""
        return self.slot * self.world_size

    def owned(self, rank: int) -> tuple[int, int]:
        """[start, stop) of the flat weight that `rank` holds (may be empty: start == stop)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return min(rank * self.slot, self.numel), min((rank + 1) * self.slot, self.numel)

    def piece_len(self, rank: int) -> int:
        start, stop = self.owned(rank)
        return stop - start
# --8<-- [end:layout]

    def owner_of(self, index: int) -> int:
        """The rank that holds flat element `index`."""
        if not 0 <= index < self.numel:
            raise ValueError(f"index must be in [0, {self.numel}), got {index}")
        return index // self.slot


def take_piece(flat: torch.Tensor, layout: FlatShardLayout, rank: int) -> torch.Tensor:
    """Rank `rank`'s elements of a flat (numel,) tensor: a copy, so the full tensor can be freed."""
    start, stop = layout.owned(rank)
    return flat[start:stop].clone()


def fill_slot(slot: torch.Tensor, piece: torch.Tensor) -> torch.Tensor:
    """Write a rank's piece into its (S,) slot of a communication buffer, zeroing the padding."""
    n = piece.numel()
    slot[:n].copy_(piece)  # casts to the slot's dtype (compute_dtype) on the way
    if n < slot.numel():
        slot[n:].zero_()
    return slot


def unpad(buffer: torch.Tensor, layout: FlatShardLayout) -> torch.Tensor:
    """The (numel,) weight inside an (N*S,) all-gather output: the padding is cut off (a view)."""
    if buffer.numel() != layout.padded:
        raise ValueError(f"buffer must hold N*S = {layout.padded} elements, got {buffer.numel()}")
    return buffer[:layout.numel]
