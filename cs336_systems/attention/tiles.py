"""Tile sizes, warps and pipeline stages of the FlashAttention-2 kernels: what a launch is handed.

`launch_fwd` and `launch_bwd` (flash_launch.py) take one of these as an argument; without one they
use `default_fwd` / `default_bwd`: under the Triton interpreter (CPU) tiles 16 wide, so small test
shapes still cross several tiles; on a GPU a choice known to fit Hopper's shared memory. Settings
measured per shape are the speed work's business (`fast/`: a table, looked up and handed in here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .triton_loader import interpreting, next_power_of_2


# --8<-- [start:configs]
@dataclass(frozen=True)
class FwdConfig:
    block_m: int  # queries per program
    block_n: int  # keys per loop step
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False  # load Q, K, V tiles through TMA descriptors (see BwdConfig.tma1)

    def __post_init__(self):
        _check_launch("FwdConfig", {"block_m": self.block_m, "block_n": self.block_n},
                      self.num_warps, self.num_stages)


@dataclass(frozen=True)
class BwdConfig:
    block_m1: int  # dK/dV pass: queries per loop step
    block_n1: int  # dK/dV pass: keys per program (resident)
    block_m2: int  # dQ pass: queries per program (resident)
    block_n2: int  # dQ pass: keys per loop step
    num_warps1: int = 4
    num_stages1: int = 2
    num_warps2: int = 4
    num_stages2: int = 2
    fused: bool = False  # both passes in one launch (with warps1/stages1)
    # Load the input tiles through TMA tensor descriptors (Hopper+, contiguous last dim, power-of-two
    # d), per pass; inputs that do not qualify fall back to pointer loads.
    tma1: bool = False
    tma2: bool = False
# --8<-- [end:configs]

    def __post_init__(self):
        tiles = {"block_m1": self.block_m1, "block_n1": self.block_n1, "block_m2": self.block_m2,
                 "block_n2": self.block_n2}
        _check_launch("BwdConfig", tiles, self.num_warps1, self.num_stages1)
        _check_launch("BwdConfig", {}, self.num_warps2, self.num_stages2)


def _power_of_2(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and n & (n - 1) == 0


def _check_launch(what: str, tiles: dict[str, object], num_warps: object, num_stages: object) -> None:
    """Tiles are tl.arange lengths (powers of two) and tl.dot operands (at least 16 rows); warps
    come in powers of two; a pipeline has at least one stage."""
    for name, size in tiles.items():
        if not (_power_of_2(size) and size >= 16):
            raise ValueError(f"{what}: {name} must be a power of two, at least 16, got {size!r}")
    if not _power_of_2(num_warps):
        raise ValueError(f"{what}: num_warps must be a power of two, got {num_warps!r}")
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"{what}: num_stages must be an int of at least 1, got {num_stages!r}")


INTERPRETER_FWD = FwdConfig(16, 16, 1, 1)
INTERPRETER_BWD = BwdConfig(16, 16, 16, 16, 1, 1, 1, 1)


def heuristic_fwd(dtype: torch.dtype, head_dim_pad: int) -> FwdConfig:
    """Before measurement: shapes known to fit Hopper's 227 KB of shared memory."""
    if dtype == torch.float32:
        return FwdConfig(64, 32, 4, 2) if head_dim_pad <= 64 else FwdConfig(32, 32, 4, 2)
    return FwdConfig(128, 64, 4, 3) if head_dim_pad <= 64 else FwdConfig(128, 64, 8, 3)


def heuristic_bwd(dtype: torch.dtype, head_dim_pad: int) -> BwdConfig:
    if dtype == torch.float32:
        return BwdConfig(16, 64, 64, 16, 4, 2, 4, 2) if head_dim_pad <= 64 else BwdConfig(16, 32, 32, 16, 4, 1, 4, 1)
    if head_dim_pad <= 64:
        return BwdConfig(32, 128, 128, 32, 4, 3, 4, 3)
    return BwdConfig(32, 64, 64, 32, 4, 2, 4, 2)


def default_fwd(dtype: torch.dtype, head_dim: int) -> FwdConfig:
    """The forward's tiles when the caller hands none: 16-wide under the interpreter, else the heuristic."""
    return INTERPRETER_FWD if interpreting() else heuristic_fwd(dtype, next_power_of_2(head_dim))


def default_bwd(dtype: torch.dtype, head_dim: int) -> BwdConfig:
    """The backward's tiles when the caller hands none: 16-wide under the interpreter, else the heuristic."""
    return INTERPRETER_BWD if interpreting() else heuristic_bwd(dtype, next_power_of_2(head_dim))
