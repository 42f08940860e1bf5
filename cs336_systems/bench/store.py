"""The results store: one JSON-lines file per (benchmark, device class).

    results/<bench>/<device-slug>.jsonl        e.g. results/attention/pytorch_attention/nvidia-h200.jsonl

Each line is one measured cell: its configuration, its metrics, a status ("ok", "oom", "error")
and the provenance fields. Rows are appended and flushed as they finish, so a sweep that dies keeps
every finished row; a re-run skips the cells already present. JSON lines (not CSV) because rows of
one file may carry different metric columns (an OOM row has none).

A process killed mid-write leaves a torn last line (no newline, not JSON). Readers skip it with a
warning naming the file and line; the next append first moves it aside into `<file>.torn`, so the
new row starts on a line of its own instead of being glued to the torn one. Anything else that is
not a row of ours (a line that is not UTF-8, or not JSON and not a torn row, a row without the
bench's key fields, a directory in the file's place) makes a writer refuse the file before it
measures anything (NotOurResultsFile, naming file and line); readers skip such lines with the same
warning, and the site build (docs/hooks/markers.py, log_skipped_lines) turns each into a
warning that fails `mkdocs build --strict`.

Every row carries the id of the invocation that wrote it (`invocation`). The committed rows are the
site's reference, not a resume point: a store skips (`has`) only the cells its own invocation
finished, so a new invocation measures every cell again, and resuming an interrupted one means
opening the store with that invocation's id (the CLIs' `--resume`). Readers keep the newest row
of a cell.

Rows written under the repository's results/ must be traceable to a commit: from a tree with
uncommitted code changes the store refuses to append there (UncommittedCode) unless
CS336_ALLOW_DIRTY=1, and then the rows say '<commit>-dirty'. Scratch roots (tests, results/_local/,
--results-dir elsewhere) take rows from any tree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
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
    """A reader skipped a line of a results file (torn by a killed writer, not JSON, not UTF-8)."""


class BadDestination(ValueError):
    """Where the rows would go cannot hold them (a file in a directory's place, a read-only or
    pseudo file system); raised before anything is measured."""


# Pseudo file systems: writable-looking for root, never a place for results.
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


def new_invocation() -> str:
    """A fresh invocation id: UTC start time (so ids sort by age) and 6 random hex digits."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


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


