"""Optimizer-state sharding (the course's version and a true ZeRO-1), memory and communication
accounting, and the sharding benchmark."""

from .sharded_optimizer import ShardedOptimizer, assign_to_ranks
from .zero1 import ZeRO1Optimizer, shard_layout

__all__ = ["ShardedOptimizer", "ZeRO1Optimizer", "assign_to_ranks", "shard_layout"]
