"""Bytes per GPU of one training step, by formula: what fits is decided before any process starts.

    layout = Layout(attention="fused", loss="fused", checkpointed_blocks=34, shard="fsdp2", param_bytes=2)
    b = budget(cfg, layout, world_size=2, batch_per_rank=1, context=32_768)
    b.lower_bound     # bytes some moment of the step certainly holds at once (refuse above the GPU)
    b.estimate        # the likely peak: the lower bound plus the largest working set (a
                      # recomputed block, a loss chunk, gathered FSDP weights)

Persistent state: parameters, gradients and AdamW's two moments, all in the parameter dtype (torch's
AdamW and ours keep the moments in it), divided by the world size where the variant shards them
(fsdp2, fsdp), plus torch DDP's gradient buckets (a second copy of the gradients, DDP's default).

Activations, per token of this rank's micro-batch (batch_per_rank x context tokens), counted from
what autograd saves in our model's code (model/layers.py, model/attention.py), b = bytes of the
parameter dtype, d = d_model, f = d_ff, h = heads, S = context:

    RMSNorm       8 d   its fp32 input copy and the normalised product (it computes in fp32)
    attention     8 b d the norm's output (the projections' input), q and k before RoPE (RoPE's
                        multiplies keep views of them), q and k after it, v, the output, and the
                        output's (b, s, h d) copy that the output projection saves; fused attention
                        (flash, SDPA) adds its fp32 log-sum-exp (4 h), naive attention its (h, S)
                        probability row per token (softmax's output, kept for P V's backward)
    SwiGLU        b d + 4 b f: the norm's output; W1 x, silu(W1 x), W3 x and their product
    a block kept  16 d + 9 b d + 4 b f (+ naive: b h S)    227 KB per token at 8B in bf16

Per block, by its mode in the checkpoint plan (checkpoint_plan.py):

    full          b d: the block's input, all torch.utils.checkpoint keeps
    selective     2 b d + 4 h: the input, the attention's output O and its fp32 L (the policy keeps
                  the attention op's outputs, selective.py), plus each kept matmul group's outputs:
                  qkv 3 b d, out b d, w13 2 b f
    none, eager   the kept block above
    none, compiled  what Inductor's partitioner keeps, which is not autograd's list: it saves the
                  matmul outputs and recomputes the cheap elementwise ops from them. Certainly
                  6 b d + 2 b f + 4 h (a partition never recomputes a matmul outside a checkpointed
                  region, and the backward reads the input, q, k, v, O, the residual after
                  attention, W1 x and W3 x, and L); likely 9 b d + 3 b f + 4 h + 8, what it keeps
                  for our block (counted on a small block in the tests: the input, both norms'
                  outputs and fp32 inverse RMS, q, k, v, O and its (b, s, h d) copy, the residual,
                  W1 x, W3 x and their gated product, L). The difference goes into the estimate.

The loss head saves: full logits, the fp32 log-softmax (4 V per token); chunked under checkpoint,
nothing beyond its input; the fused loss, the gradients it computed in its forward (b d per token
and the (V, d) weight gradient).

The lower bound is the larger of two moments every step passes through: the end of the forward
(parameters, AdamW state, every saved activation; the gradients were set to None at the step's
start) and the end of the backward (parameters, gradients, AdamW state). Anything above the GPU's
memory cannot run, whatever the allocator does. The estimate adds to it the activations a compiled
kept block likely saves beyond the certain ones, and what comes and goes: one block's recomputation
and its backward, the loss's working set, FSDP's gathered weights (the gradients arrive as the
activations they come from are freed, so the two never peak together).
Not counted: the CUDA context, torch.compile's workspaces, NCCL buffers, the allocator's
fragmentation (reserved above allocated). The bench's rows hold the estimate beside the measured
peak (torch.cuda.max_memory_allocated), so the two can be compared per run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cs336_systems.model.config import ModelConfig

from .arithmetic import params
from .checkpoint_plan import block_mode, saved_groups

GIB = 2**30
ATTENTIONS = ("naive", "fused")   # naive: the (h, S, S) probabilities; fused: flash or SDPA
LOSSES = ("full-logits", "chunked", "fused")
SHARDS = ("none", "ddp", "fsdp2", "fsdp")
FP32 = 4


@dataclass(frozen=True)
class Layout:
    """What the memory arithmetic needs to know of a variant."""

    attention: str             # one of ATTENTIONS
    loss: str                  # one of LOSSES
    checkpointed_blocks: int   # blocks run under torch.utils.checkpoint (the first ones)
    shard: str                 # one of SHARDS
    param_bytes: int           # 2 (bf16) or 4 (fp32): parameters, gradients, AdamW moments, activations
    loss_chunk: int = 4096     # positions per chunk of the chunked and fused losses
    plan: tuple[str, ...] | None = None  # each block's checkpoint mode; None: the first
                                         # checkpointed_blocks full, the rest kept
    compiled: bool = False     # torch.compile'd blocks: Inductor's partitioner decides what a kept block saves

    def __post_init__(self) -> None:
        for name, allowed in (("attention", ATTENTIONS), ("loss", LOSSES), ("shard", SHARDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.plan is not None:
            if any(block_mode(m) != m for m in self.plan):
                raise ValueError(f"plan modes must be canonical (checkpoint_plan.block_mode), got {self.plan}")
            if sum(m != "none" for m in self.plan) != self.checkpointed_blocks:
                raise ValueError(f"checkpointed_blocks {self.checkpointed_blocks} disagrees with the plan {self.plan}")
            if self.attention == "naive" and any(m.startswith("selective") for m in self.plan):
                raise ValueError("selective checkpointing keeps a fused attention's outputs; naive attention has none")

    def modes(self, num_layers: int) -> tuple[str, ...]:
        if self.plan is not None:
            return self.plan
        return ("full",) * self.checkpointed_blocks + ("none",) * (num_layers - self.checkpointed_blocks)


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes one rank holds, by kind (see the module docstring)."""

    params: float
    grads: float
    optimizer_state: float
    ddp_buckets: float
    saved_activations: float      # everything the forward certainly saves for the backward
    attention_probabilities: float  # the part of saved_activations that is naive attention's P
    working_set: float            # the largest transient on top (recompute, loss chunk, gathers)
    likely_extra_saved: float = 0.0  # what compiled kept blocks likely save beyond the certain

    @property
    def end_of_forward(self) -> float:
        return self.params + self.optimizer_state + self.ddp_buckets + self.saved_activations

    @property
    def end_of_backward(self) -> float:
        return self.params + self.grads + self.optimizer_state + self.ddp_buckets

    @property
    def lower_bound(self) -> float:
        return max(self.end_of_forward, self.end_of_backward)

    @property
    def estimate(self) -> float:
        return max(self.end_of_forward + self.likely_extra_saved, self.end_of_backward) + self.working_set

    def as_gib(self) -> dict[str, float]:
        out = {k: v / GIB for k, v in asdict(self).items()}
        return {**out, "lower_bound": self.lower_bound / GIB, "estimate": self.estimate / GIB}

    def explain(self) -> str:
        """The lower bound's arithmetic in one line, in GiB."""
        g = self.as_gib()
        if self.end_of_forward >= self.end_of_backward:
            parts = (f"params {g['params']:.1f} + AdamW state {g['optimizer_state']:.1f}"
                     + (f" + DDP buckets {g['ddp_buckets']:.1f}" if self.ddp_buckets else "")
                     + f" + saved activations {g['saved_activations']:.1f}"
                     + (f", of which attention probabilities {g['attention_probabilities']:.1f}"
                        if self.attention_probabilities else ""))
        else:
            parts = (f"params {g['params']:.1f} + grads {g['grads']:.1f} + AdamW state "
                     f"{g['optimizer_state']:.1f}" + (f" + DDP buckets {g['ddp_buckets']:.1f}" if self.ddp_buckets else ""))
        return f"at least {g['lower_bound']:.1f} GiB per rank ({parts})"


