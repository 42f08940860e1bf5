"""Stand-ins of the course's `cs336_basics` layers (that package is not ours to commit), and small
language models built from them, for the FSDP tests.

Same shapes and conventions as the course's classes: `Linear(d_in, d_out)` holds `weight`
(d_out, d_in) and no bias; `Embedding(vocab, d)` holds `weight` (vocab, d); `RMSNorm(d)` holds
`weight` (d,) and normalises in fp32. They are deliberately not our `cs336_systems.model` classes,
so a wrapper that recognised layers by importing ours would miss them.

The sizes are odd on purpose (vocab 13, d 7, d_ff 11): every weight's element count is odd, so no
weight splits evenly over 2 ranks. The feed-forward calls its layers in another order than it
registers them (w1, w3, then w2, like SwiGLU), so a wrapper that prefetches in registration order
guesses wrong on the first step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

VOCAB, D_MODEL, D_FF, SEQ = 13, 7, 11, 6


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std,
                                                         a=-3 * std, b=3 * std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(
            torch.empty(num_embeddings, embedding_dim), a=-3, b=3))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.float()
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(in_dtype)


class FeedForward(nn.Module):
    """w2(silu(w1 x) * w3 x): called w1, w3, w2; registered w1, w2, w3."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class CourseToyLM(nn.Module):
    """token ids (batch, seq) -> logits (batch, seq, VOCAB): embedding, a pre-norm residual
    feed-forward, a final norm, an output projection (optionally tied to the embedding)."""

    def __init__(self, tied: bool = False):
        super().__init__()
        self.token_embeddings = Embedding(VOCAB, D_MODEL)
        self.ln1 = RMSNorm(D_MODEL)
        self.ffn = FeedForward(D_MODEL, D_FF)
        self.ln_final = RMSNorm(D_MODEL)
        self.lm_head = Linear(D_MODEL, VOCAB)
        if tied:
            self.lm_head.weight = self.token_embeddings.weight  # (VOCAB, D_MODEL) both

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(token_ids)
        x = x + self.ffn(self.ln1(x))
        return self.lm_head(self.ln_final(x))


class TinyLayers(nn.Module):
    """Weights of 3, 1 and 5 elements: on 2 ranks the 1x1 weight leaves rank 1 an empty piece."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 1, bias=False)
        self.b = nn.Linear(1, 1, bias=True)
        self.c = nn.Linear(1, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, 3) -> (batch, 5)
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))
