"""Named ranges inside the training step, for torch.profiler (record_function) and Nsight Systems
(NVTX, where CUDA is there): what breakdown.py groups the kernels by.

    step            the whole step (the profiler's caller opens it)
    forward         the module call: embedding, blocks, final norm, the loss head
    loss            the loss head's forward, inside forward
    backward        loss.backward()
    loss_backward   the loss head's backward: opened by a hook on the loss's gradient, closed by a
                    hook on the hidden states' gradient (the head's input), so it spans exactly the
                    head's backward ops, which autograd runs first, on its own thread
    optimizer       optimizer.step()

The timed step runs without them (`TrainingStep.annotate` is False unless profiling).
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def step_range(name: str):
    """A record_function range and, with CUDA, an NVTX range of the same name."""
    nvtx = torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


class HookRange:
    """A range opened and closed from autograd hooks (both run on the backward's thread)."""

    def __init__(self, name: str):
        self.name = name
        self._open: contextlib.ExitStack | None = None

    def open(self, grad: torch.Tensor) -> None:
        self._open = contextlib.ExitStack()
        self._open.enter_context(step_range(self.name))

    def close(self, grad: torch.Tensor) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None


def around_loss_backward(loss: torch.Tensor, hidden: torch.Tensor, name: str = "loss_backward") -> None:
    """Open `name` when the backward starts at `loss`, close it when `hidden`'s gradient is done."""
    if not (loss.requires_grad and hidden.requires_grad):
        return
    r = HookRange(name)
    loss.register_hook(r.open)
    hidden.register_hook(r.close)
