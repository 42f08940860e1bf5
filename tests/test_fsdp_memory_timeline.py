"""The reduction of the CUDA allocator's history to our FSDP's gathered weights alive
(cs336_systems/distributed/fsdp/memory_timeline.py), on hand-written traces in the allocator's own
format (torch.cuda.memory._snapshot()["device_traces"]: dicts with action, addr, size, frames).
The recording itself needs a GPU: tests/test_fsdp_shared_gpu.py runs it on one."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.distributed.fsdp import comm, memory_timeline
from cs336_systems.distributed.fsdp.shard_layout import FlatShardLayout

COMM_FILE = comm.__file__
TIMELINE_FILE = memory_timeline.__file__
_addresses = iter(range(0x1000, 1 << 40, 0x1000))


def _frame(name: str, filename: str, line: int = 1) -> dict:
    return {"name": name, "filename": filename, "line": line}


def gather_alloc(addr: int, size: int = 4096) -> dict:
    # innermost first, as the allocator stores them: gathered_buffer, then Gather.start, then up
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [_frame("gathered_buffer", COMM_FILE), _frame("start", COMM_FILE),
                       _frame("_begin_use", "/somewhere/fsdp.py")]}


def other_alloc(addr: int, size: int = 512) -> dict:
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [_frame("forward", "/somewhere/layers.py")]}


def freed(addr: int, completed: bool = True) -> list[dict]:
    out = [{"action": "free_requested", "addr": addr, "size": 0}]
    if completed:
        out.append({"action": "free_completed", "addr": addr, "size": 0})
    return out


def mark() -> dict:
    return {"action": "alloc", "addr": next(_addresses), "size": 512,
            "frames": [_frame("_marker", TIMELINE_FILE), _frame("mark", TIMELINE_FILE)]}


def test_the_identifiers_name_the_real_functions():
    # the trace is matched by (file, function name): both must be what the code calls
    assert COMM_FILE.replace("\\", "/").endswith(memory_timeline._GATHER[0])
    assert memory_timeline._GATHER[1] == comm.gathered_buffer.__name__
    assert TIMELINE_FILE.replace("\\", "/").endswith(memory_timeline._MARK[0])
    assert memory_timeline._MARK[1] == memory_timeline._marker.__name__


def test_gather_allocates_its_output_through_gathered_buffer(monkeypatch):
    seen = []
    real = comm.gathered_buffer

    def spy(numel, dtype, device):
        seen.append((numel, dtype))
        return real(numel, dtype, device)

    monkeypatch.setattr(comm, "gathered_buffer", spy)
    layout = FlatShardLayout(numel=6, world_size=1)  # one rank: no process group needed
    full = comm.Gather.start(torch.arange(6.0), layout, torch.bfloat16, "w").full(torch.Size([2, 3]))
    assert seen == [(layout.padded, torch.bfloat16)]
    assert torch.equal(full, torch.arange(6.0).view(2, 3).to(torch.bfloat16))


def _step_trace(extra_alive_in_forward: bool = False, leak_at_forward_end: bool = False) -> list[dict]:
    """A history before recording, then: start mark, forward (3 layers, two gathers in flight at
    most), forward mark, backward (2 gathers again), backward mark, the optimizer, step mark."""
    stale = 0xdead000
    t = [other_alloc(stale)]           # allocated before the first mark: not ours to count
    t.append(mark())                    # start
    t += freed(stale)                   # its free comes in the window: ignored
    a, b, c, d, e = (next(_addresses) for _ in range(5))
    t += [gather_alloc(a), gather_alloc(b)]   # the first two prefetched
    t.append(other_alloc(next(_addresses)))  # an activation
    t += freed(a)                       # layer 0 done ...
    t.append(gather_alloc(c))           # ... and the one two ahead starts
    if extra_alive_in_forward:
        t.append(gather_alloc(d))       # a third in flight: over the bound
        t += freed(d)
    t += freed(b)
    if not leak_at_forward_end:
        t += freed(c)
    t.append(mark())                    # forward
    t.append(gather_alloc(d))           # backward: the last layer gathered again ...
    t.append(gather_alloc(e))           # ... and the previous one prefetched
    t += freed(d, completed=False)      # released by Python, a collective's stream still on it
    t += freed(e)
    t.append({"action": "free_completed", "addr": d, "size": 0})
    if leak_at_forward_end:
        t += freed(c)
    t.append(mark())                    # backward
    t.append(other_alloc(next(_addresses)))  # AdamW's temporaries
    t.append(mark())                    # step
    return t


def test_a_bounded_step_is_counted_phase_by_phase():
    entries, marks = memory_timeline.marks_in(_step_trace(), ["start", "forward", "backward", "step"])
    assert entries[0]["frames"][0]["name"] == "_marker" and marks["start"] == 0
    s = memory_timeline.gathered_alive(entries, marks)
    assert s["gathers"] == 5
    assert s["phases"]["forward"] == {"gathers": 3, "max_alive": 2, "max_unreleased": 2,
                                      "max_alive_bytes": 2 * 4096}
    assert s["phases"]["backward"]["gathers"] == 2 and s["phases"]["backward"]["max_alive"] == 2
    assert s["phases"]["step"]["gathers"] == 0
    assert s["at_mark"]["forward"] == {"alive": 0, "unreleased": 0}
    assert s["at_mark"]["backward"] == {"alive": 0, "unreleased": 0}
    assert memory_timeline.within_bound(s) and memory_timeline.within_bound(s, expected_gathers=5)
    assert not memory_timeline.within_bound(s, expected_gathers=9), "gathers missed: no verdict"


def test_a_weight_released_late_by_the_allocator_counts_as_unreleased():
    d, e, f = (next(_addresses) for _ in range(3))
    t = [mark(), gather_alloc(d), gather_alloc(e)]
    t += freed(d, completed=False)  # Python let go; a collective's stream still holds the block
    t.append(gather_alloc(f))
    t += freed(e) + freed(f) + [{"action": "free_completed", "addr": d, "size": 0}, mark()]
    entries, marks = memory_timeline.marks_in(t, ["start", "backward"])
    s = memory_timeline.gathered_alive(entries, marks)
    assert s["phases"]["backward"]["max_alive"] == 2       # e and f: within the bound
    assert s["phases"]["backward"]["max_unreleased"] == 3  # d's block not yet reusable beside them
    assert s["at_mark"]["backward"] == {"alive": 0, "unreleased": 0}


@pytest.mark.parametrize("kwargs, phase, why", [
    (dict(extra_alive_in_forward=True), "forward", "max_alive"),
    (dict(leak_at_forward_end=True), "forward", "left"),
])
def test_the_promise_broken_is_seen(kwargs, phase, why):
    entries, marks = memory_timeline.marks_in(_step_trace(**kwargs), ["start", "forward", "backward", "step"])
    s = memory_timeline.gathered_alive(entries, marks)
    if why == "max_alive":
        assert s["phases"][phase]["max_alive"] == 3
    else:
        assert s["at_mark"][phase]["alive"] == 1
    assert not memory_timeline.within_bound(s)


def test_markers_left_from_an_earlier_recording_are_skipped():
    t = [mark(), mark()] + _step_trace()  # an earlier recording's two marks come first
    entries, marks = memory_timeline.marks_in(t, ["start", "forward", "backward", "step"])
    assert memory_timeline.within_bound(memory_timeline.gathered_alive(entries, marks))
    assert len(entries) == len(_step_trace()) - 1  # from this recording's start mark on


def test_a_trace_that_lost_its_marks_is_refused():
    t = [e for e in _step_trace() if not (e["action"] == "alloc" and e["frames"][0]["name"] == "_marker")]
    with pytest.raises(ValueError, match="marks"):
        memory_timeline.marks_in(t, ["start", "forward"])
