"""Fully-sharded data parallel (problem fsdp): every rank keeps 1/N of each weight matrix.

    model = FSDP(module, compute_dtype=torch.bfloat16)    # broadcasts rank 0's weights, shards
    opt = torch.optim.AdamW(model.parameters())          # shards + replicated: a standard AdamW
    loss_fn(model(x_shard), y_shard).backward()
    model.finish_gradient_synchronization()              # every .grad is this rank's, averaged
    opt.step()

What happens to one sharded layer (layers.py says which are) in one step:

    forward   all-gather its weight (started when the layer two uses back finished), swap the
              whole matrix in for the call, swap the shard back, free the matrix;
    backward  all-gather it again when autograd needs it (the next one is prefetched), free it
              once its gradient exists, reduce-scatter that gradient asynchronously; the rank
              keeps its averaged piece as the shard's .grad.

Freeing between forward and backward: autograd would keep the gathered matrix alive as a saved
tensor of the layer's matmul. A saved-tensor hook (active inside FSDP.forward) replaces every saved
view of a gathered weight by a small marker, and re-gathers the weight when backward unpacks it.
A layer whose backward does not need its weight (an embedding lookup) is never gathered again.

Prefetch order: the first forward guesses registration order; every forward records the order
in which layers really ran, and the next one prefetches by it. Every rank runs the same graph, so
every rank issues the same collectives in the same order (the contract of DDP as well).

Activation checkpointing inside the module works: a recomputation in backward calls the layers
again outside FSDP.forward; each such call gathers its weight on demand and reduce-scatters its own
gradient (tests/test_fsdp.py trains both kinds of torch.utils.checkpoint).

compute_dtype: the piece is cast before the all-gather (half the bytes under bf16), the layer runs
in that dtype (its floating inputs and its other own parameters, e.g. a bias, are cast too), the
gradient is reduce-scattered in that dtype and upcast into the fp32 shard's .grad: fp32 master
weights, fp32 optimizer.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336_systems.distributed.ddp.common import all_reduce_mean_, broadcast_from_rank0

from .comm import Gather, ReduceScatter, label
from .layers import (
    ShardedLayer,
    ShardedWeight,
    check_weights_only_in_layers,
    find_layers,
)

# Reduce-scatters allowed in flight before the oldest is finished: enough to overlap with the
# next layers' backward, few enough that their (N*S,) send buffers stay a bounded amount of memory.
REDUCE_SCATTERS_IN_FLIGHT = 2


@dataclass(eq=False)
class _ForwardPass:
    """What one FSDP.forward records: the order layers ran, the weights autograd saved."""

    order: list[int] = field(default_factory=list)         # layer index per use, in call order
    saved: list[_Use] = field(default_factory=list)      # uses whose weight backward will need
    prefetched: dict[int, tuple[int, Gather]] = field(default_factory=dict)  # position -> (layer, gather)


@dataclass(eq=False)
class _Use:
    """One call of a sharded layer. `counted`: inside FSDP.forward with autograd on, so its gradient
    is summed with the weight's other uses before the reduce-scatter."""

    layer: ShardedLayer
    fwd: _ForwardPass | None
    position: int
    counted: bool
    full: torch.Tensor | None = None        # the gathered weight, during the forward call
    restore: dict[str, Any] = field(default_factory=dict)
    saved_index: int = -1                   # position in fwd.saved (-1: backward needs no weight)
    backward_gather: Gather | None = None   # the weight gathered again for backward
    done: bool = False                      # its gradient arrived: never gather it again


@dataclass(frozen=True)
class _SavedWeight:
    """What autograd keeps instead of a gathered weight: which use, and the view it saved."""

    use: _Use
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


