"""Fully-sharded data parallel: our own container (problem fsdp).

    shard_layout.py   which flat elements of a weight each rank holds; padding
    comm.py           the all-gather and reduce-scatter of one weight, asynchronous
    layers.py         which layers are sharded (a 2-D `weight`), one sharded weight's bookkeeping
    fsdp.py           the container: prefetched gathers, freed weights, overlapped reduce-scatters
    gather.py         the full parameters back in one state dict
"""

from .fsdp import FSDP
from .gather import gather_full_params
from .layers import is_sharded_layer
from .shard_layout import FlatShardLayout

__all__ = ["FSDP", "FlatShardLayout", "gather_full_params", "is_sharded_layer"]
