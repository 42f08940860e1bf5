"""Memory and communication accounting for data parallelism with and without sharding
(problem optimizer_state_sharding_accounting), computed from a config, and measured.

Computed: bytes per rank of parameters, gradients, optimizer state and activations for a
Transformer LM config (or any parameter count) at a world size N, for each stage:

    ddp      everything replicated
    sharded  the course's ShardedOptimizer: optimizer state / N           (ZeRO-1's memory)
    zero1    optimizer state / N                                          (Rajbhandari et al. 2020)
    zero2    optimizer state and gradients / N
    zero3    optimizer state, gradients and parameters / N

Measured: `MemoryProbe` records, at a point of a training step, the bytes of the parameter,
gradient and optimizer-state tensors a rank holds (unique storages, so views and tied weights count
once) and, on CUDA, the allocator's current and peak bytes; `saved_activation_bytes` counts the
tensors autograd saves for backward (activations) while a forward runs.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cs336_systems.model import ModelConfig, count_parameters

STAGES = ("ddp", "sharded", "zero1", "zero2", "zero3")
# What each stage divides by N: (optimizer state, gradients, parameters)
_SHARDS = {"ddp": (False, False, False), "sharded": (True, False, False),
           "zero1": (True, False, False), "zero2": (True, True, False), "zero3": (True, True, True)}


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each kind of training state."""

    param: int
    grad: int
    optimizer_state: int  # AdamW: m and v (+ the fp32 master copy under mixed precision)


# --8<-- [start:precisions]
FP32_ADAMW = Precision(param=4, grad=4, optimizer_state=8)     # fp32 weights, grads, m, v
MIXED_ADAMW = Precision(param=2, grad=2, optimizer_state=12)   # bf16 weights/grads; fp32 master, m, v
# --8<-- [end:precisions]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one rank holds, by kind."""

    params: float
    grads: float
    optimizer_state: float
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer_state + self.activations

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def _check(stage: str, world_size: int) -> None:
    if stage not in _SHARDS:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")


# --8<-- [start:memory_per_rank]
def memory_per_rank(n_params: int, world_size: int, stage: str = "ddp",
                    precision: Precision = FP32_ADAMW, activation_bytes: float = 0.0) -> MemoryBreakdown:
    """Bytes per rank of each kind of state for `n_params` parameters on `world_size` ranks.

    Activations are per rank (each rank runs its own micro-batch) and no stage here shards them.
    """
    _check(stage, world_size)
    state_sharded, grads_sharded, params_sharded = _SHARDS[stage]
    N = world_size
    return MemoryBreakdown(
        params=n_params * precision.param / (N if params_sharded else 1),
        grads=n_params * precision.grad / (N if grads_sharded else 1),
        optimizer_state=n_params * precision.optimizer_state / (N if state_sharded else 1),
        activations=activation_bytes)


def bytes_per_parameter(stage: str, world_size: int, precision: Precision = MIXED_ADAMW) -> float:
    """The ZeRO paper's figure: with mixed-precision Adam, DP 16; ZeRO-1 4 + 12/N; ZeRO-2
    2 + 14/N; ZeRO-3 16/N."""
    return memory_per_rank(1, world_size, stage, precision).total
# --8<-- [end:memory_per_rank]


# --8<-- [start:activations]
def transformer_activation_bytes(cfg: ModelConfig, batch: int, context: int | None = None,
                                 dtype_bytes: int = 4) -> int:
    """Bytes autograd saves for backward in one forward of cs336_systems.model.TransformerLM
    plus the cross-entropy loss: unautocast, naive attention, no activation checkpointing.

    Counted from the model's code, per layer (b batch, s seq, d d_model, f d_ff, h heads):
      RMSNorm x2:       input, 1/rms (b,s,1), normalised input, output -> 2 * (3bsd + bs)
      q, k, v:          3bsd (after RoPE for q, k) + RoPE cos/sin gathered for q and k: 2 * s * d_head
      attention:        softmax output b*h*s*s, and the ~mask (s, s) bool
      output_proj:      its input bsd
      SwiGLU:           w1 x, silu(w1 x), w3 x, their product: 4bsf
    Outside the layers: token ids (int64), the final RMSNorm (3bsd + bs), the logits (bsV) and the
    logsumexp (bs) of the loss. A test checks this against autograd's saved tensors.
    """
    b, s = batch, context or cfg.context_length
    d, f, h, V, L = cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.vocab_size, cfg.num_layers
    per_layer = dtype_bytes * (10 * b * s * d + 4 * b * s * f + 2 * b * s + b * h * s * s
                               + 2 * s * cfg.d_head) + s * s  # the last term: bool mask
    outside = 8 * b * s + dtype_bytes * (3 * b * s * d + b * s + b * s * V + b * s)
    return L * per_layer + outside
