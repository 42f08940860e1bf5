"""The LM head and the cross-entropy loss fused, chunk by chunk over positions: the full logits are
never in memory.

    loss = fused_linear_cross_entropy(hidden, weight, targets)   # hidden (..., d), weight (V, d)
    loss.backward()                                              # hidden.grad, weight.grad

is `F.cross_entropy((hidden @ weight.T).flatten(0, -2), targets.flatten(), ignore_index=-100)`
(mean over the positions whose target is not ignore_index). At the 8B training step (V = 151,936,
d = 4,096, 2 x 32,768 = 65,536 positions, bf16) the full logits would take 65,536 x 151,936 x 2 B =
20 GB, their fp32 gradient twice that. Here the N positions go through in chunks of `chunk_size`
rows (default 4096: a (4096, V) bf16 buffer is 1.2 GB, reused by every chunk). Per chunk:

    z = h_chunk @ W.T                 # (chunk, V) in h's dtype: a cuBLAS GEMM
    ce_rows_kernel (one launch)       # per row, in fp32: online logsumexp (m, l), the loss term
                                      #   lse - z[target], then z overwritten by dL/dz =
                                      #   (softmax - onehot(target)) / n_valid
    dh_chunk = G @ W                  # (chunk, d)
    dW += G.T @ h_chunk               # (V, d), accumulated in fp32 over the chunks

Gradients in the forward. The loss is the last node of the graph, so dL/dz is known as soon as the
logits are: the gradients of the mean loss are computed in the forward and saved, and the backward
only multiplies them by grad_output (a scalar: loss * 3 gives 3x). The trade: this saves a second
pass over the logits (recomputing z = h @ W.T per chunk in the backward would be a fourth GEMM of
2 N V d FLOPs, a third more work), and costs holding dh (N, d) and dW (V, d) from the forward to the
backward (0.5 GB and 1.2 GB in bf16 at the 8B shape, against 20 GB of logits). Under
torch.no_grad, or when neither hidden nor weight requires grad, only the loss is computed: one GEMM
per chunk and the kernel's first walk.

The targets are checked on the host (one device sync: a count of the valid and the out-of-range
targets) so that an out-of-range target is a ValueError, not a silent out-of-bounds read in the
kernel; the same count gives n_valid. As in torch, a batch whose every target is ignored has a NaN
loss (0 / 0) and zero gradients.

Importing this module does not import triton: the kernel module loads on first use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from cs336_systems.attention.triton_loader import interpreting, kernels, next_power_of_2

KERNELS = "cs336_systems.training_step.fused_ce_kernel"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Vocab tile of the row kernel: a (BLOCK_V,) fp32 tile is 16 values per thread at 8 warps; rows
# shorter than a tile get the next power of two above V.
BLOCK_V = 4096


@dataclass(frozen=True)
class _Problem:
    h: Tensor  # (N, d): hidden's leading dims flattened
    weight: Tensor  # (V, d)
    t: Tensor  # (N,) int64, contiguous
    chunk_size: int
    ignore_index: int
    n_valid: int  # positions whose target is not ignore_index


def _check(hidden: object, weight: object, targets: object, chunk_size: object, ignore_index: object) -> _Problem:
    """Every argument checked before any work; a ValueError names the argument."""
    for name, x in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    assert isinstance(hidden, Tensor) and isinstance(weight, Tensor) and isinstance(targets, Tensor)
    if hidden.dim() < 1 or hidden.shape[-1] < 1:
        raise ValueError(f"hidden must have shape (..., d) with d >= 1, got {tuple(hidden.shape)}")
    d = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[0] < 1 or weight.shape[1] != d:
        raise ValueError(f"weight must have shape (V, {d}) with V >= 1 (hidden's d = {d}), got {tuple(weight.shape)}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"targets must have hidden's leading shape {tuple(hidden.shape[:-1])}, "
                         f"got {tuple(targets.shape)}")
    if hidden.dtype not in DTYPES:
        raise ValueError(f"hidden's dtype must be one of {[str(t) for t in DTYPES]}, got {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight must have hidden's dtype {hidden.dtype}, got {weight.dtype}")
    if targets.dtype != torch.int64:
        raise ValueError(f"targets must be torch.int64 class indices, got {targets.dtype}")
    for name, x in (("weight", weight), ("targets", targets)):
        if x.device != hidden.device:
            raise ValueError(f"{name} must be on hidden's device {hidden.device}, got {x.device}")
    if hidden.device.type != "cuda" and not interpreting():
        raise ValueError(f"hidden must be a CUDA tensor for the Triton kernel, got device {hidden.device} "
                         "(on a CPU, run under the Triton interpreter: TRITON_INTERPRET=1)")
    if hidden.dtype == torch.bfloat16 and interpreting():
        raise ValueError("hidden's dtype torch.bfloat16 is computed wrongly by the Triton interpreter "
                         "(TRITON_INTERPRET=1 keeps bf16 as raw 16-bit integers): on the CPU use float32; "
                         "run bfloat16 on a CUDA GPU")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"ignore_index must be an integer, got {ignore_index!r}")
    V = weight.shape[0]
    t = targets.reshape(-1).contiguous()  # (N,)
    valid = t != ignore_index
    out_of_range = valid & ((t < 0) | (t >= V))
    n_valid, n_bad = torch.stack([valid.sum(), out_of_range.sum()]).tolist()  # the one host sync
    if n_bad:
        raise ValueError(f"targets must lie in [0, {V}) or equal ignore_index={ignore_index}; "
                         f"{n_bad} of {t.numel()} do not")
    return _Problem(hidden.reshape(-1, d), weight, t, chunk_size, ignore_index, n_valid)


def launch_ce_rows(z: Tensor, t: Tensor, loss_rows: Tensor, ignore_index: int, grad_scale: float,
                   write_grad: bool) -> None:
    """One kernel launch over the rows of z (rows, V): loss_rows (rows,) fp32 gets lse - z[target]
    (0 where ignored); with `write_grad`, z is overwritten by (softmax - onehot) * grad_scale."""
    rows, V = z.shape
    if rows == 0:
        return
    block_v = min(BLOCK_V, next_power_of_2(V))
    kernels(KERNELS).ce_rows_kernel[(rows,)](
        z, t, loss_rows, z.stride(0), V, ignore_index, grad_scale,
        BLOCK_V=block_v, WRITE_GRAD=write_grad, num_warps=8 if block_v >= 2048 else 4)


@functools.cache
def _mixed_addmm(device: str, dtype: torch.dtype) -> bool:
    """Whether this torch adds a `dtype` product straight into an fp32 matrix (addmm with
    out_dtype=float32: cuBLAS's fp32 C with bf16/fp16 A and B; CUDA only, recent torch)."""
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        c = torch.ones(2, 2, dtype=torch.float32, device=device)
        torch.addmm(c, a, a, out_dtype=torch.float32, out=c)
        return bool((c == 3).all())
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _accumulate_dw(dw: Tensor, g: Tensor, h: Tensor) -> None:
    """dw (V, d) fp32 += g.T (V, chunk) @ h (chunk, d).

    Why fp32: dW sums N / chunk_size partial products (16 at the 8B shape). Kept in bf16, every
    addition would round the running sum to 8 bits of mantissa, so the error would grow with the
    number of chunks, and a chunk whose contribution is under 2^-9 of the running |dW| would be
    lost entirely. In fp32 each partial is rounded at most once (to bf16 by the GEMM where torch
    cannot add into fp32 directly) and the additions cost 2^-24 each.
    """
    if g.dtype == dw.dtype:
        dw.addmm_(g.T, h)
    elif _mixed_addmm(str(dw.device), g.dtype):
        torch.addmm(dw, g.T, h, out_dtype=torch.float32, out=dw)
    else:
        dw += g.T @ h  # (V, d) in g's dtype (fp32 accumulation inside the GEMM), then added in fp32


def _chunked(p: _Problem, need_dh: bool, need_dw: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The mean loss (fp32 scalar) and, where asked, dL/dh (N, d) and dL/dW (V, d) in their dtypes."""
    h, W = p.h, p.weight
    N, d = h.shape
    V = W.shape[0]
    write_grad = need_dh or need_dw
    grad_scale = 1.0 / p.n_valid if p.n_valid else 0.0  # all ignored: zero gradients, as torch
    z_buf = torch.empty((min(p.chunk_size, N), V), dtype=h.dtype, device=h.device)  # (chunk, V), reused
    loss_rows = torch.empty(N, dtype=torch.float32, device=h.device)  # (N,)
    dh = torch.empty_like(h) if need_dh else None  # (N, d)
    dw = torch.zeros((V, d), dtype=torch.float32, device=h.device) if need_dw else None  # (V, d) fp32
    for start in range(0, N, p.chunk_size):
        end = min(start + p.chunk_size, N)
        h_c = h[start:end]  # (rows, d)
        z = z_buf[:end - start]  # (rows, V): a contiguous prefix of the buffer
        torch.matmul(h_c, W.T, out=z)
        launch_ce_rows(z, p.t[start:end], loss_rows[start:end], p.ignore_index, grad_scale, write_grad)
        if need_dh:
            torch.matmul(z, W, out=dh[start:end])  # (rows, d) = G (rows, V) @ W (V, d)
        if need_dw:
            _accumulate_dw(dw, z, h_c)
    del z_buf
    loss = loss_rows.sum() / p.n_valid  # every target ignored: 0 / 0 = NaN, as torch
    return loss, dh, (dw.to(W.dtype) if dw is not None else None)


# --8<-- [start:function]
class FusedLinearCrossEntropy(torch.autograd.Function):
    """`apply(hidden, weight, targets, chunk_size=4096, ignore_index=-100)`: the mean cross-entropy
    of hidden @ weight.T, an fp32 scalar. The forward computes the gradients of the inputs that
    require grad (the module docstring says why); the backward scales them by grad_output."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size=4096, ignore_index=-100):
        p = _check(hidden, weight, targets, chunk_size, ignore_index)
        loss, dh, dw = _chunked(p, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        ctx.save_for_backward(dh, dw)
        ctx.hidden_shape = hidden.shape
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dh, dw = ctx.saved_tensors
        # A new tensor, not dh.mul_(): a second backward (retain_graph=True) must see the saved
        # gradients unscaled. The product rounds once to dh's dtype (a 0-dim fp32 factor does not
        # promote a bf16 tensor).
        d_hidden = (dh * grad_loss).view(ctx.hidden_shape) if dh is not None else None
        d_weight = dw * grad_loss if dw is not None else None
        return d_hidden, d_weight, None, None, None
# --8<-- [end:function]


def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk_size: int = 4096,
                               ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy of the logits hidden @ weight.T against targets, never materialising them.

    hidden (..., d), weight (V, d) in one dtype (fp32, bf16, fp16; bf16 only on a GPU), targets
    (...) int64 in [0, V) or ignore_index. Returns an fp32 scalar, the mean over non-ignored
    positions. With grad enabled and hidden or weight requiring grad, backward gives their
    gradients (in their dtypes); otherwise only the loss is computed.
    """
    wants_grad = torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in (hidden, weight))
    if wants_grad:
        return FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk_size, ignore_index)
    loss, _, _ = _chunked(_check(hidden, weight, targets, chunk_size, ignore_index), False, False)
    return loss
