"""What every benchmark CLI shares: one-line argument errors, value checks argparse runs while
parsing (so a bad value is refused before any process starts or any file is written), and
opening a results store as a CLI error rather than a traceback.

    p = Parser(prog="ddp")
    p.add_argument("--world-size", type=at_least(1), default=2)
    p.add_argument("--sizes", type=csv_of(str, choices=SIZES))
    p.add_argument("--timeout-s", type=timeout_s, default=600.0)
    add_resume(p)
    args = p.parse_args(argv)
    require_gpu(p, args.device, args.results_dir)          # the [gpu] benchmarks
    store = open_store(p, "ddp/steps", KEY, device="cpu", root=args.results_dir)

A bad value exits 2 with one line, `ddp: error: argument --world-size: expected an integer >= 1,
got '0'`, naming the flag and what it takes. Before the first cell, open_store checks where the
rows go (a directory that can take the file, a results file of ours whose every line is a row
with the bench's key fields) and picks the invocation id its rows carry: a new one, or with
`--resume` the interrupted run's, whose finished cells are then skipped.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from .store import BadDestination, NotOurResultsFile, ResultStore, UncommittedCode, new_invocation

# The longest timeout the libraries take: c10d adds it, in nanoseconds, to a steady-clock time
# point (int64 ns: about 9.2e9 s minus the uptime; a 1e10 s store timeout fails), and Python's
# lock waits stop at threading.TIMEOUT_MAX (about 9.2e9 s). 1e9 s (31 years) is well inside both.
MAX_TIMEOUT_S = 1e9
# Seeds torch.manual_seed and torch.Generator.manual_seed take: 0 .. 2^64 - 1.
MAX_SEED = 2**64 - 1
RESUME_NEWEST = "newest"  # `--resume` without an id
# Stores opened by open_store in this process, with their row count then and whether the CLI takes
# --resume: what a Ctrl-C reports (bench/__main__.py).
OPENED: list[tuple[ResultStore, int, bool]] = []


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`prog: error: ...`, no usage block) and exit 2.

    After parsing, `args` holds the namespace and `given` the dests of the options the command
    line named, so a check can tell an explicit flag from its default."""

    args: argparse.Namespace | None = None
    given: frozenset[str] = frozenset()
    invocation: str | None = None

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        self.args, self.given = parsed, self._given(args)
        return parsed, extras

    def _given(self, args) -> frozenset[str]:
        """The dests the command line set: parse again with every option's default suppressed."""
        optionals = [a for a in self._actions if a.option_strings and a.default is not argparse.SUPPRESS]
        saved = [a.default for a in optionals]
        try:
            for a in optionals:
                a.default = argparse.SUPPRESS
            ns, _ = super().parse_known_args(args, argparse.Namespace())
        finally:
            for a, default in zip(optionals, saved):
                a.default = default
        return frozenset(vars(ns))

    def flag(self, dest: str) -> str:
        """The option string of `dest` (--batch-size for batch_size)."""
        for a in self._actions:
            if a.dest == dest and a.option_strings:
                return max(a.option_strings, key=len)
        return f"--{dest.replace('_', '-')}"


def _number(kind: type) -> str:
    return "an integer" if kind is int else "a number"


def at_least(low: float, kind: type = int, *, high: float | None = None,
             why: str = "") -> Callable[[str], Any]:
    """argparse type: a finite `kind` (int or float) >= low (and <= high, if given). `why`, if
    given, says in the message what the bound stands for."""
    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            value = None
        if (value is None or not value >= low or (kind is float and not math.isfinite(value))
                or (high is not None and not value <= high)):
            shown = (lambda x: f"{x:,}") if kind is int else (lambda x: f"{x:g}")
            bound = f">= {shown(low)}" if high is None else f"in [{shown(low)}, {shown(high)}]"
            raise argparse.ArgumentTypeError(f"expected {_number(kind)} {bound}{why}, got {text!r}")
        return value
    return parse


# Timeouts (seconds): positive, finite and at most what c10d and Python's waits accept.
timeout_s = at_least(1e-3, float, high=MAX_TIMEOUT_S, why=" (seconds; the libraries take no longer)")
# Seeds: what torch.manual_seed takes.
seed = at_least(0, int, high=MAX_SEED, why=" (torch.manual_seed's range)")


def results_root(text: str) -> Path:
    """argparse type of --results-dir: a directory; '' (which would mean the current directory)
    is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty path")
    return Path(text)


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
    or positive(...)) and, if given, one of `choices`; each once. Empty only if allow_empty."""
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
            if value in values:  # a cell asked for twice would be measured twice
                raise argparse.ArgumentTypeError(f"{item!r} given twice")
            values.append(value)
        if not values and not allow_empty:
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return values
    return parse


