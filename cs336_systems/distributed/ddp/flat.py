"""Stage 2 (minimal_ddp_flat_benchmarking): one all-reduce over all gradients flattened together.

Many latency-bound calls become one bandwidth-bound call, at the price of two copies (flatten,
unflatten). Communication still starts only after backward has finished.
"""

from __future__ import annotations

from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .common import DataParallel, all_reduce_mean_, check_one_kind, trainable_parameters


# --8<-- [start:ddp]
class DDPFlat(DataParallel):
    def __init__(self, module: nn.Module):
        super().__init__(module)  # broadcast rank 0's parameters and buffers
        self.params = trainable_parameters(module)
        check_one_kind(self.params, "DDPFlat")

    def finish_gradient_synchronization(self) -> None:
        if not self.require_gradient_sync:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)  # (total numel,): a copy
        all_reduce_mean_(flat)
        for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(averaged)
# --8<-- [end:ddp]
