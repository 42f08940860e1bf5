"""Measuring gradient checkpointing on any device, and the nested strategy as code.

`LiveTensorBytes` counts the bytes of every tensor created inside its block that is still alive,
and the peak of that count: an allocator-free, deterministic peak memory, so a CPU test can show
what checkpointing saves (the CUDA allocator's max_memory_allocated says the same on a GPU).

`nested_checkpoint` is the code sketch of problem gradient_checkpointing (a): checkpoint calls
nested inside each other over a chain of blocks, binary (each half, recursively) or peel-one
(everything but the last block, recursively: O(1) kept inputs, the memory-optimal one).
checkpoint_theory.py has their costs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint


# --8<-- [start:live_bytes]
class LiveTensorBytes(TorchDispatchMode):
    """Within the block: `live` = bytes of the storages created here and still alive, `peak` = its
    maximum. Storages that existed before (parameters, inputs) and views of them are not counted.

        with LiveTensorBytes() as mem:
            model(x).sum().backward()
        mem.peak

    Each op's outputs are seen at dispatch; a storage is counted once (an output that aliases an
    input is a view, not new memory) and uncounted when its Python object is finalised, which
    PyTorch ties to the storage's own lifetime.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._counted: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._counted or storage.data_ptr() in inputs:
                continue
            n = storage.nbytes()
            self._counted.add(key)
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, n)
        return out

    def _free(self, key: int, n: int) -> None:
        self._counted.discard(key)
        self.live -= n
# --8<-- [end:live_bytes]


# --8<-- [start:nested]
def nested_checkpoint(blocks: Sequence[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor,
                      split: str = "binary") -> torch.Tensor:
    """Run x through `blocks` in order with checkpoints nested inside checkpoints.

    binary: checkpoint(first half), checkpoint(second half), each half split the same way down to
            single blocks: O(log L) inputs kept at once, O(L log L) block forwards.
    peel:   checkpoint(all blocks but the last), recursively, then the last block plainly: only the
            chain's input is kept (O(1)), every block's backward recomputes its prefix, O(L^2).
    """
    if split not in ("binary", "peel"):
        raise ValueError(f"split must be 'binary' or 'peel', got {split!r}")
    if not blocks:
        raise ValueError("blocks must not be empty")

    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:  # blocks[lo:hi]
        if hi - lo == 1:
            return blocks[lo](x)
        if split == "peel":
            x = checkpoint(run, x, lo, hi - 1, use_reentrant=False)
            return blocks[hi - 1](x)
        mid = (lo + hi) // 2
        x = checkpoint(run, x, lo, mid, use_reentrant=False)
        return checkpoint(run, x, mid, hi, use_reentrant=False)

    return run(x, 0, len(blocks))
# --8<-- [end:nested]
