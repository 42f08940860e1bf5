"""Checking attention inputs once, for every implementation: shapes, dtypes, devices, head dim.

Anything the kernels cannot do, or would get wrong, raises ValueError naming the argument, before
any launch. Inputs are (batch, seq, d) or (batch, heads, seq, d); both become 4-D views
(Z, H, N, d) so the kernels see one layout (a 3-D input is H = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .triton_loader import interpreting

LOW_PRECISION = (torch.bfloat16, torch.float16)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEAD_DIM_RANGE = (16, 128)  # the Triton kernels pad d to the next power of two, at most 128


@dataclass(frozen=True)
class AttentionInputs:
    q: Tensor  # (Z, H, n_q, d)
    k: Tensor  # (Z, H, n_k, d)
    v: Tensor  # (Z, H, n_k, d)
    lead: tuple[int, ...]  # the caller's leading dims: (batch,) or (batch, heads)
    is_causal: bool

    @property
    def n_queries(self) -> int:
        return self.q.shape[-2]

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]


def check_attention_inputs(q: object, k: object, v: object, is_causal: object, *,
                           dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
                           head_dims: tuple[int, int] | None = HEAD_DIM_RANGE,
                           need_cuda: bool = False) -> AttentionInputs:
    """Validate q, k, v, is_causal; return 4-D views. `need_cuda`: tensors must live on a GPU."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    if isinstance(is_causal, Tensor) and is_causal.numel() == 1:
        is_causal = bool(is_causal.item())
    if not isinstance(is_causal, (bool, int)) or is_causal not in (0, 1):
        raise ValueError(f"is_causal must be a bool, got {is_causal!r}")
    if q.dim() not in (3, 4):
        raise ValueError(f"q must have shape (batch, seq, d) or (batch, heads, seq, d), got {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"{name} must have the rank of q ({q.dim()}), got shape {tuple(t.shape)}")
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(f"{name} must have q's leading dims {tuple(q.shape[:-2])}, got {tuple(t.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have q's head dim {q.shape[-1]}, got {k.shape[-1]}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"q and k need at least one position, got n_queries={q.shape[-2]}, n_keys={k.shape[-2]}")
    if q.shape[-1] < 1:  # softmax(QK^T / sqrt(d)) has no meaning without features
        raise ValueError(f"q's head dim must be at least 1, got {q.shape[-1]}")
    if 0 in q.shape[:-2]:
        raise ValueError(f"q's leading dims (batch[, heads]) must all be at least 1, got {tuple(q.shape[:-2])}")
    if head_dims is not None and not head_dims[0] <= q.shape[-1] <= head_dims[1]:
        raise ValueError(f"q's head dim must be in {head_dims[0]}..{head_dims[1]}, got {q.shape[-1]}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if q.dtype not in dtypes:
        raise ValueError(f"q's dtype must be one of {[str(d) for d in dtypes]}, got {q.dtype}")
    if need_cuda and q.device.type != "cuda":
        raise ValueError(f"q, k, v must be CUDA tensors for the Triton kernels, got device {q.device} "
                         "(on a CPU, run under the Triton interpreter: TRITON_INTERPRET=1)")
    lead = tuple(q.shape[:-2])
    if q.dim() == 3:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    return AttentionInputs(q, k, v, lead, bool(is_causal))


def refuse_under_interpreter(dtype: torch.dtype) -> None:
    """Refuse bf16 when the Triton kernels would run under the interpreter (TRITON_INTERPRET=1).

    numpy has no bfloat16, so the interpreter keeps bf16 tensors as their raw 16-bit patterns
    (uint16) and its tl.dot multiplies those integers: outputs come back wrong by orders of magnitude
    (~1e9 where the answer is ~1). fp16 is a numpy type and computes correctly, as does fp32.
    """
    if dtype == torch.bfloat16 and interpreting():
        raise ValueError("q's dtype torch.bfloat16 is computed wrongly by the Triton interpreter "
                         "(TRITON_INTERPRET=1 multiplies bf16 bit patterns as integers in tl.dot): "
                         "on the CPU use float32 or float16; run bfloat16 on a CUDA GPU")
