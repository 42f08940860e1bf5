"""Running each block under its checkpoint plan's mode (checkpoint_plan.py), compiled or not.

    install_plan(lm, plan, compile=True)   # each block's forward checkpoints itself as the plan
                                           # says, and is compiled, checkpoint included

The checkpoint sits *inside* the block's forward, and so inside the compiled region when the
forward is compiled: dynamo turns it into a tagged region, and the selective policy is
called while AOT autograd traces the block, marking each op MUST_SAVE or PREFER_RECOMPUTE; the
partitioner then keeps the marked outputs and recomputes the rest inside the compiled backward.
(A checkpoint wrapped around a compiled forward could not be selective: its policy runs as a
dispatch mode, and a compiled graph is one opaque call to it.) Eager, the same code is
torch.utils.checkpoint's selective checkpointing as documented.

The policy (`BlockPolicy`, one per checkpointed call) saves:

- the outputs of the attention op: ours (`cs336::flash_attention_fwd`, attention/fast/op.py: O and
  the log-sum-exp L) or whichever SDPA kernel PyTorch picked (cuDNN, flash, efficient, the CPU's);
  their backward needs exactly those, so the quadratic forward never runs twice;
- with matmul groups (selective+qkv, +out, +w13), the outputs of those projections. A policy sees
  ops, not modules, so it tells the block's matmuls apart by their order: TransformerBlock.forward
  runs seven `aten.mm` per call, q, k, v, out, w1, w3, w2 (F.linear on (batch, seq, d) inputs
  dispatches to one mm each). Each mm's weight shape is checked against that order, so a model
  that runs them otherwise fails loudly instead of saving the wrong tensors.

Each block's forward becomes `functools.partial(run, block, mode, context_fn)`, `run` being
`run_block` or one torch.compile of it shared by every block. Not its __call__: the hooks of FSDP2
and of our FSDP stay outside the compiled code. The compiled frame is run_block's, with the block an
argument: every block has the same code, one mode string and one context_fn object per mode, so
dynamo compiles once per mode (its guards compare those by value or identity) and treats each
block's parameters as inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .checkpoint_plan import CheckpointPlan, saved_groups

# The attention ops whose outputs selective checkpointing keeps, by name (str(op)): naming them
# needs no import of our op's module (which loads the Triton launchers) nor SDPA backends a build lacks.
ATTENTION_OPS = frozenset({
    "cs336.flash_attention_fwd.default",                          # ours: O and L
    "aten._scaled_dot_product_cudnn_attention.default",           # SDPA's kernels: each returns the
    "aten._scaled_dot_product_flash_attention.default",           # output, the log-sum-exp and what
    "aten._scaled_dot_product_efficient_attention.default",       # its backward reads (seeds, lengths)
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
})
BLOCK_MATMULS = ("q", "k", "v", "out", "w1", "w3", "w2")  # TransformerBlock.forward's mm, in order
GROUP_MATMULS = {"qkv": ("q", "k", "v"), "out": ("out",), "w13": ("w1", "w3")}
MM = torch.ops.aten.mm.default


# --8<-- [start:policy]
class BlockPolicy:
    """The policy_fn of one checkpointed call of a block (create_selective_checkpoint_contexts):
    MUST_SAVE for the attention op and the matmuls in `keep`, PREFER_RECOMPUTE for the rest."""

    def __init__(self, keep: frozenset[str]):
        self.keep = keep
        self.mm_seen = {False: 0, True: 0}  # mm calls so far, in the forward and in the recompute
        self.widths: dict[str, int] = {}    # d and d_ff, read off the first q and w1 weights

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func is MM:
            return CheckpointPolicy.MUST_SAVE if self._matmul(ctx.is_recompute, args[1]) in self.keep \
                else CheckpointPolicy.PREFER_RECOMPUTE
        if str(func) in ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
# --8<-- [end:policy]

    def _matmul(self, recompute: bool, weight_t: torch.Tensor) -> str:
        """Which of the block's matmuls this is, from the count (modulo 7: under compile the
        forward may be traced more than once); its (d_in, d_out) weight checked against it."""
        i = self.mm_seen[recompute] % len(BLOCK_MATMULS)
        self.mm_seen[recompute] += 1
        name = BLOCK_MATMULS[i]
        shape = tuple(weight_t.shape)
        if name == "q":
            self.widths["d"] = shape[0]
        if name == "w1":
            self.widths["f"] = shape[1]
        d, f = self.widths.get("d"), self.widths.get("f", shape[0])
        want = {"w1": (d, f), "w3": (d, f), "w2": (f, d)}.get(name, (d, d))
        if shape != want:
            raise RuntimeError(f"selective checkpointing: matmul {i} of the block has a {shape} weight, "
                               f"not {want}: the policy expects the block's matmuls in the order "
                               f"{', '.join(BLOCK_MATMULS)} (TransformerBlock.forward)")
        return name


def _contexts(keep: frozenset[str]):
    return create_selective_checkpoint_contexts(BlockPolicy(keep))


@functools.cache
def context_fn(mode: str) -> Callable:
    """The context_fn of a selective mode: one object per mode (compiled blocks guard on it)."""
    keep = frozenset(m for g in saved_groups(mode) for m in GROUP_MATMULS[g])
    return functools.partial(_contexts, keep)


# --8<-- [start:run_block]
def run_block(block: nn.Module, mode: str, contexts: Callable | None, x: torch.Tensor,
              causal_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The block's own forward on x (batch, seq, d), under `mode`'s checkpointing."""
    forward = type(block).forward
    if mode == "none" or not torch.is_grad_enabled():  # no graph, nothing to save or recompute
        return forward(block, x, causal_mask, positions)
    if contexts is None:  # full
        return checkpoint(forward, block, x, causal_mask, positions, use_reentrant=False)
    return checkpoint(forward, block, x, causal_mask, positions, use_reentrant=False, context_fn=contexts)
# --8<-- [end:run_block]


def install_plan(lm: nn.Module, plan: CheckpointPlan, compile: bool = False) -> None:
    """Give every block of `lm` (a TransformerLM) the forward of its mode in `plan`, compiled
    (one torch.compile of run_block for all the blocks) or not."""
    if len(plan) != len(lm.layers):
        raise ValueError(f"the plan has {len(plan)} blocks, the model {len(lm.layers)}")
    run = torch.compile(run_block) if compile else run_block
    for block, mode in zip(lm.layers, plan.modes):
        contexts = context_fn(mode) if mode.startswith("selective") else None
        block.forward = functools.partial(run, block, mode, contexts)