# --8<-- [end:activations]


# --8<-- [start:sublayer_bytes]
def block_sublayer_bytes(cfg: ModelConfig, batch: int, context: int | None = None,
                         dtype_bytes: int = 4) -> dict[str, int]:
    """transformer_activation_bytes' per-layer count split by residual branch, for checkpointing
    inside a block (each branch's norm counted with it; the norm saves the branch's input):

      attn  ln1 (3bsd + bs), q, k, v (3bsd), RoPE's cos/sin (2 s d_head), softmax output (b h s s),
            the output projection's input (bsd), and the ~mask (s s bools)
      ffn   ln2 (3bsd + bs), SwiGLU's four (b, s, d_ff) tensors (4bsf)
    """
    b, s = batch, context or cfg.context_length
    d, f, h = cfg.d_model, cfg.d_ff, cfg.num_heads
    attn = dtype_bytes * (7 * b * s * d + b * s + 2 * s * cfg.d_head + b * h * s * s) + s * s
    ffn = dtype_bytes * (3 * b * s * d + b * s + 4 * b * s * f)
    return {"attn": attn, "ffn": ffn}


def branch_backward_bytes(cfg: ModelConfig, batch: int, context: int | None = None,
                          dtype_bytes: int = 4) -> dict[str, int]:
    """What each branch's backward holds beyond its residuals while it runs, by the same count:
    the residual stream's gradient in and out (2 bsd) and the gradients of its largest
    intermediates: attention's dP and dS (2 b h s s: softmax's backward needs both), the
    feed-forward's three (b, s, d_ff) gradients. An estimate: tests hold it within 20% of the
    live-tensor peak of small models."""
    b, s = batch, context or cfg.context_length
    d, f, h = cfg.d_model, cfg.d_ff, cfg.num_heads
    stream = 2 * b * s * d
    return {"attn": dtype_bytes * (stream + 2 * b * h * s * s), "ffn": dtype_bytes * (stream + 3 * b * s * f)}
# --8<-- [end:sublayer_bytes]


def transformer_memory(cfg: ModelConfig, batch_per_rank: int, world_size: int, stage: str = "ddp",
                       precision: Precision = FP32_ADAMW, context: int | None = None) -> MemoryBreakdown:
    """Per-rank memory of training `cfg` (AdamW) with `batch_per_rank` sequences per rank."""
    act = transformer_activation_bytes(cfg, batch_per_rank, context)  # fp32 forward (see there)
    return memory_per_rank(count_parameters(cfg)["total"], world_size, stage, precision, act)


# --8<-- [start:communication]
def communication_bytes_per_rank(stage: str, n_params: int, world_size: int,
                                 grad_bytes: int = 4, param_bytes: int = 4) -> float:
    """Bytes each rank receives per training step (bandwidth-optimal ring collectives).

    all-reduce of M bytes: 2(N-1)/N M; reduce-scatter and all-gather: (N-1)/N M each; the course's
    per-parameter broadcasts: each rank receives the (N-1)/N of the parameters it does not own.
    """
    _check(stage, world_size)
    f = (world_size - 1) / world_size
    G, P = n_params * grad_bytes, n_params * param_bytes
    return {"ddp": 2 * f * G,                     # all-reduce the gradients
            "sharded": 2 * f * G + f * P,         # all-reduce, then broadcast from the owners
            "zero1": f * G + f * P,               # reduce-scatter + all-gather = one all-reduce
            "zero2": f * G + f * P,
            "zero3": f * G + 2 * f * P,           # parameters gathered in forward and in backward
            }[stage]
