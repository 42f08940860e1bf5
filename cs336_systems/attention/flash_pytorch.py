"""FlashAttention-2 in plain PyTorch: the tiled online-softmax forward and the recomputation backward.

This is the reference one can follow tile by tile when the Triton kernel is wrong, not a fast
path. The forward loops over key tiles (the kernel's single loop); the query tiles, which the
kernel spreads over its launch grid, are the batch dimension of each torch op here. The backward
rebuilds P = exp(S - L) from the saved logsumexp and works on whole matrices; it is an ordinary
function, so it can be (and on a GPU is) wrapped in torch.compile.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .inputs import check_attention_inputs
from .online_softmax import logsumexp_from_stats, online_update
from .reference import causal_bias
from .saved_state import exact_dtype, load_attention_state, save_attention_state, unfold_like

PYTORCH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


# --8<-- [start:tiled_forward]
def tiled_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *, block_q: int = 64,
                  block_k: int = 64) -> tuple[Tensor, Tensor]:
    """O (..., n_q, d) and L (..., n_q) by online softmax over key tiles of `block_k` keys.

    Works in fp32 (fp64 for fp64 inputs); O comes back in that precision too.
    """
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{name} must be a positive int (positions per tile), got {size!r}")
    work = exact_dtype(q.dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    n_q, n_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1], float("-inf"), dtype=work, device=q.device)  # running max
    l = torch.zeros(q.shape[:-1], dtype=work, device=q.device)  # running sum of exp(S - m)
    acc = torch.zeros_like(q)  # running unnormalised output
    for j0 in range(0, n_k, block_k):
        k_j, v_j = k[..., j0:j0 + block_k, :], v[..., j0:j0 + block_k, :]
        # Causal: query tiles that end before key j0 see none of this tile; skip them.
        i0 = (j0 // block_q) * block_q if is_causal else 0
        if i0 >= n_q:
            break  # every later key tile is masked for every query
        s = (q[..., i0:, :] @ k_j.transpose(-2, -1)) * scale  # (..., n_q - i0, Bk)
        if is_causal:
            s = s + causal_bias(n_q - i0, k_j.shape[-2], dtype=work, device=q.device,
                                q_start=i0, k_start=j0)
        m[..., i0:], l[..., i0:], acc[..., i0:, :] = online_update(
            m[..., i0:], l[..., i0:], acc[..., i0:, :], s, v_j)
    return acc / l.unsqueeze(-1), logsumexp_from_stats(m, l)
# --8<-- [end:tiled_forward]


# --8<-- [start:backward]
def attention_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, L: Tensor, do: Tensor,
                       is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV by recomputation: P = exp(S - L), D = rowsum(dO * O), dS = P * (dP - D)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * scale  # (..., n_q, n_k)
    if is_causal:
        s = s + causal_bias(q.shape[-2], k.shape[-2], dtype=s.dtype, device=s.device)
    p = torch.exp(s - L.unsqueeze(-1))  # the softmax, rebuilt without a max or a sum
    dv = p.transpose(-2, -1) @ do
    dp = do @ v.transpose(-2, -1)
    D = (do * o).sum(dim=-1, keepdim=True)  # = rowsum(P * dP), see the chapter
    ds = p * (dp - D)
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv
# --8<-- [end:backward]


_compiled_backward = None


def compiled_attention_backward(*args, **kwargs):
    """`attention_backward` under torch.compile (compiled once per process, dynamic shapes)."""
    global _compiled_backward
    if _compiled_backward is None:
        _compiled_backward = torch.compile(attention_backward, dynamic=True)
    return _compiled_backward(*args, **kwargs)


class FlashAttentionPyTorch(torch.autograd.Function):
    """Tiled FlashAttention-2 in PyTorch. `apply(q, k, v, is_causal=False)`; q, k, v are
    (batch, seq, d) or (batch, heads, seq, d); any device, fp32/fp64/bf16/fp16."""

    block_q = 64  # tile sizes (positive ints); tests shrink them to exercise ragged tiles
    block_k = 64
    compile_backward: bool | None = None  # None: compiled on CUDA, eager elsewhere

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        x = check_attention_inputs(q, k, v, is_causal, dtypes=PYTORCH_DTYPES, head_dims=None)
        o4, L32 = tiled_forward(x.q, x.k, x.v, x.is_causal, block_q=FlashAttentionPyTorch.block_q,
                                block_k=FlashAttentionPyTorch.block_k)
        o = unfold_like(o4.to(q.dtype), len(x.lead))
        save_attention_state(ctx, x, o, L32)
        return o

    @staticmethod
    def backward(ctx, do):
        return _backward(ctx, do, FlashAttentionPyTorch.compile_backward)


class FlashAttentionPyTorchCompiled(FlashAttentionPyTorch):
    """The same, with the backward always under torch.compile (what the benchmarks time)."""

    @staticmethod
    def backward(ctx, do):
        return _backward(ctx, do, True)


def _backward(ctx, do, compiled: bool | None):
    q, k, v, o, L = load_attention_state(ctx)
    work = L.dtype
    do4 = do.unsqueeze(1) if ctx.lead_ndim == 1 else do
    if compiled is None:
        compiled = q.is_cuda
    backward = compiled_attention_backward if compiled else attention_backward
    grads = backward(q.to(work), k.to(work), v.to(work), o.to(work), L, do4.to(work), ctx.is_causal)
    dq, dk, dv = (unfold_like(g.to(q.dtype), ctx.lead_ndim) for g in grads)
    return dq, dk, dv, None
