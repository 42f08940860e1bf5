"""The flat-shard arithmetic of one FSDP weight (pure functions, no processes) and the rule that
picks the sharded layers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from torch import nn

from cs336_systems.distributed.fsdp import FlatShardLayout, is_sharded_layer
from cs336_systems.distributed.fsdp.shard_layout import fill_slot, take_piece, unpad
from tests import course_standins
from tests.strategies import weight_shapes, world_sizes


@given(shape=weight_shapes(), world=world_sizes())
def test_every_element_has_exactly_one_owner(shape, world):
    layout = FlatShardLayout(math.prod(shape), world)
    owners = [[r for r in range(world) if layout.owned(r)[0] <= i < layout.owned(r)[1]]
              for i in range(layout.numel)]
    assert all(len(o) == 1 for o in owners)
    assert [o[0] for o in owners] == [layout.owner_of(i) for i in range(layout.numel)]
    assert sum(layout.piece_len(r) for r in range(world)) == layout.numel  # no padding in pieces
    assert all(layout.piece_len(r) <= layout.slot for r in range(world))
    assert 0 <= layout.padded - layout.numel < world  # padding: less than one element per rank


@given(shape=weight_shapes(), world=world_sizes())
def test_pieces_reassemble_to_the_weight(shape, world):
    weight = torch.randn(shape)
    layout = FlatShardLayout(weight.numel(), world)
    pieces = [take_piece(weight.reshape(-1), layout, r) for r in range(world)]
    assert torch.equal(torch.cat(pieces).view(shape), weight)


@given(shape=weight_shapes(), world=world_sizes())
def test_padding_never_leaks_through_a_simulated_all_gather(shape, world):
    """Each rank writes its piece into an (S,) slot of garbage (NaN); the slots concatenated are
    what all_gather_into_tensor returns. The unpadded result is the weight, NaN-free: the padding
    was zeroed and then cut off."""
    weight = torch.randn(shape)
    layout = FlatShardLayout(weight.numel(), world)
    slots = [fill_slot(torch.full((layout.slot,), float("nan")),
                       take_piece(weight.reshape(-1), layout, r)) for r in range(world)]
    gathered = torch.cat(slots)  # (N*S,)
    assert not gathered.isnan().any(), "padding is zeroed, so a reduce over it sums zeros"
    assert torch.equal(unpad(gathered, layout).view(shape), weight)


def test_layout_refuses_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        FlatShardLayout(4, 0)
    with pytest.raises(ValueError, match="numel"):
        FlatShardLayout(-1, 2)
    with pytest.raises(ValueError, match="rank"):
        FlatShardLayout(4, 2).owned(2)
    with pytest.raises(ValueError, match="buffer"):
        unpad(torch.zeros(3), FlatShardLayout(4, 2))


@pytest.mark.parametrize("module, sharded", [
    (nn.Linear(3, 4), True), (nn.Linear(3, 4, bias=False), True), (nn.Embedding(5, 2), True),
    (course_standins.Linear(3, 4), True), (course_standins.Embedding(5, 2), True),
    (course_standins.RMSNorm(4), False), (nn.LayerNorm(4), False), (nn.Conv1d(2, 3, 3), False),
    (nn.Sequential(nn.Linear(2, 2)), False),  # the container: its child is the layer
    (course_standins.FeedForward(3, 5), False),
])
def test_which_modules_are_sharded_layers(module, sharded):
    assert is_sharded_layer(module) is sharded
