"""Our FSDP's gathered weights as the CUDA caching allocator saw them in one training step: how
many were alive at once in forward and in backward, and how many were left when each ended.

The design's promise (fsdp.py): at most two gathered weights alive at any moment (the one in use
and the one in flight), none left when forward returns (backward gathers again), none when the
step ends. tests/test_fsdp.py checks it on CPU ranks through weak references to the Python
buffers; here the GPU's allocator is asked. Its history (torch.cuda.memory._record_memory_history)
logs every alloc and free in order, each alloc with its Python stack; an all-gather's output is an
alloc whose stack passes through comm.gathered_buffer. Phases are cut by marks: a one-element
alloc made by `AllocatorTrace.mark`, found in the same log, so no clock has to agree with another.

    with AllocatorTrace(device) as trace:
        loss = ...; trace.mark("forward")            # the forward has returned
        loss.backward(); ...; trace.mark("backward")
    summary = gathered_alive(trace.entries, trace.marks)

Freed means two things, both counted: `free_requested`, when the last Python reference went (what
our code controls), and `free_completed`, when the allocator may hand the block out again (later,
if a collective's stream still uses it: gloo and NCCL record their streams on the buffers).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from . import comm

BOUND = 2  # gathered weights alive at once: the one in use and the one in flight (fsdp.py)
MAX_ENTRIES = 1 << 22  # one 2.7B step logs ~10^5 entries; a full ring would lose the start
# gloo's worker thread lets go of a finished collective's buffers a moment after wait() returns
# (tests/test_fsdp.py waits for the same reason): a mark waits this long after synchronizing.
SETTLE_S = 0.2
_GATHER = ("distributed/fsdp/comm.py", comm.gathered_buffer.__name__)
_MARK = ("distributed/fsdp/memory_timeline.py", "_marker")


def _from(entry: dict, where: tuple[str, str]) -> bool:
    """Whether an alloc's Python stack passes through the function `where` names (file, name)."""
    file, name = where
    return any(f.get("name") == name and f.get("filename", "").replace("\\", "/").endswith(file)
               for f in entry.get("frames") or ())


def _marker(device: torch.device) -> torch.Tensor:
    return torch.empty(1, device=device)  # its alloc, found by this function's name, is the mark


class AllocatorTrace:
    """Record the CUDA allocator's history on `device` while inside; `mark(name)` cuts a phase."""

    def __init__(self, device: torch.device, settle_s: float = SETTLE_S):
        self.device, self.settle_s = device, settle_s
        self.names: list[str] = []
        self.entries: list[dict] = []
        self.marks: dict[str, int] = {}
        self._keep: list[torch.Tensor] = []  # markers stay allocated: their addresses stay unique

    def __enter__(self) -> AllocatorTrace:
        torch.cuda.synchronize(self.device)
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=MAX_ENTRIES, device=self.device)
        self.mark("start")
        return self

    def mark(self, name: str) -> None:
        torch.cuda.synchronize(self.device)
        time.sleep(self.settle_s)
        self.names.append(name)
        self._keep.append(_marker(self.device))

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                trace = torch.cuda.memory._snapshot(self.device)["device_traces"][self.device.index or 0]
                self.entries, self.marks = marks_in(trace, self.names)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
            self._keep.clear()


def marks_in(trace: list[dict], names: list[str]) -> tuple[list[dict], dict[str, int]]:
    """The entries from the first mark on, and each mark's index among them. The marks are the
    allocs made by `_marker`, in the order `names` were marked; earlier history is dropped."""
    at = [i for i, e in enumerate(trace) if e.get("action") == "alloc" and _from(e, _MARK)]
    if len(at) < len(names):  # the oldest entries were overwritten (or a mark is missing)
        raise ValueError(f"the allocator's trace holds {len(at)} of {len(names)} marks "
                         f"({', '.join(names)}): recorded with too few entries?")
    at = at[-len(names):]  # a history left from before holds older markers first
    start = at[0]
    return trace[start:], {name: i - start for name, i in zip(names, at)}


def gathered_alive(entries: list[dict], marks: dict[str, int]) -> dict[str, Any]:
    """Walk the allocator's entries: the all-gather outputs alive (allocated, not yet freed) over
    time. Per phase (the entries between one mark and the next, named by the later mark): how many
    gathers it allocated, the most alive at once (by free_requested and by free_completed), and
    the most bytes alive; at each mark, how many were alive. Frees of blocks allocated before the
    first mark are not gathers of this step and are ignored."""
    cuts = sorted((i, name) for name, i in marks.items())
    requested: dict[int, int] = {}   # addr -> bytes: no free_requested yet
    unreleased: dict[int, int] = {}  # addr -> bytes: no free_completed yet
    phases: dict[str, dict[str, int]] = {}
    at_mark: dict[str, dict[str, int]] = {}
    k, phase = 0, None

    def close_marks_up_to(i: int) -> None:
        nonlocal k, phase
        while k < len(cuts) and cuts[k][0] <= i:
            at_mark[cuts[k][1]] = {"alive": len(requested), "unreleased": len(unreleased)}
            k += 1
            phase = cuts[k][1] if k < len(cuts) else None
            if phase is not None:
                phases[phase] = {"gathers": 0, "max_alive": 0, "max_unreleased": 0, "max_alive_bytes": 0}

    for i, e in enumerate(entries):
        close_marks_up_to(i)
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc" and _from(e, _GATHER):
            requested[addr] = unreleased[addr] = int(e.get("size", 0))
            if phase is not None:
                phases[phase]["gathers"] += 1
        elif action == "free_requested":
            requested.pop(addr, None)
        elif action == "free_completed":
            requested.pop(addr, None)  # completed implies requested (a trace may omit the request)
            unreleased.pop(addr, None)
        else:
            continue
        if phase is not None:
            p = phases[phase]
            p["max_alive"] = max(p["max_alive"], len(requested))
            p["max_unreleased"] = max(p["max_unreleased"], len(unreleased))
            p["max_alive_bytes"] = max(p["max_alive_bytes"], sum(requested.values()))
    close_marks_up_to(len(entries))
    return {"bound": BOUND, "gathers": sum(p["gathers"] for p in phases.values()),
            "phases": phases, "at_mark": at_mark}


def within_bound(summary: dict[str, Any], expected_gathers: int | None = None,
                 phases: tuple[str, ...] = ("forward", "backward"),
                 empty_at: tuple[str, ...] = ("forward", "backward")) -> bool:
    """The promise: at most BOUND alive in each of `phases`, none left at each of `empty_at`; and,
    if given, exactly `expected_gathers` gathers seen (none seen would satisfy the rest vacuously)."""
    return ((expected_gathers is None or summary["gathers"] == expected_gathers)
            and all(summary["phases"][p]["max_alive"] <= summary["bound"] for p in phases)
            and all(summary["at_mark"][m]["alive"] == 0 for m in empty_at))
