"""Looking a shape up in a table of measured launch plans (`tuned_configs.TUNED`, handed in).

A table maps kind ("fwd" / "bwd") -> key -> a plan's fields. A key names what the kernels
specialise on and how much parallel work a launch has: dtype, padded head dim, mask, size class.
A shape the table lacks borrows the nearest measured size class (`SIZE_FALLBACK`); where no size
class of its dtype, head dim and mask was measured it runs the heuristic tiles, and says so once
per key (`UntunedShapeWarning`). Under the Triton interpreter (CPU) every shape gets the 16-wide
interpreter tiles: the table's were chosen for a GPU. No autotuning happens on a first call.
"""

from __future__ import annotations

import warnings

import torch

from ..tiles import INTERPRETER_BWD, INTERPRETER_FWD, heuristic_bwd, heuristic_fwd
from ..triton_loader import interpreting, next_power_of_2
from .plans import BwdPlan, FwdPlan, bwd_plan, fwd_plan

SIZE_FALLBACK = {"small": ("small", "medium", "large"), "medium": ("medium", "large"), "large": ("large", "medium"),
                 "huge": ("huge", "large", "medium")}


class UntunedShapeWarning(UserWarning):
    """A shape ran the heuristic tiles: the table has no measured plan for its dtype, head dim and mask."""


_WARNED: set[tuple[str, str]] = set()  # (kind, key) already reported in this process


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def size_class(n_bh: int, n_queries: int, n_keys: int) -> str:
    """How much parallel work a launch has: rows of (batch*heads) x seq. Tuned per class. "huge"
    (past 2^19 rows, e.g. 32 heads x 32k: a training step's attention) has loops long enough and
    programs many enough that other tiles win there."""
    rows = n_bh * max(n_queries, n_keys)
    return "small" if rows <= 4096 else "medium" if rows <= 32768 else "large" if rows <= 2**19 else "huge"


def table_key(dtype: torch.dtype, head_dim: int, causal: bool, size: str) -> str:
    # fp16 runs the bf16 entries: same width, same tensor-core rate.
    name = "bf16" if dtype == torch.float16 else dtype_name(dtype)
    return f"{name}-d{next_power_of_2(max(head_dim, 16))}-{'causal' if causal else 'full'}-{size}"


def key_is_causal(key: str) -> bool:
    """Whether a table key (`table_key`) names the causal mask."""
    return "-causal-" in key


def _entry(table: dict, kind: str, dtype: torch.dtype, head_dim: int, causal: bool, size: str) -> dict | None:
    """The measured entry for this shape, else the nearest measured size class, else None."""
    for s in SIZE_FALLBACK[size]:
        if (found := table.get(kind, {}).get(table_key(dtype, head_dim, causal, s))) is not None:
            return found
    return None


def lookup_fwd(table: dict, dtype: torch.dtype, head_dim: int, causal: bool, n_bh: int, n_queries: int,
               n_keys: int) -> FwdPlan:
    """Interpreter tiles > the table's entry (or the nearest size class's) > the heuristic tiles."""
    return lookup(table, "fwd", dtype, head_dim, causal, size_class(n_bh, n_queries, n_keys))


def lookup_bwd(table: dict, dtype: torch.dtype, head_dim: int, causal: bool, n_bh: int, n_queries: int,
               n_keys: int) -> BwdPlan:
    return lookup(table, "bwd", dtype, head_dim, causal, size_class(n_bh, n_queries, n_keys))


_KINDS = {"fwd": (FwdPlan, fwd_plan, INTERPRETER_FWD, heuristic_fwd),
          "bwd": (BwdPlan, bwd_plan, INTERPRETER_BWD, heuristic_bwd)}


def lookup(table: dict, kind: str, dtype: torch.dtype, head_dim: int, causal: bool, size: str):
    """The plan of one kind ("fwd" / "bwd") for a key's fields: what lookup_fwd / lookup_bwd return."""
    plan, from_entry, interpreter_tiles, heuristic = _KINDS[kind]
    if interpreting():
        return plan(interpreter_tiles)
    found = _entry(table, kind, dtype, head_dim, causal, size)
    if found:
        return from_entry(found)
    key = table_key(dtype, head_dim, causal, size)
    if (kind, key) not in _WARNED:
        _WARNED.add((kind, key))
        warnings.warn(f"FlashAttentionFast: no measured {kind} plan for {key} (nor another size class of it) "
                      "in fast/tuned_configs.py; running the heuristic tiles. `just bench flash-tune tune` "
                      "measures plans on this GPU", UntunedShapeWarning, stacklevel=2)
    return plan(heuristic(dtype, next_power_of_2(head_dim)))