def kept_block_bytes_per_token(cfg: ModelConfig, layout: Layout, context: int) -> int:
    """What autograd saves for one block run without checkpointing, per token (module docstring)."""
    b, d, f, h = layout.param_bytes, cfg.d_model, cfg.d_ff, cfg.num_heads
    norms = 2 * 2 * FP32 * d
    attention = 8 * b * d + (b * h * context if layout.attention == "naive" else FP32 * h)
    ffn = b * d + 4 * b * f
    return norms + attention + ffn


def block_bytes_per_token(cfg: ModelConfig, layout: Layout, mode: str, context: int) -> tuple[int, int]:
    """(certain, likely) bytes per token that one block in checkpoint `mode` keeps for its
    backward (module docstring); the two differ only for a compiled kept block."""
    b, d, f, h = layout.param_bytes, cfg.d_model, cfg.d_ff, cfg.num_heads
    if mode == "full":
        return b * d, b * d
    if mode.startswith("selective"):
        group = {"qkv": 3 * b * d, "out": b * d, "w13": 2 * b * f}
        n = 2 * b * d + FP32 * h + sum(group[g] for g in saved_groups(mode))
        return n, n
    if mode != "none":
        raise ValueError(f"unknown checkpoint mode {mode!r}")
    eager = kept_block_bytes_per_token(cfg, layout, context)
    if not layout.compiled or layout.attention == "naive":
        return eager, eager
    return 6 * b * d + 2 * b * f + FP32 * h, 9 * b * d + 3 * b * f + FP32 * h + 2 * FP32


