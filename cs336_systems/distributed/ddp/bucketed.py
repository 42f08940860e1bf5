"""Stage 4 (ddp_overlap_bucketed): few calls *and* overlap. Gradients are grouped into buckets
(reverse parameter order, at most `bucket_size_mb` each; see buckets.py); when a bucket's last
gradient lands, the bucket is flattened and sent with one asynchronous all-reduce.

bucket_size_mb=None puts everything in one bucket (stage 2 with a hook); a tiny cap puts every
parameter alone (stage 3 plus copies). The state machine: `_waiting[b]` counts the gradients bucket
b still owes this step; it is reset when the step finishes. A bucket that never completes (it holds
a parameter that got no gradient this step) is sent by finish_gradient_synchronization().
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .buckets import assign_buckets, bucket_cap_bytes
from .common import ACCUMULATED_AGAIN, DataParallel, all_reduce_mean_, check_one_kind, trainable_parameters


# --8<-- [start:ddp]
class DDPBucketed(DataParallel):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0):
        super().__init__(module)  # broadcast rank 0's parameters and buffers
        params = trainable_parameters(module)  # frozen ones get no hook and no bucket
        check_one_kind(params, "DDPBucketed")
        sizes = [p.numel() * p.element_size() for p in params]
        self.buckets = [[params[i] for i in bucket]
                        for bucket in assign_buckets(sizes, bucket_cap_bytes(bucket_size_mb))]
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._landed: set[int] = set()  # id(p) whose gradient arrived this step
        # bucket index -> (handle, flat buffer, the .grad tensors it was flattened from)
        self._in_flight: dict[int, tuple[dist.Work, torch.Tensor, list[torch.Tensor]]] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self.require_gradient_sync:
            return  # inside no_sync(): accumulate locally
        if id(p) in self._landed:
            raise RuntimeError(ACCUMULATED_AGAIN)
        self._landed.add(id(p))
        b = self._bucket_of[id(p)]
        self._waiting[b] -= 1
        if self._waiting[b] == 0:
            self._send(b)

    def _send(self, b: int) -> None:
        grads = [p.grad for p in self.buckets[b] if id(p) in self._landed]
        flat = _flatten_dense_tensors(grads)  # (bucket numel,): a copy
        self._in_flight[b] = (all_reduce_mean_(flat, async_op=True), flat, grads)

    def finish_gradient_synchronization(self) -> None:
        if not self.require_gradient_sync:
            return
        for b, bucket in enumerate(self.buckets):  # buckets left open by unused parameters
            if b not in self._in_flight and any(id(p) in self._landed for p in bucket):
                self._send(b)
        for handle, flat, grads in self._in_flight.values():
            handle.wait()
            for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(averaged)
        self._in_flight.clear()
        self._landed.clear()
        self._waiting = [len(bucket) for bucket in self.buckets]
# --8<-- [end:ddp]

    def on_train_batch_start(self) -> None:
        if self._in_flight or self._landed:
            raise RuntimeError("the previous step's buckets were never finished: call "
                               "finish_gradient_synchronization() after each backward")
