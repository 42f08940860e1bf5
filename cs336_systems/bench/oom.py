"""What an out-of-memory cell leaves behind: the sizes in the CUDA allocator's message, and what was
allocated when the request failed.

A sweep records an OOM as a result (bench.sweep.run_sweep); these fields say by how much the cell
missed, so a table can print "does not fit: over N GiB" instead of a bare "OOM".
"""

from __future__ import annotations

import re

import torch

MIB = 2**20
# "Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 7.5 GiB is free. ...
#  Of the allocated memory 128.0 GiB is allocated by PyTorch, and 3.6 GiB is reserved by PyTorch but
#  unallocated."
MESSAGE_FIELDS = {
    "tried_mib": r"Tried to allocate ([\d.]+) ([KMG]iB)",
    "capacity_mib": r"total capacity of ([\d.]+) ([KMG]iB)",
    "free_mib": r"of which ([\d.]+) ([KMG]iB) is free",
    "process_in_use_mib": r"this process has ([\d.]+) ([KMG]iB) memory in use",
    "allocated_by_pytorch_mib": r"([\d.]+) ([KMG]iB) is allocated by PyTorch",
    "reserved_unallocated_mib": r"([\d.]+) ([KMG]iB) is reserved by PyTorch but unallocated",
}
UNIT_MIB = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}


def parse_oom_message(message: str) -> dict[str, float | None]:
    """The sizes in a CUDA allocator OOM message, in MiB (None where the message lacks one)."""
    out: dict[str, float | None] = {}
    for field, pattern in MESSAGE_FIELDS.items():
        m = re.search(pattern, message)
        out[field] = float(m.group(1)) * UNIT_MIB[m.group(2)] if m else None
    return out


def oom_details(exc: BaseException) -> dict[str, float]:
    """Fields for an OOM row: the message's sizes that it has (the allocator's own, at the failure,
    rounded to 0.01 of their unit), and on a GPU two counters read here, in the `except` block:
    `peak_mib_at_oom`, the high-water mark since the cell began (the sweep resets it between cells),
    which is what was allocated just before the failed request, in exact bytes; and
    `allocated_mib_at_oom`, what is still allocated now, which can be lower: the failing operation's
    own temporaries are already freed, though the traceback still holds the cell's tensors."""
    out = {k: v for k, v in parse_oom_message(str(exc)).items() if v is not None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["allocated_mib_at_oom"] = torch.cuda.memory_allocated() / MIB
        out["peak_mib_at_oom"] = torch.cuda.max_memory_allocated() / MIB
    return out
