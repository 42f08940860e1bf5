"""Tile sizes, warps and pipeline stages for the FlashAttention-2 kernels, per shape.

The GPU table (`tuned_configs.TUNED`) is generated from measurements by `tune` and committed; a
shape it lacks falls back to a heuristic. No autotuning happens on a first call. Under the Triton
interpreter (CPU) tiles are 16 wide so small test shapes still cross several tiles.

    python -m cs336_systems.attention.configs tune [--only leaderboard|sweep] [--write]
    python -m cs336_systems.attention.configs write-table     # regenerate tuned_configs.py from results
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
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
    # The warp-specialised forward in Gluon (flash_fwd_ws_kernel) where it applies (Hopper, Triton
    # 3.6, bf16/fp16, d = 64, n_k a multiple of ws_block_n); elsewhere the fields above decide. Its
    # settings: keys per tile, tiles in flight, consumer warpgroups (64 query rows each).
    gluon_ws: bool = False
    ws_block_n: int = 64
    ws_stages: int = 4
    ws_warpgroups: int = 3

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
    # One pass instead of two: the dK/dV program also adds its dQ share with fp32 atomics
    # (flash_bwd_onepass_kernel; uses the *1 fields, ignores the *2 fields and `fused`).
    one_pass: bool = False
    # Load the input tiles through TMA tensor descriptors (Hopper+, contiguous last dim, power-of-two
    # d), per pass; inputs that do not qualify fall back to pointer loads.
    tma1: bool = False
    tma2: bool = False
    # The warp-specialised one-pass backward in Gluon (flash_bwd_ws_kernel) where it applies (Hopper,
    # Triton 3.6, bf16/fp16, d = 64, n_k a multiple of 128); elsewhere the fields above decide.
    # Its settings: depth of each math warpgroup's Q/dO ring, slots of its dS^T hand-over ring, and
    # registers per thread of the dQ warpgroup (the rest go to the math warpgroups).
    gluon_ws: bool = False
    ws_stages: int = 2
    ws_slots: int = 2
    ws_dq_regs: int = 80
# --8<-- [end:configs]

    def __post_init__(self):
        if self.one_pass and self.fused:
            raise ValueError("BwdConfig: one_pass and fused exclude each other (fused is a two-pass launch)")
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


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def size_class(n_bh: int, n_queries: int, n_keys: int) -> str:
    """How much parallel work a launch has: rows of (batch*heads) x seq. Tuned per class."""
    rows = n_bh * max(n_queries, n_keys)
    return "small" if rows <= 4096 else "medium" if rows <= 32768 else "large"


def table_key(dtype: torch.dtype, head_dim: int, causal: bool, size: str) -> str:
    # fp16 runs the bf16 entries: same width, same tensor-core rate.
    name = "bf16" if dtype == torch.float16 else dtype_name(dtype)
    return f"{name}-d{next_power_of_2(max(head_dim, 16))}-{'causal' if causal else 'full'}-{size}"


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


def heuristic_onepass(dtype: torch.dtype, head_dim_pad: int) -> BwdConfig:
    """A one-pass config (not measured): the heuristic dK/dV pass's tiles, whose program it extends."""
    c = heuristic_bwd(dtype, head_dim_pad)
    return BwdConfig(c.block_m1, c.block_n1, c.block_m1, c.block_n1, c.num_warps1, c.num_stages1,
                     c.num_warps1, c.num_stages1, one_pass=True)


_override: dict[str, object] = {}


@contextlib.contextmanager
def override(fwd: FwdConfig | None = None, bwd: BwdConfig | None = None) -> Iterator[None]:
    """Use these configs for every launch inside the block (tests, tuning)."""
    saved = dict(_override)
    if fwd is not None:
        _override["fwd"] = fwd
    if bwd is not None:
        _override["bwd"] = bwd
    try:
        yield
    finally:
        _override.clear()
        _override.update(saved)


SIZE_FALLBACK = {"small": ("small", "medium", "large"), "medium": ("medium", "large"), "large": ("large", "medium")}


def _tuned(kind: str, dtype: torch.dtype, head_dim: int, causal: bool, size: str) -> dict | None:
    """The measured entry for this shape, else the nearest measured size class, else None."""
    try:
        from .tuned_configs import TUNED
    except ImportError:  # no table generated yet
        return None
    for s in SIZE_FALLBACK[size]:
        if (found := TUNED.get(kind, {}).get(table_key(dtype, head_dim, causal, s))) is not None:
            return found
    return None


def _config(kind: str, dtype: torch.dtype, head_dim: int, causal: bool, n_bh: int, n_queries: int,
            n_keys: int):
    """Override (tests, tuning) > interpreter tiles > measured table > heuristic."""
    cls, interp, heuristic = {"fwd": (FwdConfig, INTERPRETER_FWD, heuristic_fwd),
                              "bwd": (BwdConfig, INTERPRETER_BWD, heuristic_bwd)}[kind]
    if kind in _override:
        return _override[kind]
    if interpreting():
        return interp
    found = _tuned(kind, dtype, head_dim, causal, size_class(n_bh, n_queries, n_keys))
    return cls(**found) if found else heuristic(dtype, next_power_of_2(head_dim))


def fwd_config(dtype: torch.dtype, head_dim: int, causal: bool, n_bh: int, n_queries: int,
               n_keys: int) -> FwdConfig:
    return _config("fwd", dtype, head_dim, causal, n_bh, n_queries, n_keys)


def bwd_config(dtype: torch.dtype, head_dim: int, causal: bool, n_bh: int, n_queries: int,
               n_keys: int) -> BwdConfig:
    return _config("bwd", dtype, head_dim, causal, n_bh, n_queries, n_keys)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from . import tune

    return tune.main(argv)


if __name__ == "__main__":
    sys.exit(main())
