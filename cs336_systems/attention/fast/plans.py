"""What the speed work launches for one shape: tiles, and which kernel runs them.

A table entry (`tuned_configs.TUNED`, written by the tuner) and a tuner's result row store a plan
as one flat dict of fields (`fwd_fields` / `bwd_fields`, the same fields the rows have always had);
`fwd_plan` / `bwd_plan` read one back. The tiles are the teaching path's `FwdConfig` / `BwdConfig`;
the rest chooses among the faster kernels beside them: the one-pass backward
(`flash_bwd_onepass_kernel`, with the backward tiles' *1 fields) and the two Gluon kernels (their
own settings; a plan's Triton tiles still run the inputs a Gluon kernel does not take).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..tiles import BwdConfig, FwdConfig


# --8<-- [start:plans]
@dataclass(frozen=True)
class GluonFwdConfig:
    """The warp-specialised forward (gluon/flash_fwd_ws_kernel.py): keys per tile, tiles in flight,
    consumer warpgroups (64 query rows each). Applies on Hopper with Triton 3.6, bf16/fp16, d = 64,
    n_k a multiple of block_n."""
    block_n: int = 64
    stages: int = 4
    warpgroups: int = 3


@dataclass(frozen=True)
class GluonBwdConfig:
    """The warp-specialised one-pass backward (gluon/flash_bwd_ws_kernel.py): depth of each math
    warpgroup's Q/dO ring, slots of its dS^T hand-over ring, registers per thread of the dQ
    warpgroup (the rest go to the math warpgroups). Applies on Hopper with Triton 3.6, bf16/fp16,
    d = 64, n_k a multiple of 128."""
    stages: int = 2
    slots: int = 2
    dq_regs: int = 80


@dataclass(frozen=True)
class FwdPlan:
    tiles: FwdConfig
    gluon: GluonFwdConfig | None = None  # the Gluon forward where it applies; `tiles` elsewhere


@dataclass(frozen=True)
class BwdPlan:
    tiles: BwdConfig
    # One pass instead of two: the dK/dV program also adds its dQ share with fp32 atomics
    # (flash_bwd_onepass_kernel; uses the *1 tiles, ignores the *2 tiles).
    one_pass: bool = False
    gluon: GluonBwdConfig | None = None  # the Gluon backward where it applies; the rest elsewhere
# --8<-- [end:plans]

    def __post_init__(self):
        if self.one_pass and self.tiles.fused:
            raise ValueError("BwdPlan: one_pass and fused exclude each other (fused is a two-pass launch)")


def fwd_fields(plan: FwdPlan) -> dict:
    """The plan as the flat dict a table entry or a result row holds."""
    return {**asdict(plan.tiles), **_gluon_fields(plan.gluon, GluonFwdConfig)}


def bwd_fields(plan: BwdPlan) -> dict:
    tiles = asdict(plan.tiles)
    tma = {k: tiles.pop(k) for k in ("tma1", "tma2")}  # the rows' order: ..., fused, one_pass, tma1, tma2
    return {**tiles, "one_pass": plan.one_pass, **tma, **_gluon_fields(plan.gluon, GluonBwdConfig)}


def fwd_plan(entry: dict) -> FwdPlan:
    """A plan from a table entry's (or a row's) fields; missing fields take their defaults."""
    return FwdPlan(_from_fields(FwdConfig, entry), _gluon_from(GluonFwdConfig, entry))


def bwd_plan(entry: dict) -> BwdPlan:
    return BwdPlan(_from_fields(BwdConfig, entry), bool(entry.get("one_pass", False)),
                   _gluon_from(GluonBwdConfig, entry))


# A Gluon setting `x` is the flat field `ws_x`, and `gluon_ws` says whether the plan has one.
def _gluon_fields(gluon, cls) -> dict:
    return {"gluon_ws": gluon is not None, **{f"ws_{k}": v for k, v in asdict(gluon or cls()).items()}}


def _gluon_from(cls, entry: dict):
    return _from_fields(cls, entry, prefix="ws_") if entry.get("gluon_ws") else None


def _from_fields(cls, entry: dict, prefix: str = ""):
    return cls(**{f.name: entry[prefix + f.name] for f in fields(cls) if prefix + f.name in entry})
