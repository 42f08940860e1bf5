"""The results store: one JSON-lines file per (benchmark, device class).

    results/<bench>/<device-slug>.jsonl        e.g. results/attention/pytorch_attention/nvidia-h200.jsonl

Each line is one measured cell: its configuration, its metrics, a status ("ok", "oom", "error")
and the provenance fields. Rows are appended and flushed as they finish, so a sweep that dies keeps
every finished row; a re-run skips the cells already present. JSON lines (not CSV) because rows of
one file may carry different metric columns (an OOM row has none).

A process killed mid-write leaves a torn last line (no newline, not JSON). Readers skip it with a
warning naming the file and line; the next append first moves it aside into `<file>.torn`, so the
new row starts on a line of its own instead of being glued to the torn one.

Rows written under the repository's results/ must be traceable to a commit: from a tree with
uncommitted code changes the store refuses to append there (UncommittedCode) unless
CS336_ALLOW_DIRTY=1, and then the rows say '<commit>-dirty'. Scratch roots (tests, results/_local/,
--results-dir elsewhere) take rows from any tree.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .provenance import device_slug, git_commit, provenance, traceable

try:  # POSIX: one writer at a time repairs and appends
    import fcntl
except ImportError:  # Windows: no advisory locks; appends are still whole rows
    fcntl = None

SCHEMA = "cs336-results/1"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Where results go by default. Tests and CPU scratch runs point this elsewhere (CS336_RESULTS_DIR or
# --results-dir); committed GPU results live under results/ in the repository.
DEFAULT_ROOT = Path(os.environ.get("CS336_RESULTS_DIR", REPO_ROOT / "results"))
# The results the site is built from: every row here must name the commit that measured it.
# Except results/_local/, which git ignores: the place for scratch runs.
COMMITTED_ROOT = REPO_ROOT / "results"
SCRATCH_DIR = "_local"
DONE_STATUSES = frozenset({"ok", "oom", "unsupported"})  # "error" rows are retried on re-run


class NotOurResultsFile(ValueError):
    """The file exists but was not written by this store (wrong schema); we refuse to append."""


class UncommittedCode(RuntimeError):
    """Rows for the committed results/ from code that no commit holds; we refuse to append."""


class SkippedLineWarning(UserWarning):
    """A reader skipped a line of a results file (torn by a killed writer, or not JSON)."""


def results_path(bench: str, device: str | None = None, root: str | Path | None = None) -> Path:
    """Path of the results file for `bench` (a name like 'attention/pytorch_attention')."""
    if not bench or bench.startswith("/") or ".." in Path(bench).parts:
        raise ValueError(f"bench must be a relative name like 'chapter/name', got {bench!r}")
    slug = device if device is not None else device_slug()
    return Path(root if root is not None else DEFAULT_ROOT) / bench / f"{slug}.jsonl"


def _is_torn(line: str) -> bool:
    """The start of a row a killed writer never finished: an unparseable JSON object (rows are
    objects). Only the last line of a file, with no newline after it, can be one."""
    if not line.lstrip().startswith("{"):
        return False
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return True
    return False


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of one results file (none if it does not exist).

    A line that is not JSON is skipped with a SkippedLineWarning naming file and line: the torn tail
    of a killed writer, or (in files written before appends repaired the tail) a torn row that an
    append was glued to. A file with no row of ours besides a torn tail, or with a JSON line lacking
    our schema, raises NotOurResultsFile.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")  # rows never hold a raw newline: JSON escapes it
    rows, skipped = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue  # blank lines hold no row (the last element after the final newline is "")
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            torn = i == len(lines) - 1 and _is_torn(line)
            skipped.append((i + 1, "torn last line (a writer killed mid-row?)" if torn else "line: not JSON"))
            continue
        if not isinstance(row, dict) or row.get("schema") != SCHEMA:
            raise NotOurResultsFile(
                f"{path}:{i + 1} lacks schema {SCHEMA!r}; refusing to mix our rows into it")
        rows.append(row)
    if not rows and any(why.endswith("not JSON") for _, why in skipped):
        raise NotOurResultsFile(f"{path}:{skipped[0][0]} is not JSON; not a results file of ours")
    for line_no, why in skipped:
        warnings.warn(f"{path}:{line_no}: skipped {why}", SkippedLineWarning, stacklevel=2)
    return rows


def _last_line_start(f, end: int, chunk: int = 1 << 16) -> int:
    """Offset just after the last newline before `end` of an open binary file (0 if none)."""
    pos = end
    while pos > 0:
        step = min(chunk, pos)
        f.seek(pos - step)
        i = f.read(step).rfind(b"\n")
        if i >= 0:
            return pos - step + i + 1
        pos -= step
    return 0


def repair_torn_tail(path: str | Path) -> str | None:
    """Move a torn last line of `path` into `<path>.torn` and cut it off; return it (None if the file
    ends cleanly). A last line that parses but lacks its newline only gets the newline. Reads only
    the last line, not the file."""
    path = Path(path)
    if not path.exists():
        return None
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return None
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return None
        start = _last_line_start(f, end)
        f.seek(start)
        tail = f.read().decode(errors="replace")
        f.seek(0)
        line_no = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b"")) + 1
    if not _is_torn(tail):
        if tail.lstrip().startswith("{"):  # a whole row whose newline never came
            with open(path, "ab") as f:
                f.write(b"\n")
            return None
        raise NotOurResultsFile(f"{path}:{line_no} is not JSON; not a results file of ours")
    aside = path.with_name(path.name + ".torn")
    with open(aside, "a") as f:
        f.write(tail + "\n")
    with open(path, "r+b") as f:
        f.truncate(start)
    warnings.warn(f"{path}:{line_no}: torn last line moved to {aside.name} before appending",
                  SkippedLineWarning, stacklevel=2)
    return tail


def check_committable(path: str | Path) -> None:
    """Refuse (UncommittedCode) to write under the committed results/ from untraceable code."""
    path, committed = Path(path).resolve(), COMMITTED_ROOT.resolve()
    if not path.is_relative_to(committed) or path.relative_to(committed).parts[0] == SCRATCH_DIR:
        return  # a scratch root: tests, CPU trials, results/_local/
    commit = git_commit()
    if traceable(commit) or os.environ.get("CS336_ALLOW_DIRTY") == "1":
        return
    shown = path.relative_to(REPO_ROOT.resolve()) if path.is_relative_to(REPO_ROOT.resolve()) else path
    raise UncommittedCode(
        f"refusing to write {shown}: the code is at git {commit!r} (uncommitted changes outside "
        f"results/), so no commit could reproduce these rows; commit first, pass --results-dir "
        f"elsewhere, or set CS336_ALLOW_DIRTY=1 to write rows labelled {commit!r}")


def _lock(f) -> None:
    """An exclusive advisory lock on the open file (the OS drops it if we are killed): one writer at
    a time repairs the tail and appends, so no writer cuts off a row another is still writing."""
    if fcntl is not None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf; store them as null so every reader agrees."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultStore:
    """Append-only rows for one benchmark on one device class.

    `key` names the configuration fields that identify a cell; `has(config)` tells whether a
    finished row (status ok/oom/unsupported) for that cell is already stored.
    """

    def __init__(self, bench: str, key: Iterable[str], *, device: str | None = None,
                 root: str | Path | None = None):
        self.bench = bench
        self.key = tuple(key)
        if not self.key:
            raise ValueError("key must name at least one configuration field")
        self.path = results_path(bench, device, root)
        self._done: set[tuple] = set()
        for row in self.rows():
            if row.get("status") in DONE_STATUSES:
                self._done.add(self._key_of(row))

    def _key_of(self, config: Mapping[str, Any]) -> tuple:
        missing = [k for k in self.key if k not in config]
        if missing:
            raise KeyError(f"configuration lacks key field(s) {missing} of bench {self.bench!r}")
        return tuple(json.dumps(config[k], sort_keys=True) for k in self.key)

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row; a skipped line (a torn tail, say) is reported by a SkippedLineWarning."""
        return read_rows(self.path)

    def has(self, config: Mapping[str, Any]) -> bool:
        return self._key_of(config) in self._done

    def newest(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last finished row stored for this cell, or None."""
        key = self._key_of(config)
        done = [r for r in self.rows() if r.get("status") in DONE_STATUSES and self._key_of(r) == key]
        return done[-1] if done else None

    def forget(self, config: Mapping[str, Any]) -> None:
        """Let run_sweep measure this cell again. Its stored rows stay; readers keep the newest."""
        self._done.discard(self._key_of(config))

    def append(self, config: Mapping[str, Any], metrics: Mapping[str, Any] | None = None, *,
               status: str = "ok", error: str | None = None) -> dict[str, Any]:
        """Write one row and flush it to disk before returning."""
        row: dict[str, Any] = {"schema": SCHEMA, "bench": self.bench}
        row.update({k: _clean(v) for k, v in config.items()})
        row.update({k: _clean(v) for k, v in (metrics or {}).items()})
        row["status"] = status
        if error:
            row["error"] = error[:500]
        row.update(provenance())
        self.check_writable()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:  # O_APPEND: each write lands at the end, after any repair
            _lock(f)
            repair_torn_tail(self.path)
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if status in DONE_STATUSES:
            self._done.add(self._key_of(config))
        return row

    def check_writable(self) -> None:
        """Raise UncommittedCode now if append would; CLIs call it before measuring anything."""
        check_committable(self.path)
