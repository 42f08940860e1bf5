"""The building blocks of the LM: Linear, Embedding, RMSNorm, SwiGLU, RoPE. No biases anywhere."""

from __future__ import annotations

import math

import torch
from torch import nn


def _trunc_normal_(w: torch.Tensor, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    """y = x W^T with W (d_out, d_in), initialised N(0, 2/(d_in+d_out)) truncated at 3 sigma."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        _trunc_normal_(self.weight, math.sqrt(2.0 / (d_in + d_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)  # autocast casts here


class Embedding(nn.Module):
    """Token id -> vector lookup, (vocab, d) initialised N(0, 1) truncated at 3."""

    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        _trunc_normal_(self.weight, 1.0)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """x / rms(x) * g, computed in fp32 (a reduction: low precision loses it), cast back."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x32 = x.float()
        rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * rms * self.weight.float()).to(in_dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each consecutive pair (x[2i], x[2i+1]) by angle pos * theta^(-2i/d).

    One instance is shared by all layers; cos/sin tables are non-persistent buffers
    (context, d_head/2), so they move with .to() but stay out of the state dict.
    """

    def __init__(self, theta: float, d_head: int, max_seq_len: int, device=None):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"d_head must be even for RoPE, got {d_head}")
        inv_freq = theta ** (-torch.arange(0, d_head, 2, device=device, dtype=torch.float32) / d_head)
        angles = torch.arange(max_seq_len, device=device, dtype=torch.float32)[:, None] * inv_freq
        self.register_buffer("cos", angles.cos(), persistent=False)  # (max_seq, d_head/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (..., seq, d_head); positions: (seq,) or broadcastable (..., seq)
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return out.flatten(-2)
