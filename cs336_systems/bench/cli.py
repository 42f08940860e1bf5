"""What every benchmark CLI shares: one-line argument errors, value checks argparse runs while
parsing (so a bad value is refused before any process starts or any file is written), and
opening a results store as a CLI error rather than a traceback.

    p = Parser(prog="ddp")
    p.add_argument("--world-size", type=at_least(1), default=2)
    p.add_argument("--sizes", type=csv_of(str, choices=SIZES))
    store = open_store(p, "ddp/steps", KEY, device="cpu", root=args.results_dir)

A bad value exits 2 with one line, `ddp: error: argument --world-size: expected an integer >= 1,
got '0'`, naming the flag and what it takes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from .store import NotOurResultsFile, ResultStore, UncommittedCode


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`prog: error: ...`, no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _number(kind: type) -> str:
    return "an integer" if kind is int else "a number"


def at_least(low: float, kind: type = int) -> Callable[[str], Any]:
    """argparse type: a `kind` (int or float) >= low."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= low:
            raise argparse.ArgumentTypeError(f"expected {_number(kind)} >= {low:g}, got {text!r}")
        return value
    return parse


def positive(kind: type = float) -> Callable[[str], Any]:
    """argparse type: a `kind` (int or float) > 0 (and finite)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected {_number(kind)} > 0, got {text!r}")
        return value
    return parse


def csv_of(kind: Callable[[str], Any] = str, *, choices: Sequence[Any] | None = None,
           allow_empty: bool = False) -> Callable[[str], list]:
    """argparse type: comma-separated values, each through `kind` (which may itself be at_least(...)
    or positive(...)) and, if given, one of `choices`. Empty only if allow_empty."""
    def parse(text: str) -> list:
        values = []
        for item in (t.strip() for t in text.split(",")):
            if not item:
                continue
            try:
                value = kind(item)
            except (ValueError, argparse.ArgumentTypeError) as exc:  # the message names the item
                raise argparse.ArgumentTypeError(str(exc)) from None
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown {item!r}; expected comma-separated values from {', '.join(map(str, choices))}")
            values.append(value)
        if not values and not allow_empty:
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return values
    return parse


def check_cuda(p: argparse.ArgumentParser, device: str, gpus: int = 1, flag: str = "--device") -> None:
    """Refuse a CUDA device this machine does not have, in one line: `gpus` GPUs must be visible."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        p.error(f"{flag}: expected cpu or cuda, got {device!r}")
    if dev.type not in ("cpu", "cuda"):
        p.error(f"{flag}: expected cpu or cuda, got {device!r}")
    if dev.type != "cuda":
        return
    have = torch.cuda.device_count()
    need = max(gpus, (dev.index or 0) + 1)
    if have < need:
        p.error(f"{flag} {device}: needs {need} CUDA GPU(s), {have} visible")


def open_store(p: argparse.ArgumentParser, bench: str, key: Iterable[str], *,
               device: str | None = None, root: str | Path | None = None) -> ResultStore:
    """The store of `bench`, checked before anything is measured: a file that is not ours, or
    committed results from uncommitted code, is a one-line CLI error (exit 2)."""
    try:
        store = ResultStore(bench, key, device=device, root=root)
        store.check_writable()
        return store
    except (NotOurResultsFile, UncommittedCode) as exc:
        p.error(str(exc).splitlines()[0])
