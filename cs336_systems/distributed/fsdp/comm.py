"""FSDP's two collectives on one weight, started asynchronously, finished when the result is needed.

    gathered = Gather.start(piece, layout, dtype)     # all-gather: every rank's piece -> (N*S,)
    full = gathered.wait().view(shape)                # the whole weight, padding cut off

    reduced = ReduceScatter.start(full_grad, layout)  # divide by N, sum over ranks, keep my slot
    my_grad = reduced.wait()                          # (piece_len,) averaged gradient

The dtype of a collective is the dtype of its buffers, so casting the piece to the compute dtype
*before* the all-gather halves the bytes sent under bf16, and a bf16 gradient is reduced in bf16.
Each range is labelled for torch.profiler (`fsdp:all_gather:<layer>`, ...) only while a profiler
is recording: the labels cost a dispatcher call each, a few thousand per step for a 48-layer model.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from cs336_systems.sharding.zero1 import _all_gather, _reduce_scatter

from .shard_layout import FlatShardLayout, fill_slot, unpad


def label(name: str):
    """A profiler range named `name` while torch.profiler records; otherwise nothing."""
    profiling = torch.autograd.profiler._is_profiler_enabled
    return record_function(name) if profiling else nullcontext()


def gathered_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The (N*S,) output of one weight's all-gather. Its own function so that the CUDA allocator's
    trace can tell gathered weights from every other allocation (memory_timeline.py)."""
    return torch.empty(numel, dtype=dtype, device=device)


# --8<-- [start:gather]
class Gather:
    """One all-gather of a weight, in flight until `wait()`."""

    def __init__(self, handle: dist.Work | None, buffer: torch.Tensor, layout: FlatShardLayout,
                 name: str):
        self.handle, self.buffer, self.layout, self.name = handle, buffer, layout, name

    @classmethod
    def start(cls, piece: torch.Tensor, layout: FlatShardLayout, dtype: torch.dtype,
              name: str = "") -> Gather:
        """Cast this rank's piece to `dtype` into a padded (S,) slot, then all-gather (async)."""
        with label(f"fsdp:all_gather:{name}"):
            piece = piece.detach()
            if piece.numel() == layout.slot:  # no padding: sent as it is (fp32) or one cast
                send = piece.to(dtype).contiguous()
            else:
                send = fill_slot(torch.empty(layout.slot, dtype=dtype, device=piece.device), piece)
            out = gathered_buffer(layout.padded, dtype, piece.device)  # (N*S,)
            if layout.world_size == 1:
                out.copy_(send)
                return cls(None, out, layout, name)
            return cls(_all_gather(out, send, async_op=True), out, layout, name)

    def wait(self) -> torch.Tensor:
        """The gathered (N*S,) buffer: on CUDA the current stream waits, the host does not."""
        if self.handle is not None:
            with label(f"fsdp:wait_all_gather:{self.name}"):
                self.handle.wait()
            self.handle = None
        return self.buffer

    def full(self, shape: torch.Size) -> torch.Tensor:
        """The whole weight: the buffer's first numel elements, viewed as `shape` (no copy)."""
        return unpad(self.wait(), self.layout).view(shape)
# --8<-- [end:gather]


# --8<-- [start:reduce_scatter]
class ReduceScatter:
    """One reduce-scatter of a full gradient, in flight until `wait()`."""

    def __init__(self, handle: dist.Work | None, out: torch.Tensor, send: torch.Tensor | None,
                 piece_len: int, name: str):
        self.handle, self.out, self.send = handle, out, send
        self.piece_len, self.name = piece_len, name

    @classmethod
    def start(cls, grad: torch.Tensor, layout: FlatShardLayout, rank: int,
              name: str = "") -> ReduceScatter:
        """grad: the full (..., ) gradient of this rank's micro-batch, in the compute dtype.

        Divided by N *before* the sum (as all_reduce_mean_ does): under fp16 the sum of N
        gradients could overflow where their mean does not; dividing by a power of two is exact.
        """
        with label(f"fsdp:reduce_scatter:{name}"):
            N = layout.world_size
            send = torch.empty(layout.padded, dtype=grad.dtype, device=grad.device)  # (N*S,)
            torch.div(grad.reshape(-1), N, out=send[:layout.numel])
            if layout.padded > layout.numel:
                send[layout.numel:].zero_()  # padding: zero on every rank, so its sum is zero
            out = torch.empty(layout.slot, dtype=grad.dtype, device=grad.device)  # (S,)
            if N == 1:
                out.copy_(send)
                return cls(None, out, None, layout.piece_len(rank), name)
            handle = _reduce_scatter(out, send, op=dist.ReduceOp.SUM, async_op=True)
            return cls(handle, out, send, layout.piece_len(rank), name)

    def wait(self) -> torch.Tensor:
        """This rank's averaged piece (piece_len,), in the dtype it was reduced in."""
        if self.handle is not None:
            with label(f"fsdp:wait_reduce_scatter:{self.name}"):
                self.handle.wait()
            self.handle = None
        self.send = None  # the input may be reused by the allocator from here on
        return self.out[:self.piece_len]
# --8<-- [end:reduce_scatter]
