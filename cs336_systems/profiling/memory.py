"""Memory snapshots (problem memory_profiling): capture, reduce to a timeline, and read the largest
allocations.

Capture: torch.cuda.memory._record_memory_history around the measured region, then our own dump
(the allocator's snapshot dict plus the bytes allocated at the end and the phase markers). Reduce:
the active-memory timeline from the snapshot alone, as a series the sweep stores with its results
(the site draws it, without pytorch.org/memory_viz). Read: the largest allocations with the line of
our code that made them.

Phases are marked in the allocator's own trace: at the start of each phase the step allocates and
frees a tiny buffer of a size no model tensor has (MARKERS), so a timeline can shade forward,
backward and optimizer without trusting clocks or thread-dependent stack traces.
"""

from __future__ import annotations

import contextlib
import pickle
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .nvtx import PHASES

# Odd multiples of the allocator's 512-byte rounding (primes x 512): no model tensor has these sizes.
MARKERS = {name: 512 * p for name, p in zip(PHASES, (1009, 1013, 1019))}
MARKER_SIZES = {v: k for k, v in MARKERS.items()}
MIB = 2**20


def phase_marker(name: str) -> None:
    """Allocate and free one marker buffer, leaving an alloc/free pair in the allocator trace."""
    if name in MARKERS and torch.cuda.is_available():
        buf = torch.empty(MARKERS[name], dtype=torch.uint8, device="cuda")
        del buf


# --8<-- [start:record_snapshot]
@contextlib.contextmanager
def record_snapshot(path: str | Path, *, max_entries: int = 1_000_000) -> Iterator[dict]:
    """Record every allocation (with its Python stack) inside the block; pickle the snapshot to path
    (pytorch.org/memory_viz opens it).

    The yielded dict receives `peak_bytes` (allocator peak inside the block) after the block ends.
    """
    info: dict[str, Any] = {}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield info
    finally:
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        info["peak_bytes"] = torch.cuda.max_memory_allocated()
        snap["cs336"] = {"allocated_end": torch.cuda.memory_allocated(), "peak_bytes": info["peak_bytes"]}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(snap, f)
# --8<-- [end:record_snapshot]


def load_snapshot(path: str | Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


# --8<-- [start:timeline]
def timeline(snapshot: dict, device: int = 0) -> dict[str, Any]:
    """Active bytes after every allocator event, and where each phase starts.

    Walks the trace backwards from the bytes allocated at the end of recording, so memory that was
    already allocated before recording began (parameters, optimizer state) is counted too.
    Returns {'bytes': [...], 'phases': [(name, index), ...], 'events': [...]}, marker events removed.
    """
    trace = [e for e in snapshot["device_traces"][device] if e["action"] in ("alloc", "free_completed")]
    # Bytes live at the end: the blocks still allocated (their requested sizes, as the trace counts).
    blocks = [b for s in snapshot.get("segments", []) for b in s.get("blocks", [])
              if b.get("state") == "active_allocated"]
    if blocks:
        end = sum(b.get("requested_size", b["size"]) for b in blocks)
    else:
        end = snapshot.get("cs336", {}).get("allocated_end", 0)
    events, phases = [], []
    for e in trace:
        marker = MARKER_SIZES.get(e["size"])
        if marker is not None:
            if e["action"] == "alloc":
                phases.append((marker, len(events)))
            continue
        events.append(e)
    deltas = [e["size"] if e["action"] == "alloc" else -e["size"] for e in events]
    level, levels = end, []
    for d in reversed(deltas):
        levels.append(level)
        level -= d
    levels.reverse()
    return {"bytes": levels, "start_bytes": level, "phases": phases, "events": events}
# --8<-- [end:timeline]


def thin_max(values: list[float], points: int) -> tuple[list[int], list[float]]:
    """At most `points` values: each the largest of its run of consecutive values (so a peak
    survives the thinning), with the index each run starts at."""
    step = max(1, -(-len(values) // points))  # ceil: values per run
    starts = list(range(0, len(values), step))
    return starts, [max(values[i:i + step]) for i in starts]


def timeline_series(snapshot: dict, *, points: int = 2000, device: int = 0) -> dict[str, Any]:
    """The timeline as a stored result: active GiB against allocator event index (`thin_max`ed to
    at most `points` values), where each phase starts and the exact level there, and a summary.
    The report layer draws it; nothing here draws."""
    tl = timeline(snapshot, device)
    gib = [b / 2**30 for b in (tl["start_bytes"], *tl["bytes"])]  # gib[i]: after i events
    event, thinned = thin_max(gib, points)
    return {"event": event, "gib": thinned,
            "phases": [[name, index] for name, index in tl["phases"]],
            "phase_gib": [gib[index] for _, index in tl["phases"]],  # exact, not thinned
            "peak_gib": max(gib), "start_gib": gib[0], "end_gib": gib[-1], "events": len(gib) - 1}


def _site(frames: list[dict], package: str = "cs336_systems") -> str:
    """The innermost frame in our package that is not the harness: the line that allocated."""
    for f in frames:
        name = f.get("filename", "")
        if package in name and "/profiling/" not in name and "/bench/" not in name:
            short = name[name.index(package):]
            return f"{short}:{f.get('line')} {f.get('name')}"
    for f in frames:
        if "torch/" not in f.get("filename", ""):
            return f"{f.get('filename')}:{f.get('line')} {f.get('name')}"
    return "(no Python frame: autograd engine / C++)"


# --8<-- [start:largest]
def largest_allocations(snapshot: dict, top: int = 12, device: int = 0) -> list[dict]:
    """The biggest allocations of the recording, grouped by (size, allocating line), with the phase
    they happened in and how many times that line allocated that size."""
    tl = timeline(snapshot, device)
    bounds = sorted(tl["phases"], key=lambda p: p[1])
    groups: dict[tuple[int, str], dict] = defaultdict(lambda: {"count": 0, "phases": set()})
    for i, e in enumerate(tl["events"]):
        if e["action"] != "alloc":
            continue
        phase = next((name for name, start in reversed(bounds) if start <= i), "(before first phase)")
        g = groups[(e["size"], _site(e.get("frames", [])))]
        g["count"] += 1
        g["phases"].add(phase)
    rows = [{"size_mib": size / MIB, "count": g["count"], "site": site,
             "phases": ", ".join(sorted(g["phases"]))} for (size, site), g in groups.items()]
    rows.sort(key=lambda r: (-r["size_mib"], -r["count"]))
    return rows[:top]
# --8<-- [end:largest]


def allocations_of_size(snapshot: dict, nbytes: int, device: int = 0) -> list[dict]:
    """Every allocation of `nbytes` (up to the allocator's 512-byte rounding)."""
    out = []
    for e in timeline(snapshot, device)["events"]:
        if e["action"] == "alloc" and nbytes <= e["size"] < nbytes + 512:
            out.append({"site": _site(e.get("frames", []))})
    return out


# --8<-- [start:residual]
def residual_stream_bytes(batch: int, context: int, d_model: int, bytes_per_element: int = 4) -> int:
    """One residual-stream activation: a (batch, context, d_model) tensor."""
    return batch * context * d_model * bytes_per_element
# --8<-- [end:residual]