# --8<-- [end:communication]


# -- measuring ------------------------------------------------------------------------------------

def storage_bytes(tensors: Iterable[torch.Tensor], exclude: set[int] | None = None) -> tuple[int, set[int]]:
    """Bytes of the distinct storages behind `tensors` (a view or a tied weight counts once),
    skipping storages whose address is in `exclude`; also returns the addresses counted."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen or (exclude and ptr in exclude) or storage.nbytes() == 0:
            continue
        seen.add(ptr)
        total += storage.nbytes()
    return total, seen


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state, looking inside wrappers: `.inner` (ours) and
    `.optim` (torch's ZeroRedundancyOptimizer)."""
    out = [v for state in optimizer.state.values() for v in state.values()
           if isinstance(v, torch.Tensor)]
    for attr in ("inner", "optim"):
        inner = getattr(optimizer, attr, None)
        if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
            out += optimizer_state_tensors(inner)
    return out


_PACKAGE = Path(__file__).resolve().parents[1]  # cs336_systems/
_MODEL = _PACKAGE / "model"


def _saving_line() -> tuple[str, str]:
    """(file:line, source text) of the innermost frame in cs336_systems/model on the stack."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if _MODEL in path.parents:
            return f"{path.relative_to(_PACKAGE.parent).as_posix()}:{frame.lineno}", (frame.line or "").strip()
    return "(outside cs336_systems/model)", ""


# --8<-- [start:saved_activation_bytes]
@contextlib.contextmanager
def saved_activation_bytes(exclude: Iterable[torch.Tensor] = (), *, by_line: bool = False
                           ) -> Iterator[dict]:
    """Count the bytes autograd saves for backward inside the block (parameters excluded).

        with saved_activation_bytes(model.parameters()) as saved:
            loss = model(x).sum()
        saved["bytes"]

    A storage saved twice (a tensor and a view of it) counts once: storages are told apart by
    identity, not by address, so this also counts on the "meta" device, where every address is 0.
    With `by_line`, saved["by_line"] maps each saving line of cs336_systems/model ("file:line") to
    {"site", "code", "bytes", "tensors"}.
    """
    skip = {t.untyped_storage()._cdata for t in exclude}
    seen: set[int] = set()
    result: dict = {"bytes": 0, "by_line": {}}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip and storage._cdata not in seen:
            seen.add(storage._cdata)
            result["bytes"] += storage.nbytes()
            if by_line:
                site, code = _saving_line()
                row = result["by_line"].setdefault(site, {"site": site, "code": code, "bytes": 0, "tensors": 0})
                row["bytes"] += storage.nbytes()
                row["tensors"] += 1
        # Detached: returning t itself makes a saved *output* (exp, silu, ...) hold its own grad_fn,
        # a cycle through C++ that no garbage collection frees: a graph never backpropagated leaks.
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
# --8<-- [end:saved_activation_bytes]


class MemoryProbe:
    """Records per-rank memory at named points of a step: tensor bytes by kind, and on CUDA the
    allocator's current bytes and its peak since the previous point (the peak is reset each time)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.cuda = any(p.is_cuda for p in model.parameters())
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def record(self, point: str, activations: int = 0) -> dict[str, float | str]:
        params = list(self.model.parameters())
        p_bytes, p_ptrs = storage_bytes(params)
        g_bytes, g_ptrs = storage_bytes((p.grad for p in params), exclude=p_ptrs)
        s_bytes, _ = storage_bytes(optimizer_state_tensors(self.optimizer), exclude=p_ptrs | g_ptrs)
        row: dict[str, float | str] = {
            "point": point, "params_bytes": p_bytes, "grads_bytes": g_bytes, "state_bytes": s_bytes,
            "activations_bytes": activations, "tensor_bytes": p_bytes + g_bytes + s_bytes + activations}
        if self.cuda:
            torch.cuda.synchronize()
            row["allocated_bytes"] = torch.cuda.memory_allocated()
            row["peak_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return row
