"""Stage 1 (naive_ddp): after backward, all-reduce every gradient, one call per parameter.

One collective per parameter tensor, all of them after backward has finished: hundreds of small,
latency-bound calls (biases, norm weights), none of them overlapped with computation.
"""

from __future__ import annotations

from torch import nn

from .common import DataParallel, all_reduce_mean_, trainable_parameters


# --8<-- [start:ddp]
class DDPNaive(DataParallel):
    def __init__(self, module: nn.Module):
        super().__init__(module)  # broadcast rank 0's parameters and buffers
        self.params = trainable_parameters(module)

    def finish_gradient_synchronization(self) -> None:
        if not self.require_gradient_sync:
            return
        for p in self.params:
            if p.grad is not None:  # unused this step: nothing to average
                all_reduce_mean_(p.grad)
# --8<-- [end:ddp]