def refuse_duplicates(p: argparse.ArgumentParser, args: argparse.Namespace, *dests: str) -> None:
    """One-line error if a list flag (nargs="+") names a value twice: it would be measured twice,
    or silently once."""
    for dest in dests:
        values = getattr(args, dest, None) or []
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            flag = p.flag(dest) if isinstance(p, Parser) else f"--{dest.replace('_', '-')}"
            p.error(f"argument {flag}: {', '.join(twice)} given twice")


def given(p: argparse.ArgumentParser, dest: str) -> bool:
    """Whether the command line named the option of `dest` (not just its default)."""
    return dest in getattr(p, "given", ())


def check_cuda(p: argparse.ArgumentParser, device: str, gpus: int = 1, flag: str = "--device",
               hint: str = "") -> None:
    """Refuse a CUDA device this machine does not have, in one line: `gpus` GPUs must be visible."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        p.error(f"{flag}: expected cpu or cuda, got {device!r}")
    if dev.type not in ("cpu", "cuda"):
        p.error(f"{flag}: expected cpu or cuda, got {device!r}")
    if dev.type != "cuda":
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = max(gpus, (dev.index or 0) + 1)
    if have < need:
        p.error(f"{flag} {device}: needs {need} CUDA GPU(s), {have} visible{hint}")


def require_gpu(p: argparse.ArgumentParser, device: str = "cuda", results_dir: str | Path | None = None, *,
                cpu_smoke: bool = True, gpus: int = 1, flag: str | None = "--device") -> None:
    """The device check of a `[gpu]` benchmark (`just bench list`), before anything starts.

    --device cuda (their default) needs the GPUs; on a machine without one that is a one-line
    error, not a run on the CPU. --device cpu is the benchmark's CPU smoke run where it has one
    (`cpu_smoke`): its rows are no GPU results, so it must name --results-dir (results/_local/ is
    git-ignored) instead of adding cpu.jsonl files beside the committed GPU rows. `flag` None: the
    benchmark has no device flag (it always times a GPU)."""
    smoke = " (a GPU benchmark; --device cpu --results-dir DIR is its CPU smoke run)" if cpu_smoke else \
        " (a GPU benchmark)"
    if flag is None:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < gpus:
            p.error(f"needs {gpus} CUDA GPU(s), {have} visible{smoke}")
        return
    check_cuda(p, device, gpus=gpus, flag=flag, hint=smoke)
    if torch.device(device).type == "cuda":
        return
    if not cpu_smoke:
        p.error(f"{flag} {device}: this benchmark times a CUDA GPU; it has no CPU run")
    if results_dir is None:
        p.error(f"{flag} {device} is the CPU smoke run of a GPU benchmark: give --results-dir "
                f"(results/_local/ is git-ignored), its rows are not the committed GPU results")


def add_resume(p: argparse.ArgumentParser) -> None:
    """--resume [RUN]: go on with an interrupted invocation instead of starting a new one."""
    p.add_argument("--resume", nargs="?", const=RESUME_NEWEST, default=None, metavar="RUN",
                   help="measure only the cells the interrupted run RUN (its id, printed when it "
                        "stopped; alone: the run of the newest row) did not finish, under its id; "
                        "without it every cell is measured again under a new id")


def _invocation(p: argparse.ArgumentParser, store: ResultStore) -> str:
    """The id this CLI's rows carry: chosen at its first store, the same for the others."""
    if getattr(p, "invocation", None):
        return p.invocation
    resume = getattr(getattr(p, "args", None), "resume", None)
    runs = list(dict.fromkeys(r["invocation"] for r in store.rows_at_open if r.get("invocation")))
    if resume is None:
        invocation = new_invocation()
    elif resume == RESUME_NEWEST:
        newest = next((r.get("invocation") for r in reversed(store.rows_at_open)), None)
        if not newest:
            p.error(f"--resume: the newest row of {store.path} carries no run id (written before "
                    f"ids, or no row at all): nothing to resume; run without --resume")
        invocation = newest
    elif resume in runs:
        invocation = resume
    else:
        p.error(f"--resume {resume}: no row of that run in {store.path}"
                + (f" (its newest run: {runs[-1]})" if runs else ""))
    if isinstance(p, Parser):
        p.invocation = invocation
    return invocation


def open_store(p: argparse.ArgumentParser, bench: str, key: Iterable[str], *,
               device: str | None = None, root: str | Path | None = None) -> ResultStore:
    """The store of `bench`, checked before anything is measured: a destination that cannot take
    the file, a file that is not ours (a line that is not a row, a row without the key fields), or
    committed results from uncommitted code is a one-line CLI error (exit 2) naming the file and
    line. The store's invocation is new, or with --resume the interrupted run's."""
    if root is not None and not str(root).strip():
        p.error("argument --results-dir: expected a directory, got an empty path")
    try:
        store = ResultStore(bench, key, device=device, root=root)
        store.check_writable()
        store.use_invocation(_invocation(p, store))
    except (NotOurResultsFile, UncommittedCode, BadDestination) as exc:
        p.error(str(exc).splitlines()[0])
    OPENED.append((store, len(store.rows_at_open), any(a.dest == "resume" for a in p._actions)))
    return store
