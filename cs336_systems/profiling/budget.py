"""Shared plumbing of the Part 1 sweeps: a time budget per sweep, one cached model, a one-line CLI error.

GPU time comes in 10-minute calls. Each sweep gets a budget: once it is spent, no new cell starts,
the finished rows stay, and the next call (the same command with `--resume RUN`) goes on where
this one stopped.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from cs336_systems.bench import cli, fit
from cs336_systems.bench.store import ResultStore
from cs336_systems.bench.sweep import EXIT_INCOMPLETE, exit_code, run_sweep
from cs336_systems.model import get_config

from .steps import build_model


class OutOfTime(KeyboardInterrupt):
    """Raised before a cell starts once the sweep's budget is spent.

    A KeyboardInterrupt subclass because run_sweep re-raises those instead of recording an error
    row: running out of budget is a stop request, not a failed cell.
    """


def run_budgeted(store: ResultStore, cells: Iterable[Mapping[str, Any]],
                 measure: Callable[[Mapping[str, Any]], Mapping[str, Any]], *,
                 budget_s: float | None, desc: str | None = None) -> int:
    """run_sweep, stopping before any cell that would start after `budget_s` seconds.

    Returns the exit code: EXIT_OK when every cell is done, EXIT_FAILED when a cell ended in
    "error", EXIT_INCOMPLETE when the budget ran out first (bench.sweep).
    """
    deadline = time.monotonic() + budget_s if budget_s else None

    def guarded(cell):
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime
        return measure(cell)

    written: list = []
    try:
        written = run_sweep(store, cells, guarded, desc=desc, written=written)
    except OutOfTime:
        print(f"[{store.bench}] time budget of {budget_s:.0f} s spent; the same command with "
              f"--resume {store.invocation} measures the rest", file=sys.stderr)
        return exit_code(written, store.bench) or EXIT_INCOMPLETE
    return exit_code(written, store.bench)


class ModelCache:
    """Holds one model at a time, keyed by (size, context): sweeps go size by size."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.key: tuple | None = None
        self.model: torch.nn.Module | None = None

    def get(self, size: str, context: int) -> torch.nn.Module:
        if self.key != (size, context):
            self.model = None
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.model = build_model(get_config(size, context), self.device)
            self.key = (size, context)
        return self.model


def open_store(p: argparse.ArgumentParser, bench: str, key: Iterable[str], args) -> ResultStore:
    """The store of `bench` on this device (cpu slug for a CPU run); a foreign file, or committed
    results from uncommitted code, is a one-line CLI error."""
    device = "cpu" if torch.device(args.device).type != "cuda" else None
    return cli.open_store(p, bench, key, device=device, root=args.results_dir)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda",
                   help="cuda (a GPU benchmark), or cpu for its CPU smoke run with --results-dir")
    p.add_argument("--results-dir", type=cli.results_root, default=None, help="results root (default: results/)")
    p.add_argument("--budget-s", type=cli.positive(float), default=None,
                   help="start no new cell after this many seconds (then --resume RUN goes on)")
    cli.add_resume(p)
    fit.add_allow_oom(p)


def check_device(p: argparse.ArgumentParser, args) -> None:
    cli.require_gpu(p, args.device, args.results_dir)


def check_fit(p: argparse.ArgumentParser, args, cells: Iterable[Mapping[str, Any]],
              describe: Callable[[Mapping[str, Any]], str],
              checkpointed: Callable[[Mapping[str, Any]], int] | None = None) -> None:
    """Refuse (one line naming the cell by its flags, `describe(cell)`) a cell whose step cannot
    fit on this device (bench.fit: the training step's memory arithmetic), unless --allow-oom.
    A cell is a dict with size, context, mode, dtype and batch (and attention: naive if absent)."""
    have, where = fit.capacity_bytes(args.device)
    for cell in cells:
        cfg = get_config(cell["size"], cell["context"])
        need = fit.step_memory(cfg, cell["mode"], batch=cell["batch"], context=cell["context"],
                               bf16=cell["dtype"] == "bf16",
                               checkpointed_blocks=checkpointed(cell) if checkpointed else 0,
                               attention=cell.get("attention", "naive"))
        fit.refuse_unless_fits(p, args, need, have, where, describe(cell))
