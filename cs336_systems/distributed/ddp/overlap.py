"""Stage 3 (ddp_overlap_individual_parameters): all-reduce each gradient the moment it exists.

A post-accumulate-grad hook on every trainable parameter launches an asynchronous all-reduce as soon
as backward has written that parameter's .grad, so the last layers' gradients travel while the first
layers' are still being computed. finish_gradient_synchronization() waits for the handles.

Counting: within one backward, autograd sums every contribution to a leaf before its AccumulateGrad
node runs, so the hook fires once per parameter per backward, tied weights included (checked in
tests/test_ddp_stages.py). It fires again only on a second accumulation (a second backward, or a
reentrant checkpoint's inner backward); sending a half-finished gradient would be silently wrong,
so a second firing before finish_gradient_synchronization() raises (use no_sync() to accumulate).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from .common import ACCUMULATED_AGAIN, DataParallel, all_reduce_mean_, trainable_parameters


# --8<-- [start:ddp]
class DDPOverlapIndividual(DataParallel):
    def __init__(self, module: nn.Module):
        super().__init__(module)  # broadcast rank 0's parameters and buffers
        self.params = trainable_parameters(module)  # frozen ones get no hook
        self._handles: list[dist.Work] = []
        self._landed: set[int] = set()  # id(p) whose gradient arrived (and left) this step
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in self.params]

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self.require_gradient_sync:
            return  # inside no_sync(): accumulate locally
        if id(p) in self._landed:
            raise RuntimeError(ACCUMULATED_AGAIN)
        self._landed.add(id(p))
        self._handles.append(all_reduce_mean_(p.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        if not self.require_gradient_sync:
            return
        for handle in self._handles:  # unused parameters never launched: nothing to wait for
            handle.wait()
        self._handles.clear()
        self._landed.clear()
# --8<-- [end:ddp]

    def on_train_batch_start(self) -> None:
        if self._handles:
            raise RuntimeError("the previous step's all-reduces were never waited for: call "
                               "finish_gradient_synchronization() after each backward")