# --8<-- [start:use_weight]
class _UseWeight(torch.autograd.Function):
    """shard -> the gathered full weight, in autograd's eyes. Backward hands the full gradient to
    FSDP (which reduce-scatters it into shard.grad) and returns nothing for the shard itself."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, use: _Use, owner: FSDP) -> torch.Tensor:
        ctx.use, ctx.owner = use, owner
        return use.full

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        ctx.owner._weight_grad_ready(ctx.use, grad_full)
        return None, None, None
# --8<-- [end:use_weight]


class FSDP(nn.Module):
    """Shards the weight of every Linear/Embedding-like layer of `module` over the ranks."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype)
                                              and compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype must be a floating torch.dtype or None, "
                             f"got {compute_dtype!r}")
        check_weights_only_in_layers(module)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("FSDP needs an initialized process group "
                               "(cs336_systems.distributed.launch starts one)")
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        broadcast_from_rank0(module)  # every rank starts from rank 0's weights, then keeps a piece
        self.layers, self.weights = self._shard(module)
        sharded = {id(w.shard) for w in self.weights}
        self.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in sharded]
        self._order = [layer.index for layer in self.layers]  # a guess until a forward records it
        self._pass: _ForwardPass | None = None
        self._live: dict[int, _Use] = {}  # storage address of a gathered weight -> its use
        self._reducing: deque[tuple[ShardedWeight, ReduceScatter]] = deque()

    def _shard(self, module: nn.Module) -> tuple[list[ShardedLayer], list[ShardedWeight]]:
        names = {id(p): n for n, p in module.named_parameters()}  # a tied weight: its first name
        by_original: dict[int, ShardedWeight] = {}
        keep_alive = []  # the replaced full weights, so that their ids stay unique until we return
        layers = []
        for index, (name, m) in enumerate(find_layers(module)):
            original = m._parameters["weight"]
            weight = by_original.get(id(original))
            if weight is None:
                weight = ShardedWeight.from_parameter(names[id(original)], original, self.rank,
                                                      self.world_size)
                by_original[id(original)] = weight
                keep_alive.append(original)
            m.weight = weight.shard
            others = [n for n, p in m._parameters.items() if n != "weight" and p is not None]
            layer = ShardedLayer(index, name, m, weight, others)
            m.forward = functools.partial(self._layer_forward, layer, m.forward)
            layers.append(layer)
        return layers, list(by_original.values())

    # -- forward ---------------------------------------------------------------------------------

    # --8<-- [start:forward]
    # --8<-- [start:forward_call]
    def forward(self, *inputs, **kwargs):
        if self._pass is not None:
            raise RuntimeError("FSDP.forward was called again from inside its own forward")
        fwd = self._pass = _ForwardPass()
        self._prefetch(fwd, 0)  # the first two layers have no "two before": start both now
        self._prefetch(fwd, 1)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return self.module(*inputs, **kwargs)
        finally:
            self._pass = None
            self._live.clear()
            for _, gather in fwd.prefetched.values():  # prefetched for a layer that never ran
                gather.wait()
            if fwd.order:
                self._order = fwd.order  # the next forward prefetches in the order seen here
    # --8<-- [end:forward_call]

    # --8<-- [start:layer_forward]
    def _layer_forward(self, layer: ShardedLayer, original_forward, *args, **kwargs):
        """Replaces a sharded layer's forward: gathered weight in, the layer's own forward, out."""
        use = self._begin_use(layer)
        try:
            if self.compute_dtype is not None:  # top-level floating tensors (x, not lists of x)
                args = tuple(self._cast_input(a) for a in args)
                kwargs = {k: self._cast_input(v) for k, v in kwargs.items()}
            with label(f"fsdp:layer:{layer.name}"):
                return original_forward(*args, **kwargs)
        finally:
            self._end_use(use)
    # --8<-- [end:layer_forward]

    # --8<-- [start:use]
    def _begin_use(self, layer: ShardedLayer) -> _Use:
        fwd, gather = self._pass, None
        position = -1
        if fwd is not None:
            position = len(fwd.order)
            fwd.order.append(layer.index)
            prefetched_for, prefetched = fwd.prefetched.pop(position, (None, None))
            if prefetched_for == layer.index:
                gather = prefetched
            elif prefetched is not None:  # prefetched for another layer (the order changed)
                prefetched.wait()  # finish the collective (every rank issued it), then free it
            del prefetched
        if gather is None:  # not prefetched (first call, an order change, or outside forward)
            gather = self._start_gather(layer)
        weight = layer.weight
        track = torch.is_grad_enabled() and weight.shard.requires_grad
        use = _Use(layer, fwd, position, counted=track and fwd is not None,
                   full=gather.full(weight.shape))
        m = layer.module
        if track:
            weight.pending_uses += use.counted
            m._parameters["weight"] = _UseWeight.apply(weight.shard, use, self)  # is use.full
        else:
            m._parameters["weight"] = use.full
        if fwd is not None:
            self._live[use.full.untyped_storage().data_ptr()] = use
        if self.compute_dtype is not None:  # the layer's bias (replicated) computes in it too
            for name in layer.others:
                use.restore[name] = m._parameters[name]
                m._parameters[name] = use.restore[name].to(self.compute_dtype)
        return use

    def _end_use(self, use: _Use) -> None:
        m = use.layer.module
        m._parameters["weight"] = use.layer.weight.shard
        m._parameters.update(use.restore)
        self._live.pop(use.full.untyped_storage().data_ptr(), None)
        use.full = None  # the last reference: the gathered weight is freed here
        if use.fwd is not None:
            self._prefetch(use.fwd, use.position + 2)  # this layer done: start the one two ahead
    # --8<-- [end:use]
    # --8<-- [end:forward]

    # --8<-- [start:prefetch]
    def _prefetch(self, fwd: _ForwardPass, position: int) -> None:
        if len(fwd.order) <= position < len(self._order) and position not in fwd.prefetched:
            layer = self.layers[self._order[position]]
            fwd.prefetched[position] = (layer.index, self._start_gather(layer))

    def _start_gather(self, layer: ShardedLayer) -> Gather:
        shard = layer.weight.shard
        return Gather.start(shard, layer.weight.layout, self.compute_dtype or shard.dtype,
                            layer.name)

    def _cast_input(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(self.compute_dtype)
        return x
    # --8<-- [end:prefetch]

    # -- saved tensors: free after forward, gather again for backward ---------------------------

    # --8<-- [start:saved]
    def _pack(self, t: torch.Tensor) -> Any:
        """Called for every tensor autograd saves inside FSDP.forward."""
        if not self._live or t.layout != torch.strided:
            return t
        use = self._live.get(t.untyped_storage().data_ptr())
        if use is None or t.dtype != use.full.dtype:
            return t  # an activation (or a copy of a weight): kept as it is
        if use.saved_index < 0 and use.fwd is not None:
            use.saved_index = len(use.fwd.saved)
            use.fwd.saved.append(use)
        return _SavedWeight(use, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, saved: Any) -> torch.Tensor:
        """Called by backward when it needs a saved tensor."""
        if not isinstance(saved, _SavedWeight):
            return saved
        use = saved.use
        if use.backward_gather is None:  # not prefetched: the first layer of backward
            use.backward_gather = self._start_gather(use.layer)
        buffer = use.backward_gather.wait()  # (N*S,): the weight is its first numel elements
        if use.fwd is not None and use.saved_index > 0:  # prefetch the next one backward needs
            previous = use.fwd.saved[use.saved_index - 1]
            if previous.backward_gather is None and not previous.done:
                previous.backward_gather = self._start_gather(previous.layer)
        return buffer.as_strided(saved.size, saved.stride, saved.offset)
    # --8<-- [end:saved]

    # -- gradients ---------------------------------------------------------------------------------

    # --8<-- [start:backward]
    def _weight_grad_ready(self, use: _Use, grad: torch.Tensor) -> None:
        """Backward produced the full gradient of one use of a sharded weight."""
        use.done, use.backward_gather = True, None  # the gathered copy is freed here
        weight = use.layer.weight
        if not use.counted:  # a call outside FSDP.forward (e.g. a checkpoint's recomputation)
            self._reduce(weight, grad)
            return
        weight.add_grad(grad)
        weight.pending_uses -= 1
        if weight.pending_uses == 0:  # every use in this forward has its gradient: send the sum
            grad_sum, weight.grad_sum = weight.grad_sum, None
            self._reduce(weight, grad_sum)

    def _reduce(self, weight: ShardedWeight, grad: torch.Tensor) -> None:
        self._reducing.append((weight, ReduceScatter.start(grad, weight.layout, self.rank,
                                                           weight.name)))
        while len(self._reducing) > REDUCE_SCATTERS_IN_FLIGHT:
            self._retire_oldest()

    def _retire_oldest(self) -> None:
        weight, reduced = self._reducing.popleft()
        weight.set_grad(reduced.wait())

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduce-scatter; average the replicated gradients. After this, every
        trainable parameter that got a gradient holds this rank's averaged piece of it."""
        for weight in self.weights:  # uses whose backward never came (a branch the loss skipped)
            if weight.grad_sum is not None:
                self._reduce(weight, weight.grad_sum)
                weight.grad_sum = None
            weight.pending_uses = 0
        replicated = self._start_replicated_all_reduce()
        while self._reducing:
            self._retire_oldest()
        for handle, flat, grads in replicated:
            handle.wait()
            for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(averaged)
    # --8<-- [end:backward]

    def _start_replicated_all_reduce(self) -> list[tuple[dist.Work, torch.Tensor, list]]:
        """One flat all-reduce per (dtype, device) of the replicated gradients (norms, biases:
        a few hundred KB), started before waiting for the reduce-scatters."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in self.replicated:
            if p.grad is not None:
                groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        started = []
        for grads in groups.values():
            flat = _flatten_dense_tensors(grads)
            started.append((all_reduce_mean_(flat, async_op=True), flat, grads))
        return started

    # -- introspection -----------------------------------------------------------------------------

    def sharded_parameter_names(self) -> list[str]:
        return [w.name for w in self.weights]
