"""The results store: one JSON-lines file per (benchmark, device class).

    results/<bench>/<device-slug>.jsonl        e.g. results/attention/pytorch_attention/nvidia-h200.jsonl

Each line is one measured cell: its configuration, its metrics, a status ("ok", "oom", "error")
and the provenance fields. Rows are appended and flushed as they finish, so a sweep that dies keeps
every finished row; a re-run skips the cells already present. JSON lines (not CSV) because rows of
one file may carry different metric columns (an OOM row has none).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .provenance import device_slug, provenance

SCHEMA = "cs336-results/1"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Where results go by default. Tests and CPU scratch runs point this elsewhere (CS336_RESULTS_DIR or
# --results-dir); committed GPU results live under results/ in the repository.
DEFAULT_ROOT = Path(os.environ.get("CS336_RESULTS_DIR", REPO_ROOT / "results"))
DONE_STATUSES = frozenset({"ok", "oom", "unsupported"})  # "error" rows are retried on re-run


class NotOurResultsFile(ValueError):
    """The file exists but was not written by this store (wrong schema); we refuse to append."""


def results_path(bench: str, device: str | None = None, root: str | Path | None = None) -> Path:
    """Path of the results file for `bench` (a name like 'attention/pytorch_attention')."""
    if not bench or bench.startswith("/") or ".." in Path(bench).parts:
        raise ValueError(f"bench must be a relative name like 'chapter/name', got {bench!r}")
    slug = device if device is not None else device_slug()
    return Path(root if root is not None else DEFAULT_ROOT) / bench / f"{slug}.jsonl"


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
        """Every stored row. A torn last line (the process died mid-write) is ignored."""
        if not self.path.exists():
            return []
        rows = []
        lines = self.path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    continue
                raise NotOurResultsFile(f"{self.path}:{i + 1} is not JSON; not a results file of ours")
            if not isinstance(row, dict) or row.get("schema") != SCHEMA:
                raise NotOurResultsFile(
                    f"{self.path}:{i + 1} lacks schema {SCHEMA!r}; refusing to mix our rows into it")
            rows.append(row)
        return rows

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if status in DONE_STATUSES:
            self._done.add(self._key_of(config))
        return row
