"""Run a grid of benchmark cells into a ResultStore: resumable, OOM-tolerant, with progress."""

from __future__ import annotations

import gc
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from .store import ResultStore

Cell = Mapping[str, Any]


def is_oom(exc: BaseException) -> bool:
    """CUDA OOM, or the allocator's RuntimeError that says the same thing."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_sweep(store: ResultStore, cells: Iterable[Cell], measure: Callable[[Cell], Mapping[str, Any]],
              *, desc: str | None = None, fail_fast: bool = False) -> list[dict[str, Any]]:
    """Measure every cell not already in `store`, appending one row per cell as it finishes.

    `measure(cell)` returns the metrics dict. An OOM becomes a row with status "oom" (a result,
    not a crash); any other exception becomes status "error" with its message, and the sweep goes on
    (unless fail_fast). Returns the rows written by this call.
    """
    cells = list(cells)
    todo = [c for c in cells if not store.has(c)]
    if len(todo) < len(cells):
        print(f"[{store.bench}] {len(cells) - len(todo)} of {len(cells)} cells already in "
              f"{store.path}; measuring the other {len(todo)}", file=sys.stderr)
    written = []
    bar = tqdm(todo, desc=desc or store.bench, unit="cell", file=sys.stderr, dynamic_ncols=True)
    for cell in bar:
        bar.set_postfix_str(", ".join(f"{k}={cell[k]}" for k in store.key), refresh=False)
        try:
            metrics = measure(cell)
            written.append(store.append(cell, metrics))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row
            if is_oom(exc):
                written.append(store.append(cell, status="oom", error="CUDA out of memory"))
            else:
                msg = f"{type(exc).__name__}: {exc}"
                written.append(store.append(cell, status="error", error=msg))
                tqdm.write(f"[{store.bench}] {cell}: {msg}", file=sys.stderr)
                if fail_fast:
                    traceback.print_exc()
                    raise
        finally:
            free_memory()
    return written
