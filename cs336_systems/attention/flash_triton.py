"""FlashAttention-2 in Triton as a torch.autograd.Function: forward and backward kernels.

`FlashAttentionTriton.apply(q, k, v, is_causal=False)`: q, k, v of shape (batch, seq, d) or
(batch, heads, seq, d), one dtype among fp32 / bf16 / fp16, head dim 16..128, on a CUDA device
(or any device when the Triton interpreter is on). n_queries may differ from n_keys; sequence
lengths need not be multiples of anything. Tiles: `apply(q, k, v, is_causal, fwd_config, bwd_config)`
hands the kernels a `tiles.FwdConfig` / `BwdConfig`; left out, the launchers' defaults.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .flash_launch import launch_bwd, launch_fwd
from .inputs import AttentionInputs, check_attention_inputs, refuse_under_interpreter
from .saved_state import load_attention_state, save_attention_state, unfold_like
from .tiles import BwdConfig, FwdConfig
from .triton_loader import interpreting


def unit_last_stride(t: Tensor) -> Tensor:
    """The kernels read rows of d contiguous elements; anything else is copied once."""
    return t if t.stride(-1) == 1 else t.contiguous()


def check_triton_inputs(q, k, v, is_causal) -> AttentionInputs:
    x = check_attention_inputs(q, k, v, is_causal, need_cuda=not interpreting())
    refuse_under_interpreter(x.q.dtype)
    return dataclasses.replace(x, q=unit_last_stride(x.q), k=unit_last_stride(x.k),
                               v=unit_last_stride(x.v))


# --8<-- [start:function]
class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton: `apply(q, k, v, is_causal=False)`, output in q's dtype.

    Precision, per input dtype (the softmax statistics m, l, L and D are fp32 in every case):
    - bf16 / fp16: every matmul multiplies bf16 / fp16 operands on the tensor cores and accumulates
      in fp32; P and dS are rounded to the input dtype before the matmuls that consume them.
    - fp32: IEEE fp32 matmuls, as torch.matmul computes fp32 by default, unless the user opted in
      to TF32 the way PyTorch is told (`torch.backends.cuda.matmul.fp32_precision = "tf32"`, or
      `allow_tf32 = True` / `torch.set_float32_matmul_precision("high")`): then the tensor cores
      round the operands to TF32 (10-bit mantissa) and accumulate in fp32.
    Under the Triton interpreter (CPU) fp32 and fp16 compute correctly; bf16 is refused.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, fwd_config: FwdConfig | None = None,
                bwd_config: BwdConfig | None = None):
        x = check_triton_inputs(q, k, v, is_causal)
        o4, L = _forward(x.q, x.k, x.v, x.is_causal, fwd_config)  # (Z, H, n_q, d), (Z, H, n_q) fp32
        o = unfold_like(o4, len(x.lead))
        save_attention_state(ctx, x, o, L)
        ctx.bwd_config = bwd_config
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, L = load_attention_state(ctx)
        do4 = unit_last_stride(do.unsqueeze(1) if ctx.lead_ndim == 1 else do)
        dq, dk, dv = _backward(q, k, v, o, L, do4, ctx.is_causal, ctx.bwd_config)
        return (unfold_like(dq, ctx.lead_ndim), unfold_like(dk, ctx.lead_ndim),
                unfold_like(dv, ctx.lead_ndim), None, None, None)
# --8<-- [end:function]


# Kernel launches are opaque to torch.compile: under `torch.compile(FlashAttentionTriton.apply)`
# dynamo stops here and the Function runs as written, kernels and all.
@torch.compiler.disable
def _forward(q, k, v, is_causal, config):
    return launch_fwd(q, k, v, is_causal, config)


@torch.compiler.disable
def _backward(q, k, v, o, L, do, is_causal, config):
    return launch_bwd(q, k, v, o, L, do, is_causal, config)