def budget(cfg: ModelConfig, layout: Layout, world_size: int, batch_per_rank: int,
           context: int) -> MemoryBudget:
    """Bytes per rank of `layout`'s training step on `batch_per_rank` sequences of `context`."""
    if not 0 <= layout.checkpointed_blocks <= cfg.num_layers:
        raise ValueError(f"checkpointed_blocks must be in [0, {cfg.num_layers}], got {layout.checkpointed_blocks}")
    modes = layout.modes(cfg.num_layers)
    if len(modes) != cfg.num_layers:
        raise ValueError(f"the plan has {len(modes)} blocks, the model {cfg.num_layers}")
    if world_size < 1 or batch_per_rank < 1 or context < 1:
        raise ValueError(f"need world_size, batch_per_rank, context >= 1; got {world_size}, {batch_per_rank}, {context}")
    b, d, f, V, L = layout.param_bytes, cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
    tokens = batch_per_rank * context
    n = params(cfg)
    shards = world_size if layout.shard in ("fsdp2", "fsdp") else 1
    weights = n * b / shards

    # saved by the forward
    per_block = [block_bytes_per_token(cfg, layout, m, context) for m in modes]
    kept = block_bytes_per_token(cfg, layout, "none", context)[1]  # what a recomputed block holds
    probabilities = b * cfg.num_heads * context if layout.attention == "naive" else 0
    n_ckpt = layout.checkpointed_blocks
    blocks = tokens * sum(certain for certain, _ in per_block)
    likely_extra = tokens * sum(likely - certain for certain, likely in per_block)
    final_norm = tokens * (2 * FP32 * d + b * d)
    head = {"full-logits": tokens * FP32 * V, "chunked": 0, "fused": tokens * b * d + V * d * b}[layout.loss]
    saved = blocks + final_norm + head

    # the largest transient: a block's recomputation (if any block is checkpointed) plus the
    # gradients of its largest intermediates (the SwiGLU's three (tokens, f) and the residual's),
    # or the loss's working set, or FSDP's gathered weights and their unreduced gradients
    block_backward = tokens * ((kept if n_ckpt else 0) + 3 * b * f + 4 * b * d
                               + (3 * probabilities))  # naive: scores, scaled, masked beside P
    chunk = min(layout.loss_chunk, tokens)
    loss_work = {"full-logits": tokens * (2 * FP32 + b) * V,        # bf16 logits, fp32 copy, its grad
                 "chunked": chunk * V * (2 * b + 3 * FP32),         # one chunk's logits, fwd and bwd
                 "fused": chunk * V * b + V * d * FP32}[layout.loss]  # the chunk buffer, fp32 dW
    block_params = 4 * d * d + 3 * d * f + 2 * d
    gathers = {"none": 0, "ddp": 0,
               # the root (embedding, final norm, head) stays gathered through the step, with its
               # gradients; a block, the prefetched next one and one block's gradients
               "fsdp2": 2 * (2 * V * d + d) * b + 3 * block_params * b,
               # ours gathers per layer: the largest weight (V x d), a prefetched one, one gradient
               "fsdp": 3 * V * d * b}[layout.shard]
    return MemoryBudget(
        params=weights, grads=weights, optimizer_state=2 * weights,
        ddp_buckets=n * b if layout.shard == "ddp" else 0,
        saved_activations=saved,
        attention_probabilities=tokens * (L - n_ckpt) * probabilities,
        working_set=max(block_backward, loss_work) + gathers,
        likely_extra_saved=likely_extra)