def _scan(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str, bool]]]:
    """(rows with their line numbers, skipped lines as (line, why, torn)) of one results file.

    `torn` marks a line that starts like a row but is cut short: a killed writer's tail, or (in
    files written before appends repaired the tail) a torn row that an append was glued to. The
    others (not UTF-8, not JSON) are not ours. A JSON line lacking our schema raises."""
    if path.is_dir():
        raise NotOurResultsFile(f"{path} is a directory, not a results file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NotOurResultsFile(f"{path}: cannot read it ({exc.strerror or exc})") from None
    lines = data.split(b"\n")  # rows never hold a raw newline: JSON escapes it
    rows, skipped = [], []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue  # blank lines hold no row (the last element after the final newline is b"")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            skipped.append((i + 1, f"line: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})", False))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            last = i == len(lines) - 1
            torn = _is_torn(line)
            why = ("torn last line (a writer killed mid-row?)" if last and torn
                   else "line: a torn row" if torn else "line: not JSON")
            skipped.append((i + 1, why, torn))
            continue
        if not isinstance(row, dict) or row.get("schema") != SCHEMA:
            raise NotOurResultsFile(
                f"{path}:{i + 1} lacks schema {SCHEMA!r}; refusing to mix our rows into it")
        rows.append((i + 1, row))
    if not rows and any(not torn for _, _, torn in skipped):
        first, why = next((line_no, why) for line_no, why, torn in skipped if not torn)
        raise NotOurResultsFile(f"{path}:{first}: {why.removeprefix('line: ')}; not a results file of ours")
    return rows, skipped


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of one results file (none if it does not exist).

    A line that is not a row (not UTF-8, not JSON: the torn tail of a killed writer, say) is
    skipped with a SkippedLineWarning naming file and line. A file with no row of ours besides
    such lines, or with a JSON line lacking our schema, raises NotOurResultsFile.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows, skipped = _scan(path)
    for line_no, why, _ in skipped:
        warnings.warn(f"{path}:{line_no}: skipped {why}", SkippedLineWarning, stacklevel=2)
    return [row for _, row in rows]


def check_results_file(path: str | Path, key: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The rows of `path` for a writer, which refuses (NotOurResultsFile, naming file and line)
    what a reader would skip or trip over later: a line that is not UTF-8, one that is neither JSON
    nor a torn row (the tail is repaired at the next append; an old glued row in the middle is
    skipped with a warning), a row without one of the `key` fields, a directory or an unreadable
    file in the file's place."""
    path = Path(path)
    if not path.exists():
        return []
    rows, skipped = _scan(path)
    for line_no, why, torn in skipped:
        if not torn:
            raise NotOurResultsFile(f"{path}:{line_no}: {why.removeprefix('line: ')}; not a row of ours "
                                    f"(fix or move the file aside)")
    key = tuple(key)
    for line_no, row in rows:
        missing = [k for k in key if k not in row]
        if missing:
            raise NotOurResultsFile(f"{path}:{line_no}: row lacks key field(s) {', '.join(missing)} of "
                                    f"bench {row.get('bench')!r} (fix or move the file aside)")
    for line_no, why, _ in skipped:
        warnings.warn(f"{path}:{line_no}: skipped {why}", SkippedLineWarning, stacklevel=2)
    return [row for _, row in rows]


def check_destination(path: str | Path) -> None:
    """Refuse (BadDestination) a results file that could not be created or appended to: a
    directory in its place or in a parent's, a read-only place, a pseudo file system."""
    path = Path(path)
    resolved = path.resolve()
    for pseudo in PSEUDO_ROOTS:
        if resolved.is_relative_to(pseudo):
            raise BadDestination(f"{path} is under {pseudo}, a pseudo file system, not a place for results")
    if path.exists():
        if not path.is_file():
            raise BadDestination(f"{path} is not a regular file")
        if not os.access(path, os.R_OK | os.W_OK):
            raise BadDestination(f"{path} is not readable and writable by this user")
        return
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link: mkdir would fail on it
            raise BadDestination(f"{parent} is a broken symbolic link")
        parent = parent.parent
    if not parent.is_dir():
        raise BadDestination(f"{parent} is a file, so {path} cannot be created under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadDestination(f"{parent} is not writable by this user, so {path} cannot be created")


def log_skipped_lines(logger: logging.Logger) -> None:
    """Send every SkippedLineWarning (each time, not once per place) to `logger` as a warning, with
    its file and line: the site build's hook passes mkdocs' logger, so `mkdocs build --strict`
    shows each skipped line of a results file and fails on it. Other warnings are left alone."""
    previous = warnings.showwarning
    if getattr(previous, "_logs_skipped_lines", None) is logger:
        return

    shown: set[str] = set()  # the report layer reads a file many times: say each line once

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, SkippedLineWarning):
            if str(message) not in shown:
                shown.add(str(message))
                logger.warning("results file: %s", message)
        else:
            previous(message, category, filename, lineno, file, line)

    show._logs_skipped_lines = logger  # type: ignore[attr-defined]
    warnings.showwarning = show
    warnings.simplefilter("always", SkippedLineWarning)


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
    """Append-only rows for one benchmark on one device class, written by one invocation.

    `key` names the configuration fields that identify a cell; `has(config)` tells whether this
    store's invocation already finished that cell (status ok/oom/unsupported). Rows of other
    invocations (the committed ones included) are never skipped: a new invocation measures every
    cell. `invocation` given: resume that invocation (its finished cells are skipped).
    """

    def __init__(self, bench: str, key: Iterable[str], *, device: str | None = None,
                 root: str | Path | None = None, invocation: str | None = None):
        self.bench = bench
        self.key = tuple(key)
        if not self.key:
            raise ValueError("key must name at least one configuration field")
        self.path = results_path(bench, device, root)
        self.rows_at_open = check_results_file(self.path, self.key)  # refuses a file not ours
        self.use_invocation(invocation or new_invocation())

    def use_invocation(self, invocation: str) -> None:
        """Write as `invocation` from now on, skipping (`has`) the cells it finished."""
        self.invocation = invocation
        self._done = {self._key_of(r) for r in self.rows_at_open
                      if r.get("status") in DONE_STATUSES and r.get("invocation") == invocation}

    def _key_of(self, config: Mapping[str, Any]) -> tuple:
        missing = [k for k in self.key if k not in config]
        if missing:
            raise KeyError(f"configuration lacks key field(s) {missing} of bench {self.bench!r}")
        return tuple(json.dumps(config[k], sort_keys=True) for k in self.key)

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row, of every invocation; a skipped line (a torn tail, say) is reported by
        a SkippedLineWarning."""
        return read_rows(self.path)

    def invocations(self) -> list[str]:
        """The invocation ids found in the file, oldest row first (rows from before ids: none)."""
        return list(dict.fromkeys(r["invocation"] for r in self.rows() if r.get("invocation")))

    def has(self, config: Mapping[str, Any]) -> bool:
        """Whether this invocation already finished the cell (so a resumed run skips it)."""
        return self._key_of(config) in self._done

    def newest(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last finished row stored for this cell by any invocation, or None."""
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
        row["invocation"] = self.invocation
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
        """Raise UncommittedCode or BadDestination now if append would; CLIs call it before
        measuring anything."""
        check_committable(self.path)
        check_destination(self.path)
