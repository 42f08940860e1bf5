"""The pre-norm decoder-only Transformer LM (the course's assignment-1 architecture)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import CausalMultiHeadSelfAttention
from .config import ModelConfig
from .layers import Embedding, Linear, RMSNorm, RotaryEmbedding, SwiGLU

SUBLAYERS = ("attn", "ffn")  # the two residual branches of a block, in call order


class TransformerBlock(nn.Module):
    """x + attn(norm(x)), then + ffn(norm(x)).

    `checkpointed` names the sub-layers (of SUBLAYERS) run under torch.utils.checkpoint: a finer
    granularity than a block. A checkpointed sub-layer (its norm included) keeps only its input for
    the backward and recomputes the rest there; the other keeps its activations as usual.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding,
                 device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, rope, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device, dtype)
        self.checkpointed: tuple[str, ...] = ()

    def attention_branch(self, x, causal_mask, positions):
        return self.attn(self.ln1(x), causal_mask, positions)  # (batch, seq, d_model)

    def ffn_branch(self, x):
        return self.ffn(self.ln2(x))  # (batch, seq, d_model)

    def forward(self, x, causal_mask, positions):
        # --8<-- [start:sublayer_checkpoint]
        if self.checkpointed and torch.is_grad_enabled():
            # the same arithmetic either way: checkpoint replays the branch on the same input
            attn = (checkpoint(self.attention_branch, x, causal_mask, positions, use_reentrant=False)
                    if "attn" in self.checkpointed else self.attention_branch(x, causal_mask, positions))
            x = x + attn
            ffn = checkpoint(self.ffn_branch, x, use_reentrant=False) if "ffn" in self.checkpointed else self.ffn_branch(x)
            return x + ffn
        # --8<-- [end:sublayer_checkpoint]
        x = x + self.attention_branch(x, causal_mask, positions)
        return x + self.ffn_branch(x)


class TransformerLM(nn.Module):
    """token ids (batch, seq) -> logits (batch, seq, vocab).

    `checkpoint_every = k > 0` runs the blocks in segments of k under torch.utils.checkpoint: the
    forward keeps only each segment's input, and the backward recomputes one segment at a time
    (one extra forward in all). 0 (the default) keeps every activation.

    `checkpoint_sublayers` checkpoints inside every block instead: ("attn",) the attention branch
    alone, ("ffn",) the feed-forward alone, ("attn", "ffn") each branch on its own (segments of half
    a block). One granularity at a time: set the other to 0 / () first.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int, rope_theta: float = 10_000.0, device=None, dtype=None,
                 checkpoint_every: int = 0):
        super().__init__()
        self.config = ModelConfig(vocab_size, context_length, d_model, num_layers, num_heads, d_ff,
                                  rope_theta)
        self.token_embeddings = Embedding(vocab_size, d_model, device, dtype)
        rope = RotaryEmbedding(rope_theta, d_model // num_heads, context_length, device)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, rope, device, dtype) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device, dtype)
        # One RoPE table shared by all layers; registered once here so .to() moves it.
        self.rope = rope
        mask = torch.ones(context_length, context_length, dtype=torch.bool, device=device).tril()
        self.register_buffer("causal_mask", mask, persistent=False)  # (ctx, ctx), True = keep
        self.checkpoint_every = checkpoint_every

    @classmethod
    def from_config(cls, cfg: ModelConfig, device=None, dtype=None,
                    checkpoint_every: int = 0) -> "TransformerLM":
        return cls(cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.num_layers, cfg.num_heads,
                   cfg.d_ff, cfg.rope_theta, device=device, dtype=dtype,
                   checkpoint_every=checkpoint_every)

    @property
    def checkpoint_every(self) -> int:
        return self._checkpoint_every

    @checkpoint_every.setter
    def checkpoint_every(self, k: int) -> None:
        # A settable switch, so one built model can be measured at every block size.
        L = self.config.num_layers
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= L:
            raise ValueError(f"checkpoint_every must be an int in [0, num_layers={L}] "
                             f"(0 = no checkpointing), got {k!r}")
        if k and self.checkpoint_sublayers:
            raise ValueError(f"checkpoint_every={k} with checkpoint_sublayers={self.checkpoint_sublayers}: "
                             f"one granularity at a time; set checkpoint_sublayers = () first")
        self._checkpoint_every = k

    @property
    def checkpoint_sublayers(self) -> tuple[str, ...]:
        return self.layers[0].checkpointed if len(self.layers) else ()

    @checkpoint_sublayers.setter
    def checkpoint_sublayers(self, names) -> None:
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in names if n not in SUBLAYERS]
        if unknown:
            raise ValueError(f"checkpoint_sublayers: unknown sub-layer(s) {unknown}; expected some of "
                             f"{', '.join(SUBLAYERS)}")
        if names and getattr(self, "_checkpoint_every", 0):
            raise ValueError(f"checkpoint_sublayers={names} with checkpoint_every={self._checkpoint_every}: "
                             f"one granularity at a time; set checkpoint_every = 0 first")
        ordered = tuple(n for n in SUBLAYERS if n in names)  # canonical order, no repeats
        for layer in self.layers:
            layer.checkpointed = ordered

    def _run_blocks(self, x, start: int, stop: int, mask, positions):
        for layer in self.layers[start:stop]:
            x = layer(x, mask, positions)
        return x

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if token_ids.dim() != 2:
            raise ValueError(f"token_ids must be (batch, seq), got shape {tuple(token_ids.shape)}")
        s = token_ids.shape[1]
        if s > self.config.context_length:
            raise ValueError(f"sequence length {s} exceeds context_length {self.config.context_length}")
        positions = torch.arange(s, device=token_ids.device)
        mask = self.causal_mask[:s, :s]
        x = self.token_embeddings(token_ids)  # (batch, seq, d_model)
        # --8<-- [start:checkpoint_every]
        L, k = len(self.layers), self.checkpoint_every
        if k and torch.is_grad_enabled():
            # use_reentrant=False: the recommended implementation (works with inputs that need no
            # grad, nests, and frees each recomputed segment as soon as its backward is done).
            for start in range(0, L, k):
                x = checkpoint(self._run_blocks, x, start, min(start + k, L), mask, positions,
                               use_reentrant=False)
        else:
            x = self._run_blocks(x, 0, L, mask, positions)
        # --8<-- [end:checkpoint_every]
        return self.lm_head(self.ln_final(x))  # (batch, seq, vocab)
