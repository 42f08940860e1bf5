"""The LM and its loss as one module: `module(tokens, targets) -> mean cross-entropy (fp32)`.

    PlainLoss(lm)                  the model as written (TransformerLM.forward: the full logits),
                                   then F.cross_entropy on an fp32 copy of the logits
    LanguageModelLoss(lm, head)    the same computation with a loss head in place of the logits

Both keep the TransformerLM as `.lm`, so parameter names (`lm.layers.0.ffn.w1.weight`) and the
weights are the same in every variant. Both have `logits(tokens)` for comparisons.

LanguageModelLoss runs what TransformerLM.forward runs (embedding, the blocks, the final RMSNorm),
then the head, with two changes that the stock and our variants need:

- the head is a loss head (heads.py) that owns `lm.lm_head.weight` and returns the mean
  cross-entropy, so the (N, V) logits need not exist;
- each block runs under its mode of a checkpoint plan (checkpoint_plan.py): none, full
  (torch.utils.checkpoint: the block's input kept, the block recomputed) or selective (the
  attention's outputs, and chosen matmul outputs, kept; the rest recomputed). The checkpoint is
  inside each block's forward (selective.py), compiled with it (`compile`). An int `plan`
  n is the older switch: the first n blocks full, the last ones kept (their activations are the
  first the backward needs, and recomputing them buys little).

Causal masking: the blocks get a (1, 1) mask instead of the model's (context, context) one (1 GiB of
bools at 32k). The attention functions of these variants (SDPA with is_causal, FlashAttention) read
only whether a mask is given; naive attention reads its entries, so it is refused here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cs336_systems.model import TransformerLM
from cs336_systems.model import attention as model_attention

from .annotate import around_loss_backward, step_range
from .checkpoint_plan import CheckpointPlan, plan_of_keep_blocks
from .selective import install_plan


class PlainLoss(nn.Module):
    """tokens (batch, seq), targets (batch, seq) -> F.cross_entropy of the model's fp32 logits."""

    annotate = False  # no loss ranges: the head is inside the model's forward here

    def __init__(self, lm: TransformerLM):
        super().__init__()
        self.lm = lm

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm(tokens).float()  # (batch, seq, vocab): the full logits, and an fp32 copy
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(tokens)


class LanguageModelLoss(nn.Module):
    """tokens (batch, seq), targets (batch, seq) -> mean cross-entropy, an fp32 scalar."""

    annotate = False  # True: the loss head's forward and backward in named ranges (annotate.py)

    def __init__(self, lm: TransformerLM, head: nn.Module, plan: CheckpointPlan | int = 0,
                 compile: bool = False):
        super().__init__()
        L = len(lm.layers)
        if isinstance(plan, int):
            if not 0 <= plan <= L:
                raise ValueError(f"checkpointed_blocks must be in [0, {L}], got {plan}")
            plan = plan_of_keep_blocks(L, L - plan)
        if len(plan) != L:
            raise ValueError(f"the checkpoint plan has {len(plan)} blocks, the model {L}")
        if head.weight is not lm.lm_head.weight:
            raise ValueError("the loss head must own the model's lm_head.weight (the same Parameter)")
        lm.lm_head = head  # same weight, same name: lm_head.weight
        # the presence of a mask is the causal flag of SDPA and FlashAttention (module docstring)
        lm.causal_mask = torch.ones(1, 1, dtype=torch.bool, device=lm.causal_mask.device)
        install_plan(lm, plan, compile)  # each block's forward checkpoints itself as the plan says
        self.lm = lm
        self.plan = plan
        self.checkpointed_blocks = plan.checkpointed_blocks

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """(batch, seq) token ids -> (batch, seq, d_model) after the final norm."""
        if model_attention.scaled_dot_product_attention is model_attention.naive_attention:
            raise RuntimeError("LanguageModelLoss passes a (1, 1) causal marker, which naive attention "
                               "would apply as a mask: run it under use_attention('sdpa') or a flash one")
        lm = self.lm
        s = tokens.shape[1]
        if s > lm.config.context_length:
            raise ValueError(f"sequence length {s} exceeds context_length {lm.config.context_length}")
        positions = torch.arange(s, device=tokens.device)
        x = lm.token_embeddings(tokens)  # (batch, seq, d_model)
        for block in lm.layers:
            x = block(x, lm.causal_mask, positions)  # checkpointed inside, per the plan
        return lm.ln_final(x)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = self.hidden(tokens)
        if not self.annotate:
            return self.lm.lm_head(hidden, targets)
        with step_range("loss"):
            loss = self.lm.lm_head(hidden, targets)
        around_loss_backward(loss, hidden)
        return loss

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(batch, seq, vocab) in the parameter dtype: for comparisons, never the training step."""
        return self.lm.lm_head.logits(self.hidden(tokens))
