"""Run a grid of benchmark cells into a ResultStore: resumable, OOM-tolerant, with progress.

Every cell is measured, unless the store resumes an interrupted invocation (`--resume`): then the
cells that invocation finished are skipped. Each row records `cell_wall_s`, the cell's wall time
(set-up included), from which `just bench-all` estimates how long the next run takes.

Exit codes of the sweeps: 0 every cell done, 1 some cell ended in "error" (so `just bench-all`
reports the failure), 3 stopped early by a time budget (re-run with `--resume RUN` to go on).
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from .oom import oom_details
from .store import ResultStore

Cell = Mapping[str, Any]
EXIT_OK, EXIT_FAILED, EXIT_INCOMPLETE = 0, 1, 3


def worst(*codes: int) -> int:
    """The exit code of several sweeps: a failure outranks an early stop, which outranks success."""
    return max(codes, key=[EXIT_OK, EXIT_INCOMPLETE, EXIT_FAILED].index, default=EXIT_OK)


def exit_code(rows: Iterable[Mapping[str, Any]], bench: str = "sweep") -> int:
    """EXIT_FAILED (with one line on stderr) if any of `rows` ended in "error", else EXIT_OK."""
    rows = list(rows)
    failed = [r for r in rows if r.get("status") == "error"]
    if not failed:
        return EXIT_OK
    print(f"[{bench}] {len(failed)} of {len(rows)} cells failed; first: {failed[0].get('error')}",
          file=sys.stderr)
    return EXIT_FAILED


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
              *, desc: str | None = None, fail_fast: bool = False,
              written: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Measure every cell that `store`'s invocation has not finished (all of them, unless it resumes
    an interrupted run), appending one row per cell as it finishes.

    `measure(cell)` returns the metrics dict. An OOM becomes a row with status "oom" (a result,
    not a crash), with the allocator's numbers and any `oom_context` dict the exception carries; any other exception becomes status "error" with its message, and the sweep goes on
    (unless fail_fast). Returns the rows written by this call; exit_code(rows) turns them into
    the process's exit status. Rows also go into `written` if given, so a caller that stops the
    sweep with an exception still has them.
    """
    store.check_writable()  # refuse before measuring anything, not after the first cell
    cells = list(cells)
    todo = [c for c in cells if not store.has(c)]
    if len(todo) < len(cells):
        print(f"[{store.bench}] resuming run {store.invocation}: {len(cells) - len(todo)} of "
              f"{len(cells)} cells done in {store.path}; measuring the other {len(todo)}", file=sys.stderr)
    written = [] if written is None else written
    bar = tqdm(todo, desc=desc or store.bench, unit="cell", file=sys.stderr, dynamic_ncols=True)
    for cell in bar:
        bar.set_postfix_str(", ".join(f"{k}={cell[k]}" for k in store.key), refresh=False)
        start = time.monotonic()
        try:
            metrics = measure(cell)
            written.append(store.append(cell, {**metrics, "cell_wall_s": time.monotonic() - start}))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row
            if is_oom(exc):
                # `oom_context`: fields the measure function attached (the phase it failed in, its
                # memory arithmetic), stored beside the allocator's numbers
                details = {**oom_details(exc), **getattr(exc, "oom_context", {})}
                written.append(store.append(cell, details, status="oom", error="CUDA out of memory"))
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
